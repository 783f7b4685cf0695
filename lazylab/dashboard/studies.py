"""The sweeps under a runs folder as one Optuna storage, served by optuna-dashboard beside the labml dashboard.

``lazylab dashboard --runs-dir DIR`` finds every sweep under DIR (a folder with ``sweep.yaml``, at any depth) and
opens its study record: the journal file ``SWEEP/study.journal``, or the storage sweep.yaml names (``storage_url``:
a journal file elsewhere, or a database URL; one whose password sweep.yaml hides, ``***``, cannot be opened, and
says so once, the URL redacted). :class:`SweepStudies` puts all of them behind Optuna's storage interface, which is
what optuna-dashboard's own server API (``optuna_dashboard.wsgi(storage)``) takes, so its study list (``/api/studies``)
has every sweep's study, and a sweep started after the dashboard appears at the next look (DIR is searched again at
most every ``rescan_s`` seconds, when the list is asked for).

Each backend keeps its own study and trial ids; here they are ``local_id * SLOTS + backend`` (the backends numbered
in the order they were found), so ids stay the same while the server runs, and a note written on the page goes to
the study's own storage. The studies and trials handed on are shallow copies with the id
(and the user attrs) replaced: Optuna 5's ``FrozenStudy._study_id``, ``FrozenTrial._trial_id`` and ``_user_attrs``,
which tests/dashboard/test_studies.py exercises through optuna-dashboard's API.

A sweep's trials carry ``run_dir`` and ``status`` (user attrs the sweep writes); the trials served here add
``labml_url``, the run's page on the labml dashboard (from the run.json in ``run_dir``), so each dashboard points to
the other.

    studies = SweepStudies(Path('runs'), labml_url='http://127.0.0.1:5005')
    app = optuna_dashboard.wsgi(studies)

The page reads; of what optuna-dashboard's API can change, only notes get through (:func:`refusal`): a study's
journal is its sweep's record — ``lazylab sweep --resume`` continues from it, the trials' ``run_dir`` and
``status`` name the runs — so a study is not created, renamed or deleted, nor a trial told or its attributes
changed, from the page (403 and the reason). A note is kept in the study's system attributes, beside the record.
:class:`StudiesServer` serves it with the labml port's server and guard (:mod:`lazylab.dashboard.serving`).
"""
import copy
import json
import re
import sys
import threading
import time
from collections.abc import Container, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import parse_qs

from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from lazylab import runs
from lazylab.dashboard.guard import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_BODY_MB, RequestGuard
from lazylab.dashboard.serving import ServerThread, WsgiApp
from lazylab.errors import UsageError
from lazylab.redaction import database_connection, redact, redact_url

#: backends per id: an id is local_id * SLOTS + the backend's number
SLOTS = 1 << 20
#: seconds between two searches of the runs folder for new sweeps
RESCAN_S = 2.0


def find_sweeps(runs_dir: Path) -> list[Path]:
    """The sweep folders under `runs_dir` (those with a sweep.yaml, at any depth), sorted; [] when it does not
    exist."""
    if not Path(runs_dir).is_dir():
        return []
    return sorted(p.parent for p in Path(runs_dir).rglob(runs.SWEEP_YAML) if p.is_file())


def sweep_storage(sweep_dir: Path) -> str:
    """Where the sweep keeps its study: sweep.yaml's ``storage_url`` (a database URL, or a journal file: as given,
    else relative to the sweep folder), or the sweep's own ``study.journal``.

    Raises:
        ValueError: sweep.yaml cannot be read, or hides the storage's password (the message shows it redacted).
    """
    try:
        record = runs.read_sweep_record(sweep_dir)
    except UsageError as e:  # missing, unreadable, not a regular file or too large: the one line says which
        raise ValueError(str(e)) from None
    if record is None:
        raise ValueError(f'cannot read {sweep_dir / runs.SWEEP_YAML}: not a YAML mapping')
    url = record.get('storage_url')
    if not url:
        return str(sweep_dir / runs.STUDY_JOURNAL)
    url = str(url)
    if '://' in url:
        if '***' in url:
            raise ValueError(f'{sweep_dir / runs.SWEEP_YAML} hides the password of its storage {url}')
        return url
    path = Path(url)
    return str(path if path.is_absolute() or path.exists() else sweep_dir / path)


def open_storage(source: str) -> Optional[BaseStorage]:
    """An Optuna storage reading `source` (a journal file, or a database URL, without creating tables); None for a
    journal file that does not exist yet (the sweep has not started: a later look opens it).

    Raises:
        ValueError: the storage cannot be opened (the message has the URL redacted).
    """
    if '://' not in source:
        if not Path(source).is_file():
            return None
        return JournalStorage(JournalFileBackend(source))
    try:
        url, connect_args = database_connection(source)  # the driver never parses the password (lazylab.redaction)
        return RDBStorage(url, engine_kwargs={'connect_args': connect_args}, skip_table_creation=True)
    except Exception as e:  # sqlalchemy's errors: a driver missing, a server that does not answer
        raise ValueError(f'cannot open {redact_url(source)}: '
                         f'{redact(str(e).splitlines()[0] if str(e) else type(e).__name__, [source])}') from None


class SweepStudies(BaseStorage):
    """Every sweep's study under `runs_dir` as one Optuna storage (see the module docstring).

    Args:
        runs_dir: the folder searched for sweeps.
        labml_url: the labml dashboard's address (``http://127.0.0.1:5005``), for each trial's ``labml_url``; ''
            for none.
        rescan_s: seconds between two searches of `runs_dir`.
        warn: where a sweep that cannot be opened is reported, once per sweep (default: stderr).
    """

    def __init__(self, runs_dir: Path, labml_url: str = '', rescan_s: float = RESCAN_S,
                 warn: Optional[Callable[[str], None]] = None):
        self.runs_dir = Path(runs_dir)
        self.labml_url = labml_url.rstrip('/')
        self.rescan_s = rescan_s
        self.warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self._backends: list[BaseStorage] = []
        self._sources: dict[str, int] = {}  # storage source → backend number
        self._seen: set[Path] = set()  # sweep folders opened or reported
        self._scanned = float('-inf')
        self._lock = threading.Lock()
        self._uuids: dict[str, str] = {}  # run dir → labml uuid

    # ---- finding the sweeps ---------------------------------------------------------------------------------------

    def scan(self, force: bool = False) -> None:
        """Open the sweeps under `runs_dir` not opened yet (at most every `rescan_s` seconds unless `force`)."""
        with self._lock:
            if not force and time.monotonic() - self._scanned < self.rescan_s:
                return
            self._scanned = time.monotonic()
            for sweep_dir in find_sweeps(self.runs_dir):
                if sweep_dir in self._seen:
                    continue
                try:
                    source = sweep_storage(sweep_dir)
                    storage = None if source in self._sources else open_storage(source)
                except ValueError as e:
                    self._seen.add(sweep_dir)
                    self.warn(f'lazylab: warning: studies: the sweep {sweep_dir} is not served: {e}')
                    continue
                if source in self._sources:
                    self._seen.add(sweep_dir)
                elif storage is not None:  # else its journal is not there yet: look again later
                    self._seen.add(sweep_dir)
                    self._sources[source] = len(self._backends)
                    self._backends.append(storage)

    def _local(self, gid: int) -> tuple[BaseStorage, int]:
        b, local = gid % SLOTS, gid // SLOTS
        if b >= len(self._backends):
            raise KeyError(f'no study or trial with id {gid}')
        return self._backends[b], local

    @staticmethod
    def _gid(b: int, local: int) -> int:
        return local * SLOTS + b

    def _trial(self, b: int, trial) -> Any:
        out = copy.copy(trial)
        out._trial_id = self._gid(b, trial._trial_id)
        run_dir = trial.user_attrs.get('run_dir')
        if self.labml_url and isinstance(run_dir, str):
            uuid = self._uuid(run_dir)
            if uuid:
                out._user_attrs = {**trial.user_attrs, 'labml_url': f'{self.labml_url}/run/{uuid}'}
        return out

    def _uuid(self, run_dir: str) -> Optional[str]:
        if run_dir not in self._uuids:
            record = runs.read_json(Path(run_dir) / runs.RUN_JSON) or {}
            if not isinstance(record.get('uuid'), str):
                return None  # not written yet: ask again next time
            self._uuids[run_dir] = record['uuid']
        return self._uuids[run_dir]

    # ---- studies --------------------------------------------------------------------------------------------------

    def get_all_studies(self) -> list:
        self.scan()
        out = []
        for b, storage in enumerate(list(self._backends)):
            for study in storage.get_all_studies():
                frozen = copy.copy(study)
                frozen._study_id = self._gid(b, study._study_id)
                out.append(frozen)
        return out

    def create_new_study(self, directions: Sequence, study_name: Optional[str] = None) -> int:
        raise NotImplementedError('lazylab dashboard shows the sweeps\' studies; start a study with lazylab sweep')

    def delete_study(self, study_id: int) -> None:
        raise NotImplementedError('a sweep\'s study is deleted with its sweep folder, not from the dashboard')

    def get_study_id_from_name(self, study_name: str) -> int:
        for study in self.get_all_studies():
            if study.study_name == study_name:
                return study._study_id
        raise KeyError(f'no study named {study_name!r}')

    def get_study_name_from_id(self, study_id: int) -> str:
        storage, local = self._local(study_id)
        return storage.get_study_name_from_id(local)

    def get_study_directions(self, study_id: int) -> list:
        storage, local = self._local(study_id)
        return storage.get_study_directions(local)

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        storage, local = self._local(study_id)
        return storage.get_study_user_attrs(local)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        storage, local = self._local(study_id)
        return storage.get_study_system_attrs(local)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        storage, local = self._local(study_id)
        storage.set_study_user_attr(local, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        storage, local = self._local(study_id)
        storage.set_study_system_attr(local, key, value)

    # ---- trials ---------------------------------------------------------------------------------------------------

    def create_new_trial(self, study_id: int, template_trial=None) -> int:
        storage, local = self._local(study_id)
        return self._gid(study_id % SLOTS, storage.create_new_trial(local, template_trial))

    def get_all_trials(self, study_id: int, deepcopy: bool = True, states: Optional[Container] = None) -> list:
        storage, local = self._local(study_id)
        return [self._trial(study_id % SLOTS, t) for t in storage.get_all_trials(local, deepcopy, states)]

    def get_trial(self, trial_id: int):
        storage, local = self._local(trial_id)
        return self._trial(trial_id % SLOTS, storage.get_trial(local))

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        storage, local = self._local(study_id)
        return self._gid(study_id % SLOTS, storage.get_trial_id_from_study_id_trial_number(local, trial_number))

    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float, distribution) -> None:
        storage, local = self._local(trial_id)
        storage.set_trial_param(local, param_name, param_value_internal, distribution)

    def set_trial_state_values(self, trial_id: int, state, values: Optional[Sequence[float]] = None) -> bool:
        storage, local = self._local(trial_id)
        return storage.set_trial_state_values(local, state, values)

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        storage, local = self._local(trial_id)
        storage.set_trial_intermediate_value(local, step, intermediate_value)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        storage, local = self._local(trial_id)
        storage.set_trial_user_attr(local, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        storage, local = self._local(trial_id)
        storage.set_trial_system_attr(local, key, value)


#: the one key of the studies port's JSON errors, as optuna-dashboard's own ({"reason": "…"}: its page shows it)
ERROR_KEY = 'reason'
#: the requests that only read
READS = ('GET', 'HEAD', 'OPTIONS')
#: the writes the page may make: a study's note, a trial's note (PUT, with the version they replace)
_NOTE = re.compile(r'/api/studies/(\d+)(?:/(\d+))?/note')
_STUDY = re.compile(r'/api/studies/\d+')
READ_ONLY = "the studies are the sweeps' record: this dashboard shows them and keeps notes, nothing else"


def refusal(method: str, path: str) -> Optional[str]:
    """Why the studies port refuses `method` on `path` (a URL path), or None when it serves it: anything but a
    read or a note (see the module docstring)."""
    path = path.rstrip('/')
    if method in READS or (method == 'PUT' and _NOTE.fullmatch(path)):
        return None
    if method == 'DELETE' and _STUDY.fullmatch(path):
        return "a sweep's study is its record: it goes with its sweep folder, not from this dashboard"
    if method == 'POST' and path == '/api/studies':
        return 'a study is started by lazylab sweep, not from this dashboard'
    return READ_ONLY


_DIGITS = re.compile(r'[0-9]+')


def input_problem(environ: dict, storage: BaseStorage) -> Optional[tuple[int, str]]:
    """What is wrong with the input of a request the studies port lets through, as (status, reason); None when
    nothing is. optuna-dashboard reads these unchecked, so each was a 500: a note on a study or trial `storage`
    does not have, a note's body that is not a JSON object of an integer version and a string body (or not sent as
    JSON: the app then sees None), and a study's ``after`` that is not a whole number."""
    method, path = environ['REQUEST_METHOD'], environ.get('PATH_INFO', '').rstrip('/')
    note = _NOTE.fullmatch(path) if method == 'PUT' else None
    if note is not None:
        missing = _missing(storage, int(note[1]), None if note[2] is None else int(note[2]))
        if missing is not None:
            return 404, missing
        if environ.get('CONTENT_TYPE', '').split(';')[0].strip().lower() != 'application/json':
            return 415, 'a note is sent as JSON (Content-Type: application/json)'
        body = environ['wsgi.input']  # the whole body, in memory (serving.WsgiApp): read, then put back for the app
        try:
            sent = json.loads(body.read())
        except ValueError:
            return 400, 'malformed JSON body'
        finally:
            body.seek(0)
        if not (isinstance(sent, dict) and type(sent.get('version')) is int and isinstance(sent.get('body'), str)):
            return 400, 'a note is {"version": INTEGER, "body": STRING}'
    after = parse_qs(environ.get('QUERY_STRING', ''), keep_blank_values=True).get('after')
    if method in READS and _STUDY.fullmatch(path) and after and not _DIGITS.fullmatch(after[-1]):
        return 400, f'after must be a whole number (0 or more), got {after[-1]!r}'
    return None


def _missing(storage: BaseStorage, study_id: int, trial_id: Optional[int]) -> Optional[str]:
    """Why `storage` has no study `study_id` (with a trial `trial_id`), in optuna-dashboard's words; None if it has."""
    try:
        storage.get_study_name_from_id(study_id)
        trials = [] if trial_id is None else storage.get_all_trials(study_id, deepcopy=False)
    except KeyError:
        return f'study_id={study_id} is not found'
    if trial_id is not None and trial_id not in {t._trial_id for t in trials}:
        return f'trial_id={trial_id} is not found in study_id={study_id}'
    return None


class ReadMostly:
    """optuna-dashboard's WSGI app behind :func:`refusal` (403) and :func:`input_problem` (4xx), each with one line
    of JSON, and with its other answers mended: a request without ``Accept-Encoding`` (its static routes read the
    header unchecked: a KeyError, 500) is served uncompressed, which every client accepts; bottle's HTML error
    pages (404, 405, …) are JSON (:func:`json_error_page`), and so is any other 4xx the app answers in text (the
    artifact routes'); an exception reaches the guard outside (500, its traceback logged once)."""

    def __init__(self, app, storage: BaseStorage):
        app.default_error_handler = json_error_page
        app.catchall = False  # (bottle would answer an exception with its HTML page, and log it itself)
        self.app = app
        self.storage = storage

    def __call__(self, environ, start_response):
        reason = refusal(environ['REQUEST_METHOD'], environ.get('PATH_INFO', ''))
        problem = (403, reason) if reason is not None else input_problem(environ, self.storage)
        if problem is not None:
            return _answer_json(start_response, f'{problem[0]} {HTTPStatus(problem[0]).phrase}', [], problem[1])
        environ.setdefault('HTTP_ACCEPT_ENCODING', '')
        head = []
        result = self.app(environ, lambda status, headers, exc_info=None: head.append((status, headers)))
        status, headers = head[-1]  # bottle answers when it returns, and never through write()
        if status.startswith('4') and not any(k.lower() == 'content-type' and v.startswith('application/json')
                                              for k, v in headers):
            try:
                text = b''.join(result).decode('utf-8', 'replace')
            finally:
                if hasattr(result, 'close'):
                    result.close()
            return _answer_json(start_response, status, headers, ' '.join(text.split()) or status[4:])
        start_response(status, headers)
        return result


def _answer_json(start_response, status: str, headers: list, reason: str) -> list[bytes]:
    body = json.dumps({ERROR_KEY: reason}).encode()
    kept = [(k, v) for k, v in headers if k.lower() not in ('content-type', 'content-length', 'content-encoding')]
    start_response(status, kept + [('Content-Type', 'application/json'), ('Content-Length', str(len(body)))])
    return [body]


def json_error_page(error) -> str:
    """bottle's error page (an HTTPError: 404 for no route, 405, …) as one line of JSON."""
    import bottle  # optuna-dashboard's web framework, installed with it (the `dashboard` extra)

    bottle.response.content_type = 'application/json'
    return json.dumps({ERROR_KEY: str(error.body) or error.status_line})


class StudiesServer:
    """optuna-dashboard (its own server API, ``optuna_dashboard.wsgi``) over :class:`SweepStudies`, read-mostly
    (:class:`ReadMostly`), on ``host:port`` in a thread of this process, with the labml port's server and guard
    (:mod:`lazylab.dashboard.serving`: the same token, body limit and head deadline; errors as ``{"reason": …}``).

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(self, runs_dir: Path, host: str, port: int, *, labml_url: str = '',
                 max_body_bytes: int = DEFAULT_MAX_BODY_MB << 20, token: Optional[str] = None,
                 header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S):
        import optuna_dashboard  # the `dashboard` extra, checked by server.require_app

        self.storage = SweepStudies(runs_dir, labml_url)
        self.storage.scan(force=True)
        self.wsgi = WsgiApp(ReadMostly(optuna_dashboard.wsgi(self.storage), self.storage))
        app = RequestGuard(self.wsgi, max_body_bytes, token, error_key=ERROR_KEY)
        bare = host.strip('[]')
        self.server = ServerThread(app, bare, port, header_timeout_s=header_timeout_s, error_key=ERROR_KEY)
        self.url = f'http://[{bare}]:{port}' if ':' in bare else f'http://{bare}:{port}'

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()
        self.wsgi.pool.shutdown(wait=False, cancel_futures=True)
