"""The first and last lines of a run: what it is, and how it ended and why it stopped.

    feedback: 1,234,567 parameters, 10 minutes (the step count is fitted to them after the first steps; at most
        24,600 steps) of 32×64 characters on cpu → runs/feedback/20261201-143005-9f3a
    …
    done: step 636, valid loss 1.5212 nats/char, accuracy 0.551, 10,422 tokens/s (the run's average), MFU 3.1%;
        stopped by the time budget (max_minutes=10); run dir runs/feedback/20261201-143005-9f3a

MFU (lazylab.experiments.flops) is the run's average, shown once the run's FLOPs are counted. Why it stopped comes
from the trainer's `stopped` (trainer.train: 'max_steps', 'epochs', 'time', 'target') or the reason a sweep's hook
gave ('pruned').
"""
from pathlib import Path
from typing import Any, Optional

import torch

from lazylab.configs import inspect
from lazylab.errors import plural
from lazylab.experiments import distributed
from lazylab.experiments.configure import device
from lazylab.experiments.metrics import percent


def parameter_count(model: torch.nn.Module) -> int:
    """The number of parameters of `model` (every element of every parameter tensor)."""
    return sum(p.numel() for p in model.parameters())


def first_line(name: str, conf, run_dir: Path) -> str:
    """What the run is: `feedback: 1,234 parameters, 10 minutes (…) of 32×64 characters on cpu → RUN_DIR`."""
    length = plural(conf.total_steps, 'step')
    if conf.max_minutes > 0 and conf.max_steps == 0:  # the time budget decides the step count, as it goes
        length = (f'{plural(conf.max_minutes, "minute")} (the step count is fitted to them after the first steps; '
                  f'at most {plural(conf.total_steps, "step")})')
    elif conf.max_minutes > 0:
        length += f' (at most {plural(conf.max_minutes, "minute")})'
    batch = f'{conf.batch_size}×{conf.seq_len} {conf.task.position_unit}'
    world_size = distributed.get_world_size()
    if world_size > 1:
        batch += f' per process, {world_size} processes (effective batch {conf.batch_size * world_size})'
    return f'{name}: {parameter_count(conf.model):,} parameters, {length} of {batch} on {device(conf)} → {run_dir}'


def last_line(conf, run_dir: Path, last: dict[str, Any], hook_reason: Optional[str] = None) -> str:
    """How the run ended and why it stopped: `done: step 636, valid loss 1.5212 nats/char, accuracy 0.551, 10,422
    tokens/s (the run's average), MFU 3.1%; stopped by the time budget (max_minutes=10); run dir RUN_DIR` (no MFU
    when the run's FLOPs were not counted)."""
    why = stop_reason(conf, last, hook_reason)
    if 'loss.valid' not in last:
        return f'stopped at step {last["step"]:,}: {why}; run dir {run_dir}'
    speed = last.get('tokens_per_s_avg', last.get('tokens_per_s', 0))
    utilization = last.get('mfu_avg', last.get('mfu'))
    utilization = f', MFU {percent(utilization)}' if utilization is not None else ''
    return (f'done: step {last["step"]:,}, valid loss {last["loss.valid"]:.4f} {conf.task.loss_unit}, accuracy '
            f'{last["accuracy.valid"]:.3f}, {speed:,.0f} tokens/s (the run\'s average){utilization}; {why}; run dir '
            f'{run_dir}')


def stop_reason(conf, last: dict[str, Any], hook_reason: Optional[str] = None) -> str:
    """Why the run stopped, in words, from the trainer's `stopped` (see trainer.train) or the hook's answer."""
    if hook_reason is not None:
        return f'stopped by the sweep\'s pruner at step {last["step"]:,}' if hook_reason == 'pruned' else \
            f'stopped by the hook at step {last["step"]:,} ({hook_reason})'
    stopped = last.get('stopped')
    if stopped == 'target':
        return (f'stopped early, at step {last["step"]:,} of {conf.total_steps:,}: the task\'s target was reached '
                f'({type(conf.task).__name__}.converged, valid loss {last["loss.valid"]:.4g})')
    if stopped == 'time':
        return f'stopped by the time budget (max_minutes={conf.max_minutes:g})'
    if stopped == 'max_steps':
        return f'stopped at max_steps={conf.max_steps:,}'
    if stopped == 'epochs' and inspect.selected_option(conf, 'total_steps') is None:
        return f'stopped at total_steps={conf.total_steps:,}'  # given: neither epochs nor max_steps decided
    if stopped == 'epochs':
        return f'stopped after {plural(conf.epochs, "epoch")} (epochs={conf.epochs})'
    return 'stopped'
