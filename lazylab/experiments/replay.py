"""Replaying a run's configuration: the checks of `--config RUN/configs.yaml` and of `lazylab resume`.

Replaying a dump applies its given values and then checks that every value it recorded as computed comes out the
same, unless the new key=value settings changed what it was computed from (`lazylab.configs.replay_changes`); a
difference is one error line naming the key and both values, and `--allow-changes` accepts it (each is then printed
as a warning and recorded in run.json). A resume also compares the training data with what its checkpoint records
(the text's sha256 and size: `check_data_changes`), refused or accepted the same way.

`open_run(RUN_DIR)` finds the run's experiment again from run.json's `source` (the file by its path, with one
warning line when it changed since; the module by its name) and replays its configs.yaml into a fresh Configs.
"""
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import yaml

from lazylab import safe_yaml, user_files
from lazylab.configs import load, replay_changes
from lazylab.errors import CheckpointError, UsageError
from lazylab.experiments.configure import check_dump, empty_dump
from lazylab.experiments.discovery import Experiment, from_source
from lazylab.runs import CONFIGS_YAML, RUN_JSON, SWEEP_YAML, RunRecord, read_record

ALLOW_CHANGES = '--allow-changes'


def check_replay(conf, allow_changes: bool = False) -> list[str]:
    """After `prepare`: the computed values of a replayed dump (--config RUN/configs.yaml, resume) that came out
    differently although nothing they depend on was given a new value; returns them as lines (printed as
    warnings) when `allow_changes`.

    Args:
        conf: the prepared Configs; allow_changes: accept the differences (`--allow-changes`).

    Raises:
        UsageError: `<key> comes out <now>, <dump> has <recorded> (…); --allow-changes accepts it`.
    """
    lines = [str(change) for change in replay_changes(conf)]
    if lines and not allow_changes:
        more = f' (and {len(lines) - 1} more)' if len(lines) > 1 else ''
        them = 'them' if more else 'it'
        raise UsageError(f'{lines[0]}{more}: the code or data computes {them} differently now, or the file was '
                         f'edited by hand (give a new setting as key=value instead); {ALLOW_CHANGES} accepts '
                         f'{them}')
    _warn_accepted(lines)
    return lines


def check_data_changes(lines: list[str], allow_changes: bool = False) -> list[str]:
    """The changes of a resumed run's data since its checkpoint (`trainer.check_resume`'s lines, e.g. a text that
    changed but kept its characters): refused, or with `allow_changes` printed as warnings and returned.

    Args:
        lines: the changes, one line each; allow_changes: accept them (`--allow-changes`).

    Raises:
        CheckpointError: `text FILE changed since the checkpoint: sha256 … → …, size … → … bytes; …`.
    """
    if lines and not allow_changes:
        more = f' (and {len(lines) - 1} more)' if len(lines) > 1 else ''
        raise CheckpointError(f'{lines[0]}{more}; resume on the data it was trained on, or {ALLOW_CHANGES} to go '
                              f'on with this')
    _warn_accepted(lines)
    return list(lines)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _warn_accepted(lines: list[str]) -> None:
    for line in lines:
        print(f'lazylab: warning: {line} (accepted: {ALLOW_CHANGES})', file=sys.stderr, flush=True)


class Reopened(NamedTuple):
    """A run directory opened again (`reopen`): its experiment, its Configs replayed from configs.yaml (nothing
    computed yet), its folder and its run.json."""
    experiment: Experiment
    conf: Any
    path: Path
    record: RunRecord


def reopen(run_dir: str, warn: Optional[Callable[[str], None]] = None) -> Reopened:
    """The run in RUN_DIR, opened again: its experiment found from run.json's `source` (`discovery.from_source`:
    a file that changed since the run started is one warning line), and its configs.yaml replayed into a fresh
    Configs (checked as a dump, `configure.check_dump`).

    Args:
        run_dir: the run directory (RUNS_DIR/STEM/RUN_ID, or a sweep's trial folder).
        warn: takes the warning line of a changed experiment file (default: printed on stderr).

    Raises:
        UsageError: not a run directory of `lazylab train` (no run.json and configs.yaml, a `lazylab labml` run),
            run.json damaged, configs.yaml empty, not a regular file, larger than `user_files.CONFIG` allows or
            holding keys the experiment does not have, the experiment gone; ConfigError: configs.yaml does not
            replay.
    """
    path = Path(run_dir)
    if not (path / RUN_JSON).is_file() or not (path / CONFIGS_YAML).is_file():
        if (path / SWEEP_YAML).is_file():
            raise UsageError(f'{run_dir} is a sweep directory, not a run: `lazylab sweep --resume {run_dir}` '
                             f'continues the sweep (`lazylab resume {path / "trial-NNNN"}` one of its runs)')
        raise UsageError(f'{run_dir} is not a lazylab run directory (no {RUN_JSON} and {CONFIGS_YAML})')
    record = read_record(path)
    source = record.get('source') if isinstance(record.get('source'), dict) else {}
    labml_module = source.get('module') if source.get('kind') == 'labml' else record.get('module')
    if isinstance(labml_module, str) and (source.get('kind') == 'labml' or 'experiment' not in record):
        raise UsageError(f'{run_dir} is a run of lazylab labml {labml_module}; lazylab resume and generate take '
                         f'runs of lazylab train')
    name = record.get('experiment')
    if not isinstance(name, str):
        raise UsageError(f'{path / RUN_JSON} is damaged')
    experiment = from_source(name, record.get('source'), warn=warn or _stderr)
    conf = experiment.load().Configs()
    doc = _parsed_yaml(path / CONFIGS_YAML)
    if empty_dump(doc):
        raise UsageError(f'{path / CONFIGS_YAML} is empty: the run\'s configuration is not in it any more')
    if isinstance(doc, dict) and isinstance(doc.get('values'), dict):
        check_dump(experiment.name, type(conf), doc, path / CONFIGS_YAML)
    load(conf, path / CONFIGS_YAML)
    return Reopened(experiment, conf, path, record)


def open_run(run_dir: str) -> tuple[str, Any, Path]:
    """(experiment name, Configs replayed from configs.yaml, run directory) of an existing run (see `reopen`).

    Args:
        run_dir: the run directory.

    Raises:
        UsageError, ConfigError: as `reopen`.
    """
    run = reopen(run_dir)
    return run.experiment.name, run.conf, run.path


def _parsed_yaml(path: Path) -> Any:
    """The YAML document in `path`; the path itself when it is not UTF-8 or YAML (`load` then says what is wrong).

    Raises:
        UsageError: `path` is not a regular file (a FIFO, a device) or larger than `user_files.CONFIG` allows.
    """
    raw = user_files.read_bytes(path, CONFIGS_YAML, user_files.CONFIG)
    try:
        return safe_yaml.load(raw.decode('utf-8'))
    except (UnicodeDecodeError, yaml.YAMLError):
        return path
