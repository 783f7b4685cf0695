"""What the training loop takes from an experiment: its batches, the loss of a batch, its validation, a sample.

An experiment's config provides a `Task` (the item `task`); `trainer.train` needs nothing else from the data:

    for x, y in task.batches(epoch, start=batch):        # this process's training batches, resumable
        x, y = task.shorten(x, y, warmup.length(step))    # only with a sequence-length warm-up (see below)
        loss = task.loss(model, x, y)                     # BatchLoss(loss, correct, count)
    valid = task.evaluate(model, final=False)             # {'loss': …, 'accuracy': …} (all processes)
    text = task.sample(model, step)                       # or None

`nlp_autoregression.TextTask` (next character of a text) is one; a task on synthetic sequences overrides `loss`
(and `evaluate`) with its own objective. The defaults are next-token cross-entropy and accuracy
(`next_token_loss`) and no sample.

Sequence-length warm-up (`SeqLenWarmup`, the trainer's `seq_len_start` and `seq_len_warmup`): training starts on
short sequences and grows them to `seq_len`, the speed-up of the Feedback Transformer paper (Fan et al. 2020);
a task that can cut its batches to shorter sequences says so with `shorter_sequences = True` (the text task:
windows of the current length); the others refuse the warm-up before a run starts.
"""
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

from lazylab.errors import CheckpointError, TrainingError
from lazylab.experiments import distributed

Batch = tuple[torch.Tensor, torch.Tensor]


class BatchLoss(NamedTuple):
    """The loss of one batch and its accuracy counts.

    loss: scalar tensor; the mean over the batch's predictions (reduction='mean', what training backpropagates)
        or their sum (reduction='sum', what evaluation adds up).
    correct: how many of the predictions are right.
    count: how many predictions the batch holds (accuracy = correct / count; the mean loss = sum / count).
    """
    loss: torch.Tensor
    correct: int
    count: int


def logits_of(output: Any) -> torch.Tensor:
    """The logits of a text model's output: the tensor itself, or the first element of labml_nn's
    `(logits, state)` pair."""
    return output[0] if isinstance(output, (tuple, list)) else output


def check_logits(logits: Any, y: torch.Tensor, n_tokens: Optional[int] = None) -> None:
    """That a text model's logits have the shape [seq_len, batch_size, n_tokens] of the targets `y`.

    Raises:
        TrainingError: naming the shape expected and the shape found (the first-batch check shows it before a
            run starts).
    """
    expected = (*y.shape, n_tokens if n_tokens is not None else 'n_tokens')
    shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else None
    if shape is None or len(shape) != 3 or shape[:2] != tuple(y.shape) or \
            (n_tokens is not None and shape[2] != n_tokens):
        found = f'logits of shape [{", ".join(map(str, shape))}]' if shape is not None else \
            f'a {type(logits).__name__}'
        raise TrainingError(f'the model returns {found}; a text model must return logits [seq_len, batch_size, '
                            f'n_tokens] = [{", ".join(map(str, expected))}] (alone, or as (logits, state))')


def next_token_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str = 'mean',
                    n_tokens: Optional[int] = None) -> BatchLoss:
    """Cross-entropy (nats per token) and accuracy of predicting y from x.

    Args:
        model: returns logits, alone or as `(logits, state)` (labml_nn's models: `logits_of`).
        x, y: the batch (inputs and next tokens); reduction: 'mean' or 'sum' of the per-token losses.
        n_tokens: the vocabulary size the logits must have (None: not checked).

    Shapes:
        x, y: LongTensor [seq_len, batch_size]; logits [seq_len, batch_size, n_tokens] (the loss is taken in float32)

    Raises:
        TrainingError: the logits have another shape (`check_logits`).
    """
    logits = logits_of(model(x))
    check_logits(logits, y, n_tokens)
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction=reduction)
    correct = (logits.detach().argmax(-1) == y).sum().item()
    return BatchLoss(loss, correct, y.numel())


class Task:
    """The interface between an experiment and the training loop (see the module docstring): a contract.

    Required: `batches_per_epoch` (an attribute), `batches(epoch, start)` and `evaluate(model, final)`. Optional,
    with defaults: `loss` (next-token cross-entropy), `sample` (none), `converged` (never), `checkpoint_extras`
    (none), `check_checkpoint` (the extras compared), `shorten` with `shorter_sequences` (for the sequence-length
    warm-up), `probe_batch`, `final_valid_ratio`, and the units `position_unit` / `loss_unit` / `loss_label`.

    The rules each method's docstring states: batches are a pure function of (epoch, index), so a resumed run sees
    what the uninterrupted one saw; `loss` returns a `BatchLoss` whose `loss` is a scalar tensor the trainer
    backpropagates; nothing uses the global random state but the model's dropout. Under torchrun every process has
    its own task: `batches` yields this process's share of each batch (`lazylab.experiments.distributed.get_rank`),
    and `evaluate` returns the result over all processes (the `evaluate` helper all-reduces).

    Attributes:
        batches_per_epoch: training batches per epoch (of this process); `epochs`, `inner_iterations` count in them.
        final_valid_ratio: the final validation's duration over an interleaved one's (for the time budget).
        shorter_sequences: whether `shorten` gives batches of shorter sequences (the warm-up needs it).
        position_unit, loss_unit, loss_label: what the run's first line, last line and plots call a batch
            position ('characters'), the loss's unit ('nats/char') and the loss ('cross-entropy (nats/char)').
    """
    #: training batches per epoch (of this process); the trainer's `epoch` and `valid_interval` count in them
    batches_per_epoch: int
    #: the final validation's duration over an interleaved one's, for the time budget (e.g. their batch counts)
    final_valid_ratio: float = 1.0
    #: whether `shorten` gives batches of shorter sequences (the trainer's sequence-length warm-up needs it)
    shorter_sequences: bool = False
    #: the task's units, for what a run prints and plots: a position of a training sequence (the first line's
    #: '16×64 characters'), the loss's unit after a number ('valid loss 1.5212 nats/char'), the loss on an axis
    position_unit: str = 'tokens'
    loss_unit: str = 'nats/token'
    loss_label: str = 'cross-entropy (nats/token)'

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The training batches (x, y) of `epoch` from batch index `start` on (resuming mid-epoch), as a pure
        function of (epoch, index): a resumed run must see the batches the uninterrupted one saw. Required.

        Args:
            epoch: the epoch (0, 1, …).
            start: the first batch index to yield (0 … batches_per_epoch).

        Raises:
            NotImplementedError: the subclass does not define it.
        """
        raise NotImplementedError

    def shorten(self, x: torch.Tensor, y: torch.Tensor, seq_len: int) -> Batch:
        """The batch (x, y) of `batches` cut to sequences of `seq_len` ≤ its own, for the sequence-length warm-up;
        the default keeps the first `seq_len` positions of both (sequence-first), right for a task whose every
        position is a prediction (next-token tasks set `shorter_sequences = True` to use it).

        Args:
            x, y: a batch of `batches`.
            seq_len: the length this step trains on.
        """
        return x[:seq_len], y[:seq_len]

    def probe_batch(self) -> Batch:
        """A batch to check, before a run starts, that the model trains on this task (`trainer.check_trains`): the
        first training batch (the batches are a pure function of (epoch, index), so this changes nothing)."""
        return next(iter(self.batches(0)))

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str = 'mean') -> BatchLoss:
        """The loss of a batch (x, y already on the model's device, under the run's autocast); default:
        `next_token_loss`. `reduction='mean'` is what training backpropagates, `'sum'` what evaluation adds up
        (then `BatchLoss.loss / count` is the mean).

        Args:
            model: the model (wrapped in DDP under torchrun).
            x, y: one batch of `batches`.
            reduction: 'mean' or 'sum', as above.

        Raises:
            TrainingError: the model's output has another shape than the loss needs (the default's check).
        """
        return next_token_loss(model, x, y, reduction)

    def evaluate(self, model: torch.nn.Module, final: bool) -> dict[str, float]:
        """{'loss', 'accuracy'} on the validation data: a quick estimate (final=False, at every validation) or
        the thorough one that ends the run (final=True). Called on every process; it leaves the model in the
        mode it found it in. Required; the `evaluate` helper of this module does it for a list of batches. Metrics
        of the task's own may come beside them, named as metrics.jsonl records them (a name with a dot, e.g.
        'accuracy.valid_2x': the state-tracking task's accuracy at twice the training length).

        Args:
            model: the model (not the DDP wrapper).
            final: the thorough validation at the end of the run.

        Raises:
            NotImplementedError: the subclass does not define it.
        """
        raise NotImplementedError

    def sample(self, model: torch.nn.Module, step: int) -> Optional[str]:
        """A text the model generates, shown and saved at each validation of step `step` (rank 0 only; use a
        generator of its own, not the global random state); None: nothing to show (the default).

        Args:
            model: the model.
            step: the steps taken.
        """
        return None

    def checkpoint_extras(self) -> dict[str, Any]:
        """Plain values (str, numbers, lists, dicts of them) saved in every checkpoint, for using the model without
        the data (e.g. its vocabulary, which `lazylab generate` reads); none by default."""
        return {}

    def converged(self, valid: dict[str, float]) -> bool:
        """Whether training may stop early after the validation that gave `valid` (the same on every process: the
        validation is all-reduced). Default: never; the retrieval task stops at its target loss. The run's last line
        then says the task's target stopped it.

        Args:
            valid: the validation's {'loss', 'accuracy'}.
        """
        return False
    def check_checkpoint(self, checkpoint: dict[str, Any]) -> list[str]:
        """Before a resume: refuse a checkpoint made on other data, i.e. one whose `checkpoint_extras` differ
        from this task's (default: each extra compared for equality). Returns the differences a resume may accept
        with `--allow-changes` (one line each; e.g. the text task's text changed but kept its characters), which
        the runner refuses without it; none by default.

        Args:
            checkpoint: the checkpoint, as `checkpoint.load_checkpoint` returns it.

        Raises:
            CheckpointError: naming the extra that differs (what no resume can accept).
        """
        for key, value in self.checkpoint_extras().items():
            if key in checkpoint and checkpoint[key] != value:
                raise CheckpointError(f"the checkpoint's {key} differs from this run's; it was made on other data")
        return []


class SeqLenWarmup:
    """The sequence length of each training step: `start` at the first step, growing linearly to `seq_len` over
    `warmup` steps (Fan et al. 2020 train the Feedback Transformer on short sequences first, then longer ones).

        length(step) = start + ⌊(seq_len − start) · step / warmup⌋   for step < warmup (steps done), else seq_len

    A pure function of the step, so a resumed run cuts its batches as the uninterrupted one did. `start` = 0 or
    `warmup` = 0: no warm-up (every step at seq_len).

    Args:
        start: the first steps' length (1 ≤ start ≤ seq_len, or 0 for none).
        warmup: the steps over which the length grows.
        seq_len: the full length (what validation uses throughout).
    """

    def __init__(self, start: int, warmup: int, seq_len: int):
        self.active = start > 0 and warmup > 0 and start < seq_len
        self.start, self.warmup, self.seq_len = (start, warmup, seq_len) if self.active else (seq_len, 0, seq_len)

    def length(self, step: int) -> int:
        """The length of the batch the step after `step` steps trains on."""
        if step >= self.warmup:
            return self.seq_len
        return self.start + (self.seq_len - self.start) * step // self.warmup

    def work(self, first: int, end: int) -> float:
        """Σ length(s) / seq_len for s in [first, end): the cost of those steps in full-length steps (exact; for
        the time budget, which fits the step count to the time left)."""
        first, end = max(first, 0), max(end, first)
        mid = min(max(first, self.warmup), end)  # steps in [first, mid) are in the warm-up, [mid, end) are not
        d, w = self.seq_len - self.start, max(self.warmup, 1)
        ramp = self.start * (mid - first) + _floor_sum(mid, w, d) - _floor_sum(first, w, d)
        return ramp / self.seq_len + (end - mid)


def _floor_sum(n: int, m: int, a: int) -> int:
    """Σ_{i<n} ⌊a·i / m⌋ for n, m ≥ 1, a ≥ 0, in O(log) steps (the Euclid-like reduction of the floor sum)."""
    total, b = 0, 0
    while n > 0:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        last = a * n + b
        if last < m:
            break
        n, b, m, a = last // m, last % m, a, m
    return total


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterable[Batch], device: torch.device,
             autocast: Callable[[], Any] = nullcontext, loss: Callable[..., BatchLoss] = next_token_loss
             ) -> dict[str, float]:
    """Mean loss (of `loss`, by default cross-entropy in nats/token) and accuracy over all `batches`, in eval mode.

    Under torchrun each process takes its share of every batch's columns (distributed.batch_share) and the sums
    are added up, so the result is that of the whole batches.

    Args:
        model: the model (put in eval mode for the pass, its mode restored after).
        batches: (x, y) pairs, sequence-first [seq_len, batch_size].
        device: where the batches go (the model's device).
        autocast: a context-manager factory around the forward pass (e.g. bfloat16 autocast).
        loss: called as loss(model, x, y, reduction='sum').
    """
    was_training = model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for x, y in batches:
        x, y = distributed.batch_share(x).to(device), distributed.batch_share(y).to(device)
        if y.numel():
            with autocast():
                batch = loss(model, x, y, reduction='sum')
            loss_sum += batch.loss.item()
            correct += batch.correct
            count += batch.count
    model.train(was_training)
    loss_sum, correct, count = distributed.all_reduce_sum(loss_sum, correct, count)
    return {'loss': loss_sum / count, 'accuracy': correct / count}
