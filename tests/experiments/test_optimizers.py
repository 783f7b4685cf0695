"""Optimizer configs: the learning rate each step actually uses, against closed forms and labml_nn's Noam."""
import math

import pytest
import torch
from torch import nn

from lazylab.configs import apply_overrides
from lazylab.experiments.optimizers import Noam, OptimizerConfigs, ScheduledLR


def _rates(overrides, steps):
    """Learning rate used by optimizer steps 1..steps."""
    model = nn.Linear(3, 3)
    conf = OptimizerConfigs()
    conf.parameters = model.parameters()
    apply_overrides(conf, overrides)
    opt, sched = conf.optimizer, conf.scheduler
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]['lr'])
        opt.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        sched.step()
    return opt, rates


def test_noam_matches_labml_nn_schedule():
    from labml_nn.optimizers.noam import Noam as LabmlNoam
    opt, rates = _rates({'optimizer': 'Noam', 'learning_rate': 1.0, 'warmup': 20, 'd_model': 64}, 60)
    assert isinstance(opt, Noam)
    reference = LabmlNoam(nn.Linear(1, 1).parameters(), lr=1.0, warmup=20, d_model=64)
    for t, lr in enumerate(rates, start=1):
        want = reference.get_lr({'step': t}, reference.defaults)
        assert lr == pytest.approx(want, rel=1e-12)
        assert lr == pytest.approx(64 ** -0.5 * min(t ** -0.5, t * 20 ** -1.5), rel=1e-12)
    assert max(rates) == rates[19]  # the peak is at t = warmup


def test_warmup_then_cosine_to_min_ratio():
    _, rates = _rates({'optimizer': 'AdamW', 'learning_rate': 0.01, 'warmup': 4, 'schedule': 'cosine',
                       'total_steps': 24, 'min_lr_ratio': 0.1}, 30)
    assert rates[:4] == pytest.approx([0.0025, 0.005, 0.0075, 0.01])
    for t in range(5, 31):
        p = min(1.0, (t - 4) / 20)
        assert rates[t - 1] == pytest.approx(0.01 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))))
    assert rates[23] == pytest.approx(0.001) and rates[-1] == pytest.approx(0.001)


@pytest.mark.parametrize('name, cls', [('Adam', torch.optim.Adam), ('AdamW', torch.optim.AdamW),
                                       ('SGD', torch.optim.SGD)])
def test_constant_schedule_and_weight_decay_reach_the_torch_optimizer(name, cls):
    opt, rates = _rates({'optimizer': name, 'learning_rate': 0.05, 'weight_decay': 0.01, 'warmup': 0,
                         'schedule': 'constant'}, 5)
    assert type(opt) is cls
    assert rates == [0.05] * 5
    assert opt.param_groups[0]['weight_decay'] == 0.01


def test_set_total_steps_stretches_the_cosine_from_the_next_step_and_is_saved_in_the_state_dict():
    model = nn.Linear(3, 3)
    conf = OptimizerConfigs()
    conf.parameters = model.parameters()
    apply_overrides(conf, {'optimizer': 'SGD', 'learning_rate': 0.01, 'warmup': 2, 'schedule': 'cosine',
                           'total_steps': 100, 'min_lr_ratio': 0.1})
    opt, sched = conf.optimizer, conf.scheduler
    assert isinstance(sched, ScheduledLR) and isinstance(sched, torch.optim.lr_scheduler.LambdaLR)
    rates = []
    for t in range(1, 13):
        if t == 5:
            sched.set_total_steps(12)  # e.g. the time budget fitted the run to 12 steps after 4
        rates.append(opt.param_groups[0]['lr'])
        opt.step()
        sched.step()
    # step 5's rate was computed by the scheduler step before (over 100 steps); from step 6 on: over 12 steps
    assert rates[4] == pytest.approx(0.01 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 98))))
    for t in range(6, 13):
        assert rates[t - 1] == pytest.approx(0.01 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (t - 2) / 10))))
    assert rates[-1] == pytest.approx(0.001)
    assert sched.state_dict()['lr_lambdas'][0]['total_steps'] == 12
