"""Sweeps of labml scripts: `lazylab sweep --labml MODULE key=a,b …`, each trial a `lazylab labml` run.

A labml experiment module (what `lazylab labml MODULE key=value` runs: a dotted module name or a .py file) keeps its
own training loop, so what a sweep of an experiment checks by computing every point is known here only as far as
the script tells it before it trains: the module is imported and its `main()` run up to `experiment.configs(conf,
…)` — in a child process (`python -m lazylab.sweeps.trial --check-labml …`), so that labml's patches stay out of the
sweep's own process —, and every fixed key and every swept value is typed by the script's config class
(`lazylab.labml.runner.script_configs`, then `lazylab.sweeps.typed.type_dimension`). A key of a sub-config the
script has not made by then stays text, as `lazylab labml` leaves it until the run starts. Nothing is written.

The trials are `lazylab labml` runs in the trial folders (`python -m lazylab.sweeps.trial … --labml`), so
`lazylab compare`, `lazylab diff` and the sweep's own table read them as any run; their metric is any key the
script tracks (`--metric loss.valid` by default). Pruning needs lazylab's trainer (its validation hook), and a
labml run keeps no checkpoint lazylab can resume: an interrupted trial starts again. The runs folder is
`--runs-dir DIR` (default runs/labml, as for `lazylab labml`): the sweep is DIR/MODULE/sweep-STUDY, labml's data
DIR/data.
"""
import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from lazylab import user_files
from lazylab.errors import UsageError
from lazylab.sweeps.grammar import Dimension
from lazylab.sweeps.launcher import TRIAL_MODULE

#: the runs folder of `lazylab labml` (and of `lazylab sweep --labml`) when none is given
DEFAULT_RUNS_DIR = 'runs/labml'
#: how the child process marks its report on stdout (the script may print before it)
REPORT_MARK = 'lazylab-sweep-check: '


def runs_dir(text: Optional[str]) -> str:
    """--runs-dir, checked: a folder, or a path whose first existing parent is one (DEFAULT_RUNS_DIR when None).

    Raises:
        UsageError: empty, inside a file (naming the file), or holding a control character.
    """
    if text is None:
        return DEFAULT_RUNS_DIR
    if not text:
        raise UsageError('--runs-dir needs a folder')
    user_files.check_path_text(text, '--runs-dir')  # a newline in a folder's name splits every line showing it
    path = Path(text)
    existing = next(p for p in (path, *path.parents) if p.exists())  # '.' or '/' at the latest
    if not existing.is_dir():
        raise UsageError(f'--runs-dir {text}: {existing} is a file, not a folder')
    return text


def folder_name(module: str) -> str:
    """The runs folder of labml script MODULE (RUNS_DIR/NAME), as `lazylab labml` names it: a file's stem, else the
    dotted module name (lazylab.labml.runner.script_name)."""
    return Path(module).stem if module.endswith('.py') else module


def check_script(module: str, fixed: list[str], dims: list[Dimension], *, config: list[str],
                 runs_dir: str) -> None:
    """Type `dims` (each value, or the bounds of an interval) and check `fixed` against the config class of labml
    script MODULE, in a child process (see the module docstring).

    Raises:
        UsageError: what `lazylab labml MODULE` says of the module, a fixed key=value or `config`; a swept key or
            value (`key=SWEEP: …`); or, when the script itself fails before `experiment.configs`, its last line.
    """
    cmd = [sys.executable, '-m', TRIAL_MODULE, '--check-labml', module, '--runs-dir', runs_dir,
           *(arg for path in config for arg in ('--config', path)), '--', *fixed,
           *(f'{d.key}={d.written}' for d in dims)]
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(_error_line(module, done))
    report = json.loads(next(line for line in reversed(done.stdout.splitlines())
                             if line.startswith(REPORT_MARK))[len(REPORT_MARK):])
    for d in dims:
        typed = report['dims'][d.key]
        if d.discrete:
            d.values, d.int_step = [_value(v) for v in typed['values']], typed['int_step']
        else:
            d.low, d.high, d.is_int = _value(typed['low']), _value(typed['high']), typed['is_int']


def report_line(dims: list[Dimension]) -> str:
    """The child's report (`check_script` reads it): each dimension's typed values."""
    typed: dict[str, Any] = {}
    for d in dims:
        typed[d.key] = ({'values': [repr(v) for v in d.values], 'int_step': d.int_step} if d.discrete else
                        {'low': repr(d.low), 'high': repr(d.high), 'is_int': d.is_int})
    return REPORT_MARK + json.dumps({'dims': typed})


def _value(text: str) -> Any:
    """A typed value back from its repr (plain data: numbers, strings, bools, None, lists, tuples)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):  # not plain data: its text (as Optuna would store it)
        return text


def _error_line(module: str, done: subprocess.CompletedProcess) -> str:
    """The child's `lazylab: error: …` line, else the last line it printed (a traceback's), naming the module."""
    lines = [x.strip() for x in done.stderr.splitlines() if x.strip()]
    for line in reversed(lines):
        if line.startswith('lazylab: error: '):
            return line[len('lazylab: error: '):]
    last = lines[-1] if lines else f'exit code {done.returncode}'
    return f'{module} failed before experiment.configs: {last} (lazylab labml {module} --options shows it all)'
