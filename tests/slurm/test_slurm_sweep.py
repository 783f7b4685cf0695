"""A sweep whose trials are Slurm jobs (`--launcher slurm`), on the one-node test cluster: two jobs at a time, one
cancelled and run again by `--resume`, and `--resume` reattaching to the jobs a killed sweep left queued or running."""
import json
import signal
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(420)


def trial_json(folder: Path) -> dict:
    path = folder / 'trial.json'
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:  # (written by a rename: never half, but a reader may race the first write)
        return {}


def last_step(folder: Path) -> int:
    path = folder / 'metrics.jsonl'
    lines = [x for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    return json.loads(lines[-1])['step'] if lines else 0


class Queue(threading.Thread):
    """Watches squeue while the sweep runs: the most jobs it ever showed at once, and every job id."""

    def __init__(self, slurm):
        super().__init__(daemon=True)
        self.slurm, self.most, self.seen, self.done = slurm, 0, set(), threading.Event()

    def run(self):
        while not self.done.is_set():
            jobs = self.slurm.jobs()
            self.most = max(self.most, len(jobs))
            self.seen |= set(jobs)
            time.sleep(0.1)


def test_a_sweep_keeps_two_jobs_in_the_queue_reruns_a_cancelled_trial_and_reattaches_after_a_kill(slurm, slurm_tools,
                                                                                                  tmp_path):
    command = slurm_tools.guide_command('lazylab sweep transformer')  # 2 × 2 points, --workers 2
    queue = Queue(slurm)
    queue.start()
    sweep = slurm.start_lazylab(*slurm_tools.on_cluster(command, tmp_path), '--study', 'grid')
    sweep_dir = tmp_path / 'transformer' / 'sweep-grid'
    trials = [sweep_dir / f'trial-{n:04d}' for n in range(4)]
    try:
        # cancel trial 0's job while it trains
        job0 = slurm_tools.wait_until(lambda: last_step(trials[0]) >= 200 and trial_json(trials[0])['slurm']['job_id'],
                                      180, "trial 0's job to train")
        slurm.command('scancel', job0)
        slurm_tools.wait_until(lambda: trial_json(trials[0]).get('state') == 'cancelled', 60, 'trial 0 cancelled')
        # the sweep fills the worker trial 0 left (trial 2); kill the sweep while trials 1 and 2 are queued or running
        job2 = slurm_tools.wait_until(lambda: (trial_json(trials[2]).get('slurm') or {}).get('job_id'), 120,
                                      "trial 2's job")
        live = slurm.jobs()
        assert job0 not in live and job2 in live, live
        sweep.send_signal(signal.SIGKILL)
        sweep.communicate(timeout=30)
        left = {t.name: trial_json(t)['slurm']['job_id'] for t in trials[1:3]}
        assert set(left.values()) <= set(slurm.jobs()), (left, slurm.jobs())  # the jobs outlive the sweep
        again = slurm_tools.guide_command('lazylab sweep --resume')
        done = slurm.lazylab(*slurm_tools.on_cluster(again, tmp_path, sweep_dir=str(sweep_dir)), timeout=300)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.communicate()
        queue.done.set()
        queue.join()
    assert done.returncode == 0, done.stdout + done.stderr
    assert queue.most <= 2, f'squeue showed {queue.most} jobs at once'
    # trial 0: its cancelled job, then a new one that resumed it; trials 1 and 2: reattached, never submitted twice
    assert [str(j) for j in trial_json(trials[0])['slurm']['jobs']][0] == job0
    assert len(trial_json(trials[0])['slurm']['jobs']) == 2
    for t in trials[1:3]:
        assert trial_json(t)['slurm']['jobs'] == [left[t.name]], t
        assert f'reattached to Slurm job {left[t.name]}' in (t / 'output.log').read_text()
    assert len(queue.seen) == 5, queue.seen  # 4 trials, one of them twice
    assert [trial_json(t)['state'] for t in trials] == ['completed'] * 4
    assert json.loads((trials[0] / 'run.json').read_text())['status'] == 'completed'
    table = done.stdout.split('\n\n')[-1]
    assert table.count('completed') == 4, done.stdout
