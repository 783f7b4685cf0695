"""`lazylab sweep`: trials per hour with 1 and 2 workers, and the cost of a trial over a plain `lazylab train`.

    python benchmarks/sweep.py [--steps 60] [--reps 2]

1. A 4-point grid (d_model=32,48 × optimizer.learning_rate=3e-3,1e-2) of tiny transformer runs (2 layers,
   batch 8 × 64, `--steps` steps), swept with --workers 1 and then --workers 2: trials per hour of each, and their
   ratio (the goal on a 2-core machine: ≥ 1.7×; each trial of the 2-worker sweep gets 1 thread, of the 1-worker
   sweep 2). With --reps 2 or more the order alternates (1, 2, then 2, 1, …), so a machine whose load changes
   meanwhile does not favour one; the medians are compared.
2. The same run as a plain `lazylab train` and as a one-point sweep's trial with one worker (the time from the
   trial's start to its end, as the sweep measures it), alternating, medians of --reps: the difference is what a
   trial costs beyond its run (goal: < 1 s), in wall-clock seconds and in CPU seconds (the trial's from its
   trial.json; CPU time moves much less than wall time on a shared machine). The one-point sweep's own start
   (checking the command and computing its first point, creating the study) is shown too; it is paid once per
   sweep, not per trial.

Wall-clock seconds; a loaded machine moves the absolute numbers and, less, the ratio.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = ['heads=4', 'd_ff=128', 'n_layers=2', 'seq_len=64', 'batch_size=8', 'max_minutes=0', 'valid_batches=2',
         'final_valid_batches=2', 'log_interval=20', 'sample_tokens=0', 'device=cpu']


def lazylab(*args: str) -> tuple[float, str, float]:
    """(wall seconds, stdout, CPU seconds of the process and its children) of `lazylab ARGS`."""
    before = _children_cpu()
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, '-m', 'lazylab.cli', *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f'lazylab {" ".join(args)} failed:\n{out.stdout}\n{out.stderr}')
    return time.perf_counter() - t0, out.stdout, _children_cpu() - before


def _children_cpu() -> float:
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def trial_seconds(output: str) -> list[float]:
    """The seconds of each finished trial, from the sweep's end-of-trial lines."""
    return [float(s) for s in re.findall(r' completed loss\.valid \S+  ([\d.]+) s', output)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--steps', type=int, default=60)
    p.add_argument('--reps', type=int, default=2)
    a = p.parse_args()
    steps = [f'max_steps={a.steps}', f'valid_interval={max(1, a.steps // 3)}']
    grid = ['d_model=32,48', 'optimizer.learning_rate=3e-3,1e-2']
    with tempfile.TemporaryDirectory() as tmp:
        print(f'lazylab sweep, 4-point grid of tiny transformer runs ({a.steps} steps of 8×64, 2 layers), '
              f'wall clock')
        rates: dict[int, list[float]] = {1: [], 2: []}
        for rep in range(a.reps):
            for workers in ((1, 2) if rep % 2 == 0 else (2, 1)):
                seconds, out, _ = lazylab('sweep', 'transformer', *SIZES, *steps, *grid, '--workers', str(workers),
                                       f'runs_dir={tmp}/w{workers}-{rep}')
                rates[workers].append(4 / seconds * 3600)
                print(f'  --workers {workers}    {seconds:7.1f} s   {rates[workers][-1]:7.0f} trials/hour   '
                      f'(trials took {", ".join(f"{s:.1f}" for s in trial_seconds(out))} s)', flush=True)
        one_worker, two_workers = statistics.median(rates[1]), statistics.median(rates[2])
        print(f'  2 workers / 1 worker (medians): {two_workers / one_worker:.2f}x   (goal ≥ 1.7x)')

        one = ['d_model=32', 'optimizer.learning_rate=3e-3']
        plain, swept = [], []
        for i in range(a.reps):  # alternating, as above
            for kind in (('train', 'sweep') if i % 2 == 0 else ('sweep', 'train')):
                if kind == 'train':
                    wall, _, cpu = lazylab('train', 'transformer', *SIZES, *steps, *one, 'threads=2',
                                           f'runs_dir={tmp}/plain')
                    plain.append((wall, cpu))
                else:
                    total, out, _ = lazylab('sweep', 'transformer', *SIZES, *steps, *one, f'runs_dir={tmp}/one{i}')
                    trial = json.loads(next(Path(tmp, f'one{i}').glob('transformer/sweep-*/trial-0000/trial.json'))
                                       .read_text())
                    swept.append((trial['seconds'], trial['cpu_seconds'], total))
        train_wall, train_cpu = (statistics.median(x[i] for x in plain) for i in range(2))
        trial_wall, trial_cpu, total = (statistics.median(x[i] for x in swept) for i in range(3))
        print(f'  plain lazylab train        {train_wall:6.2f} s wall   {train_cpu:6.2f} s CPU')
        print(f'  the same run as a trial    {trial_wall:6.2f} s wall   {trial_cpu:6.2f} s CPU   overhead '
              f'{trial_wall - train_wall:+.2f} s wall, {trial_cpu - train_cpu:+.2f} s CPU   (goal < 1 s)')
        print(f'  the one-point sweep, all   {total:6.2f} s wall   (its own start, once per sweep: '
              f'{total - trial_wall:.2f} s)')
        print(f'  (runs: train {", ".join(f"{w:.2f}" for w, _ in plain)} s; trial '
              f'{", ".join(f"{w:.2f}" for w, _, _ in swept)} s)')
        print(f'  the study\'s work per trial (claim, draw, record owner, tell; journal file): '
              f'{study_seconds(Path(tmp)) * 1000:.1f} ms')


def study_seconds(tmp: Path, n: int = 20) -> float:
    """Seconds per trial of what a sweep asks of its study, measured in this process on a journal file."""
    from lazylab.sweeps.study import Study, make_pruner, make_sampler, open_storage
    study = Study(open_storage(str(tmp / 'bench.journal')), 'bench', 'minimize', make_sampler('random', 0),
                  make_pruner('none'))
    study.enqueue([{}] * n, {'bench': True})
    t0 = time.perf_counter()
    for _ in range(n):
        trial = study.claim()
        study.set_owner(trial.number, 'bench')
        trial.suggest_float('x', 1e-4, 1e-2, log=True)
        study.tell(trial.number, 'completed', 1.0)
    return (time.perf_counter() - t0) / n


if __name__ == '__main__':
    main()
