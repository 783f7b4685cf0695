"""What a stop costs: for each built-in experiment at its defaults, a run is stopped by a signal between two
validations; the table gives the steps lost (between the step the signal reached and the step the resume starts
from: the goal is 0), the seconds from the signal to the process's exit, and the checkpoint's size and write time.

    python scripts/stop_latency.py                       # feedback, fast_weights, transformer; SIGTERM after 40 s
    python scripts/stop_latency.py --experiments transformer --signal USR1 --after 20

Each run trains with `max_minutes` long enough not to end first, in a temporary folder; the write time is the median
of three `torch.save`s of the run's own checkpoint into that folder (what the stop writes, measured apart from it).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lazylab.experiments.checkpoint import load_checkpoint
from lazylab.testing import lazylab_argv, lazylab_env


def stop_one(experiment: str, signum: int, after: float, folder: Path) -> dict:
    """Train `experiment` at its defaults, send `signum` `after` seconds into training; what the stop cost."""
    runs = folder / experiment
    proc = subprocess.Popen(lazylab_argv('train', experiment, 'max_minutes=30', f'runs_dir={runs}'),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=lazylab_env())
    deadline = time.monotonic() + 600
    while not list(runs.glob('*/*/metrics.jsonl')):  # training has started
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f'{experiment} did not start: {proc.communicate()[1]}')
        time.sleep(0.1)
    time.sleep(after)
    signalled = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=600)
    exited = time.monotonic() - signalled
    run, = runs.glob('*/*/run.json')
    info = json.loads(run.read_text())
    checkpoint = run.parent / 'checkpoint.pt'
    payload = load_checkpoint(checkpoint)
    writes = []
    for _ in range(3):
        started = time.perf_counter()
        with open(folder / 'write-test.pt', 'wb') as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        writes.append(time.perf_counter() - started)
    return {'experiment': experiment, 'code': proc.returncode, 'status': info.get('status'),
            'steps': info.get('steps'), 'checkpoint_step': info.get('checkpoint_step'),
            'lost': (info.get('steps') or 0) - (info.get('checkpoint_step') or 0), 'exit_s': exited,
            'size_mb': checkpoint.stat().st_size / 2**20, 'write_s': statistics.median(writes),
            'line': err.strip().splitlines()[-1] if err.strip() else ''}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--experiments', nargs='+', default=['feedback', 'fast_weights', 'transformer'])
    parser.add_argument('--signal', default='TERM', help='the signal sent (TERM, INT, USR1)')
    parser.add_argument('--after', type=float, default=40.0, help='seconds of training before the signal')
    a = parser.parse_args()
    signum = signal.Signals['SIG' + a.signal.upper().removeprefix('SIG')]
    print(f'stop by SIG{signum.name.removeprefix("SIG")} after {a.after:g} s of training, the defaults of each '
          f'experiment (CPU; load average {os.getloadavg()[0]:.1f} at the start)')
    print(f'{"experiment":<14}{"status":<11}{"stopped at":>11}{"resumes at":>11}{"lost":>6}{"exit (s)":>10}'
          f'{"checkpoint":>12}{"write (s)":>11}')
    with tempfile.TemporaryDirectory() as tmp:
        for experiment in a.experiments:
            r = stop_one(experiment, signum, a.after, Path(tmp))
            print(f'{r["experiment"]:<14}{r["status"]:<11}{r["steps"]:>11,}{r["checkpoint_step"]:>11,}'
                  f'{r["lost"]:>6}{r["exit_s"]:>10.2f}{r["size_mb"]:>9.1f} MB{r["write_s"]:>11.3f}', flush=True)
    sys.exit(0)


if __name__ == '__main__':
    main()
