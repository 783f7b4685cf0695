"""The start-up cost of an experiment of your own: a .py file against the built-in it copies, side by side.

    python benchmarks/startup.py [--reps 9] [--quick]

Two measurements, each in fresh processes, alternated round-robin (file, built-in, file, …), medians:

1. find + import: `discovery.find_experiment(X).load()` and `.source` (what `lazylab train` adds for a file: the
   path, a module name, the import by path, the sha256 run.json records), timed inside the process after the
   imports both share (torch, lazylab.experiments' text base), so only the experiment's own start-up is counted;
2. `lazylab options X`: the whole command as a user runs it (the process start, torch, the listing), by its wall
   time and by its CPU time (steadier where other processes share the machine).

The file is a copy of lazylab/experiments/transformer.py in a scratch folder, so both import the same modules and
build the same configuration: the difference is the cost of naming an experiment by its file.
"""
import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOAD = '''
import sys, time
import torch  # noqa: F401 - shared by both: not counted
import lazylab.experiments.nlp_autoregression  # noqa: F401
from lazylab.experiments.discovery import find_experiment
t = time.perf_counter()
e = find_experiment(sys.argv[1])
e.load()
e.source
print(time.perf_counter() - t)
'''


def _seconds_inside(experiment: str, cwd: Path) -> float:
    out = subprocess.run([sys.executable, '-c', LOAD, experiment], cwd=cwd, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _seconds_of_command(experiment: str, cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, '-m', 'lazylab.cli', 'options', experiment], cwd=cwd, capture_output=True,
                   check=True)
    return time.perf_counter() - started


def _cpu_seconds_of_command(experiment: str, cwd: Path) -> float:
    """The command's CPU seconds (user + system): steadier than its wall time on a machine others load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, '-m', 'lazylab.cli', 'options', experiment], cwd=cwd, capture_output=True,
                   check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _round_robin(measure, cases: dict[str, str], cwd: Path, reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(reps):
        for name, experiment in cases.items():
            times[name].append(measure(experiment, cwd))
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--reps', type=int, default=9)
    parser.add_argument('--quick', action='store_true', help='2 repetitions (a smoke run)')
    args = parser.parse_args()
    reps = 2 if args.quick else args.reps
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        shutil.copy(ROOT / 'lazylab' / 'experiments' / 'transformer.py', folder / 'my_transformer.py')
        cases = {'built-in transformer': 'transformer', 'file ./my_transformer.py': './my_transformer.py'}
        print(f'experiment start-up: a file against the built-in it copies (median of {reps}, fresh processes)')
        measures = (('find + import + source (wall)', _seconds_inside),
                    ('lazylab options X (wall)', _seconds_of_command),
                    ('lazylab options X (CPU user + system)', _cpu_seconds_of_command))
        for title, measure in measures:
            medians = _round_robin(measure, cases, folder, reps)
            base = medians['built-in transformer']
            print(f'  {title}')
            for name, seconds in medians.items():
                print(f'    {name:28s} {seconds * 1000:8.1f} ms   {(seconds - base) * 1000:+7.1f} ms')


if __name__ == '__main__':
    main()
