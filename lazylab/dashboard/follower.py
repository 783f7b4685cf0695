"""Every run under ``--runs-dir`` in the labml dashboard, read from its run directory: no ``dashboard=URL`` needed.

:class:`RunFollower` finds the run directories under the runs folder (any depth: runs, sweeps' trials, a user's
experiments' runs; :func:`lazylab.runs.walk_runs`), and sends each to the labml app (:mod:`labml_store`) as labml's
own client would: the configuration with its provenance (:func:`config_items`), the metrics of metrics.jsonl (every
numeric key, against its ``step``), the samples as the run's text, the status, the command. A run that is still
being written is followed: its files are looked at every ``POLL_S`` seconds and only what was appended is read
(:func:`lazylab.runs.read_metrics`); the folder is searched for new runs every ``RESCAN_S`` seconds.

It reads; it never writes in a run directory. What it has sent is kept in the dashboard's store (``imported.json``,
the ledger): per run, how far its metrics.jsonl and samples.txt were read. So a restart sends nothing twice, and a
file that changed in a way other than by growing (``lazylab resume`` cuts metrics.jsonl back to its checkpoint) is
sent again whole, its old series cleared first. A run the app has that the ledger does not know (a labml client
streamed it) is cleared and sent from its files the same way; from then on the files are the truth for it, and the
track route drops the metrics and configs a client still streams for it (:func:`lazylab.dashboard.labml_patches.
patch_app_followed`). A ledger entry written as "being applied" and never closed (the server died mid-update) is
sent again whole on the next start.

    follower = RunFollower(Path('runs'), Path('runs/.dashboard'))
    await follower.follow()          # in the server's event loop: reads in a worker thread, writes in the loop
"""
import asyncio
import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Container
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from lazylab import runs, user_files
from lazylab.dashboard import labml_store
from lazylab.errors import LazylabError

#: seconds between two looks at a running run's files
POLL_S = 0.5
#: seconds between two searches of the runs folder for new runs (and looks at finished runs' files)
RESCAN_S = 2.0
#: the ledger's file name, in the dashboard's store
LEDGER = 'imported.json'
#: lazylab's run status → the labml app's (completed, crashed, interrupted, in progress, unknown)
LABML_STATUS = {'running': 'in progress', 'completed': 'completed', 'interrupted': 'interrupted',
                'preempted': 'interrupted', 'cancelled': 'interrupted', 'pruned': 'interrupted',
                'failed': 'crashed', 'killed': 'crashed', 'dead': 'crashed', 'damaged': 'crashed'}
_HEAD = 4096  # bytes of metrics.jsonl whose hash tells a grown file from a rewritten one


@dataclass
class Entry:
    """What the ledger knows of one run: where it is, how far its files were read, the stamps of the files that
    are read whole (run.json, configs.yaml), whether an update was left half-applied."""
    path: str
    metrics: int = 0
    head: str = ''
    samples: int = 0
    stamps: dict[str, list] = field(default_factory=dict)
    status: str = ''  # the labml status sent
    applying: bool = False

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Update:
    """One run's news, read from its files (in a worker thread), for the app (in the event loop)."""
    uuid: str
    entry: Entry
    packet: dict[str, Any]
    whole: bool  # the run is new to the app, or sent again from the start: clear it first
    updated: Optional[float]


def config_items(run: runs.Run) -> dict[str, dict[str, Any]]:
    """The run's configs.yaml as labml's config items (what labml's client sends), provenance included: a key the
    user or a config file gave is "explicitly specified", one a sweep chose a "hyperparam" (the page marks both),
    one an option computed shows the option's name, a default is plain."""
    items = {}
    for order, (key, value) in enumerate(run.values.items()):
        source = str(run.given.get(key) or run.computed.get(key) or '')
        option = source[len('option '):] if source.startswith('option ') else None
        items[key] = {'name': key, 'type': type(value).__name__, 'value': value if option is None else option,
                      'computed': value, 'order': order, 'options': [] if option is None else [option],
                      'is_hyperparam': run.given.get(key) == 'sweep', 'is_meta': False,
                      'is_explicitly_specified': key in run.given}
    return items


def track(records: list[dict[str, Any]]) -> dict[str, dict[str, list]]:
    """metrics.jsonl records as labml's series: each numeric key but the positions, against the record's step."""
    series: dict[str, dict[str, list]] = {}
    for r in records:
        step = r.get('step')
        if not isinstance(step, (int, float)) or isinstance(step, bool):
            continue
        for key, value in r.items():
            if key in runs.POSITION_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            s = series.setdefault(key, {'step': [], 'value': []})
            s['step'].append(step)
            s['value'].append(float(value))
    return series


def command(run: runs.Run) -> str:
    """The command line that made the run, as run.json tells it."""
    argv = [str(a) for a in run.info.get('argv') or []]
    verb = 'labml' if run.info.get('labml_run') or run.info.get('module') else 'train'
    return ' '.join(['lazylab', verb, run.experiment or '?', *argv])


def first_packet(run: runs.Run, where: str) -> dict[str, Any]:
    """The fields labml's client sends when a run starts: name, comment (the command), tags, the configuration and
    the keys its summary card lists (those given)."""
    tags = [f'trial {run.label}', run.path.parent.name] if run.is_trial else []
    items = config_items(run)
    git = run.info.get('git') if isinstance(run.info.get('git'), dict) else {}
    return {'name': run.experiment or run.path.name, 'comment': command(run), 'tags': tags, 'python_file': where,
            'commit': str(git.get('commit') or ''), 'start_step': 0, 'configs': items,
            'selected_configs': [k for k in items if items[k]['is_explicitly_specified']]}


def status_item(run: runs.Run) -> dict[str, Any]:
    details = run.status if not run.error else f'{run.status}: {run.error}'
    return {'rank': 0, 'status': LABML_STATUS.get(run.status, 'unknown'), 'details': details, 'time': time.time()}


def start_time(run: runs.Run) -> Optional[float]:
    created = run.info.get('created')
    with contextlib.suppress(TypeError, ValueError, OverflowError):
        return time.mktime(time.strptime(str(created), '%Y-%m-%dT%H:%M:%S'))  # run.json's local time
    with contextlib.suppress(OSError):
        return (run.path / runs.RUN_JSON).stat().st_mtime
    return None


def _stamp(path: Path) -> list:
    try:
        st = path.stat()
    except OSError:
        return []
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _head(path: Path, size: int) -> str:
    try:
        with open(path, 'rb') as f:
            return hashlib.sha256(f.read(min(size, _HEAD))).hexdigest()
    except OSError:
        return ''


def _read_from(path: Path, offset: int) -> tuple[str, int]:
    """The text of `path` from `offset` to its end (a file shorter than `offset`: from 0, flagged by the caller)."""
    try:
        data = user_files.read_bytes(path, runs.SAMPLES_TXT, None, offset=offset)
    except LazylabError:  # missing, unreadable, or not a regular file: nothing yet
        return '', offset
    return data.decode('utf-8', errors='replace'), offset + len(data)


class RunFollower:
    """The runs under `runs_dir` sent to the labml app and followed (see the module docstring).

    Args:
        runs_dir: the folder searched, at any depth.
        store: the dashboard's store (its ledger is ``store/imported.json``).
        warn: where a run that cannot be sent is reported, once per run (default: stderr).
    """

    def __init__(self, runs_dir: Path, store: Path, warn: Optional[Callable[[str], None]] = None):
        self.runs_dir = Path(runs_dir)
        self.ledger_path = Path(store) / LEDGER
        self.warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self.entries: dict[str, Entry] = {}
        self.live: set[str] = set()  # uuids of runs whose status is running: looked at every POLL_S
        self._paths: dict[Path, str] = {}  # run directory → uuid
        self._warned: set[str] = set()
        self._scanned = float('-inf')
        self._pool = ThreadPoolExecutor(1, thread_name_prefix='follower')
        doc = runs.read_json(self.ledger_path) or {}
        for uuid, e in doc.items():
            with contextlib.suppress(TypeError):
                self.entries[uuid] = Entry(**e)
        self._paths = {Path(e.path): uuid for uuid, e in self.entries.items()}
        self.live = {uuid for uuid, e in self.entries.items() if e.status == LABML_STATUS['running']}

    def followed_uuids(self) -> Container[str]:
        """The uuids of the runs sent from their files (the track route drops a client's metrics for them)."""
        return self.entries

    # ---- reading (a worker thread) ---------------------------------------------------------------------------------

    def read_changes(self, now: float) -> list[Update]:
        """The updates of the runs whose files changed: all runs at most every RESCAN_S, the running ones always."""
        if now - self._scanned >= RESCAN_S:
            self._scanned = now
            known = set(self._paths.values())
            for path in runs.walk_runs(self.runs_dir):
                if path not in self._paths:
                    uuid = (runs.read_json(path / runs.RUN_JSON) or {}).get('uuid')
                    if not isinstance(uuid, str) or len(uuid) < 10:  # none yet, or one the app would refuse
                        continue
                    if uuid in known:  # a copy of a run found already: the first one found is shown
                        self._warn_once(f'{uuid} {path}', f'lazylab: warning: dashboard: {path} is a copy of the '
                                                          f'run {uuid} shown already; not shown')
                        continue
                    self._paths[path] = uuid
                    known.add(uuid)
            looked = list(self._paths.items())
        else:
            looked = [(p, u) for p, u in self._paths.items() if u in self.live]
        updates = []
        for path, uuid in looked:
            if not (path / runs.RUN_JSON).is_file():
                continue  # removed (or its disk is gone): what the app shows of it stays
            try:
                update = self.read_run(path, uuid)
            except Exception as e:  # a run that cannot be read must not stop the others: said once
                self._warn_once(uuid, f'lazylab: warning: dashboard: cannot read the run {path}: {e}')
                continue
            if update is not None:
                updates.append(update)
        return updates

    def read_run(self, path: Path, uuid: str) -> Optional[Update]:
        """The news of one run since the ledger's entry (None: nothing changed)."""
        old = self.entries.get(uuid)
        stamps = {name: _stamp(path / name) for name in (runs.RUN_JSON, runs.CONFIGS_YAML, runs.TRIAL_JSON)}
        metrics_path, samples_path = path / runs.METRICS_JSONL, path / runs.SAMPLES_TXT
        size, samples_size = (p.stat().st_size if p.is_file() else 0 for p in (metrics_path, samples_path))
        grown = old is not None and not old.applying and old.path == str(path) and size >= old.metrics and \
            samples_size >= old.samples and _head(metrics_path, old.metrics) == old.head
        same = grown and stamps == old.stamps and size == old.metrics and samples_size == old.samples
        if same and uuid not in self.live and old.status != LABML_STATUS['running']:
            return None  # a finished run whose files did not change: nothing is read
        run = runs.load_run(path, metrics=False)
        (self.live.add if run.status == 'running' else self.live.discard)(uuid)
        status = status_item(run)
        if same and old.status == status['status']:
            return None  # a running run that wrote nothing since the last look
        entry = Entry(str(path), stamps=stamps, status=status['status'])
        if grown:
            entry.metrics, entry.samples = old.metrics, old.samples
        records, entry.metrics = runs.read_metrics(metrics_path, entry.metrics)
        text, entry.samples = _read_from(samples_path, entry.samples)
        entry.head = _head(metrics_path, entry.metrics)
        packet = {'status': status, 'track': track(records), 'stdout': text}
        if not grown or stamps != old.stamps:
            packet.update(first_packet(run, os.path.relpath(path, self.runs_dir)))
            if grown:
                del packet['selected_configs']  # chosen once: the page may have changed them since
        updated = (_stamp(metrics_path) or _stamp(path / runs.RUN_JSON) or [0, 0, None])[2]
        return Update(uuid, entry, packet, whole=not grown, updated=None if updated is None else updated / 1e9)

    # ---- writing (the event loop) ----------------------------------------------------------------------------------

    def apply(self, updates: list[Update]) -> None:
        """Send the updates to the app; the ledger is written before (the runs marked "being applied") and after."""
        if not updates:
            return
        for u in updates:
            u.entry.applying = True
            self.entries[u.uuid] = u.entry
        self.save()
        for u in updates:
            try:
                if u.whole:
                    if labml_store.has_run(u.uuid):
                        labml_store.clear(u.uuid)
                    else:
                        labml_store.create_run(u.uuid, start_time(runs.load_run(Path(u.entry.path), False)))
                labml_store.update(u.uuid, u.packet, u.updated)
            except Exception as e:  # the app refused it (a value it cannot keep): the others go on
                self._warn_once(u.uuid, f'lazylab: warning: dashboard: cannot show the run {u.entry.path}: '
                                        f'{type(e).__name__}: {e}')
                continue
            u.entry.applying = False
        self.save()

    def save(self) -> None:
        runs.write_json(self.ledger_path, {uuid: e.to_json() for uuid, e in self.entries.items()})

    async def follow(self) -> None:
        """Send and follow the runs until cancelled: files read in a worker thread, the app written in this loop."""
        loop = asyncio.get_running_loop()
        while True:
            updates = await loop.run_in_executor(self._pool, self.read_changes, time.monotonic())
            self.apply(updates)
            await asyncio.sleep(POLL_S)

    def _warn_once(self, uuid: str, line: str) -> None:
        if uuid not in self._warned:
            self._warned.add(uuid)
            self.warn(line)
