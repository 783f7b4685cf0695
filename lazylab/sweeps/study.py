"""The Optuna study a sweep keeps its record in: storage, samplers, pruners, and claiming trials exactly once.

Optuna (https://optuna.org) is the study record: each trial of a sweep is an Optuna trial whose params are the
swept values and whose value is the final metric; failed trials keep their one-line error (user attr `error`).
The storage is a journal file (`JournalFileBackend`, the default: SWEEP_DIR/study.journal, or any path, e.g. on a
shared filesystem) or any database URL Optuna accepts (`postgresql://…`, `mysql://…`, `sqlite:///…`).

Every trial of a sweep is created up front as a WAITING trial (`enqueue_trial`): the grid's points with their
params, or `--trials` empty ones whose params the sampler draws when the trial is claimed. A worker claims a
trial by moving it from WAITING to RUNNING (`storage.set_trial_state_values`, which succeeds for one process only,
on a journal file and in a database alike), so with any number of processes and machines each trial runs once.
The process that creates the study enqueues the trials and then records the sweep's signature in the study's
user attrs (`lazylab`); a process that finds the study already there waits for that record and checks that it
runs the same sweep.
"""
import importlib.util
import json
import math
import os
import statistics
import time
from typing import Any, Callable, Optional

from lazylab.errors import UsageError
from lazylab.redaction import StorageURLError, database_connection, redact, redact_url

#: the study's user attr holding the sweep's signature (written last by the process that created the study)
SIGNATURE = 'lazylab'
#: the trial system attr naming the process (owner token) that runs the trial
OWNER = 'lazylab:owner'
#: the environment variable that gives a trial of a pruned sweep its study (JSON: storage, study, number, metric,
#: pruner; in the environment, never on the command line, where `ps` would show a database password)
REPORT_ENV = 'LAZYLAB_SWEEP_REPORT'


def load_optuna():
    """The optuna module, imported on first use (start-up time: `lazylab compare` and the sweep's parser need none)."""
    import optuna  # start-up time (about 0.5 s): see the docstring
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep prints its own line per trial
    return optuna


def open_storage(url_or_file: str):
    """The storage for a journal file path or a database URL (anything with '://').

    Args:
        url_or_file: a journal file's path (made when missing; its folder must exist), or a database URL Optuna
            accepts (`postgresql://…`, `mysql://…`, `sqlite:///…`).

    Raises:
        UsageError: the database cannot be reached or the URL is not one Optuna accepts (its credentials hidden:
            lazylab.redaction); the journal file is a folder or is not an Optuna journal.
    """
    optuna = load_optuna()
    if '://' not in url_or_file:
        from optuna.storages.journal import JournalFileBackend  # (optuna: on first use, as load_optuna)
        _check_journal(url_or_file)
        return optuna.storages.JournalStorage(JournalFileBackend(url_or_file))
    url, connect_args = _connection(url_or_file)
    last: Optional[Exception] = None
    for attempt in range(5):  # two processes creating the schema at once: one of them may fail; try again
        try:
            rdb = optuna.storages.RDBStorage(url, engine_kwargs={'pool_pre_ping': True, 'connect_args': connect_args})
            return optuna.storages.get_storage(rdb)  # Optuna's cached wrapper, as create_study would use
        except ImportError as e:
            raise _driver_error(url_or_file, e) from None
        except Exception as e:  # sqlalchemy's errors (bad URL, refused connection, a concurrent schema creation)
            last = e
            if not any(w in str(e).lower() for w in ('already exists', 'duplicate', 'unique')):
                break
            time.sleep(0.3 * (attempt + 1))
    raise _storage_error(url_or_file, last) from None


def check_storage(url_or_file: str) -> None:
    """What `open_storage` checks, writing nothing (`lazylab sweep --dry-run`): a journal file that is a folder or
    not an Optuna journal; a database that cannot be reached (connected to, and nothing created in it).

    Raises:
        UsageError: as `open_storage`.
    """
    if '://' not in url_or_file:
        _check_journal(url_or_file)
        return
    url, connect_args = _connection(url_or_file)
    try:
        import sqlalchemy  # optuna's dependency; only a --dry-run on a database connects
        from sqlalchemy.pool import NullPool
        engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=connect_args)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except ImportError as e:
        raise _driver_error(url_or_file, e) from None
    except Exception as e:  # sqlalchemy's errors: a bad URL, a refused connection
        raise _storage_error(url_or_file, e) from None


def _connection(url: str) -> tuple[str, dict]:
    """(the URL with no secret in it, the connect_args with them) for SQLAlchemy: the driver never parses a URL
    with a password in it (lazylab.redaction.database_connection says why).

    Raises:
        UsageError: a URL that reads two ways, or a port that is not a number; the message quotes none of it.
    """
    try:
        return database_connection(_with_driver(url))
    except StorageURLError as e:
        raise UsageError(f'--storage: {e}') from None


def _check_journal(path: str) -> None:
    if os.path.isdir(path):
        raise UsageError(f'--storage {path} is a folder; give a journal file or a database URL')
    if not _is_journal(path):
        raise UsageError(f'cannot open the study storage {path}: not an Optuna journal file')


def _driver_error(url: str, e: ImportError) -> UsageError:
    return UsageError(f'storage {redact_url(url)} needs a database driver: {redact(str(e), [url, _with_driver(url)])}'
                      f" (pip install 'lazylab[postgres]' for PostgreSQL)")


def _storage_error(url: str, e: Optional[Exception]) -> UsageError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return UsageError(f'cannot open the study storage {redact_url(url)}: {redact(first, [url, _with_driver(url)])}')


def _is_journal(path: str) -> bool:
    """Whether `path` is missing, empty, or an Optuna journal: every complete line a JSON object, and at least one
    line complete (Optuna writes each record whole, with its newline; it skips an unfinished last line, which
    another process may be writing, so a file of other text would only fail once the sweep appends to it)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return True
    with open(path, 'rb') as f:
        lines = [line for line in f if line.endswith(b'\n')]
    try:
        return bool(lines) and all(isinstance(json.loads(line), dict) for line in lines)
    except ValueError:  # not JSON, or not UTF-8
        return False


def _with_driver(url: str) -> str:
    """postgresql://… with the psycopg2 driver when psycopg (3), SQLAlchemy 2.1's default for that scheme, is not
    installed (lazylab's `postgres` extra installs psycopg2-binary)."""
    scheme, sep, rest = url.partition('://')
    if scheme in ('postgresql', 'postgres') and importlib.util.find_spec('psycopg') is None \
            and importlib.util.find_spec('psycopg2') is not None:
        return f'postgresql+psycopg2{sep}{rest}'
    return url


def make_sampler(kind: str, seed: int):
    """Optuna's sampler for --sampler `kind` ('tpe', else random: a grid's params are fixed when enqueued).

    Args:
        kind: 'grid', 'random' or 'tpe' (TPE with `constant_liar`, so that parallel workers spread out).
        seed: the sampler's seed (--seed).
    """
    optuna = load_optuna()
    if kind == 'tpe':
        # constant_liar: trials still running count as likely-bad, so parallel workers spread out
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    return optuna.samplers.RandomSampler(seed=seed)  # random; the grid's params are fixed when enqueued


def make_pruner(kind: str):
    """Optuna's pruner for --prune `kind`.

    Args:
        kind: 'none': never prunes; 'median': MedianByProgress (below: a trial is stopped at a validation past the
            first quarter of its run where its best metric so far is worse than the median of the finished trials'
            by the same point of theirs); 'halving': SuccessiveHalvingPruner (Optuna's defaults).
    """
    optuna = load_optuna()
    if kind == 'median':
        return MedianByProgress()
    if kind == 'halving':
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


#: a trial reports its metric at the per-mille of its run it has done (lazylab.sweeps.trial.Pruning)
PROGRESS_SCALE = 1000


class MedianByProgress:
    """Optuna's median rule with its steps read as points of the run: a trial's intermediate values are keyed by
    the per-mille of its run done (`PROGRESS_SCALE`; the time budget's share when `max_minutes` decides the run's
    length, else step / total_steps), and a finished trial's value at a point is the last it reported at or
    before it. Where all trials report at the same points this is Optuna's MedianPruner (n_startup_trials=2).

    Optuna's MedianPruner compares trials at equal step numbers. In a sweep under a time budget the trials'
    steps differ in cost by more than 10× (width, depth, batch, seq_len), so at equal steps a small, fast trial has
    seen a fraction of a large one's tokens and is stopped for it, though in its minutes it would take many more
    steps: the first search of scripts/recipes.sh lost 27 of its first 28 trials so, all at their step-30
    calibration validation (the fitted schedule's first point, 8–30 s into a 2-minute trial). Here the comparison
    is at the same share of each trial's budget, and none is judged in its first `warmup` per-mille (a quarter:
    learning-rate warm-ups and the first steps' noise are over by then).

    Args:
        min_finished: finished trials needed before any trial is stopped.
        warmup: per-mille of a run before which it is never stopped.
    """

    def __init__(self, min_finished: int = 2, warmup: int = PROGRESS_SCALE // 4):
        self.min_finished, self.warmup = min_finished, warmup

    def prune(self, study, trial) -> bool:
        """Optuna's pruner interface: whether `trial` (a FrozenTrial, running) stops now."""
        optuna = load_optuna()
        finished = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        point = trial.last_step
        if len(finished) < self.min_finished or point is None or point < self.warmup:
            return False
        mine = [v for v in trial.intermediate_values.values() if not math.isnan(v)]
        if not mine:
            return True  # a diverged metric
        by_then = []
        for other in finished:
            reported = [k for k in other.intermediate_values if k <= point]
            if reported and not math.isnan(value := other.intermediate_values[max(reported)]):
                by_then.append(value)
        if not by_then:
            return False
        median = statistics.median(by_then)
        return min(mine) > median if study.direction == optuna.study.StudyDirection.MINIMIZE else max(mine) < median


class Study:
    """One sweep's Optuna study, as a worker uses it.

    Args:
        storage: from `open_storage`.
        name: the study name.
        direction: 'minimize' or 'maximize'.
        sampler, pruner: see `make_sampler`, `make_pruner`.
    """

    def __init__(self, storage, name: str, direction: str, sampler, pruner):
        self.storage, self.name = storage, name
        self.optuna = optuna = load_optuna()
        self.created = True
        try:
            self.study = optuna.create_study(storage=storage, study_name=name, direction=direction,
                                             sampler=sampler, pruner=pruner, load_if_exists=False)
        except optuna.exceptions.DuplicatedStudyError:
            self.created = False
            self.study = optuna.load_study(storage=storage, study_name=name, sampler=sampler, pruner=pruner)
        self.study_id = storage.get_study_id_from_name(name)
        if not self.created and self.study.direction.name.lower() != direction:
            raise UsageError(f'study {name} maximizes/minimizes the other way ({self.study.direction.name.lower()})')

    def enqueue(self, points: list[dict[str, Any]], signature: dict[str, Any],
                say: Optional[Callable[[str], None]] = None) -> None:
        """(The creating process) add one WAITING trial per point, then the signature that says they are there.
        `say` gets a line every few seconds (a journal file syncs each trial to disk: thousands take a while)."""
        last = time.monotonic()
        for i, params in enumerate(points):
            if say is not None and time.monotonic() - last >= 5.0:
                say(f'recording trial {i + 1:,} of {len(points):,} in the study…')
                last = time.monotonic()
            self.study.enqueue_trial(params, user_attrs={'lazylab.point': i})
        self.study.set_user_attr(SIGNATURE, signature)

    def wait_for_signature(self, timeout: float = 120.0) -> dict[str, Any]:
        """(A joining process) the signature the creating process records once it has enqueued the trials.

        Raises:
            UsageError: none came within `timeout` seconds (not a lazylab study, or its creator died early).
        """
        deadline = time.monotonic() + timeout
        while True:
            attrs = self.storage.get_study_user_attrs(self.study_id)
            if SIGNATURE in attrs:
                return attrs[SIGNATURE]
            if time.monotonic() > deadline:
                raise UsageError(f'study {self.name} exists but holds no lazylab sweep (no {SIGNATURE!r} record '
                                 f'after {timeout:.0f} s); give another --study name')
            time.sleep(0.2)

    def trials(self, states=None) -> list:
        """The study's trials (in the given Optuna TrialStates only, when `states`), not copied."""
        return self.storage.get_all_trials(self.study_id, deepcopy=False, states=states)

    def claim(self, before: Optional[Callable[[int], None]] = None) -> Optional[Any]:
        """Move the first WAITING trial (by number) to RUNNING, as this process only; None when none is left.
        `before(number)` is called before each attempt (lazylab.sweeps.owners records the claim)."""
        TrialState = self.optuna.trial.TrialState
        for t in sorted(self.trials((TrialState.WAITING,)), key=lambda t: t.number):
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, t.number)
            if before is not None:
                before(t.number)
            try:
                if self.storage.set_trial_state_values(trial_id, state=TrialState.RUNNING):
                    return self.optuna.trial.Trial(self.study, trial_id)
            except self.optuna.exceptions.UpdateFinishedTrialError:
                continue
        return None

    def trial(self, number: int):
        """The Trial object of a RUNNING trial (one taken over from a process that died)."""
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        return self.optuna.trial.Trial(self.study, trial_id)

    def set_owner(self, number: int, token: str) -> None:
        """Tag trial `number` with the owner token of the process that runs it."""
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        self.storage.set_trial_system_attr(trial_id, OWNER, token)

    def set_user_attr(self, number: int, key: str, value: Any) -> None:
        """Set a user attr of trial `number` (what optuna-dashboard shows: its run directory, its status)."""
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        self.storage.set_trial_user_attr(trial_id, key, value)

    def tell(self, number: int, state: str, value: Optional[float] = None) -> None:
        """Finish a trial: 'completed' with its value, 'pruned' (Optuna takes the last reported value), 'failed'."""
        TrialState = self.optuna.trial.TrialState
        if state == 'completed':
            self.study.tell(number, value)
        else:
            self.study.tell(number, state=TrialState.PRUNED if state == 'pruned' else TrialState.FAIL)
