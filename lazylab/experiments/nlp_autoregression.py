"""Character-level autoregressive language modelling: what every experiment here shares.

`NLPAutoRegressionConfigs` adds to the trainer's items the text, the model width, the optimizer and sampling, and
`task`, the trainer's view of the data: a `TextTask` (next character of the text: shuffled training windows,
validation on the held-out 10%, a sample from `prompt`). Experiments subclass it and add
`@option(Configs.model, 'name')` functions that build an `AutoregressiveModel(n_tokens, d_model, core_transformer)`
on `device_of(c)`.
"""
import sys
from collections.abc import Iterator
from typing import Annotated, Any, Callable, Optional

import torch
from annotated_types import Ge, Le
from torch import nn

from lazylab.configs import option
from lazylab.configs.types import NonEmptyStr, NonNegativeFloat, NonNegativeInt, PathStr, PositiveInt
from lazylab.data import TINY_SHAKESPEARE, SequentialLoader, ShuffledLoader, TextDataset, vocabulary_change
from lazylab.errors import CheckpointError, DataError, plural
from lazylab.experiments import distributed
from lazylab.experiments.optimizers import OptimizerConfigs
from lazylab.experiments.task import Batch, BatchLoss, Task, evaluate, logits_of, next_token_loss
from lazylab.experiments.trainer import TrainerConfigs, resolve_device
from lazylab.models.sampling import MAX_NEW_TOKENS, check_generate_arguments, sample_next

#: labml_nn's published experiment settings (d_model 512, 8 heads, 6 layers, Noam lr 1.0, 128 epochs); each
#: experiment's `preset=labml_nn` is this plus its own keys
LABML_NN_PRESET = {'d_model': 512, 'heads': 8, 'n_layers': 6, 'd_ff': 2048, 'seq_len': 128, 'batch_size': 64,
                   'optimizer.optimizer': 'Noam', 'optimizer.learning_rate': 1.0, 'optimizer.warmup': 2000,
                   'dropout': 0.0, 'epochs': 128, 'max_steps': 0, 'max_minutes': 0, 'inner_iterations': 25,
                   'valid_interval': 0}


class NLPAutoRegressionConfigs(TrainerConfigs):
    """Trainer items plus data, model width, optimizer and sampling.

    The defaults are a 10-minute run on a 2-core CPU: the time budget (`max_minutes`) fixes the step count after
    timing the first steps, and the learning rate warms up, then follows a cosine to a tenth of its peak.
    """
    max_minutes: NonNegativeFloat = 10.0  # training time budget in minutes (0: epochs / max_steps decide)
    epochs: PositiveInt = 100         # an upper bound; the time budget ends the default run first
    seq_len: PositiveInt = 64         # characters per sequence
    batch_size: PositiveInt = 32      # sequences per step (per process)
    valid_interval: NonNegativeInt = 250  # steps between validations (and checkpoints)
    text: PathStr = TINY_SHAKESPEARE  # tiny_shakespeare (bundled) or the path of a UTF-8 text file
    dataset: TextDataset              # the tokenized 90% / 10% split of `text`
    task: Task                        # what the trainer trains on: batches, loss, validation, samples
    n_tokens: PositiveInt             # vocabulary size (from the dataset)
    model: nn.Module                  # the autoregressive model (options per experiment)
    d_model: PositiveInt = 128        # model width
    optimizer: OptimizerConfigs       # optimizer.optimizer, optimizer.learning_rate, …
    total_steps: PositiveInt          # optimizer steps this run takes (from epochs and max_steps)
    prompt: NonEmptyStr = 'It is'     # start of the text sampled at each validation
    sample_tokens: Annotated[int, Ge(0), Le(MAX_NEW_TOKENS)] = 200  # characters sampled at each validation
    sample_temperature: NonNegativeFloat = 0.8  # temperature of that sampling (0: greedy)


def device_of(c: TrainerConfigs) -> torch.device:
    """The torch.device that `c.device` names ('auto' picks cuda, mps or cpu): where an experiment's option puts
    its model (`.to(device_of(c))`).

    Args:
        c: the experiment's config.

    Raises:
        ValueError: the device is unknown or not available (a run checks it first, as one error line).
    """
    return resolve_device(c.device)


@option(NLPAutoRegressionConfigs.dataset, 'character_split')
def _dataset(c: NLPAutoRegressionConfigs):
    data = TextDataset.load(c.text)
    data.check_seq_len(c.seq_len)
    return data


class TextTask(Task):
    """Next-character prediction on a `TextDataset` (labml_nn's NLPAutoRegressionConfigs' data and loss).

    Training: `ShuffledLoader` windows of the training split (this process's shard under torchrun), cut to the
    current length during a sequence-length warm-up (`shorten`: a window's first positions, itself a window);
    loss: next-token cross-entropy and accuracy. Validation: `SequentialLoader` windows of the validation split,
    `valid_batches` of them at each validation and `final_valid_batches` (0: all) at the end; every batch spans all
    processes (`evaluate` takes this process's columns). Sample: `sample_tokens` characters after `prompt`.

    Args:
        data: the text split.
        seq_len, batch_size: window length and windows per step (per process).
        seed: the data order (ShuffledLoader) and the samples' generator (seed + step).
        valid_batches, final_valid_batches: validation batches each time, and at the end (0: the whole split).
        prompt, sample_tokens, sample_temperature: the samples at each validation.
        device: where batches go for validation and sampling (the model's device).
        rank, world_size: this process in a torchrun job (default: read from lazylab.experiments.distributed).

    Raises:
        DataError: a split holds no window of seq_len + 1 characters, or fewer training windows than processes;
            the prompt has a character outside the text's vocabulary.
    """

    def __init__(self, data: TextDataset, *, seq_len: int, batch_size: int, seed: int, valid_batches: int,
                 final_valid_batches: int, prompt: str, sample_tokens: int, sample_temperature: float,
                 device: torch.device, rank: Optional[int] = None, world_size: Optional[int] = None):
        rank = distributed.get_rank() if rank is None else rank
        world_size = distributed.get_world_size() if world_size is None else world_size
        data.check_seq_len(seq_len, processes=world_size)
        self.data, self.device, self.seed, self.seq_len = data, device, seed, seq_len
        self.prompt_ids = prompt_ids(data, prompt)
        self.sample_tokens, self.sample_temperature = sample_tokens, sample_temperature
        self.train_loader = ShuffledLoader(data.train, seq_len=seq_len, batch_size=batch_size, seed=seed,
                                           rank=rank, world_size=world_size)
        self.valid_quick = SequentialLoader(data.valid, seq_len=seq_len, batch_size=batch_size * world_size,
                                            max_batches=valid_batches)
        self.valid_full = SequentialLoader(data.valid, seq_len=seq_len, batch_size=batch_size * world_size,
                                           max_batches=final_valid_batches or None)
        self.batches_per_epoch = len(self.train_loader)
        self.final_valid_ratio = len(self.valid_full) / len(self.valid_quick)

    shorter_sequences = True  # every position is a prediction: a window's first L positions are a window of L
    position_unit, loss_unit, loss_label = 'characters', 'nats/char', 'cross-entropy (nats/char)'

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        return self.train_loader.epoch(epoch, start=start)

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str = 'mean') -> BatchLoss:
        """Next-character cross-entropy and accuracy (`task.next_token_loss`), the logits checked to be
        [seq_len, batch_size, n_tokens] of this text's vocabulary.

        Args:
            model: a text model (logits alone, or `(logits, state)`).
            x, y: a batch of `batches`.
            reduction: 'mean' (training) or 'sum' (evaluation).

        Raises:
            TrainingError: the logits have another shape (naming both).
        """
        return next_token_loss(model, x, y, reduction, n_tokens=self.data.n_tokens)

    def evaluate(self, model: nn.Module, final: bool) -> dict[str, float]:
        return evaluate(model, self.valid_full if final else self.valid_quick, self.device, loss=self.loss)

    def sample(self, model: nn.Module, step: int) -> str:
        """`prompt` and `sample_tokens` characters sampled at `sample_temperature`, from a generator seeded with
        seed + step (training's random state is untouched); a model without `generate` is re-run on the last
        seq_len characters for each (`generate_ids`).

        Args:
            model: the text model.
            step: the steps taken (seeds the sample).
        """
        g = torch.Generator(device=self.device).manual_seed(self.seed + step)
        ids = generate_ids(model, self.prompt_ids.to(self.device), self.sample_tokens, context=self.seq_len,
                           temperature=self.sample_temperature, generator=g)
        return self.data.tokenizer.decode(ids.cpu())

    def checkpoint_extras(self) -> dict[str, Any]:
        """The vocabulary, so that `lazylab generate` needs only the checkpoint; the text's sha256 and size in
        bytes (`text_sha256`, `text_size`), so that a resume can tell the text changed."""
        return {'vocabulary': self.data.tokenizer.itos, 'text_sha256': self.data.sha256,
                'text_size': self.data.size}

    def check_checkpoint(self, checkpoint: dict[str, Any]) -> list[str]:
        """Refuse to resume from a checkpoint trained on another vocabulary (the text changed): the ids would
        mean other characters, or the embedding would not fit. A text that changed but kept its characters (its
        sha256 or size differ from the checkpoint's) is returned as one line, which `lazylab resume` refuses
        unless `--allow-changes`. A checkpoint of an older lazylab records no sha256: a note says the text is not
        compared, and the resume goes on.

        Args:
            checkpoint: the checkpoint, as `checkpoint.load_checkpoint` returns it.

        Raises:
            CheckpointError: saying what differs (sizes, characters added or removed, or their order).
        """
        saved = checkpoint.get('vocabulary')
        change = vocabulary_change(saved, self.data.tokenizer.itos) if isinstance(saved, str) else None
        if change is not None:
            raise CheckpointError(f'the text {self.data.name} has another vocabulary than the checkpoint was '
                                  f'trained on ({change}); resume with the same text')
        sha256, size = checkpoint.get('text_sha256'), checkpoint.get('text_size')
        if not isinstance(sha256, str) or not isinstance(size, int):
            if distributed.is_main_process():
                print(f'lazylab: note: the checkpoint records no sha256 of its text (an older lazylab wrote it); '
                      f'only the vocabulary of {self.data.name} was compared', file=sys.stderr, flush=True)
            return []
        if (sha256, size) == (self.data.sha256, self.data.size):
            return []
        return [f'text {self.data.name} changed since the checkpoint: sha256 {sha256[:12]}… → '
                f'{self.data.sha256[:12]}…, size {size:,} → {self.data.size:,} bytes']


@torch.no_grad()
def generate_ids(model: nn.Module, prompt_ids: torch.Tensor, tokens: int, *, context: int, temperature: float = 1.0,
                 top_k: Optional[int] = None, generator: Optional[torch.Generator] = None,
                 on_token: Optional[Callable[[torch.Tensor], None]] = None) -> torch.Tensor:
    """The prompt followed by `tokens` sampled ids (`lazylab.models.sampling.sample_next`), in eval mode (the mode
    is restored after).

    A model with its own `generate` (`lazylab.models.autoregressive.LanguageModel`'s signature: prompt_ids,
    max_new_tokens, temperature=, top_k=, generator=, on_token=; incremental where the model can) makes them; any
    other text model is re-run for every new id on the last `context` ids (its `seq_len`: what it was trained on).

    Args:
        model: a text model (logits alone or `(logits, state)`); prompt_ids: LongTensor [prompt_len] (≥ 1).
        tokens: ids to add; context: the most ids a re-run sees; temperature, top_k, generator: the sampling's.
        on_token: called with each new id (LongTensor [1]) as soon as it is sampled.

    Raises:
        ValueError: an empty prompt, or tokens, temperature or top_k out of range (`check_generate_arguments`).
        NonFiniteLogitsError: the logits have no next token (weights that are not finite).
    """
    own = getattr(model, 'generate', None)
    if callable(own):
        return own(prompt_ids, tokens, temperature=temperature, top_k=top_k, generator=generator, on_token=on_token)
    if prompt_ids.dim() != 1 or prompt_ids.shape[0] == 0:
        raise ValueError(f'prompt_ids must be [prompt_len] with prompt_len ≥ 1, got shape {tuple(prompt_ids.shape)}')
    check_generate_arguments(tokens, temperature, top_k)
    was_training = model.training
    model.eval()
    try:
        out = [prompt_ids]
        for _ in range(tokens):
            window = torch.cat(out)[-context:]
            logits = logits_of(model(window.unsqueeze(1)))  # [len, 1, n_tokens]
            out.append(sample_next(logits[-1], temperature, top_k, generator))
            if on_token is not None:
                on_token(out[-1])
    finally:
        model.train(was_training)
    return torch.cat(out)


def prompt_ids(data: TextDataset, prompt: str) -> torch.Tensor:
    """The ids of `prompt` in the text's vocabulary (LongTensor [len(prompt)]).

    Raises:
        DataError: `prompt='It is' (…): character 'I' (position 0) is not in the text FILE (its N characters); …`,
            naming the `prompt` key and how to set it (the default prompt is English; a text need not contain it).
    """
    stoi = data.tokenizer.stoi
    bad = next(((i, ch) for i, ch in enumerate(prompt) if ch not in stoi), None)
    if bad is not None:
        i, ch = bad
        raise DataError(f'prompt={prompt!r} (the start of the validation samples): character {ch!r} (position {i}) '
                        f'is not in the text {data.name} (its {plural(data.n_tokens, "character")}); set '
                        f'prompt=TEXT to characters of the text')
    return data.tokenizer.encode(prompt)


@option(NLPAutoRegressionConfigs.task, 'next_character')
def _task(c: NLPAutoRegressionConfigs):
    """Made inside the torchrun process group (runner.prepare): each process takes its shard."""
    check_vocabulary_size(c)
    return TextTask(c.dataset, seq_len=c.seq_len, batch_size=c.batch_size, seed=c.seed,
                    valid_batches=c.valid_batches, final_valid_batches=c.final_valid_batches, prompt=c.prompt,
                    sample_tokens=c.sample_tokens, sample_temperature=c.sample_temperature, device=device_of(c))


@option(NLPAutoRegressionConfigs.n_tokens, 'vocabulary_size')
def _n_tokens(c: NLPAutoRegressionConfigs):
    return c.dataset.n_tokens


def check_vocabulary_size(c: NLPAutoRegressionConfigs) -> None:
    """`n_tokens` is the text's vocabulary size: a value given for it must be that size.

    Raises:
        DataError: naming both sizes.
    """
    if c.n_tokens != c.dataset.n_tokens:
        raise DataError(f'n_tokens={c.n_tokens}, but the text {c.dataset.name} has '
                        f'{plural(c.dataset.n_tokens, "character")}; leave n_tokens out (it is the vocabulary size '
                        f'of the text)')


@option(NLPAutoRegressionConfigs.total_steps, 'epochs_or_max_steps')
def _total_steps(c: NLPAutoRegressionConfigs):
    per_epoch = -(-((len(c.dataset.train) - 1) // c.seq_len) // c.batch_size)
    steps = c.epochs * per_epoch
    return min(steps, c.max_steps) if c.max_steps > 0 else steps


@option(NLPAutoRegressionConfigs.optimizer, 'OptimizerConfigs')
def _optimizer(c: NLPAutoRegressionConfigs):
    """OptimizerConfigs over the model's parameters (defaults: AdamW, 100 warm-up steps to 3·10⁻³, then a cosine
    to 3·10⁻⁴ over the run)."""
    conf = OptimizerConfigs()
    conf.parameters = c.model.parameters()
    conf.d_model = c.d_model
    conf.total_steps = c.total_steps
    return conf
