"""What the training loop takes from an experiment: its batches, the loss of a batch, its validation, a sample.

An experiment's config provides a `Task` (the item `task`); `trainer.train` needs nothing else from the data:

    for x, y in task.batches(epoch, start=batch):        # this process's training batches, resumable
        loss = task.loss(model, x, y)                     # BatchLoss(loss, correct, count)
    valid = task.evaluate(model, final=False)             # {'loss': …, 'accuracy': …} (all processes)
    text = task.sample(model, step)                       # or None

`nlp_autoregression.TextTask` (next character of a text) is one; a task on synthetic sequences overrides `loss`
(and `evaluate`) with its own objective. The defaults are next-token cross-entropy and accuracy
(`next_token_loss`) and no sample.
"""
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

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


def next_token_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str = 'mean') -> BatchLoss:
    """Cross-entropy (nats per token) and accuracy of predicting y from x; the model returns (logits, _).

    Shapes:
        x, y: LongTensor [seq_len, batch_size]; logits [seq_len, batch_size, n_vocab] (the loss is taken in float32)
    """
    logits, _ = model(x)
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction=reduction)
    correct = (logits.detach().argmax(-1) == y).sum().item()
    return BatchLoss(loss, correct, y.numel())


class Task:
    """The interface between an experiment and the training loop (see the module docstring).

    A subclass sets `batches_per_epoch` and defines `batches` and `evaluate`; `loss`, `final_valid_ratio`,
    `sample` and `checkpoint_extras` have defaults. Under torchrun every process has its own task: `batches`
    yields this process's share of each batch, and `evaluate` returns the result over all processes.
    """
    #: training batches per epoch (of this process); the trainer's `epoch` and `valid_interval` count in them
    batches_per_epoch: int
    #: the final validation's duration over an interleaved one's, for the time budget (e.g. their batch counts)
    final_valid_ratio: float = 1.0

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The training batches (x, y) of `epoch` from batch index `start` on (resuming mid-epoch), as a pure
        function of (epoch, index): a resumed run must see the batches the uninterrupted one saw."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str = 'mean') -> BatchLoss:
        """The loss of a batch (x, y already on the model's device); default: `next_token_loss`."""
        return next_token_loss(model, x, y, reduction)

    def evaluate(self, model: torch.nn.Module, final: bool) -> dict[str, float]:
        """{'loss', 'accuracy'} on the validation data: a quick estimate (final=False, at every validation) or
        the thorough one that ends the run (final=True). Called on every process; it leaves the model in the
        mode it found it in."""
        raise NotImplementedError

    def sample(self, model: torch.nn.Module, step: int) -> Optional[str]:
        """A text the model generates, shown and saved at each validation of step `step` (rank 0 only; use a
        generator of its own, not the global random state); None: nothing to show."""
        return None

    def checkpoint_extras(self) -> dict[str, Any]:
        """Plain values saved in every checkpoint, for using the model without the data (e.g. its vocabulary)."""
        return {}

    def converged(self, valid: dict[str, float]) -> bool:
        """Whether training may stop early after the validation that gave `valid` (the same on every process: the
        validation is all-reduced). Default: never; the retrieval task stops at its target loss."""
        return False


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterable[Batch], device: torch.device,
             autocast: Callable[[], Any] = nullcontext, loss: Callable[..., BatchLoss] = next_token_loss
             ) -> dict[str, float]:
    """Mean loss (of `loss`, by default cross-entropy in nats/token) and accuracy over all `batches`, in eval mode.

    Under torchrun each process takes its share of every batch's columns (distributed.batch_share) and the sums
    are added up, so the result is that of the whole batches.

    Args:
        batches: (x, y) pairs, sequence-first [seq_len, batch_size].
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
