"""The trainer's sequence-length warm-up (`seq_len_start`, `seq_len_warmup`): the length of each step, the batches
cut to it, a time budget that knows later steps cost more, and a resume mid-warm-up that is bitwise the run that
never stopped."""
import pytest
import torch

from lazylab import cli
from lazylab.experiments.budget import TimeBudget
from lazylab.experiments.checkpoint import Position, load_checkpoint
from lazylab.experiments.task import SeqLenWarmup
from lazylab.experiments.trainer import read_metrics
from lazylab.runs import CHECKPOINT_PT as CHECKPOINT

TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=32', 'batch_size=4', 'sample_tokens=5',
        'valid_batches=1', 'final_valid_batches=2', 'device=cpu', 'threads=1', 'max_steps=12', 'valid_interval=4',
        'log_interval=2', 'optimizer.warmup=2', 'seq_len_start=8', 'seq_len_warmup=8']


def test_the_length_grows_linearly_from_start_to_seq_len_over_the_warmup_steps():
    warmup = SeqLenWarmup(start=8, warmup=8, seq_len=32)
    # 8 + ⌊24 · step / 8⌋ = 8 + 3 · step, then 32
    assert [warmup.length(step) for step in range(11)] == [8, 11, 14, 17, 20, 23, 26, 29, 32, 32, 32]
    assert warmup.active
    assert [SeqLenWarmup(5, 3, 12).length(s) for s in range(4)] == [5, 7, 9, 12]  # 5 + ⌊7s/3⌋
    for off in (SeqLenWarmup(0, 8, 32), SeqLenWarmup(8, 0, 32), SeqLenWarmup(32, 8, 32)):
        assert not off.active and off.length(0) == 32 and off.work(3, 10) == 7


def test_work_is_the_steps_cost_in_full_length_steps():
    warmup = SeqLenWarmup(start=8, warmup=8, seq_len=32)
    lengths = [warmup.length(s) for s in range(40)]
    for first, end in ((0, 8), (0, 40), (3, 5), (6, 20), (9, 12), (5, 5)):
        assert warmup.work(first, end) == pytest.approx(sum(lengths[first:end]) / 32, abs=1e-12)
    assert warmup.work(0, 8) == (8 + 11 + 14 + 17 + 20 + 23 + 26 + 29) / 32


def test_the_time_budget_fits_the_steps_whose_cost_fills_the_time_left():
    """Steps cost 0.01 s per unit of work (a full-length step costs 1 unit). After 20 steps (timed from step 10 on,
    as the budget does), the steps that fit the time left are those a plain loop over the schedule counts."""
    warmup = SeqLenWarmup(start=8, warmup=100, seq_len=64)
    clock = [0.0]
    pos = Position(total_steps=10_000)
    budget = TimeBudget(0.05, pos, fit_steps=True, max_total_steps=10_000, valid_every=1000, final_valid_ratio=1.0,
                        now=lambda: clock[0], work=warmup.work)  # 3 s
    for _ in range(20):
        clock[0] += 0.01 * warmup.length(pos.step) / 64
        pos.step += 1
        budget.step_done(pos)
    assert budget.validated(pos, seconds=0.0)
    left, step, expected = 3.0 - clock[0], pos.step, 0
    while left >= 0.01 * warmup.length(step + expected) / 64 - 1e-12:  # the reference: step by step
        left -= 0.01 * warmup.length(step + expected) / 64
        expected += 1
    assert pos.total_steps == step + expected
    # an estimate that assumed every step cost what the first 20 did would run far past the budget
    naive = step + int((3.0 - clock[0]) / (clock[0] / 20))
    assert naive > pos.total_steps * 1.5


def test_batches_are_cut_to_the_steps_length_and_validation_uses_seq_len(tmp_path):
    assert cli.main(['train', 'transformer', *TINY, f'runs_dir={tmp_path}']) == 0
    run, = (tmp_path / 'transformer').iterdir()
    records = read_metrics(run / 'metrics.jsonl')
    warmup = SeqLenWarmup(8, 8, 32)
    # tokens = 4 sequences × the length of every step so far
    assert [r['tokens'] for r in records] == [4 * sum(warmup.length(s) for s in range(r['step'])) for r in records]
    assert records[-1]['step'] == 12 and 'loss.valid' in records[-1]
    assert load_checkpoint(run / CHECKPOINT)['position']['tokens'] == 4 * (8 + 11 + 14 + 17 + 20 + 23 + 26 + 29
                                                                          + 4 * 32)


class _Killed(Exception):
    """Stands for a SIGKILL: raised after the checkpoint of step 4 (mid-warm-up), before step 5's record."""


def test_a_run_stopped_mid_warmup_and_resumed_is_bitwise_the_run_that_never_stopped(tmp_path, monkeypatch):
    from lazylab.experiments import trainer
    reference, stopped = tmp_path / 'reference', tmp_path / 'stopped'
    assert cli.main(['train', 'transformer', *TINY, f'runs_dir={reference}']) == 0

    real_save = trainer.Checkpointer.save

    def save_then_die(self, pos, sums):
        real_save(self, pos, sums)
        if pos.step == 4:
            raise _Killed
    monkeypatch.setattr(trainer.Checkpointer, 'save', save_then_die)
    with pytest.raises(_Killed):
        cli.main(['train', 'transformer', *TINY, f'runs_dir={stopped}'])
    monkeypatch.undo()
    run, = (stopped / 'transformer').iterdir()
    assert load_checkpoint(run / CHECKPOINT)['position']['step'] == 4
    torch.manual_seed(12345)  # whatever the process did in between must not matter
    assert cli.main(['resume', str(run)]) == 0

    expected = read_metrics(next((reference / 'transformer').iterdir()) / 'metrics.jsonl')
    resumed = read_metrics(run / 'metrics.jsonl')
    assert [r['step'] for r in resumed] == [r['step'] for r in expected] == [2, 4, 6, 8, 10, 12]
    for got, want in zip(resumed, expected):
        for key in ('loss.train', 'accuracy.train', 'loss.valid', 'accuracy.valid', 'lr', 'tokens'):
            assert got.get(key) == want.get(key), (got['step'], key)
    ours = load_checkpoint(run / CHECKPOINT)['model']
    theirs = load_checkpoint(next((reference / 'transformer').iterdir()) / CHECKPOINT)['model']
    assert all(torch.equal(ours[k], v) for k, v in theirs.items())


def test_a_task_without_shorter_sequences_refuses_the_warmup(tmp_path, capsys):
    from lazylab.configs import apply_overrides, option
    from lazylab.errors import UsageError
    from lazylab.experiments import configure
    from lazylab.experiments.task import Task
    from lazylab.experiments.transformer import Configs

    class Fixed(Task):
        batches_per_epoch = 1

    class FixedConfigs(Configs):
        pass

    @option(FixedConfigs.task, 'fixed')
    def _fixed(c):
        return Fixed()

    conf = FixedConfigs()
    apply_overrides(conf, {'task': 'fixed', 'seq_len_start': 4, 'seq_len_warmup': 2, 'device': 'cpu'})
    with pytest.raises(UsageError, match=r'^seq_len_start: the task of this experiment \(Fixed\) has no shorter '
                                         r'sequences, so it cannot warm up the sequence length'):
        configure.prepare(conf)
