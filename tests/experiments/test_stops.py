"""A stop is a checkpoint: a stop signal (Ctrl-C's SIGINT, SIGTERM, SIGUSR1, the one $LAZYLAB_STOP_SIGNAL names)
ends the step in progress, writes the checkpoint of exactly that step, records the stop in run.json, and `lazylab
resume` then ends with the parameters, optimizer state, metrics and samples of a run that never stopped, bit for
bit, whichever step the signal came at; a run that ended for good is not trained again.

The signal is sent by the process to itself in the middle of a chosen step (inside the trainer's all-reduce of the
step's loss, before the backward pass), so the step it stops at is exact and the grid of steps is the test's, not
the scheduler's; `test_interrupts.py` sends real signals from outside."""
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazylab import cli
from lazylab.errors import STOP_SIGNAL_ENV, Interrupted
from lazylab.experiments.checkpoint import load_checkpoint
from lazylab.experiments.metrics import read_metrics
from lazylab.experiments.trainer import Training
from lazylab.runs import CHECKPOINT_PT, METRICS_JSONL, RUN_JSON, SAMPLES_TXT
from lazylab.testing import replaced

#: 12 steps, validated and checkpointed every 5 (steps 5, 10, 12), a metrics record every 2, dropout on (so the
#: random states matter): a stop at steps 1-4, 6-9 or 11 falls between validations
STEPS, EVERY = 12, 5
LENGTH = ['max_steps=12', 'valid_interval=5', 'log_interval=2', 'device=cpu', 'threads=1', 'seed=3']
SMALL = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'sample_tokens=8',
         'valid_batches=1', 'final_valid_batches=1', 'dropout=0.1']
EXPERIMENTS = {
    'transformer': SMALL,
    'feedback': SMALL,
    'fast_weights': SMALL,
    'retrieval': ['n_keys=4'],
    'mqar': ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'batch_size=4', 'valid_batches=1',
             'final_valid_batches=1', 'dropout=0.1', 'stop_accuracy=0'],
    'state_tracking': ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=8', 'batch_size=4',
                       'valid_batches=1', 'final_valid_batches=1', 'dropout=0.1', 'stop_accuracy=0'],
}
#: what a record holds that is not measured by a clock (those are compared bit for bit)
EXACT_KEYS = ('step', 'tokens', 'epoch', 'lr', 'loss.train', 'accuracy.train', 'loss.valid', 'accuracy.valid',
              'loss.valid_2x', 'accuracy.valid_2x', 'loss.valid_4x', 'accuracy.valid_4x')  # (state_tracking's)


def _signal_at(monkeypatch, step: int, signum: int = signal.SIGINT) -> None:
    """The process sends itself `signum` in the middle of step `step` (1-based), once."""
    mean_loss, sent = Training.mean_loss, []

    def signalling(self, batch, x, noted):
        if self.pos.step + 1 == step and not sent:
            sent.append(step)
            os.kill(os.getpid(), signum)  # the handler only notes it: the step goes on to its end
        return mean_loss(self, batch, x, noted)

    monkeypatch.setattr(Training, 'mean_loss', signalling)


def _run_dir(runs: Path) -> Path:
    run, = (d for d in runs.glob('*/*') if (d / RUN_JSON).is_file())
    return run


def _train(experiment: str, settings: list[str], runs: Path) -> tuple[int, Path]:
    code = cli.main(['train', experiment, *replaced(LENGTH, *settings), f'runs_dir={runs}'])
    return code, _run_dir(runs)


def assert_same_run(got: Path, want: Path) -> None:
    """Two runs' end states equal bit for bit: parameters, optimizer and scheduler state, position, metrics
    records (their clock-free values), samples."""
    a, b = load_checkpoint(got / CHECKPOINT_PT), load_checkpoint(want / CHECKPOINT_PT)
    assert a['model'].keys() == b['model'].keys()
    for name, value in b['model'].items():
        assert torch.equal(a['model'][name], value), name
    for state_a, state_b in zip(a['optimizer']['state'].values(), b['optimizer']['state'].values()):
        for key, value in state_b.items():
            assert torch.equal(torch.as_tensor(state_a[key]), torch.as_tensor(value)), key
    assert a['scheduler'] == b['scheduler']
    pick = ('step', 'epoch', 'batch', 'tokens', 'total_steps', 'finished')
    assert {k: a['position'][k] for k in pick} == {k: b['position'][k] for k in pick}
    records_a, records_b = read_metrics(got / METRICS_JSONL), read_metrics(want / METRICS_JSONL)
    assert [r['step'] for r in records_a] == [r['step'] for r in records_b]
    for ra, rb in zip(records_a, records_b):
        assert {k: ra.get(k) for k in EXACT_KEYS} == {k: rb.get(k) for k in EXACT_KEYS}, ra['step']
    samples = got / SAMPLES_TXT
    assert (samples.read_text() if samples.exists() else None) == \
        ((want / SAMPLES_TXT).read_text() if (want / SAMPLES_TXT).exists() else None)


@pytest.fixture(scope='module')
def references(tmp_path_factory):
    """Each experiment's uninterrupted 12-step run (made on first use)."""
    made: dict[str, Path] = {}

    def reference(experiment: str, settings: list[str]) -> Path:
        key = experiment + ' '.join(settings)
        if key not in made:
            runs = tmp_path_factory.mktemp('reference')
            code, made[key] = _train(experiment, settings, runs)
            assert code == 0
        return made[key]
    return reference


def _stop_and_resume(tmp_path: Path, monkeypatch, experiment: str, settings: list[str], step: int,
                     signum: int = signal.SIGINT) -> tuple[Path, dict]:
    """Train, stopped by `signum` in step `step`; check the stop; resume to the end. Returns the run and its
    run.json at the stop."""
    runs = tmp_path / f'runs-{step}-{signum}'
    _signal_at(monkeypatch, step, signum)
    code, run = _train(experiment, settings, runs)
    monkeypatch.undo()
    assert code == 128 + signum
    stopped = json.loads((run / RUN_JSON).read_text())
    assert load_checkpoint(run / CHECKPOINT_PT)['position']['step'] == step  # the checkpoint of that very step
    assert stopped['steps'] == stopped['checkpoint_step'] == step
    assert cli.main(['resume', str(run)]) == 0
    return run, stopped


@pytest.mark.parametrize('experiment', EXPERIMENTS)
def test_a_stop_between_validations_resumes_to_the_uninterrupted_end_bit_for_bit(references, tmp_path,
                                                                                   monkeypatch, experiment):
    run, stopped = _stop_and_resume(tmp_path, monkeypatch, experiment, EXPERIMENTS[experiment], step=7)
    assert stopped['status'] == 'interrupted' and stopped['signal'] == 'SIGINT'
    assert json.loads((run / RUN_JSON).read_text())['status'] == 'completed'
    assert_same_run(run, references(experiment, EXPERIMENTS[experiment]))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.integers(1, STEPS - 1))
def test_a_stop_at_any_step_loses_nothing(references, tmp_path_factory, monkeypatch, step):
    """Work lost to a stop: 0 steps, wherever it comes (at a validation or between two)."""
    tmp_path = tmp_path_factory.mktemp('any-step')
    run, _ = _stop_and_resume(tmp_path, monkeypatch, 'transformer', SMALL, step)
    assert_same_run(run, references('transformer', SMALL))


@pytest.mark.parametrize('signum, status, named', [
    (signal.SIGTERM, 'killed', None),
    (signal.SIGUSR1, 'preempted', None),
    (signal.SIGUSR2, 'preempted', 'USR2'),  # the warning signal of a cluster that is told to send USR2
])
def test_each_stop_signal_is_recorded_as_what_it_means(references, tmp_path, monkeypatch, capsys, signum, status,
                                                         named):
    if named:
        monkeypatch.setenv(STOP_SIGNAL_ENV, named)
    runs = tmp_path / 'runs'
    _signal_at(monkeypatch, 8, signum)
    code, run = _train('transformer', SMALL, runs)
    assert code == 128 + signum
    info = json.loads((run / RUN_JSON).read_text())
    name = signal.Signals(signum).name
    assert (info['status'], info['signal'], info['steps'], info['checkpoint_step']) == (status, name, 8, 8)
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f'lazylab: {status} ({name}) at step 8; lazylab resume {run} continues from step 8, its checkpoint'
    monkeypatch.undo()
    assert cli.main(['resume', str(run)]) == 0
    assert_same_run(run, references('transformer', SMALL))


def test_a_second_signal_while_the_stop_checkpoint_is_written_is_neither_lost_nor_harmful(references, tmp_path,
                                                                                        monkeypatch, capsys):
    """SIGTERM arrives in the middle of the checkpoint that a SIGINT asked for: the checkpoint is whole, the run
    stops for the first signal, and nothing of the second is left to go off later."""
    from lazylab.experiments import checkpoint
    real_save, sent = torch.save, []

    def save_and_get_signalled(obj, f):
        if not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        real_save(obj, f)

    monkeypatch.setattr(checkpoint.torch, 'save', save_and_get_signalled)
    runs = tmp_path / 'runs'
    _signal_at(monkeypatch, 3)
    code, run = _train('transformer', SMALL, runs)
    assert sent and code == 130
    info = json.loads((run / RUN_JSON).read_text())
    assert (info['status'], info['signal'], info['checkpoint_step']) == ('interrupted', 'SIGINT', 3)
    assert load_checkpoint(run / CHECKPOINT_PT)['position']['step'] == 3
    assert not [p.name for p in run.iterdir() if '.tmp' in p.name]
    monkeypatch.undo()
    assert cli.main(['resume', str(run)]) == 0  # no SIGTERM left pending to stop the resume
    assert_same_run(run, references('transformer', SMALL))


@pytest.mark.parametrize('task', ['text', 'custom'])
def test_a_users_own_experiment_and_task_stop_and_resume_bit_for_bit(tmp_path, monkeypatch, task):
    monkeypatch.chdir(tmp_path)
    name = f'stops_own_{task}'
    assert cli.main(['new', name, '--task', task]) == 0
    small = ['d_model=16', 'hidden=16', 'final_valid_batches=1', 'sample_tokens=5', 'seq_len=16', 'batch_size=4',
             'valid_batches=1'] if task == 'text' else ['hidden=8', 'batch_size=4', 'valid_batches=1',
                                                        'target_accuracy=1.0']
    code, want = _train(f'{name}.py', small, tmp_path / 'reference')
    assert code == 0
    _signal_at(monkeypatch, 6, signal.SIGTERM)
    code, run = _train(f'{name}.py', small, tmp_path / 'stopped')
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert code == 143 and json.loads((run / RUN_JSON).read_text())['checkpoint_step'] == 6
    assert cli.main(['resume', str(run)]) == 0
    assert_same_run(run, want)


def test_checkpoint_minutes_adds_checkpoints_between_validations(tmp_path, monkeypatch):
    from lazylab.experiments.checkpoint import Checkpointer
    saved, save = [], Checkpointer.save

    def recording(self, pos, sums):
        saved.append(pos.step)
        save(self, pos, sums)

    monkeypatch.setattr(Checkpointer, 'save', recording)
    code, _ = _train('transformer', [*SMALL, 'checkpoint_minutes=1e-9'], tmp_path / 'runs')  # due after every step
    assert code == 0 and saved == list(range(1, STEPS + 1))
    saved.clear()
    code, _ = _train('transformer', SMALL, tmp_path / 'plain')
    assert code == 0 and saved == [5, 10, 12]  # without it: at the validations only


# --- a finished run is finished -----------------------------------------------------------------------------------

def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob('*')) if p.is_file()}


@pytest.mark.parametrize('why, settings', [
    ('max_steps', []),
    ('time', ['max_steps=0', 'max_minutes=0.0001']),  # ends while it still times its steps for the budget
    ('epochs', ['max_steps=0', 'epochs=1', 'text=SMALL_TEXT']),
])
def test_resume_of_a_run_that_ended_for_good_says_nothing_to_do_and_touches_nothing(tmp_path, capsys, why,
                                                                                     settings):
    text = tmp_path / 'small.txt'
    text.write_text('It is a small text, read once and over.\n' * 12)
    settings = [s.replace('SMALL_TEXT', str(text)) for s in settings]
    code, run = _train('transformer', [*SMALL, *settings], tmp_path / 'runs')
    assert code == 0
    info = json.loads((run / RUN_JSON).read_text())
    assert load_checkpoint(run / CHECKPOINT_PT)['position']['finished'] == why
    before = _files(run)
    capsys.readouterr()
    for _ in range(2):
        assert cli.main(['resume', str(run)]) == 0
        assert capsys.readouterr().out == f'nothing to do: the run in {run} has already finished\n'
    assert _files(run) == before and info['status'] == 'completed'


def test_resume_removes_what_a_writer_killed_mid_write_left(references, tmp_path, monkeypatch):
    _signal_at(monkeypatch, 4)
    code, run = _train('transformer', SMALL, tmp_path / 'runs')
    monkeypatch.undo()
    assert code == 130
    leftovers = ['checkpoint.pt.tmp4242', 'run.json.tmp4242-ab12', 'metrics.jsonl.tmp']
    for name in leftovers:
        (run / name).write_bytes(b'half a file')
    (run / 'notes.tmp.txt').write_text('the user\'s own')  # not lazylab's: kept
    assert cli.main(['resume', str(run)]) == 0
    assert not [n for n in leftovers if (run / n).exists()] and (run / 'notes.tmp.txt').exists()
    assert_same_run(run, references('transformer', SMALL))


def test_a_stop_before_a_resumes_first_step_records_the_checkpoint_it_resumed(tmp_path, monkeypatch, capsys):
    """The signal comes while the resume still builds its trainer (no step taken in this process): the run stands
    where its checkpoint does, and the line says so (it said no checkpoint was written yet)."""
    _signal_at(monkeypatch, 4)
    code, run = _train('transformer', SMALL, tmp_path / 'runs')
    monkeypatch.undo()
    assert code == 130

    def stopped_early(*args, **kwargs):
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(Training, '__init__', stopped_early)
    capsys.readouterr()
    assert cli.main(['resume', str(run)]) == 143
    info = json.loads((run / RUN_JSON).read_text())
    assert (info['status'], info['steps'], info['checkpoint_step']) == ('killed', 4, 4)
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f'lazylab: killed (SIGTERM) at step 4; lazylab resume {run} continues from step 4, its checkpoint'
