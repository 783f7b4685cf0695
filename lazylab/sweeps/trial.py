"""One trial of a sweep, in a process of its own: an ordinary run, in the trial's folder of the sweep directory.

    python -m lazylab.sweeps.trial RUN_DIR NAME [--resume] [--swept KEY,KEY…] [--info JSON] -- key=value … [--config F…]
    python -m lazylab.sweeps.trial RUN_DIR MODULE --labml [--runs-dir DIR] [--steps N] [--resume] … -- key=value …
    python -m lazylab.sweeps.trial --check-labml MODULE [--runs-dir DIR] [--config F …] -- key=value key=SWEEP …

is `lazylab train NAME key=value … [--config F …]` whose run directory is RUN_DIR (RUNS_DIR/NAME/sweep-ID/trial-NNNN),
so `lazylab resume/generate/plot` work on it as on any run. The swept keys are labelled `sweep` in its
configs.yaml, and run.json gets `sweep` (the sweep directory, study and trial number) from --info.

`--resume`: the trial was running when its worker died. With a checkpoint it continues from it (bitwise as a run
that never stopped, like `lazylab resume`); without one it starts again in the same folder (what the folder held,
but output.log, is removed first).

Pruning: when LAZYLAB_SWEEP_REPORT is set (JSON: storage, study, number, metric, pruner), the trainer's hook
(`on_validation`) reports the metric to the Optuna trial at every validation and stops the run when the pruner
says so; run.json's status is then `pruned`, and the files stay. (The storage travels in the environment, not on
the command line, so a database password is not shown by `ps`.)

`--labml`: a trial of `lazylab sweep --labml` is `lazylab labml MODULE key=value … [--config F …] [--steps N]
[--runs-dir DIR]` whose run directory is RUN_DIR (lazylab.sweeps.scripts); run.json gets `sweep` as above. Such a
run has no checkpoint lazylab resumes: `--resume` starts it again. `--check-labml` is the sweep's check of a labml
script before anything is written: it types the settings by the script's config class and prints a report line
(`lazylab.sweeps.scripts.check_script` reads it).

The process holds an exclusive lock on RUN_DIR/.lock while it runs, so no two processes ever train in one folder.
"""
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Optional

from lazylab import locks, runs
from lazylab.command_line import Parser
from lazylab.errors import UsageError, run_cli
from lazylab.experiments import lifecycle
from lazylab.labml import runner
from lazylab.slurm import SLURM_DIR
from lazylab.sweeps import scripts
from lazylab.sweeps.grammar import Dimension, Fixed, parse_value
from lazylab.sweeps.study import PROGRESS_SCALE, REPORT_ENV, load_optuna, make_pruner, open_storage
from lazylab.sweeps.typed import type_dimension

USAGE = 'usage: python -m lazylab.sweeps.trial RUN_DIR NAME [--resume] [--swept K,…] -- key=value …'


class OptunaReport:
    """The trainer's `on_validation` hook for a sweep with a pruner.

    At each validation: reports `record[metric]` to the Optuna trial at the per-mille of the run done
    (`record['progress']`, which the trainer adds; its step where a record has none), once per point (a resumed
    trial's points already reported are not reported again), then asks the study's pruner. Returns 'pruned' to
    stop.

    Args:
        storage: the study's journal file or database URL.
        study: the study name; number: the trial number; metric: the record key (e.g. 'loss.valid');
        pruner: 'median' or 'halving' (see lazylab.sweeps.study.make_pruner).
    """

    def __init__(self, storage: str, study: str, number: int, metric: str, pruner: str):
        optuna = load_optuna()
        store = open_storage(storage)
        loaded = optuna.load_study(study_name=study, storage=store, pruner=make_pruner(pruner),
                                   sampler=optuna.samplers.RandomSampler())
        trial_id = store.get_trial_id_from_study_id_trial_number(store.get_study_id_from_name(study), number)
        self.trial = optuna.trial.Trial(loaded, trial_id)
        self.reported = set(store.get_trial(trial_id).intermediate_values)
        self.metric = metric

    def __call__(self, step: int, record: dict[str, Any]) -> Optional[str]:
        value = record.get(self.metric)
        if value is None:
            return None
        # the point of the run, not the step: see lazylab.sweeps.study.MedianByProgress (a labml script's record
        # has no `progress`: its step)
        point = round(record['progress'] * PROGRESS_SCALE) if 'progress' in record else step
        if point not in self.reported:
            self.trial.report(float(value), point)
            self.reported.add(point)
        return 'pruned' if self.trial.should_prune() else None


def lock(run_dir: Path) -> locks.HeldLock:
    """An exclusive lock on RUN_DIR/.lock, held until it is released (or the process ends).

    Raises:
        UsageError: another process holds it (the trial is still running there).
    """
    return locks.hold_lock(run_dir / runs.TRIAL_LOCK, f'{run_dir} is in use by another process (its trial is still '
                                                     f'running)', create=True)


def clear(run_dir: Path) -> None:
    """Remove a restarted trial's files, but its output log, lock and trial record (and, for a trial that is a Slurm
    job, its job's files: lazylab.sweeps.slurm_launcher)."""
    for p in run_dir.iterdir():
        if p.name in (runs.TRIAL_LOCK, runs.OUTPUT_LOG, runs.TRIAL_JSON, SLURM_DIR):
            continue
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def parser() -> Parser:
    """The trial process's flags (before `--`; see the module docstring)."""
    p = Parser('sweep', add_help=False)  # a trial's mistakes are the sweep's: `lazylab sweep --help` says more
    p.add_argument('run_dir', nargs='?', type=Path)
    p.add_argument('name', nargs='?')
    p.add_argument('--check-labml', metavar='MODULE')
    p.add_argument('--resume', action='store_true')
    p.add_argument('--swept', type=lambda text: text.split(','), default=[])
    p.add_argument('--info', type=json.loads, default={})
    p.add_argument('--labml', action='store_true')
    p.add_argument('--steps', type=int)
    p.add_argument('--runs-dir', default=scripts.DEFAULT_RUNS_DIR)
    p.add_argument('--config', action='append', default=[])
    return p


def settings_and_config(tokens: list[str]) -> tuple[list[str], list[str]]:
    """(the key=value settings, the `--config FILE`s among them, in order) of the tokens after a trial's `--`."""
    a, settings = parser().parse_with_settings(tokens)
    return settings, a.config


def run_trial(argv: list[str]) -> None:
    """The trial (or the check) `argv` describes (see the module docstring).

    Raises:
        UsageError: a command line that is not one of the module docstring's; what the run raises.
    """
    if '--' not in argv:
        raise UsageError(USAGE)
    cut = argv.index('--')
    a, rest = parser().parse(argv[:cut]), argv[cut + 1:]
    if a.check_labml:
        check_labml(a.check_labml, rest, runs_dir=a.runs_dir, config=a.config)
        return
    if a.name is None:
        raise UsageError(USAGE)
    run_dir, name, resume, swept, info = a.run_dir, a.name, a.resume, a.swept, a.info
    if a.labml:
        run_script(run_dir, name, rest, resume=resume, info=info, steps=a.steps, runs_dir=a.runs_dir)
        return
    # under a torchrun launcher every process runs this; rank 0 owns the folder and talks to the study, and the
    # others pass a hook that says nothing (the trainer asks rank 0's, and every process must take part)
    rank0 = int(os.environ.get('RANK', '0')) == 0
    run_dir.mkdir(parents=True, exist_ok=True)
    held = lock(run_dir) if rank0 else None
    try:
        report = os.environ.get(REPORT_ENV)
        hook = (OptunaReport(**json.loads(report)) if rank0 else _silent) if report else None
        if resume and (run_dir / runs.CHECKPOINT_PT).is_file() and (run_dir / runs.RUN_JSON).is_file():
            print(f'trial: resuming {run_dir} from its checkpoint', flush=True)
            lifecycle.resume_main(str(run_dir), on_validation=hook)
            return
        if resume and rank0:
            print(f'trial: restarting {run_dir} (no checkpoint yet)', flush=True)
        if rank0:
            clear(run_dir)
        settings, config = settings_and_config(rest)
        lifecycle.train_main(name, settings, config=config, run_dir=run_dir, on_validation=hook,
                             labels={'sweep': swept}, info={'sweep': info} if info else None)
    finally:
        if held is not None:
            held.release()


def run_script(run_dir: Path, module: str, tokens: list[str], *, resume: bool, info: dict[str, Any],
               steps: Optional[int], runs_dir: str) -> None:
    """A trial of a labml script: `lazylab labml MODULE tokens…` in RUN_DIR (started again on `resume`: see the
    module docstring); run.json gets the trial's `sweep` record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    held = lock(run_dir)
    try:
        if resume:
            print(f'trial: restarting {run_dir} (a labml run is not resumed)', flush=True)
        clear(run_dir)
        settings, config = settings_and_config(tokens)
        try:
            runner.run_labml(module, settings, config=config, steps=steps, runs_dir=runs_dir, run_dir=run_dir,
                             argv=(module, *tokens))
        finally:
            if info and (run_dir / runs.RUN_JSON).is_file():
                runs.update_record(run_dir, sweep=info)
    finally:
        held.release()


def check_labml(module: str, tokens: list[str], *, runs_dir: str, config: list[str]) -> None:
    """`--check-labml`: the fixed settings among `tokens` given and the swept ones typed by labml script MODULE's
    config class (lazylab.sweeps.scripts); prints the report line.

    Raises:
        UsageError, ConfigError: the module, a key or a value, as `lazylab labml` says it (one line).
    """
    fixed: list[str] = []
    dims: list[Dimension] = []
    for token in tokens:
        key, _, text = token.partition('=')
        value = parse_value(key, text)
        if isinstance(value, Fixed):
            fixed.append(f'{key}={value.text}')
        else:
            value.key = key
            dims.append(value)
    conf = runner.script_configs(module, fixed, config=config, runs_dir=runs_dir)
    for d in dims:
        type_dimension(d, conf, d.key)
    print(scripts.report_line(dims), flush=True)


def _silent(step: int, record: dict[str, Any]) -> None:
    return None


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m lazylab.sweeps.trial …`; the exit code (2 for a user's mistake, printed as one line)."""
    return run_cli(run_trial, sys.argv[1:] if argv is None else list(argv))


if __name__ == '__main__':
    sys.exit(main())
