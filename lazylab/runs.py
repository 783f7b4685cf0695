"""The run directory and the sweep directory: their files, the run.json record, atomic JSON, run ids, the
environment a run records, and the locks that keep one process on a run (torch-free).

Every module that reads or writes these folders does it through here, so that a file's name, its schema and how it
is written are said once:

    RUNS_DIR/STEM/RUN_ID/           a run (`lazylab train`, `lazylab labml`, or a sweep's trial-NNNN/)
        run.json                    the record (`RunRecord`): what ran, where it came from, how it ended
        configs.yaml                the replayable configuration dump (lazylab.configs.dump)
        metrics.jsonl               one JSON object per line: step, tokens, loss.train, …, loss.valid
        samples.txt                 the text sampled at each validation
        checkpoint.pt               the last good checkpoint (lazylab.experiments.checkpoint)
        labml/                      labml's own records of the run
        trial.json, output.log      a sweep trial's record and what its process printed (sweeps only)
    RUNS_DIR/STEM/sweep-STUDY/      a sweep: sweep.yaml, study.journal, config.yaml, .owners/, trial-NNNN/

A run id is the start time and 4 random hex digits (`20261201-225659-3fa2`), so runs sort by time; `make_run_dir`
creates one without a race (an exclusive mkdir, retried with a new id on a clash). JSON files are written to a
temporary file beside them and renamed over (`write_json`), so a reader sees the old file or the new one, never half.

The locks that keep one process on a run or a sweep's trials are `flock`s (`lazylab.locks`: `exclusive_lock`,
`hold_lock`, `lock_is_held`, which the kernel drops when the process ends, even by SIGKILL); this module decides
what is locked (the run directory itself while it trains, see `training_pid`) and reads them back (`load_run`).

Reading a run directory back (`load_run` → `Run`: its record, configuration dump, metrics and status, a sweep
trial's whether its process is alive) is here too, for `lazylab compare`, `lazylab diff` and a sweep's table: a
file that cannot be read whole is named in a warning, and what could be read is kept.
"""
import contextlib
import errno
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypedDict

import yaml

from lazylab import safe_yaml, user_files
from lazylab.errors import LazylabError, UsageError, plural
from lazylab.locks import HAS_FLOCK, lock_is_held

# the files of a run directory
RUN_JSON = 'run.json'
CONFIGS_YAML = 'configs.yaml'
METRICS_JSONL = 'metrics.jsonl'
SAMPLES_TXT = 'samples.txt'
CHECKPOINT_PT = 'checkpoint.pt'
LABML_DIR = 'labml'
# a sweep trial's folder adds these
TRIAL_JSON = 'trial.json'
OUTPUT_LOG = 'output.log'
TRIAL_LOCK = '.lock'
# the files of a sweep directory
SWEEP_YAML = 'sweep.yaml'
STUDY_JOURNAL = 'study.journal'
SWEEP_CONFIG = 'config.yaml'
OWNERS_DIR = '.owners'
TRIAL_PREFIX = 'trial-'
SWEEP_PREFIX = 'sweep-'
#: the files lazylab writes in a run or sweep directory: no command writes a user's output (a CSV, a figure) over one
OWN_FILES = frozenset({RUN_JSON, CONFIGS_YAML, METRICS_JSONL, SAMPLES_TXT, CHECKPOINT_PT, TRIAL_JSON, OUTPUT_LOG,
                       SWEEP_YAML, STUDY_JOURNAL, SWEEP_CONFIG})


def sweep_config(i: int) -> str:
    """The name of the copy of a sweep's `i`-th --config file in its directory: config.yaml, config-2.yaml, …"""
    return SWEEP_CONFIG if i == 0 else f'config-{i + 1}.yaml'


#: the metric keys of a metrics.jsonl record (lazylab.experiments.metrics): what a sweep optimizes and compares
METRIC_KEYS = ('loss.valid', 'accuracy.valid', 'loss.train', 'accuracy.train', 'tokens_per_s')
#: the keys of a metrics.jsonl record that say where the run was, not how it did
POSITION_KEYS = ('step', 'tokens', 'epoch', 'time')

#: run.json's `status`: running, then how it ended
STATUSES = ('running', 'completed', 'pruned', 'failed', 'interrupted', 'killed', 'preempted', 'cancelled')
#: run.json's fields about how a run ended; a resume removes them (the run is running again)
END_FIELDS = ('finished', 'error', 'signal', 'checkpoint_step')


class RunRecord(TypedDict, total=False):
    """run.json: one schema for `lazylab train`, `lazylab labml` and a sweep's trials.

    experiment: the experiment's name (a built-in's, or the file's or module's last name: its runs' folder).
    source: where the experiment came from, for resume and sweeps to import it again:
        {'kind': 'builtin' | 'file' | 'module' | 'entry_point', 'module': dotted name, 'path': absolute file
        path, 'sha256': the file's, 'distribution': its package, 'version': that package's version} (what applies).
    run_id, uuid: the folder's name; labml's run uuid. argv: the command line's settings. created, finished:
        local times, `timestamp()`. lazylab, torch, python, device, device_name, git: see `environment`.
    parameters: the model's parameter count. loss_label: the task's loss with its unit (plots).
    status: one of STATUSES; error: its one line (failed); signal, checkpoint_step: how it was stopped, and the
        step `lazylab resume` continues from; steps: optimizer steps taken.
    replay_changes: computed values of a replayed dump that --allow-changes accepted. sweep: the trial's sweep.
    labml_run: labml's run folder, relative to the run directory (`lazylab labml` runs).
    requeues: a Slurm job's requeues, one {'job_id', 'time' (`timestamp()`), 'signal', 'step'} each (lazylab.slurm.job).
    flops_per_token, peak_flops: a training step's FLOPs per token and its devices' peak FLOP/s (one's · processes),
        once counted (lazylab.experiments.flops; a resume counts again); mfu: the run's average MFU, at the end.
    """
    experiment: str
    source: dict[str, Any]
    run_id: str
    uuid: str
    argv: list[str]
    created: str
    finished: str
    lazylab: Optional[str]
    torch: Optional[str]
    python: str
    device: str
    device_name: str
    git: dict[str, Any]
    parameters: int
    loss_label: str
    status: str
    error: str
    signal: str
    checkpoint_step: Optional[int]
    steps: Optional[int]
    replay_changes: list[str]
    sweep: dict[str, Any]
    labml_run: str
    requeues: list[dict[str, Any]]
    flops_per_token: float
    peak_flops: float
    mfu: float


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float) -> float:
    """Model FLOPs utilization: the FLOP/s the training does (its FLOPs per token · tokens per second) over the
    peak FLOP/s of its devices (PaLM, Chowdhery et al. 2022, appendix B); a fraction (0.031 is 3.1%)."""
    return flops_per_token * tokens_per_s / peak_flops


def timestamp() -> str:
    """The local time as run.json records it: '2026-12-01T22:56:59'."""
    return time.strftime('%Y-%m-%dT%H:%M:%S')


def new_run_id() -> str:
    """The start time and 4 random hex digits: '20261201-225659-3fa2' (runs sort by time)."""
    return time.strftime('%Y%m%d-%H%M%S') + '-' + os.urandom(2).hex()


def make_run_dir(parent: Path, made: Optional[list[Path]] = None, *, prefix: str = '', attempts: int = 20,
                 where: Optional[str] = None) -> Path:
    """Create PARENT/PREFIX+RUN_ID (a new `new_run_id`), and PARENT's missing folders; returns it.

    The run's own folder is made with an exclusive mkdir: two processes that start in the same second never share
    one (the loser draws a new id and tries again). `made`: a list to which the folders this call made are added,
    outermost first (see `remove_made`). Runs that start beside it at the same moment share its parents. `where`:
    how the error names PARENT (e.g. "runs_dir='runs'", the setting it came from; default: PARENT).

    Raises:
        UsageError: a folder cannot be made (PARENT or one above it is a file, not writable, …); what this call
            made before it failed is removed again.
    """
    made = [] if made is None else made
    parent = Path(parent).expanduser()
    try:
        for folder in reversed([parent, *parent.parents]):
            if folder.is_dir():
                continue
            try:
                folder.mkdir()
                made.append(folder)
            except FileExistsError:  # another process made it just now (then share it), or it is a file
                if not folder.is_dir():
                    raise NotADirectoryError(errno.ENOTDIR, f'{folder} is a file, not a folder') from None
        for _ in range(attempts):
            run_dir = parent / (prefix + new_run_id())
            try:
                run_dir.mkdir()
            except FileExistsError:  # another run took this id
                continue
            made.append(run_dir)
            return run_dir
        raise FileExistsError(errno.EEXIST, f'{attempts} new run ids in a row were taken in {parent}')
    except (OSError, ValueError) as e:
        remove_made(made)
        why = getattr(e, 'strerror', None) or str(e)
        raise UsageError(f'cannot create a run directory in {where or parent}: {why}') from None


def remove_made(folders: list[Path], run_dir: Optional[Path] = None) -> None:
    """Remove `folders` (made in this order, each inside the one before), deepest first: `run_dir` (when one of
    them) with what is in it, the others only when empty (a run another process started at the same moment may be
    in them by now)."""
    import shutil  # only on this error path
    for folder in reversed(list(folders)):
        if run_dir is not None and folder == run_dir:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                folder.rmdir()


def write_json(path: Path, doc: Any) -> None:
    """`doc` as indented JSON in `path`, atomically (`write_text`).

    Raises:
        OSError: the file cannot be written (the caller says which run; e.g. a full disk).
    """
    write_text(path, json.dumps(doc, indent=1) + '\n')


def write_text(path: Path, text: str) -> None:
    """`text` in `path` (UTF-8), through a temporary file beside it and a rename (a reader sees the old file or the
    new one, never half of one); the temporary file is removed if writing fails.

    Raises:
        OSError: the file cannot be written (e.g. a full disk).
    """
    path = Path(path)
    tmp = path.with_name(f'{path.name}.tmp{os.getpid()}-{os.urandom(2).hex()}')
    try:
        tmp.write_text(text, encoding='utf-8')
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def remove_leftovers(folder: Path) -> list[str]:
    """Remove the temporary files a writer killed mid-write left in a run directory (`checkpoint.pt.tmp1234`,
    `run.json.tmp…`: see `write_json`, `save_checkpoint`); call it only while holding the run's training lock, so
    that no live writer owns them. Returns their names."""
    removed = []
    for path in Path(folder).iterdir():
        name = path.name
        if path.is_file() and any(name.startswith(own + '.tmp') for own in OWN_FILES):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(name)
    return sorted(removed)


def read_json(path: Path) -> Optional[dict[str, Any]]:
    """The JSON object in `path`; None when the file is missing, unreadable, not JSON or not an object, or not a
    regular file of at most `user_files.CONFIG`'s size (a FIFO put in a run's place would block the reader)."""
    try:
        doc = json.loads(user_files.read_bytes(path, 'JSON file', user_files.CONFIG))
    except (LazylabError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return doc if isinstance(doc, dict) else None


def read_record(run_dir: Path) -> RunRecord:
    """The run.json of RUN_DIR.

    Raises:
        UsageError: RUN_DIR has no run.json, or it is damaged (not a JSON object), naming the file.
    """
    path = Path(run_dir) / RUN_JSON
    if not path.is_file():
        raise UsageError(f'{run_dir} is not a lazylab run directory (no {RUN_JSON})')
    doc = read_json(path)
    if doc is None:
        raise UsageError(f'{path} is damaged (not a JSON object)')
    return doc  # type: ignore[return-value]


def write_record(run_dir: Path, record: RunRecord) -> None:
    """run.json of RUN_DIR, atomically (`write_json`)."""
    write_json(Path(run_dir) / RUN_JSON, dict(record))


def update_record(run_dir: Path, **values: Any) -> RunRecord:
    """run.json of RUN_DIR with `values` set (and the rest as it was); returns the new record."""
    record = read_record(run_dir)
    record.update(values)  # type: ignore[typeddict-item]
    write_record(run_dir, record)
    return record


def environment() -> dict[str, Any]:
    """What run.json records about the software: the lazylab, torch and Python versions, and the git commit of
    lazylab's source when it is a git checkout (`git`: {'commit', 'dirty'}). torch's version is read from its
    package metadata (torch is not imported here); the caller adds the device."""
    info: dict[str, Any] = {'lazylab': _version('lazylab'), 'torch': _version('torch'),
                            'python': platform.python_version()}
    git = git_commit(Path(__file__).resolve().parent)
    if git is not None:
        info['git'] = git
    return info


def _version(distribution: str) -> Optional[str]:
    from importlib import metadata  # a few ms, only when a run starts
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def git_commit(folder: Path) -> Optional[dict[str, Any]]:
    """{'commit': sha, 'dirty': bool} of the git checkout holding `folder`, or None (not a checkout, no git)."""
    try:
        sha = subprocess.run(['git', '-C', str(folder), 'rev-parse', 'HEAD'], capture_output=True, text=True,
                             timeout=10)
        if sha.returncode != 0:
            return None
        status = subprocess.run(['git', '-C', str(folder), 'status', '--porcelain', '--untracked-files=no'],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {'commit': sha.stdout.strip(), 'dirty': bool(status.stdout.strip())}


def training_pid(run_dir: Path) -> Optional[int]:
    """The process id labml's run.pid records for the run (LABML_DIR/NAME/UUID/run.pid, written while it trains),
    for the message of a refused training lock; None when there is none yet, or it is unreadable."""
    try:
        uuid = read_record(run_dir)['uuid']
        return int(next((Path(run_dir) / LABML_DIR).glob(f'*/{uuid}/run.pid')).read_text().strip())
    except (OSError, ValueError, KeyError, TypeError, StopIteration, UsageError):
        return None


# --- reading a run directory back --------------------------------------------------------------------------------

@dataclass
class Run:
    """One run as its files tell it (see `load_run`).

    Attributes:
        path, label: its folder; its name in a table (a sweep trial's number, NNNN, else the folder's name).
        is_trial: a sweep's trial (it has a trial.json).
        values, given, computed, objects: the sections of its configs.yaml (a trial that never started its run:
            its swept params, given by 'sweep').
        info, trial: its run.json and trial.json ({} when missing or damaged).
        records: the whole records of its metrics.jsonl.
        status, error: completed, pruned, failed (with its one-line error), running, interrupted (a sweep trial
            whose process is gone), dead (run.json says running, but no process holds its training lock: it ended
            without recording how — SIGKILL, out of memory, a lost machine) or damaged; '—' for a run from before
            run.json had a status.
        damage: a line per file that could not be read whole (warnings).
    """
    path: Path
    label: str
    is_trial: bool
    values: dict[str, Any] = field(default_factory=dict)
    given: dict[str, str] = field(default_factory=dict)
    computed: dict[str, str] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    trial: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    status: str = 'running'
    error: Optional[str] = None
    damage: list[str] = field(default_factory=list)

    @property
    def experiment(self) -> Optional[str]:
        """The experiment that made the run (run.json; an older `lazylab labml` run's: its module; a trial whose
        run.json is missing or damaged: its sweep's, from sweep.yaml, named as run.json names it: a file's stem, a
        module's last name, a labml script's module); None when no file says (never a folder's name: a run directory
        may be anywhere)."""
        name = self.info.get('experiment') or self.info.get('module')
        if not isinstance(name, str) and self.is_trial:
            with contextlib.suppress(OSError):  # (no sweep.yaml: none) the trial's folder is SWEEP_DIR/trial-NNNN
                sweep = read_sweep_record(self.path.parent) or {}
                name = given = sweep.get('experiment')  # as given: named as run.json names it (a file's stem, …)
                if isinstance(given, str) and (given.endswith('.py') or not sweep.get('labml')):
                    name = Path(given).stem if given.endswith('.py') else given.rsplit('.', 1)[-1]
        return name if isinstance(name, str) else None

    def metric(self, key: str) -> tuple[Optional[float], list[tuple[int, float]]]:
        """(final value, [(tokens, value) of every record that has it])."""
        points = [(r.get('tokens', r.get('step', 0)), float(r[key])) for r in self.records if key in r]
        return (points[-1][1] if points else None), points

    def steps(self) -> Optional[int]:
        """The optimizer steps taken (run.json's, else the last record's)."""
        if self.info.get('steps') is not None:
            return int(self.info['steps'])
        return int(self.records[-1]['step']) if self.records else None

    def tokens_per_s(self) -> Optional[float]:
        """The run's training speed: its tokens over its training seconds, each record's speed weighted by the
        tokens of its interval (what the last line of `lazylab train` reports); the plain mean of the records'
        speeds when they do not count tokens (a `lazylab labml` run)."""
        rated = [r for r in self.records if 'tokens_per_s' in r]
        if not rated:
            return None
        tokens, seconds, before = 0.0, 0.0, 0.0
        for r in rated:
            if not isinstance(r.get('tokens'), (int, float)) or r['tokens'] <= before or r['tokens_per_s'] <= 0:
                return sum(x['tokens_per_s'] for x in rated) / len(rated)
            tokens += r['tokens'] - before
            seconds += (r['tokens'] - before) / r['tokens_per_s']
            before = r['tokens']
        return tokens / seconds

    def mfu(self) -> Optional[float]:
        """The run's MFU: run.json's flops_per_token and peak_flops with the run's speed (`tokens_per_s`); None
        when run.json has not both (a run from before MFU, one whose FLOPs could not be counted, a labml run)."""
        flops, peak, speed = self.info.get('flops_per_token'), self.info.get('peak_flops'), self.tokens_per_s()
        counted = all(type(v) in (int, float) and v > 0 for v in (flops, peak))  # a bool is no count
        return mfu(flops, speed, peak) if counted and speed is not None else None

    def seconds(self) -> Optional[float]:
        """Its wall-clock seconds over all resumes (the last record's)."""
        return float(self.records[-1]['time']) if self.records and 'time' in self.records[-1] else None


def load_run(path: Path, metrics: bool = True) -> Run:
    """A run directory (or a sweep trial's folder, which may hold only trial.json and output.log when the trial
    failed before its run started), read back from its files alone.

    A damaged file (run.json, configs.yaml, metrics.jsonl, trial.json) is a line in `Run.damage` and makes the
    status 'damaged'; what could be read is kept (a damaged configs.yaml: no values). `metrics=False` leaves
    metrics.jsonl unread (`Run.records` empty): for a reader that follows it with `read_metrics`.
    """
    path = Path(path)
    damage: list[str] = []
    trial = _read_object(path / TRIAL_JSON, damage)
    number = trial.get('number')
    label = f'{number:04d}' if isinstance(number, int) and not isinstance(number, bool) else path.name
    run = Run(path, label, bool(trial) or (path / TRIAL_JSON).is_file(), info=_read_object(path / RUN_JSON, damage),
              trial=trial, damage=damage)
    if (path / CONFIGS_YAML).is_file():
        try:
            doc = read_dump(path / CONFIGS_YAML)
        except UsageError as e:
            damage.append(f'{e}; its settings are not shown')
            doc = {}
        run.values = dict(doc.get('values') or {})
        run.given = dict(doc.get('given') or {k: '' for k in run.values})  # an older dump: all count as given
        run.computed = dict(doc.get('computed') or {})
        run.objects = dict(doc.get('objects') or {})
    elif trial:
        run.values = dict(trial.get('params') if isinstance(trial.get('params'), dict) else {})
        run.given = {k: 'sweep' for k in run.values}
    run.status, run.error = _status(run)
    if metrics and (path / METRICS_JSONL).is_file():
        running = run.status == 'running' or run.info.get('status') == 'running'
        being_written = running and lock_is_held(path, unreadable=False)  # its training lock: a process trains it
        run.records = _read_records(path / METRICS_JSONL, damage, being_written)
    if damage:
        run.status = 'damaged'
    return run


def read_metrics(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The records of metrics.jsonl from byte `offset` on, and the offset after the last whole line read: a
    follower's read of a file that may be being written (a line without its newline yet is left for the next read;
    a whole line that is not a JSON object is skipped). ([], offset) when the file is missing or shorter than
    `offset`; a FIFO or other non-regular file in its place is never opened for reading."""
    try:
        data = user_files.read_bytes(path, METRICS_JSONL, None, offset=offset)
    except LazylabError:  # missing, unreadable, or not a regular file: nothing yet
        return [], offset
    whole = data[:data.rfind(b'\n') + 1]
    records = [r for r in map(_record, whole.split(b'\n')) if r is not None]
    return records, offset + len(whole)


def walk_runs(root: Path) -> list[Path]:
    """Every run directory under `root` (a folder with run.json), at any depth: runs, sweeps' trials, a user's
    experiments' runs; sorted. Hidden folders (a dashboard's store, a sweep's .owners) and labml's own records
    inside a run are not searched; [] when `root` is not a folder."""
    found = []
    for folder, subfolders, files in os.walk(root):
        if RUN_JSON in files:
            found.append(Path(folder))
            subfolders.clear()  # a run directory holds no runs (its labml/ and checkpoints are its own)
        else:
            subfolders[:] = sorted(d for d in subfolders if not d.startswith('.'))
    return sorted(found)


def _read_object(path: Path, damage: list[str]) -> dict[str, Any]:
    """The JSON object in `path`; {} when the file is missing, damaged or holds no object (then, when it is there,
    a line in `damage`: the file is written whole, through a rename, so a reader never sees half of it)."""
    if not path.exists():
        return {}
    doc = read_json(path)
    if doc is None:
        damage.append(f'{path} is damaged (not a JSON object); the run\'s status is not known')
        return {}
    return doc


def _read_records(path: Path, damage: list[str], being_written: bool) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file, each whole line that is a JSON object; a line in `damage` for the lines
    that are not (a last line cut off by a crash, say), but for the last line of a run still being written."""
    lines = user_files.read_bytes(path, METRICS_JSONL, None).split(b'\n')  # a FIFO: refused, not waited on
    torn = lines[-1] != b''
    records, bad = [], 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        record = _record(line)
        if record is not None:
            records.append(record)
        elif not (being_written and torn and i == len(lines) - 1):  # the line the trainer is writing now
            bad += 1
    if bad:
        last = torn and not being_written and _record(lines[-1]) is None
        why = 'its last line is cut off (a crash while it was written?)' if bad == 1 and last else \
            f'{plural(bad, "line")} {"is" if bad == 1 else "are"} not a JSON record'
        damage.append(f'{path} is damaged: {why}; only its {plural(len(records), "whole record")} '
                      f'{"is" if len(records) == 1 else "are"} read')
    return records


def _record(line: bytes) -> Optional[dict[str, Any]]:
    try:
        record = json.loads(line.decode('utf-8'))
    except ValueError:  # (UnicodeDecodeError too)
        return None
    return record if isinstance(record, dict) else None


def read_dump(path: Path) -> dict[str, Any]:
    """A run's configs.yaml as a mapping.

    Raises:
        UsageError: the file is not UTF-8, not YAML, or not a mapping (it names the file); missing, not a regular
            file or larger than `user_files.CONFIG` allows (`user_files.read_bytes`).
    """
    raw = user_files.read_bytes(path, CONFIGS_YAML, user_files.CONFIG)
    try:
        doc = safe_yaml.load(raw.decode('utf-8'))
    except (UnicodeDecodeError, yaml.YAMLError):
        raise UsageError(f'{path} is damaged (not a YAML configuration dump)') from None
    sections = ('values', 'given', 'computed', 'objects')
    if doc is not None and (not isinstance(doc, dict) or
                            any(not isinstance(doc.get(k) or {}, dict) for k in sections)):
        raise UsageError(f'{path} is damaged (not a YAML configuration dump)')
    return doc or {}


def _status(run: Run) -> tuple[str, Optional[str]]:
    if run.trial:
        state = run.trial.get('state', 'running')
        if state in ('running', 'interrupted') and not _owner_alive(run):
            return 'interrupted', None
        return state, run.trial.get('error')
    status = run.info.get('status', '—')  # '—': a run from before run.json had a status
    # `lazylab train` and `resume` hold the training lock (an flock on the folder) while they train, and the kernel
    # drops it even on SIGKILL: free, the run ended without recording how. Not known without flock (Windows), for a
    # folder this process cannot open, or for a `lazylab labml` run (its script's loop holds no lock)
    if status == 'running' and HAS_FLOCK and not run.info.get('labml_run') and not lock_is_held(run.path):
        return 'dead', None
    return status, run.info.get('error')


def _owner_alive(run: Run) -> bool:
    """Whether the sweep process that runs this trial still holds its owner lock (SWEEP_DIR/.owners/TOKEN)."""
    attempts = run.trial.get('attempts') or [{}]
    owner = attempts[-1].get('owner')
    if not owner:
        return True
    return lock_is_held(run.path.parent / OWNERS_DIR / owner)  # the trial's folder is SWEEP_DIR/trial-NNNN


def find_runs(paths: list[str]) -> list[Path]:
    """The run directories of run, sweep and experiment folders: a run directory (run.json, or a trial's
    trial.json), a sweep directory (its trial-NNNN runs), or a folder of those (RUNS_DIR/NAME); each once (a run
    named twice, or also through its folder, is one).

    Raises:
        UsageError: a path that is none of those.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / SWEEP_YAML).is_file():
            out += sorted(d for d in p.glob(TRIAL_PREFIX + '*') if d.is_dir())
        elif (p / RUN_JSON).is_file() or (p / TRIAL_JSON).is_file():
            out.append(p)
        elif p.is_dir() and any((d / RUN_JSON).is_file() or (d / SWEEP_YAML).is_file() for d in p.iterdir()):
            out += find_runs([str(d) for d in sorted(p.iterdir())
                              if (d / RUN_JSON).is_file() or (d / SWEEP_YAML).is_file()])
        else:
            raise UsageError(f'{p} is not a run or sweep directory (no {RUN_JSON} or {SWEEP_YAML})')
    first: dict[Path, Path] = {}
    for d in out:
        first.setdefault(d.resolve(), d)
    return list(first.values())


def read_sweep_record(sweep_dir: Path) -> Optional[dict[str, Any]]:
    """The mapping in SWEEP_DIR/sweep.yaml; None when the file is not UTF-8, not YAML or not a mapping.

    Raises:
        UsageError: the file is missing, unreadable, not a regular file or larger than `user_files.CONFIG` allows
            (`user_files.read_bytes`).
    """
    raw = user_files.read_bytes(Path(sweep_dir) / SWEEP_YAML, SWEEP_YAML, user_files.CONFIG)
    try:
        record = safe_yaml.load(raw.decode('utf-8'))
    except (UnicodeDecodeError, yaml.YAMLError):
        return None
    return record if isinstance(record, dict) else None
