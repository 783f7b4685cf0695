"""Optimizer and learning-rate schedule configs: `optimizer.optimizer` in Adam, AdamW, SGD, Noam.

The schedule is a `torch.optim.lr_scheduler.LambdaLR` stepped once per optimizer step; the learning rate of step
t (t = 1, 2, …) is `learning_rate · factor(t)` with

    warm-up (warmup > 0, t ≤ warmup):  factor = t / warmup
    schedule='constant' after it:      factor = 1
    schedule='cosine' after it:        factor = r + (1 − r)·½(1 + cos(π·p)),  p = (t − warmup) / (total − warmup),
                                       r = min_lr_ratio, so the rate ends at learning_rate · r at total_steps
    optimizer='Noam' (any schedule):   factor = d_model^(−½) · min(t^(−½), t · warmup^(−3/2))
                                       ("Attention Is All You Need", eq. 3; labml_nn's Noam, lr 1.0 there)
"""
import math
from typing import Callable

import torch

from lazylab.configs import BaseConfigs, meta_config, option


class Noam(torch.optim.Adam):
    """Adam whose learning rate follows the Noam schedule (warm-up, then inverse square root, scaled by
    d_model^(−½)); the schedule itself is applied by OptimizerConfigs.scheduler."""


class OptimizerConfigs(BaseConfigs):
    """The optimizer (`optimizer.optimizer`) and its learning-rate schedule (`optimizer.scheduler`)."""
    optimizer: torch.optim.Optimizer = 'Adam'  # Adam, AdamW, SGD or Noam
    scheduler: torch.optim.lr_scheduler.LambdaLR
    parameters: object                         # the parameters to optimize (set by the experiment)
    learning_rate: float = 1e-3                # peak learning rate (Noam: the scale, 1.0 in labml_nn)
    weight_decay: float = 0.0                  # L2 for Adam/SGD, decoupled for AdamW
    warmup: int = 0                            # linear warm-up steps (Noam: its w)
    schedule: str = 'constant'                 # constant or cosine (after warm-up; ignored by Noam)
    min_lr_ratio: float = 0.1                  # cosine ends at learning_rate · min_lr_ratio
    beta1: float = 0.9                         # Adam's β₁
    beta2: float = 0.999                       # Adam's β₂
    momentum: float = 0.9                      # SGD momentum
    d_model: int = 512                         # model width for Noam's d_model^(−½) (set by the experiment)
    total_steps: int = 1                       # steps the cosine schedule spans (set by the experiment)


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


def lr_factor(c: OptimizerConfigs, noam: bool) -> Callable[[int], float]:
    """factor(t) of the module docstring, for t = 1, 2, … optimizer steps."""
    warmup, total, r, d_model = c.warmup, c.total_steps, c.min_lr_ratio, c.d_model
    if c.schedule not in ('constant', 'cosine'):
        raise ValueError(f"optimizer.schedule must be 'constant' or 'cosine', got {c.schedule!r}")

    def factor(t: int) -> float:
        if noam:
            return d_model ** -0.5 * min(t ** -0.5, t * max(warmup, 1) ** -1.5)
        if t <= warmup:
            return t / warmup
        if c.schedule == 'constant':
            return 1.0
        p = min(1.0, (t - warmup) / max(1, total - warmup))
        return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * p))

    return factor


@option(OptimizerConfigs.scheduler, 'LambdaLR')
def _scheduler(c: OptimizerConfigs):
    factor = lr_factor(c, isinstance(c.optimizer, Noam))
    # LambdaLR passes the number of scheduler steps taken so far (0 before the first optimizer step)
    return torch.optim.lr_scheduler.LambdaLR(c.optimizer, lambda done: factor(done + 1))
