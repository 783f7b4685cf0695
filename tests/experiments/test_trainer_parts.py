"""The trainer's named parts, each on hand-worked cases: the time budget, the checkpointer, the running metrics,
and the task interface (a task that is not text, with a loss of its own, trained by `trainer.train`)."""
import random
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from lazylab.configs import apply_overrides, option
from lazylab.errors import CheckpointError
from lazylab.experiments import configure
from lazylab.experiments.budget import CALIBRATION_STEPS, TimeBudget
from lazylab.experiments.checkpoint import Checkpointer, Position, load_checkpoint
from lazylab.experiments.metrics import RunningMetrics, read_metrics
from lazylab.experiments.task import BatchLoss, Task
from lazylab.experiments.trainer import train
from lazylab.experiments.transformer import Configs as TransformerExperiment
from lazylab.runs import CHECKPOINT_PT as CHECKPOINT


class Clock:
    """A wall clock the test sets by hand."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _budget(clock, pos, **kwargs):
    args = dict(fit_steps=True, max_total_steps=1000, valid_every=10, final_valid_ratio=2.0, now=clock)
    return TimeBudget(1.0, pos, **{**args, **kwargs})


def _steps(budget, clock, pos, n, seconds=0.5):
    for _ in range(n):
        clock.t += seconds
        pos.step += 1
        budget.step_done(pos)


def test_time_budget_fits_the_step_count_from_the_warm_steps_and_the_validation_time():
    clock, pos = Clock(), Position(total_steps=1000)
    budget = _budget(clock, pos)
    _steps(budget, clock, pos, 20)  # 0.5 s a step: t = 10 s; the warm-up ends at step 10, t = 5 s
    assert not budget.calibration_due(pos) and not pos.calibrated
    clock.t += 1.0  # a validation of 1 s
    assert budget.validated(pos, seconds=1.0) and pos.calibrated
    # steps 10..20 took 11 − 5 − 1 = 5 s: 0.5 s + 1 s / 10 (the validations' share) = 0.6 s a step; the final
    # validation takes 2 × 1 s; (60 − 11 − 2) / 0.6 = 78.3 steps are left
    assert pos.total_steps == 20 + 78
    assert budget.eta(pos) == pytest.approx(min(11 / 20 * 78, 60 - 11))
    _steps(budget, clock, pos, 5)  # t = 13.5 s; 5 steps of 0.5 s since the validation
    assert budget.refit(pos) and pos.total_steps == 25 + int((60 - 13.5 - 2) / 0.6)
    assert not budget.out_of_time()
    clock.t = 60.0
    assert budget.out_of_time()


def test_time_budget_is_capped_by_the_epochs_and_calibrates_at_step_30_without_a_validation():
    clock, pos = Clock(), Position(total_steps=50)
    budget = _budget(clock, pos, max_total_steps=50, valid_every=1000)
    _steps(budget, clock, pos, CALIBRATION_STEPS - 1)
    assert not budget.calibration_due(pos)
    _steps(budget, clock, pos, 1)
    assert budget.calibration_due(pos)
    assert budget.validated(pos, seconds=0.0) and pos.total_steps == 50  # 15 s for 30 steps: 90 more would fit


def test_time_budget_without_fitting_only_stops_the_run_and_continues_the_clock_of_a_resumed_run():
    clock = Clock()
    clock.t = 100.0
    pos = Position(step=40, elapsed=50.0, total_steps=80, calibrated=False)
    budget = _budget(clock, pos, fit_steps=False)
    assert budget.elapsed() == 50.0
    _steps(budget, clock, pos, 20)  # 10 s more
    assert pos.elapsed == 60.0 and budget.out_of_time()
    assert not budget.validated(pos, seconds=1.0) and not budget.refit(pos) and pos.total_steps == 80
    assert not budget.calibration_due(pos)


def _trained_objects(seed=0):
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: 1 / (t + 1))
    for _ in range(3):
        model(torch.ones(4, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


def test_checkpointer_restores_model_optimizer_scheduler_random_states_and_position(tmp_path):
    model, optimizer, scheduler = _trained_objects()
    ckpt = Checkpointer(tmp_path / CHECKPOINT, model, optimizer, scheduler, extras={'vocabulary': 'abc'})
    assert ckpt.kept() == 'no checkpoint was written'
    pos = Position(step=3, epoch=1, batch=2, tokens=96, elapsed=1.5, total_steps=10, calibrated=True)
    ckpt.save(pos, {'loss': 0.0, 'correct': 0, 'count': 0, 'steps': 0, 'tokens': 0, 'seconds': 0.0})
    assert ckpt.kept() == 'the checkpoint of step 3 is kept'
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT]  # the temporary file was renamed
    after = torch.rand(3), random.random()  # what the saved random states produce next

    other = _trained_objects(seed=1)
    restored = Checkpointer(tmp_path / CHECKPOINT, *other)
    got, sums = restored.restore()
    assert got == pos and sums['steps'] == 0 and restored.saved_step == 3
    assert torch.equal(torch.rand(3), after[0]) and random.random() == after[1]
    for p, q in zip(model.parameters(), other[0].parameters()):
        assert torch.equal(p, q)
    assert other[1].state_dict()['state'][0]['step'] == optimizer.state_dict()['state'][0]['step']
    assert other[2].last_epoch == scheduler.last_epoch == 3
    assert load_checkpoint(tmp_path / CHECKPOINT)['vocabulary'] == 'abc'


def test_checkpointer_refuses_a_checkpoint_of_another_number_of_processes(tmp_path):
    model, optimizer, scheduler = _trained_objects()
    ckpt = Checkpointer(tmp_path / CHECKPOINT, model, optimizer, scheduler)
    ckpt.save(Position(step=1), {})
    payload = load_checkpoint(tmp_path / CHECKPOINT)
    payload['world_size'] = 4
    with pytest.raises(CheckpointError, match=r'saved by 4 process\(es\); resume it with 4, not 1'):
        ckpt.restore(payload)


def test_running_metrics_record_means_since_the_last_record_then_start_again():
    metrics = RunningMetrics()
    metrics.add(2.0, correct=3, count=8, tokens=8, seconds=0.5, lr=0.01)
    metrics.add(1.0, correct=5, count=8, tokens=8, seconds=1.5, lr=0.02)
    pos = Position(step=2, epoch=1, batch=1, tokens=16, elapsed=2.0004)
    r = metrics.record(pos, batches_per_epoch=4, valid={'loss': 1.25, 'accuracy': 0.5})
    assert r == {'step': 2, 'tokens': 16, 'epoch': 1.25, 'lr': 0.02, 'time': 2.0, 'loss.train': 1.5,
                 'accuracy.train': 0.5, 'tokens_per_s': 8.0, 'loss.valid': 1.25, 'accuracy.valid': 0.5}
    assert metrics.state() == {'loss': 0.0, 'correct': 0, 'count': 0, 'steps': 0, 'tokens': 0, 'seconds': 0.0}
    assert 'loss.train' not in metrics.record(pos, batches_per_epoch=4)  # no step since: no training metrics


# --- a task that is not text ------------------------------------------------------------------------------------

class LastTokenTask(Task):
    """Copy-the-first-token sequences, scored on the last position only (a loss of its own); evaluation returns
    fixed values, so the records can be checked exactly."""
    batches_per_epoch = 4

    def __init__(self, n_tokens: int):
        self.n_tokens, self.losses, self.counts = n_tokens, [], []

    def batches(self, epoch: int, start: int = 0) -> Iterator:
        g = torch.Generator().manual_seed(epoch)
        batches = [torch.randint(0, self.n_tokens, (1, 3), generator=g).repeat(5, 1) for _ in range(4)]
        for x in batches[start:]:
            yield x, x

    def loss(self, model, x, y, reduction='mean') -> BatchLoss:
        logits, _ = model(x)
        loss = nn.functional.cross_entropy(logits[-1].float(), y[0], reduction=reduction)
        correct = int((logits[-1].argmax(-1) == y[0]).sum())
        if reduction == 'mean':
            self.losses.append(loss.item())
            self.counts.append(correct)
        return BatchLoss(loss, correct, y.shape[1])

    def evaluate(self, model, final: bool) -> dict[str, float]:
        return {'loss': 1.0, 'accuracy': 0.75} if final else {'loss': 2.0, 'accuracy': 0.25}

    def checkpoint_extras(self):
        return {'task': 'last_token'}


class LastTokenConfigs(TransformerExperiment):
    pass


@option(LastTokenConfigs.task, 'last_token')
def _last_token(c: LastTokenConfigs):
    return LastTokenTask(c.n_tokens)


def test_the_trainer_takes_batches_loss_and_validation_from_the_task(tmp_path):
    conf = LastTokenConfigs()
    apply_overrides(conf, {'task': 'last_token', 'd_model': 16, 'heads': 2, 'd_ff': 32, 'n_layers': 1,
                           'seq_len': 5, 'batch_size': 3, 'max_steps': 6, 'valid_interval': 3, 'log_interval': 2,
                           'device': 'cpu', 'max_minutes': 0})
    threads = torch.get_num_threads()
    try:
        configure.prepare(conf)
        last = train(conf, tmp_path)
    finally:
        torch.set_num_threads(threads)
    task = conf.task
    records = read_metrics(tmp_path / 'metrics.jsonl')
    assert [r['step'] for r in records] == [2, 3, 4, 6]
    assert records[0]['loss.train'] == sum(task.losses[:2]) / 2  # the task's loss, not next-token cross-entropy
    assert records[1]['accuracy.train'] == task.counts[2] / 3  # right answers out of the task's count
    assert [r['tokens'] for r in records] == [30, 45, 60, 90]  # x.numel() per step: 5 × 3
    assert records[1]['epoch'] == 0.75 and records[3]['epoch'] == 1.5
    assert (records[1]['loss.valid'], records[3]['loss.valid'], last['accuracy.valid']) == (2.0, 1.0, 0.75)
    assert not (tmp_path / 'samples.txt').exists()  # the task has no sample
    ck = load_checkpoint(tmp_path / CHECKPOINT)
    assert ck['task'] == 'last_token' and 'vocabulary' not in ck and ck['position']['step'] == 6
