"""Optimizer and learning-rate schedule configs: `optimizer.optimizer` in Adam, AdamW, SGD, Noam.

The schedule is a `ScheduledLR` (a `torch.optim.lr_scheduler.LambdaLR` whose length `set_total_steps` can change)
stepped once per optimizer step; the learning rate of step t (t = 1, 2, …) is `learning_rate · factor(t)` with

    warm-up (warmup > 0, t ≤ warmup):  factor = t / warmup
    schedule='constant' after it:      factor = 1
    schedule='cosine' after it:        factor = r + (1 − r)·½(1 + cos(π·p)),  p = (t − warmup) / (total − warmup),
                                       r = min_lr_ratio, so the rate ends at learning_rate · r at total_steps
    optimizer='Noam' (any schedule):   factor = d_model^(−½) · min(t^(−½), t · warmup^(−3/2))
                                       ("Attention Is All You Need", eq. 3; labml_nn's Noam, lr 1.0 there)
"""
import math
from typing import Annotated, Literal

import torch
from annotated_types import Interval, Le

from lazylab.configs import BaseConfigs, meta_config, option
from lazylab.configs.types import Fraction, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

#: Adam's β₁, β₂: 0 ≤ β < 1
AdamBeta = Annotated[float, Interval(ge=0, lt=1)]
#: torch applies learning rates and decays as float32 scalars (times factors such as Adam's 1/(1 − β₁)): larger
#: values overflow its arithmetic (a RuntimeError mid-step), so the bound is 10³⁰, far above any useful value
PositiveRate = Annotated[PositiveFloat, Le(1e30)]
NonNegativeRate = Annotated[NonNegativeFloat, Le(1e30)]


class Noam(torch.optim.Adam):
    """Adam whose learning rate follows the Noam schedule (warm-up, then inverse square root, scaled by
    d_model^(−½)); the schedule itself is applied by OptimizerConfigs.scheduler."""


class OptimizerConfigs(BaseConfigs):
    """The optimizer (`optimizer.optimizer`) and its learning-rate schedule (`optimizer.scheduler`)."""
    optimizer: torch.optim.Optimizer = 'AdamW'          # Adam, AdamW, SGD or Noam
    scheduler: torch.optim.lr_scheduler.LambdaLR        # the learning-rate schedule (see the module docstring)
    parameters: object                                  # the parameters to optimize (set by the experiment)
    learning_rate: PositiveRate = 3e-3                  # peak learning rate (Noam: the scale, 1.0 in labml_nn)
    weight_decay: NonNegativeRate = 0.0                # L2 for Adam/SGD, decoupled for AdamW
    warmup: NonNegativeInt = 100                        # linear warm-up steps (Noam: its w)
    schedule: Literal['constant', 'cosine'] = 'cosine'  # after warm-up; ignored by Noam
    min_lr_ratio: Fraction = 0.1                        # cosine ends at learning_rate · min_lr_ratio
    beta1: AdamBeta = 0.9                               # Adam's β₁
    beta2: AdamBeta = 0.999                             # Adam's β₂
    momentum: NonNegativeRate = 0.9                    # SGD momentum
    d_model: PositiveInt = 512                          # model width for Noam's d_model^(−½) (set by the experiment)
    total_steps: PositiveInt = 1                        # steps the cosine schedule spans (set by the experiment)


meta_config(OptimizerConfigs.parameters)


@option(OptimizerConfigs.optimizer, 'Adam')
def _adam(c: OptimizerConfigs):
    return torch.optim.Adam(c.parameters, lr=c.learning_rate, betas=(c.beta1, c.beta2), weight_decay=c.weight_decay)


@option(OptimizerConfigs.optimizer, 'AdamW')
def _adamw(c: OptimizerConfigs):
    return torch.optim.AdamW(c.parameters, lr=c.learning_rate, betas=(c.beta1, c.beta2),
                             weight_decay=c.weight_decay)


@option(OptimizerConfigs.optimizer, 'SGD')
def _sgd(c: OptimizerConfigs):
    return torch.optim.SGD(c.parameters, lr=c.learning_rate, momentum=c.momentum, weight_decay=c.weight_decay)


@option(OptimizerConfigs.optimizer, 'Noam')
def _noam(c: OptimizerConfigs):
    return Noam(c.parameters, lr=c.learning_rate, betas=(c.beta1, c.beta2), weight_decay=c.weight_decay)


class LRSchedule:
    """factor(t) of the module docstring, called by LambdaLR with the number of steps done (t − 1).

    A plain object rather than a closure: LambdaLR saves its attributes in the scheduler's state dict, so a
    checkpoint keeps `total_steps` even when the trainer fits it to a time budget (`max_minutes`).

    Raises:
        ValueError: an unknown schedule.
    """

    def __init__(self, *, schedule: str, warmup: int, total_steps: int, min_lr_ratio: float, d_model: int,
                 noam: bool):
        if schedule not in ('constant', 'cosine'):
            raise ValueError(f"optimizer.schedule must be 'constant' or 'cosine', got {schedule!r}")
        self.schedule, self.warmup, self.total_steps = schedule, warmup, total_steps
        self.min_lr_ratio, self.d_model, self.noam = min_lr_ratio, d_model, noam

    def __call__(self, done: int) -> float:
        t, warmup = done + 1, self.warmup
        if self.noam:
            return self.d_model ** -0.5 * min(t ** -0.5, t * max(warmup, 1) ** -1.5)
        if t <= warmup:
            return t / warmup
        if self.schedule == 'constant':
            return 1.0
        r = self.min_lr_ratio
        p = min(1.0, (t - warmup) / max(1, self.total_steps - warmup))
        return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * p))

    def set_total_steps(self, total_steps: int) -> None:
        """Stretch (or shrink) the cosine over `total_steps` (factor(t) computed from now on uses it)."""
        self.total_steps = total_steps


class ScheduledLR(torch.optim.lr_scheduler.LambdaLR):
    """A LambdaLR over an `LRSchedule` whose length can be set once the run's step count is known
    (the trainer fits it to `max_minutes`). Its state dict is LambdaLR's."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LRSchedule):
        super().__init__(optimizer, schedule)

    def set_total_steps(self, total_steps: int) -> None:
        """The number of steps the schedule spans (the cosine ends at learning_rate · min_lr_ratio there). The rate
        of the next step is already set (by the last `step()`); the steps after it follow the new length."""
        for schedule in self.lr_lambdas:
            schedule.set_total_steps(total_steps)


@option(OptimizerConfigs.scheduler, 'LambdaLR')
def _scheduler(c: OptimizerConfigs):
    schedule = LRSchedule(schedule=c.schedule, warmup=c.warmup, total_steps=c.total_steps,
                          min_lr_ratio=c.min_lr_ratio, d_model=c.d_model, noam=isinstance(c.optimizer, Noam))
    return ScheduledLR(c.optimizer, schedule)
