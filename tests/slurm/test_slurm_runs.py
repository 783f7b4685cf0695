"""Runs as Slurm jobs on a real one-node cluster (tests/slurm/conftest.py): submitted and completed, stopped by the
warning signal and requeued, at their time limit, cancelled and resumed; each compared with a run here."""
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

#: what a metrics record holds that depends on the clock, not on the computation
CLOCK = ('time', 'tokens_per_s', 'mfu')


def records(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / 'metrics.jsonl'
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def computed(record: dict) -> dict:
    """A metrics record without its clock fields: what must be equal bit for bit."""
    return {k: v for k, v in record.items() if k not in CLOCK}


def run_json(run_dir: Path) -> dict:
    path = Path(run_dir) / 'run.json'
    return json.loads(path.read_text()) if path.is_file() else {}


def submitted(done: subprocess.CompletedProcess) -> tuple[str, Path]:
    """(job id, run directory) of `lazylab train … --slurm`'s first line."""
    line = done.stdout.splitlines()[0] if isinstance(done, subprocess.CompletedProcess) else done
    assert line.startswith('submitted Slurm job '), line
    job_id, _, rest = line[len('submitted Slurm job '):].partition(': ')
    return job_id, Path(rest.split(' (output: ')[0])


@pytest.fixture(scope='module')
def local_run(tmp_path_factory, slurm, slurm_tools):
    """The reference: the same run trained here, uninterrupted (its metrics records)."""
    runs = tmp_path_factory.mktemp('local')
    done = slurm.lazylab('train', 'transformer', *slurm_tools.RUN, f'runs_dir={runs}', timeout=240)
    assert done.returncode == 0, done.stderr
    [run_dir] = (runs / 'transformer').iterdir()
    return records(run_dir)


def test_a_submitted_run_completes_and_equals_a_run_here(slurm, slurm_tools, local_run, tmp_path):
    # the guide's first command, with the sizes of RUN, on the test cluster (no gpu partition), and --wait
    command = slurm_tools.guide_command('lazylab train transformer d_model=')
    done = slurm.lazylab(*slurm_tools.on_cluster(command, tmp_path), '--wait')
    assert done.returncode == 0, done.stderr
    job_id, run_dir = submitted(done)
    assert run_dir.parent == tmp_path / 'transformer'
    assert slurm.state(job_id) == 'COMPLETED'
    assert 'done: step 1,500' in done.stdout  # --wait printed the job's output
    assert f'slurm job {job_id}: completed' in done.stderr
    assert [computed(r) for r in records(run_dir)] == [computed(r) for r in local_run]
    assert run_json(run_dir)['status'] == 'completed' and 'requeues' not in run_json(run_dir)
    assert json.loads((run_dir / 'slurm' / 'job.json').read_text())['jobs'][0]['job_id'] == job_id


def test_the_warning_signal_to_the_batch_shell_requeues_and_the_run_ends_as_if_never_stopped(slurm, slurm_tools,
                                                                                               local_run, tmp_path):
    done = slurm.lazylab('train', 'transformer', *slurm_tools.RUN, f'runs_dir={tmp_path}', '--slurm', 'time=10')
    assert done.returncode == 0, done.stderr
    job_id, run_dir = submitted(done)
    # mid-run, between two validations (every 500 steps)
    slurm_tools.wait_until(lambda: any(r['step'] >= 600 for r in records(run_dir)), 120, 'step 600', every=0.05)
    slurm.command(*slurm_tools.guide_command('scancel --signal=USR1 --batch').replace('4242', job_id).split())
    slurm_tools.wait_until(lambda: slurm.state(job_id) in ('COMPLETED', 'FAILED', 'CANCELLED'), 180,
                           'the requeued job to end')
    assert slurm.state(job_id) == 'COMPLETED', (run_dir / 'output.log').read_text()[-3000:]
    record = run_json(run_dir)
    assert record['status'] == 'completed'
    [requeue] = record['requeues']
    assert requeue['job_id'] == job_id and requeue['signal'] == 'SIGUSR1' and requeue['step'] >= 600
    log = (run_dir / 'output.log').read_text()
    # no step lost: the checkpoint is of the step it stopped at, between two validations
    assert f'lazylab: requeued Slurm job {job_id}: it continues from the checkpoint of step {requeue["step"]:,}' in log
    assert requeue['step'] % 500
    assert [computed(r) for r in records(run_dir)] == [computed(r) for r in local_run]


def test_a_run_at_its_time_limit_requeues_itself_comes_back_and_a_cancel_leaves_it_resumable(slurm, slurm_tools,
                                                                                              tmp_path):
    # time=1 with the warning 25 s before: Slurm checks time limits every 30 s, so the warning comes 5 to 35 s
    # after the job starts, while this long run trains; it is cancelled once it has come back and gone on
    long = [s for s in slurm_tools.RUN if not s.startswith('max_steps=')] + ['max_steps=1000000']
    done = slurm.lazylab('train', 'transformer', *long, f'runs_dir={tmp_path}', '--slurm', 'time=1,signal=USR1@25')
    assert done.returncode == 0, done.stderr
    job_id, run_dir = submitted(done)
    first = slurm_tools.wait_until(lambda: (run_json(run_dir).get('requeues') or [None])[0], 120, 'the requeue')
    assert first['job_id'] == job_id and first['signal'] == 'SIGUSR1'
    assert '#SBATCH --signal=B:USR1@25' in (run_dir / 'slurm' / f'{job_id}_submission.sh').read_text()
    # it comes back: the same job, running again, training past the step it stopped at
    slurm_tools.wait_until(lambda: run_json(run_dir).get('status') == 'running'
                           and records(run_dir) and records(run_dir)[-1]['step'] > first['step'] + 100, 120,
                           'the requeued job to train again')
    slurm.command('scancel', job_id)
    slurm_tools.wait_until(lambda: slurm.state(job_id) == 'CANCELLED', 60, 'the cancel')
    slurm_tools.wait_until(lambda: run_json(run_dir).get('status') == 'cancelled', 30, 'run.json to say cancelled')
    assert (run_dir / 'checkpoint.pt').is_file()
    assert 'lazylab resume' in (run_dir / 'output.log').read_text()  # the line that says how to go on


def test_two_processes_in_a_job_train_as_under_torchrun_and_requeue_once(slurm, slurm_tools, tmp_path):
    # nodes=1, ntasks_per_node=2: srun starts both ranks with torchrun's variables from Slurm's (what nodes=N does on
    # N machines); the warning reaches both, rank 0 requeues, and the run ends as the same run under torchrun here
    here = tmp_path / 'torchrun'
    done = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', '-m',
                           'lazylab.cli', 'train', 'transformer', *slurm_tools.RUN, f'runs_dir={here}'],
                          capture_output=True, text=True, timeout=240, env=slurm.env)
    assert done.returncode == 0, done.stderr[-3000:]
    [reference] = (here / 'transformer').iterdir()
    command = slurm_tools.guide_command('lazylab train transformer batch_size=')  # nodes=1, ntasks_per_node=2 here
    done = slurm.lazylab(*slurm_tools.on_cluster(command, tmp_path / 'slurm'))
    assert done.returncode == 0, done.stderr
    job_id, run_dir = submitted(done)
    slurm_tools.wait_until(lambda: any(r['step'] >= 600 for r in records(run_dir)), 120, 'step 600', every=0.05)
    slurm.command('scancel', '--signal=USR1', '--batch', job_id)
    slurm_tools.wait_until(lambda: slurm.state(job_id) in ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT'), 180,
                           'the requeued job to end')
    log = (run_dir / 'output.log').read_text()
    assert slurm.state(job_id) == 'COMPLETED', log[-3000:]
    assert '2 processes' in log and log.count(f'lazylab: requeued Slurm job {job_id}') == 1
    assert len(run_json(run_dir)['requeues']) == 1
    assert [computed(r) for r in records(run_dir)] == [computed(r) for r in records(reference)]


def test_a_run_stopped_here_resumes_as_a_slurm_job_and_ends_as_if_never_stopped(slurm, slurm_tools, local_run,
                                                                                tmp_path):
    here = slurm.start_lazylab('train', 'transformer', *slurm_tools.RUN, f'runs_dir={tmp_path}')
    try:
        run_dir = slurm_tools.wait_until(lambda: next((tmp_path / 'transformer').glob('*'), None), 120, 'the run')
        slurm_tools.wait_until(lambda: any(r['step'] >= 600 for r in records(run_dir)), 120, 'step 600', every=0.05)
        here.send_signal(signal.SIGINT)
        assert here.wait(timeout=60) == 130
    finally:
        if here.poll() is None:
            here.kill()
        here.communicate()
    assert run_json(run_dir)['status'] == 'interrupted'
    command = slurm_tools.guide_command('lazylab resume ')
    done = slurm.lazylab(*slurm_tools.on_cluster(command, tmp_path, run_dir=str(run_dir)), '--wait')
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert done.stdout.startswith('submitted Slurm job ') and ': resumes ' in done.stdout.splitlines()[0]
    assert [computed(r) for r in records(run_dir)] == [computed(r) for r in local_run]
    again = slurm.lazylab(*slurm_tools.on_cluster(command, tmp_path, run_dir=str(run_dir)))
    assert again.returncode == 0 and again.stdout.startswith('nothing to do: '), again.stdout + again.stderr
    assert len(json.loads((run_dir / 'slurm' / 'job.json').read_text())['jobs']) == 1
