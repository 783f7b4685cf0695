"""EXPERIMENT_NAME: a Task of its own (sorting digits) with its model, trained by lazylab.

    lazylab train EXPERIMENT_NAME.py                      # or: python EXPERIMENT_NAME.py
    lazylab train EXPERIMENT_NAME.py seq_len=12 hidden=128
    lazylab options EXPERIMENT_NAME.py

A Configs on TrainerConfigs provides the four items the trainer reads, each made by an @option: `model` (an
nn.Module), `task` (a Task: batches, loss, evaluation), `optimizer` (an OptimizerConfigs over the model's
parameters) and `total_steps`. TrainerConfigs brings the rest (seed, device, batch_size, validation, max_steps, …).
"""
import sys
from collections.abc import Iterator
from typing import Annotated

import torch
from annotated_types import Ge, Interval
from torch import nn

from lazylab.configs import option
from lazylab.experiments import Batch, Task, TrainerConfigs, device_of, distributed, evaluate, main
from lazylab.experiments.optimizers import OptimizerConfigs


class SortDigits(Task):
    """x: random digits [seq_len, batch]; y: the same digits sorted, position by position. A batch is a pure
    function of (seed, epoch, index), so a resumed run sees the batches the uninterrupted one saw; under torchrun
    each process draws its own (its rank is part of the seed). The loss is Task's default: cross-entropy of the
    model's logits [seq_len, batch, 10] against y, with the accuracy of its argmax."""
    batches_per_epoch = 500
    position_unit, loss_unit, loss_label = 'digits', 'nats/digit', 'cross-entropy (nats/digit)'

    def __init__(self, seq_len: int, batch_size: int, seed: int, device: torch.device, target_accuracy: float):
        self.seq_len, self.batch_size, self.seed, self.device = seq_len, batch_size, seed, device
        self.target_accuracy, self.rank = target_accuracy, distributed.get_rank()
        self.valid = [self._batch(-1, i, batch_size * distributed.get_world_size()) for i in range(4)]

    def _batch(self, epoch: int, index: int, size: int) -> Batch:
        """Batch `index` of `epoch` (epoch −1: the evaluation batches, the same on every process)."""
        rank = self.rank if epoch >= 0 else 0
        g = torch.Generator().manual_seed((((self.seed * 1_000_003 + epoch + 1) * 1_000_003 + index) * 1024 + rank)
                                          % 2**63)
        x = torch.randint(0, 10, (self.seq_len, size), generator=g)
        return x, x.sort(dim=0).values

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        for index in range(start, self.batches_per_epoch):
            yield self._batch(epoch, index, self.batch_size)

    def evaluate(self, model: nn.Module, final: bool) -> dict[str, float]:
        return evaluate(model, self.valid, self.device, loss=self.loss)  # {'loss', 'accuracy'}, every process

    def converged(self, valid: dict[str, float]) -> bool:
        return valid['accuracy'] >= self.target_accuracy  # stop early: the run says so on its last line


class Sorter(nn.Module):
    """Digits [seq_len, batch] → logits [seq_len, batch, 10]: embeddings, a bidirectional GRU, a linear layer."""

    def __init__(self, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(10, hidden)
        self.gru = nn.GRU(hidden, hidden, bidirectional=True)
        self.logits = nn.Linear(2 * hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.embed(x))
        return self.logits(h)


# Each key's type says what values it takes (Annotated[int, Ge(1)]: an int ≥ 1), so `hidden=0` is a one-line error
# naming the key, as for every built-in key; `lazylab options` shows the rule. lazylab.configs.types has the
# common ones by name (PositiveInt, Probability, …).
class Configs(TrainerConfigs):
    seq_len: Annotated[int, Ge(1)] = 8                               # digits per sequence
    hidden: Annotated[int, Ge(1)] = 64                               # GRU width
    target_accuracy: Annotated[float, Interval(ge=0, le=1)] = 0.99   # stop once validation sorts this fraction
                                                                     # of the digits right
    model: nn.Module = 'gru'        # the model
    task: Task = 'sort_digits'      # the data, the loss and the evaluation
    optimizer: OptimizerConfigs     # optimizer.learning_rate, optimizer.optimizer, …
    total_steps: Annotated[int, Ge(1)]  # optimizer steps this run takes


@option(Configs.model, 'gru')
def _gru(c: Configs):
    return Sorter(c.hidden).to(device_of(c))


@option(Configs.task, 'sort_digits')
def _sort_digits(c: Configs):
    return SortDigits(c.seq_len, c.batch_size, c.seed, device_of(c), c.target_accuracy)


@option(Configs.optimizer, 'adamw')
def _optimizer(c: Configs):
    conf = OptimizerConfigs()
    conf.parameters = c.model.parameters()
    conf.total_steps = c.total_steps
    return conf


@option(Configs.total_steps, 'epochs_or_max_steps')
def _total_steps(c: Configs):
    return c.max_steps or c.epochs * c.task.batches_per_epoch


if __name__ == '__main__':
    sys.exit(main(Configs))
