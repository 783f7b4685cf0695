"""Synthetic token tasks that compare sequence mixers: what the `mqar` and `state_tracking` experiments share.

    lazylab train mqar model=fast_weights fast_weights.update_rule=gated_delta
    lazylab train state_tracking model=feedback feedback.memory_span=8

A task of this kind (`SyntheticTask`) is a generator of token sequences x [seq_len, batch] with a label y at some
positions (−1 elsewhere): fresh training batches at every step, drawn from (seed, epoch, batch index, rank), so a
resumed run sees what the uninterrupted one saw and no data state needs a checkpoint; fixed evaluation batches drawn
from the seed alone, at the training length and, for a task that measures length generalisation, at multiples of it
(metrics `accuracy.valid_2x`, `loss.valid_4x`, …). The loss is the cross-entropy of the model's logits
[seq_len, batch, n_tokens] at the labelled positions only; the accuracy counts those positions whose argmax is the
label.

The model is any of lazylab's three families (`model=transformer|feedback|fast_weights`), built from the same
sub-configs as the text experiments (`transformer.*`, `feedback.*`, `fast_weights.*`), whose sizes default to the
common keys d_model, heads, d_ff, n_layers, dropout. Each must take the longest sequence the task shows it (the
evaluation's, for length generalisation): the transformer's positions and the feedback transformer's
relative-position tables are checked against it before a run starts (one error line naming the key to change);
fast weights have no positions and take any length.
"""
from collections.abc import Iterator
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from lazylab.configs import inspect, option
from lazylab.configs.fast_weights import FastWeightsConfigs
from lazylab.configs.feedback import FeedbackConfigs
from lazylab.configs.transformer import TransformerConfigs
from lazylab.configs.types import Fraction, LayerCount, NonNegativeInt, PositiveInt, Probability
from lazylab.errors import UsageError, plural
from lazylab.experiments import Batch, BatchLoss, Task, TrainerConfigs, device_of, distributed, evaluate
from lazylab.experiments.memory import LONG, Need, feature_size, language_model_needs, named, selected_option
from lazylab.experiments.optimizers import OptimizerConfigs
from lazylab.experiments.task import check_logits, logits_of
from lazylab.models.autoregressive import AutoregressiveTransformer, TokenAndPositionEmbeddings

#: an "epoch" of fresh random batches (the trainer's epoch and valid_interval count in them)
BATCHES_PER_EPOCH = 1000
#: the model families `model` picks from, each with its sub-config of the same name
FAMILIES = ('transformer', 'feedback', 'fast_weights')


class SyntheticTask(Task):
    """The trainer's view of a synthetic task (see the module docstring); a subclass defines `draw`.

    Args:
        n_tokens: the vocabulary (inputs and labels are ids below it).
        seq_len: the training length.
        lengths: the evaluation lengths as multiples of seq_len, 1 first ((1,), or (1, 2, 4) for length
            generalisation): metrics loss.valid / accuracy.valid, then loss.valid_2x / accuracy.valid_2x, ….
        batch_size: sequences per step (per process).
        seed: the training batches (with epoch, index and rank) and the evaluation batches.
        valid_batches, final_valid_batches: evaluation batches per length at each validation, and at the end (0: as
            many as valid_batches).
        stop_accuracy: training ends once a validation's accuracy (at seq_len) is at least this (0: never).
        device: where evaluation batches go.
        rank, world_size: this process in a torchrun job (default: read from lazylab.experiments.distributed).
    """
    position_unit = 'tokens'

    def __init__(self, *, n_tokens: int, seq_len: int, lengths: tuple[int, ...], batch_size: int, seed: int,
                 valid_batches: int, final_valid_batches: int, stop_accuracy: float, device: torch.device,
                 rank: Optional[int] = None, world_size: Optional[int] = None):
        self.n_tokens, self.seq_len, self.lengths, self.batch_size = n_tokens, seq_len, lengths, batch_size
        self.seed, self.stop_accuracy, self.device = seed, stop_accuracy, device
        self.rank = distributed.get_rank() if rank is None else rank
        self.world_size = distributed.get_world_size() if world_size is None else world_size
        self.batches_per_epoch = BATCHES_PER_EPOCH
        #: the longest sequence the model is shown, and what shows it (for the models' checks)
        self.longest = seq_len * max(lengths)
        self.longest_use = f'seq_len={seq_len}' if max(lengths) == 1 else \
            f'the evaluation at {max(lengths)} × seq_len = {self.longest} tokens'
        self.valid_quick = {m: self._evaluation_batches(valid_batches, m, stream=1) for m in lengths}
        self.valid_full = {m: self._evaluation_batches(max(final_valid_batches, valid_batches), m, stream=2)
                           for m in lengths}
        self.final_valid_ratio = max(final_valid_batches, valid_batches) / valid_batches

    def draw(self, seq_len: int, batch_size: int, generator: torch.Generator) -> Batch:
        """`batch_size` sequences of `seq_len` tokens and their labels, from `generator` alone: x, y LongTensors
        [seq_len, batch_size], y = −1 where a position is not scored. Required.

        Raises:
            NotImplementedError: the subclass does not define it.
        """
        raise NotImplementedError

    def _generator(self, *parts: int) -> torch.Generator:
        value = self.seed
        for part in parts:
            value = value * 1_000_003 + part
        return torch.Generator().manual_seed(value % (2 ** 63))

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Fresh batches: batch `index` of `epoch` is drawn from (seed, epoch, index, rank) alone."""
        for index in range(start, self.batches_per_epoch):
            yield self.draw(self.seq_len, self.batch_size, self._generator(0, epoch, index, self.rank))

    def _evaluation_batches(self, count: int, multiple: int, stream: int) -> list[Batch]:
        """`count` batches of batch_size · world_size sequences of multiple · seq_len tokens (each process takes its
        columns), the same on every process and in every run of this seed."""
        return [self.draw(multiple * self.seq_len, self.batch_size * self.world_size,
                          self._generator(stream, multiple, index)) for index in range(count)]

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str = 'mean') -> BatchLoss:
        """Cross-entropy (nats per label, float32) of the logits at the labelled positions (y ≥ 0), and how many of
        those the argmax gets right.

        Args:
            model: returns logits [seq_len, batch_size, n_tokens], alone or as (logits, state).
            x, y: a batch of `batches` (y = −1: not scored).
            reduction: 'mean' (training) or 'sum' (evaluation) over the labels.

        Raises:
            TrainingError: the logits have another shape (naming both).
        """
        logits = logits_of(model(x))
        check_logits(logits, y, self.n_tokens)
        scored = y >= 0
        logits, labels = logits.float()[scored], y[scored]
        loss = F.cross_entropy(logits, labels, reduction=reduction)
        correct = int((logits.detach().argmax(-1) == labels).sum())
        return BatchLoss(loss, correct, int(scored.sum()))

    def evaluate(self, model: nn.Module, final: bool) -> dict[str, float]:
        """{'loss', 'accuracy'} at seq_len, and 'loss.valid_2x', 'accuracy.valid_2x', … at the longer lengths."""
        sets = self.valid_full if final else self.valid_quick
        out: dict[str, float] = {}
        for multiple, batches in sets.items():
            result = evaluate(model, batches, self.device, loss=self.loss)
            if multiple == 1:
                out.update(result)
            else:
                out.update({f'{name}.valid_{multiple}x': value for name, value in result.items()})
        return out

    def probe_batch(self) -> Batch:
        """The first evaluation batch of the longest length, cut to batch_size sequences: the check before a run
        (`trainer.check_trains`) then also shows that the model takes the longest sequences it will be shown."""
        x, y = self.valid_quick[max(self.lengths)][0]
        return x[:, :self.batch_size], y[:, :self.batch_size]

    def converged(self, valid: dict[str, float]) -> bool:
        """The validation accuracy at seq_len reached `stop_accuracy` (never when it is 0)."""
        return self.stop_accuracy > 0 and valid['accuracy'] >= self.stop_accuracy


class SyntheticConfigs(TrainerConfigs):
    """A synthetic task and a model of one of the three families (see the module docstring); an experiment adds its
    data keys and an `@option(Configs.task, …)` making its SyntheticTask."""
    max_steps: NonNegativeInt = 3000      # at most this many steps, unless stop_accuracy is reached first
    epochs: PositiveInt = 100             # of 1000 batches: the bound when max_steps=0 (max_minutes then decides)
    batch_size: PositiveInt = 64          # sequences per step (per process)
    valid_interval: NonNegativeInt = 100  # steps between validations (and checkpoints)
    log_interval: PositiveInt = 50        # steps between metric records
    valid_batches: PositiveInt = 2        # evaluation batches (fixed sequences) at each validation ...
    final_valid_batches: NonNegativeInt = 8  # ... and at the end (0: as many as valid_batches)
    stop_accuracy: Fraction = 1.0         # stop once the validation accuracy reaches this (0: never)
    task: Task                            # the data, the loss and the evaluation
    model: nn.Module = 'transformer'      # transformer, feedback or fast_weights (keys: transformer.*, …)
    transformer: TransformerConfigs       # the causal transformer's parts (as `lazylab train transformer`)
    feedback: FeedbackConfigs             # the Feedback Transformer's parts (as `lazylab train feedback`)
    fast_weights: FastWeightsConfigs      # the Fast Weights Transformer's parts (as `lazylab train fast_weights`)
    d_model: PositiveInt = 64             # model width
    heads: PositiveInt = 4                # attention heads
    d_ff: PositiveInt = 256               # feed-forward hidden width
    n_layers: LayerCount = 2              # layers
    dropout: Probability = 0.0            # dropout probability
    optimizer: OptimizerConfigs           # AdamW, 3·10⁻³, 100 warm-up steps, cosine
    total_steps: PositiveInt              # max_steps (or epochs of 1000 batches)


def check_family_keys(c: SyntheticConfigs) -> None:
    """Keys of a family's sub-config that a person gave (on the command line, in a --config file, by a sweep) for a
    run of another family change nothing: a mistake. A preset's are not (a preset may set several families up), nor
    the values code gives (a sweep's check of its points hands one point's built parts to the next).

    Raises:
        UsageError: naming the keys, the model they belong to, and the model chosen.
    """
    chosen = selected_option(c, 'model')
    given = [k for k, label in inspect.given(c).items() if '.' in k and k.split('.', 1)[0] in FAMILIES
             and k.split('.', 1)[0] != chosen and _by_a_person(str(label))]
    if not given:
        return
    families = list(dict.fromkeys(k.split('.', 1)[0] for k in given))
    them, verb = ('it', 'has') if len(given) == 1 else ('them', 'have')
    if len(families) == 1:
        raise UsageError(f'{", ".join(given)} {verb} no effect with model={chosen} (only model={families[0]} reads '
                         f'{them}); leave {them} out, or use model={families[0]}')
    raise UsageError(f'{", ".join(given)} have no effect with model={chosen} (only '
                     f'{", ".join(f"model={f}" for f in families)} read them, each its own); leave them out')


def _by_a_person(label: str) -> bool:
    """Whether a given value's label (`lazylab.configs.inspect.given`) says a person gave it."""
    return label in ('user', 'sweep') or label.startswith('--config')


@option(SyntheticConfigs.transformer, 'TransformerConfigs')
def _transformer_configs(c: SyntheticConfigs):
    conf = TransformerConfigs()
    conf.n_src_vocab = conf.n_tgt_vocab = c.task.n_tokens
    conf.d_model, conf.n_heads, conf.n_layers, conf.dropout = c.d_model, c.heads, c.n_layers, c.dropout
    conf._set_values({'ffn.d_ff': c.d_ff})  # reaches the FFN sub-config when it is created
    # learned positions (starting as sinusoids) for every position the task shows, unless transformer.src_embed
    # names one of TransformerConfigs' options
    conf.set_default(TransformerConfigs.src_embed,
                     func=lambda: TokenAndPositionEmbeddings(c.d_model, c.task.n_tokens, c.task.longest))
    return conf


def _sub_config(conf, c: SyntheticConfigs):
    """A FeedbackConfigs or FastWeightsConfigs whose sizes default to the common keys and the task's vocabulary."""
    defaults = {'n_tokens': lambda: c.task.n_tokens, **{k: (lambda k=k: getattr(c, k)) for k in
                                                        ('d_model', 'heads', 'd_ff', 'n_layers', 'dropout')}}
    for key, value in defaults.items():
        conf.set_default(getattr(type(conf), key), func=value)
    return conf


@option(SyntheticConfigs.feedback, 'FeedbackConfigs')
def _feedback_configs(c: SyntheticConfigs):
    return _sub_config(FeedbackConfigs(), c)


@option(SyntheticConfigs.fast_weights, 'FastWeightsConfigs')
def _fast_weights_configs(c: SyntheticConfigs):
    return _sub_config(FastWeightsConfigs(), c)


@option(SyntheticConfigs.model, 'transformer')
def _transformer(c: SyntheticConfigs):
    """The causal softmax transformer (lazylab.models.autoregressive.AutoregressiveTransformer)."""
    check_family_keys(c)
    t = c.transformer
    positions = getattr(t.src_embed, 'positional_encodings', None)
    if positions is not None and positions.shape[0] < c.task.longest:
        raise UsageError(f'transformer.src_embed={selected_option(t, "src_embed")} has positions for '
                         f'{plural(positions.shape[0], "token")}, fewer than {c.task.longest_use}; leave '
                         f'transformer.src_embed out (positions for every length the task shows), or use no_pos')
    return AutoregressiveTransformer(t.encoder, t.src_embed, t.generator, c.seq_len).to(device_of(c))


@option(SyntheticConfigs.model, 'feedback')
def _feedback(c: SyntheticConfigs):
    """The Feedback Transformer (`feedback.model`: feedback_transformer_kv, or the original feedback_transformer)."""
    check_family_keys(c)
    f = c.feedback
    needed = c.task.longest - 1 if not f.memory_span else min(c.task.longest - 1, f.memory_span)
    if f.n_positions < needed:
        raise UsageError(f'feedback.n_positions={f.n_positions} is too small for {c.task.longest_use}: a step '
                         f'attends over up to {plural(needed, "memory vector")}; set feedback.n_positions ≥ {needed} '
                         f'(or feedback.memory_span ≤ {f.n_positions})')
    return f.model.to(device_of(c))


@option(SyntheticConfigs.model, 'fast_weights')
def _fast_weights(c: SyntheticConfigs):
    """The Fast Weights Transformer (`fast_weights.update_rule`, `fast_weights.phi`, …; any length)."""
    check_family_keys(c)
    return c.fast_weights.model.to(device_of(c))


@option(SyntheticConfigs.total_steps, 'max_steps_or_epochs')
def _total_steps(c: SyntheticConfigs):
    return c.max_steps if c.max_steps > 0 else c.epochs * BATCHES_PER_EPOCH


@option(SyntheticConfigs.optimizer, 'OptimizerConfigs')
def _optimizer(c: SyntheticConfigs):
    """OptimizerConfigs over the model's parameters (its defaults: AdamW, 100 warm-up steps to 3·10⁻³, then a
    cosine to 3·10⁻⁴ over the run)."""
    conf = OptimizerConfigs()
    conf.parameters = c.model.parameters()
    conf.d_model = c.d_model
    conf.total_steps = c.total_steps
    return conf


class _Sizes:
    """The items `memory.language_model_needs` reads, for a task whose vocabulary is not a config item."""

    def __init__(self, c: SyntheticConfigs, n_tokens: int):
        self.batch_size, self.seq_len, self.n_tokens = c.batch_size, c.seq_len, n_tokens


def synthetic_needs(c: SyntheticConfigs, n_tokens: int, lengths: tuple[int, ...]) -> list[Need]:
    """The least memory a run takes (`lazylab.experiments.memory`): the language model's needs for the family
    chosen, at its sub-config's sizes, and the evaluation batches (x and y of every length, both sets).

    Args:
        c: the config (plain items only are read).
        n_tokens: the task's vocabulary.
        lengths: the evaluation lengths as multiples of seq_len.
    """
    family = selected_option(c, 'model')
    sizes = {k: (k, getattr(c, k)) for k in ('d_model', 'd_ff', 'n_layers', 'heads')}
    features = None
    if family in ('feedback', 'fast_weights'):
        sub = getattr(c, family)
        paths = {'d_model': 'd_model', 'd_ff': 'ffn.d_ff', 'n_layers': 'n_layers', 'heads': 'heads'}
        sizes = {k: named(c, k, f'{family}.{p}', getattr(sub, k) if k != 'd_ff' else sub.ffn.d_ff)
                 for k, p in paths.items()}
        if family == 'fast_weights':
            phi, d_key = selected_option(sub, 'phi'), max(1, sub.d_model // sub.heads)
            d_dot = d_key if phi == 'l2' else feature_size(phi, d_key, sub.nu, sub.favor_features)
            features = None if d_dot is None else (d_dot, (sizes['d_model'], sizes['heads']))
    n_eval = c.valid_batches + max(c.final_valid_batches, c.valid_batches)
    tokens = n_eval * c.batch_size * c.seq_len * sum(lengths)
    return language_model_needs(_Sizes(c, n_tokens), sizes, features) + [
        Need('the evaluation batches', 2 * LONG * tokens, (('batch_size', c.batch_size), ('seq_len', c.seq_len),
                                                           ('valid_batches', c.valid_batches),
                                                           ('final_valid_batches', c.final_valid_batches)))]


def task_arguments(c: SyntheticConfigs) -> dict[str, Any]:
    """The SyntheticTask arguments every experiment takes from the trainer's keys."""
    return dict(seq_len=c.seq_len, batch_size=c.batch_size, seed=c.seed, valid_batches=c.valid_batches,
                final_valid_batches=c.final_valid_batches, stop_accuracy=c.stop_accuracy, device=device_of(c))
