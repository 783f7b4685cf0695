"""A run stopped by a real SIGTERM, Ctrl-C (SIGINT) or SIGUSR1 from another process records it in run.json (status,
signal, the step it reached and that of its checkpoint, written at that step), exits with 128 + the signal's
number, and resumes (test_stops.py stops runs at chosen steps and compares them with runs that never stopped)."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from lazylab.errors import Interrupted, run_cli, signals_polled
from lazylab.experiments.metrics import read_metrics
from lazylab.testing import start_lazylab, tiny

#: long enough (600 steps) not to end before the signal; a checkpoint every 5 steps
SIZES = tiny('sample_tokens=4', 'max_steps=600', 'valid_interval=5', 'log_interval=5')


def _train_then_signal(runs: Path, signum: int) -> tuple[Path, subprocess.CompletedProcess]:
    """Start a run; once it has a checkpoint, send it `signum`; returns its folder and how the process ended."""
    proc = start_lazylab('train', 'transformer', *SIZES, f'runs_dir={runs}')
    deadline = time.monotonic() + 120
    while not list(runs.glob('transformer/*/checkpoint.pt')):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    run, = (runs / 'transformer').iterdir()
    return run, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize('signum, code, status', [(signal.SIGTERM, 143, 'killed'), (signal.SIGINT, 130, 'interrupted'),
                                                  (signal.SIGUSR1, 138, 'preempted')],
                         ids=['SIGTERM', 'SIGINT', 'SIGUSR1'])
def test_a_signal_records_where_the_run_stopped_and_checkpoints_that_step(tmp_path, signum, code, status):
    run, done = _train_then_signal(tmp_path, signum)
    assert done.returncode == code, done.stderr
    info = json.loads((run / 'run.json').read_text())
    ck = torch.load(run / 'checkpoint.pt', weights_only=True)
    assert info['status'] == status and info['signal'] == signal.Signals(signum).name
    assert info['checkpoint_step'] == ck['position']['step'] == info['steps'] < 600  # nothing lost
    assert 'Traceback' not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f'lazylab: {status} ({signal.Signals(signum).name}) at step {info["steps"]:,}; lazylab resume {run} '
        f'continues from step {info["checkpoint_step"]:,}, its checkpoint')
    assert not [p.name for p in run.iterdir() if '.tmp' in p.name]  # no half-written checkpoint or run.json


def test_resume_finishes_a_run_that_sigterm_killed(tmp_path):
    run, done = _train_then_signal(tmp_path, signal.SIGTERM)
    assert done.returncode == 143, done.stderr
    killed = json.loads((run / 'run.json').read_text())
    resumed = start_lazylab('resume', str(run))
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    info = json.loads((run / 'run.json').read_text())
    assert info['status'] == 'completed' and info['steps'] == 600
    assert not {'signal', 'checkpoint_step'} & set(info)  # how it ended before is no longer true
    assert info['uuid'] == killed['uuid']
    steps = [r['step'] for r in read_metrics(run / 'metrics.jsonl')]
    assert steps == sorted(set(steps)) and steps[-1] == 600  # the records after the checkpoint were logged again
    assert torch.load(run / 'checkpoint.pt', weights_only=True)['position']['step'] == 600


def test_run_cli_ends_an_interrupted_command_with_128_plus_the_signal(capsys):
    def stopped(signum):
        raise Interrupted(signum)

    assert run_cli(stopped, signal.SIGTERM) == 143
    assert capsys.readouterr().err == '\nlazylab: killed (SIGTERM)\n'
    assert run_cli(stopped, signal.SIGINT) == 130
    assert capsys.readouterr().err == '\nlazylab: interrupted\n'


def test_a_signal_in_the_middle_of_a_checkpoint_write_waits_for_the_whole_checkpoint(tmp_path, monkeypatch):
    """SIGTERM delivered while torch.save is writing (the race test_run_processes met: torch's writer turned the
    interrupt into `unexpected pos …`, read as a failed write) ends as an interrupt after the rename."""
    from lazylab.errors import signals_interrupt
    from lazylab.experiments import checkpoint

    real_save = torch.save

    def save_and_get_killed(obj, f):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of the write
        real_save(obj, f)

    monkeypatch.setattr(checkpoint.torch, 'save', save_and_get_killed)
    path = tmp_path / 'checkpoint.pt'
    with pytest.raises(Interrupted) as e, signals_interrupt():
        checkpoint.save_checkpoint(path, {'format': checkpoint.FORMAT, 'weights': torch.arange(5000)})
    assert e.value.signal_name == 'SIGTERM'
    assert torch.equal(torch.load(path, weights_only=True)['weights'], torch.arange(5000))
    assert [p.name for p in tmp_path.iterdir()] == ['checkpoint.pt']  # no temporary file left


@pytest.mark.parametrize('signum, code', [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_polled_signal_is_raised_where_the_block_checks_and_nowhere_else(signum, code):
    before = signal.getsignal(signum)
    with signals_polled() as check:
        check()  # nothing arrived: nothing raised
        os.kill(os.getpid(), signum)
        time.sleep(0.01)  # the handler runs here, and only notes it (a raise from it could be swallowed)
        reached = True
        with pytest.raises(Interrupted) as e:
            check()
    assert reached and e.value.exit_code == code
    assert signal.getsignal(signum) is before  # the previous handler is back
