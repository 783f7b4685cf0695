"""The one module of lazylab that reaches into labml's private API (``labml.internal.*``, labml 0.5.3).

labml has no public hook for another configuration engine, for a writer of its tracker, for its console, or for
where a created run lives; lazylab needs each (``lazylab labml``, the trainer's labml records, the dashboard's
client). Everything that touches labml's internals is a small function or class here, and each assumption is
pinned by ``tests/test_labml_internals.py``, which fails with the assumption's name on another labml version (run
it after upgrading labml). labml's public API (``labml.experiment``, ``labml.tracker``, ``labml.lab``) is used
where it is, not here. labml_app's internals (the dashboard's server) are patched in
:mod:`lazylab.dashboard.labml_patches`, the dashboard's one place for labml_app.

- **L1 the experiment**: ``labml.internal.experiment.experiment_singleton()`` (``has_experiment()``) keeps
  ``configs_processor``, ``is_started``, ``run`` (a ``RunInfo``: ``uuid``, ``name``, ``run_path``,
  ``configs_path``, ``checkpoint_path``) and ``finish(status)``.
- **L2 the configs processor**: ``Experiment.calc_configs`` keeps a ``ConfigProcessor`` as ``configs_processor``;
  ``Experiment.start()`` adds its savers (labml's configs.yaml, the app) with ``add_saver``, which calls
  ``to_json()``: ``configs_dict``, ``configs`` (``_to_json``, ``_get_computed``, ``_set_values``,
  ``_set_update_callback``), ``values``, ``savers``. ``DynamicHyperParam.register(path)``; labml_nn imports
  ``FloatDynamicHyperParam`` / ``IntDynamicHyperParam`` from ``labml.internal.configs.dynamic_hyperparam``.
- **L3** ``global_params_singleton().configs``: labml's own command-line overrides.
- **L4 the lab**: ``labml.internal.lab._internal`` is the process's ``Lab``; ``lab_singleton().
  set_configurations`` settings survive the ``set_path(python_file)`` that ``experiment.create`` does, and an
  absolute ``experiments_path`` / ``data_path`` is used as given.
- **L5 tracker writers**: a ``labml.internal.tracker.writers.Writer`` gets ``write(global_step=, indicators=)`` on
  each ``tracker.save()``; ``NumericIndicator.get_mean()``; ``Experiment.start()`` resets the writers.
- **L6 indicators**: ``Indicator(name=, is_print=, options=)`` with ``collect_value``, ``clear``, ``is_empty``,
  ``copy``; ``Scalar``'s ``_values`` / ``_merge``; ``tracker_singleton().add_indicator``, ``.indicators``,
  ``.dot_indicators``.
- **L7** the watcher ``Experiment.start()`` returns ends the run with ``finish('completed' | 'interrupted' |
  'crashed')`` in ``__exit__``; ``monitor_singleton().finish_loop()`` closes a loop left open.
- **L8** labml's notices about a missing ``.labml.yaml`` and git repository go through the module globals
  ``labml.internal.lab.labml_notice`` and ``labml.internal.experiment.labml_notice``.
- **L9** ``get_caller_file(ignore_callers)`` names the script that called ``experiment.create``.
- **L10** ``Computer.get_projects`` reads ``~/.labml/projects/*.txt`` (two runs starting at once race on it).
- **L11** importing ``labml.internal.app.logs`` makes labml send the console to the app.
- **L12 the app client**: ``labml.internal.app.AppTracker(app_track_url, params, *, timeout_seconds, daemon)``
  makes its ``_AppTrackThread`` in ``self.thread`` in ``_check()``; ``labml.internal.app.experiment`` constructs
  ``AppUrlResponseHandler(open_browser, label)`` through its own module's name.
- **L13 the console**: ``logger_singleton()._Logger__destinations`` get every line as ``log(parts, *,
  is_new_line, is_reset)``, parts ``(text, StyleCode or None)``; a loop's time part is one part
  ``'  0:01m/ 16:10m  '`` (spent / left, :data:`LOOP_TIME`).
- **L15 the file writer**: ``labml.internal.tracker.writers.file.FileWriterThread`` (a non-daemon thread) writes
  each packet in ``_send(data)`` to ``file_path`` and ends on the 'done' that the writer's ``finish()`` queues;
  ``tracker_singleton().finish_loop()`` calls every writer's ``finish()``; the writers are the tracker's
  ``_Tracker__writers``, a file writer's thread its ``thread``.
- **L16 labml's config class**: ``labml.configs.BaseConfigs`` is an empty subclass of
  ``labml.internal.configs.base.Configs``; code may declare config classes on the latter directly (labml's own tests
  do); labml's modules that use the class
  (``labml.internal.configs.processor``, ``labml.internal.experiment``) bind it when they are imported.
- **L17 the app client's console**: ``labml.internal.app`` and ``labml.internal.app.url`` print through their
  module's name ``logger`` (``logger.log(text or parts, style, is_new_line=)``), coloured and padded for a terminal.
- **L14** a created run's paths are ``Path`` attributes of ``Experiment`` (``experiment_path``) and its
  ``RunInfo`` under the lab's ``experiments`` folder, made only at ``Experiment.start()``.
"""
import contextlib
import functools
import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

# late imports: labml's private modules are imported where each is used: importing lazylab never imports labml (the
# CLI's start-up), and a test can pin each one alone

#: the labml version every assumption above is pinned to
LABML_VERSION = '0.5.3'

#: L13: the part of a loop's progress line giving the minutes spent and left (labml's Loop.log_progress)
LOOP_TIME = re.compile(r'\s*\d+:\d\dm/\s*\d+:\d\dm\s*')


# ---- L1 the experiment --------------------------------------------------------------------------------------------

def experiment() -> Any:
    """labml's Experiment of this process (the one ``experiment.create`` made last), or None."""
    from labml.internal.experiment import experiment_singleton, has_experiment
    return experiment_singleton() if has_experiment() else None


def is_started() -> bool:
    """Whether labml's experiment has been started (``experiment.start()``)."""
    exp = experiment()
    return exp is not None and exp.is_started


def run_info() -> Any:
    """labml's ``RunInfo`` of the experiment created last (``uuid``, ``name``, ``run_path``, ``configs_path``,
    ``checkpoint_path``)."""
    from labml.internal.experiment import experiment_singleton
    return experiment_singleton().run


def finish_experiment(status: str) -> None:
    """End labml's run (status 'completed', 'interrupted' or 'crashed') when it is started and still open, and close
    labml's monitor loop a run stopped mid-loop leaves open (so later output prints normally)."""
    if is_started():
        experiment().finish(status)
    from labml.internal.monitor import monitor_singleton
    with contextlib.suppress(RuntimeError):
        monitor_singleton().finish_loop()


def move_run(experiments_path: Path) -> None:
    """Put the created (not yet started) run under ``experiments_path`` instead (L4, L14): the lab's experiments
    folder, and every path of the experiment and its run that was under the old one."""
    exp = experiment()
    old = Path(exp.experiment_path).parent
    new = Path(experiments_path)
    set_lab({'experiments_path': str(new)})
    for owner in (exp, exp.run):
        for name, value in list(vars(owner).items()):
            if isinstance(value, Path) and (value == old or old in value.parents):
                setattr(owner, name, new / value.relative_to(old))


# ---- L2, L3 the configs processor ---------------------------------------------------------------------------------

def configs_processor() -> Any:
    """The ConfigProcessor labml keeps for the experiment (None: ``experiment.configs`` was not called yet)."""
    from labml.internal.experiment import experiment_singleton
    return experiment_singleton().configs_processor


def set_configs_processor(processor: Any) -> None:
    from labml.internal.experiment import experiment_singleton
    experiment_singleton().configs_processor = processor


def global_configs() -> dict[str, Any]:
    """labml's own command-line overrides (L3), {} when there are none."""
    from labml.internal.experiment import global_params_singleton
    return dict(global_params_singleton().configs or {})


def configs_base_module() -> Any:
    """The module whose ``Configs`` is labml's own config class (L16), with labml's modules that use the class
    imported first, so they keep labml's class when the module's ``Configs`` is replaced (the engine switch)."""
    importlib.import_module('labml.internal.configs.processor')
    importlib.import_module('labml.internal.experiment')
    return importlib.import_module('labml.internal.configs.base')


def dynamic_hyperparam(name: str) -> Any:
    """``FloatDynamicHyperParam`` / ``IntDynamicHyperParam`` (labml_nn imports them from ``labml.configs``)."""
    return getattr(importlib.import_module('labml.internal.configs.dynamic_hyperparam'), name)


def config_processor(configs: Any, values: dict[str, Any], computed: Callable[[Any], dict[str, Any]]) -> Any:
    """labml's ConfigProcessor over a config object of another engine (L2), whose ``values`` are applied already:
    labml's savers get ``configs._to_json()`` whenever the config reports an update, and ``computed(configs)`` (the
    computed items by dotted path) gives the values labml asks for and its dynamic hyper-parameters."""
    return _processor_class()(configs, values, computed)


@functools.cache
def _processor_class() -> type:
    from labml.internal.configs.dynamic_hyperparam import DynamicHyperParam
    from labml.internal.configs.processor import ConfigProcessor

    class ForeignConfigProcessor(ConfigProcessor):
        def __init__(self, configs: Any, values: dict[str, Any], computed: Callable[[Any], dict[str, Any]]):
            # Not ConfigProcessor.__init__: it takes only labml's own Configs.
            self.configs_dict = None
            self.configs = configs
            self.values = dict(values)
            self.savers = []
            self._computed = computed
            configs._set_update_callback(self._on_configs_updated)

        def _on_configs_updated(self):
            self._register_dynamic_hyper_params()
            configs = self.to_json()
            for s in self.savers:
                s.save(configs)

        def _register_dynamic_hyper_params(self):
            for path, value in self._computed(self.configs).items():
                if isinstance(value, DynamicHyperParam):
                    value.register(path)

        def get_value(self, key):
            return self._computed(self.configs).get(key)

    return ForeignConfigProcessor


# ---- L4, L8, L9, L10, L11 the lab and the experiment's start-up ---------------------------------------------------

def new_lab(path: Path) -> None:
    """A fresh labml lab for the project folder ``path`` (its ``.labml.yaml``, if any, is read), without labml's
    notices about a missing ``.labml.yaml`` or git repository."""
    import labml.internal.lab as labml_lab
    with quiet_labml_notices():
        labml_lab._internal = labml_lab.Lab(path=Path(path))


def set_lab(settings: dict[str, Any]) -> None:
    """Lab settings (``path``, ``experiments_path``, ``data_path``, ``app_url``, …) over the current ones (L4)."""
    from labml.internal.lab import lab_singleton
    lab_singleton().set_configurations(settings)


@contextlib.contextmanager
def quiet_labml_notices() -> Iterator[None]:
    """Drop labml's notices about a missing ``.labml.yaml`` and git repository (L8): under lazylab the lab's paths
    are set explicitly, and a run directory is never a repository."""
    import labml.internal.experiment as labml_experiment
    import labml.internal.lab as labml_lab
    saved = labml_lab.labml_notice, labml_experiment.labml_notice

    def notice(message, **kwargs):
        parts = [message] if isinstance(message, str) else message
        text = ''.join(p if isinstance(p, str) else str(p[0]) for p in parts)
        if '.labml.yaml' not in text and 'git' not in text.lower():
            saved[0](message, **kwargs)

    labml_lab.labml_notice = labml_experiment.labml_notice = notice
    try:
        yield
    finally:
        labml_lab.labml_notice, labml_experiment.labml_notice = saved


def ignoring_caller(kwargs: dict[str, Any], file: str) -> dict[str, Any]:
    """``experiment.create``'s keyword arguments with ``file``'s frames skipped when labml looks for the calling
    script (L9)."""
    return {**kwargs, 'ignore_callers': set(kwargs.get('ignore_callers') or ()) | {file}}


def tolerate_concurrent_runs() -> None:
    """labml keeps a list of projects in ~/.labml/projects/*.txt, and each run's start reads every file there and
    removes those of folders gone; two runs starting at once (a sweep's workers) race on it, and the one that finds a
    file just removed by the other fails with FileNotFoundError. Reading the list here skips such files (L10)."""
    from labml.internal.computer import configs as computer_configs
    if getattr(computer_configs.Computer.get_projects, '_lazylab', False):
        return

    def get_projects(self) -> set:
        projects = set()
        for p in list(self.projects_folder.iterdir()):
            try:
                project_path = p.read_text()
            except OSError:  # removed by another run meanwhile
                continue
            if project_path in projects or not Path(project_path).exists():
                p.unlink(missing_ok=True)
            else:
                projects.add(project_path)
        return projects

    get_projects._lazylab = True
    computer_configs.Computer.get_projects = get_projects


def send_console_to_app() -> None:
    """labml's app writer sends the console to the dashboard by patching ``sys.stdout.write`` when
    ``labml.internal.app.logs`` is first imported (L11): import it now, before any redirection of stdout."""
    importlib.import_module('labml.internal.app.logs')


# ---- L5, L6 the tracker -------------------------------------------------------------------------------------------

def add_writer(writer: Any) -> None:
    from labml.internal.tracker import tracker_singleton
    tracker_singleton().add_writer(writer)


def tracker_writer(write: Callable[[int, dict[str, float], dict[str, list[str]]], None],
                   finish: Callable[[], None] = lambda: None) -> Any:
    """A labml tracker writer (L5) calling ``write(global_step, means, texts)`` on each ``tracker.save()``: the mean
    of each numeric indicator with values, and the strings of each text indicator (:func:`text_indicator`) with
    some; ``finish()`` when labml's run finishes."""
    from labml.internal.tracker.indicators.numeric import NumericIndicator
    from labml.internal.tracker.writers import Writer

    class CallbackWriter(Writer):
        def write(self, *, global_step: int, indicators: dict[str, Any]):
            means, texts = {}, {}
            for name, ind in indicators.items():
                if ind.is_empty():
                    continue
                if isinstance(ind, NumericIndicator):
                    means[name] = ind.get_mean()
                elif isinstance(ind, _text_class()):
                    texts[name] = list(ind.values)
            write(int(global_step), means, texts)

        def finish(self):
            finish()

    return CallbackWriter()


def add_indicator(indicator: Any) -> None:
    from labml.internal.tracker import tracker_singleton
    tracker_singleton().add_indicator(indicator)


def has_indicator(key: str) -> bool:
    """Whether labml's tracker has an indicator (or an indicator pattern) named ``key`` (L6)."""
    from labml.internal.tracker import tracker_singleton
    tracker = tracker_singleton()
    return key in tracker.indicators or key in tracker.dot_indicators


def has_unsaved_values() -> bool:
    """Whether any indicator of labml's tracker holds values not saved yet (L6: ``tracker.save()`` writes and
    clears them)."""
    from labml.internal.tracker import tracker_singleton
    return any(not ind.is_empty() for ind in tracker_singleton().indicators.values())


def text_indicator(name: str, is_print: bool = False) -> Any:
    """labml 0.4's text indicator (labml 0.5 dropped it): collects strings, which numeric writers skip."""
    return _text_class()(name, is_print)


def dropped_indicator(name: str) -> Any:
    """A text indicator that keeps nothing (values of a kind labml 0.5.3 cannot record)."""
    return _dropped_class()(name, False)


def queue_indicator(name: str, queue_size: int = 10, is_print: bool = False) -> Any:
    """labml 0.4's queue indicator: the mean of the last ``queue_size`` values, kept across saves."""
    return _queue_class()(name, queue_size, is_print)


@functools.cache
def _text_class() -> type:
    from labml.internal.tracker.indicators import Indicator

    class Text(Indicator):
        def __init__(self, name: str, is_print: bool = False):
            super().__init__(name=name, is_print=is_print, options=None)
            self.values: list[str] = []

        def collect_value(self, value):
            self.values.append(str(value))

        def clear(self):
            self.values = []

        def is_empty(self) -> bool:
            return not self.values

        def copy(self, key: str):
            return type(self)(key, self.is_print)

    return Text


@functools.cache
def _dropped_class() -> type:
    class Dropped(_text_class()):
        def collect_value(self, value):
            pass

    return Dropped


@functools.cache
def _queue_class() -> type:
    from labml.internal.tracker.indicators.numeric import Scalar

    class Queue(Scalar):
        def __init__(self, name: str, queue_size: int = 10, is_print: bool = False, options=None):
            super().__init__(name, is_print, options)
            self.queue_size = queue_size

        def collect_value(self, value):
            super().collect_value(value)
            self._values = [self._merge()[-self.queue_size:]]

        def clear(self):
            pass  # a queue keeps its last values from one save to the next

        def copy(self, key: str):
            return Queue(key, self.queue_size, self.is_print, self.options)

    return Queue


# ---- L7 the watcher -----------------------------------------------------------------------------------------------

class Watcher:
    """labml's run watcher (what ``experiment.start()`` returns, L7), plus: an exception of type ``stop`` ends the
    run as 'completed' and is swallowed (a step limit is no error); ``on_exit(exception type or None)`` first."""

    def __init__(self, inner: Any, on_exit: Callable[[Optional[type]], None], stop: type):
        self._inner = inner
        self._on_exit = on_exit
        self._stop = stop

    def __enter__(self):
        return self._inner.__enter__()

    def __exit__(self, exc_type, exc, tb):
        stopped = exc_type is not None and issubclass(exc_type, self._stop)
        self._on_exit(exc_type)
        if stopped:
            self._inner.__exit__(None, None, None)
            return True
        return self._inner.__exit__(exc_type, exc, tb)


# ---- L15 the file writer ------------------------------------------------------------------------------------------

#: the first OSError labml's file-writer thread met (see `guard_file_writer`), or None
_FILE_WRITER_FAILURE: list[OSError] = []


def guard_file_writer() -> None:
    """Make labml's file writer survive a write that fails (L15: ``labml.internal.tracker.writers.file.
    FileWriterThread`` appends each packet to the run's log in ``_send``, on a non-daemon thread that ends only on
    the 'done' its writer's ``finish()`` queues). Unguarded, a read-only or full disk kills that thread with a
    traceback of its own and the run goes on blind; worse, labml's ``Experiment.finish`` then fails on its own
    ``run_log.jsonl`` before it queues 'done', and the process hangs at exit waiting for the thread. Guarded, the
    thread records the first failure (`file_writer_failure`), drops what it cannot write and keeps serving its
    queue until 'done'. Idempotent."""
    from labml.internal.tracker.writers import file as labml_file_writer

    thread_class = labml_file_writer.FileWriterThread
    if getattr(thread_class, '_lazylab_guarded', False):
        return
    send = thread_class._send

    def guarded_send(self, data):
        if _FILE_WRITER_FAILURE:
            return  # the disk failed once already: the run is ending with that error
        try:
            send(self, data)
        except OSError as e:
            if e.filename is None:
                e.filename = str(self.file_path)
            _FILE_WRITER_FAILURE.append(e)

    thread_class._send = guarded_send
    thread_class._lazylab_guarded = True


def file_writer_failure() -> Optional[OSError]:
    """The OSError labml's guarded file writer met (`guard_file_writer`), or None."""
    return _FILE_WRITER_FAILURE[0] if _FILE_WRITER_FAILURE else None


def reset_file_writer_failure() -> None:
    """Forget a failure of an earlier run in this process (a new run starts clean)."""
    _FILE_WRITER_FAILURE.clear()


def wait_for_file_writer(timeout: float) -> None:
    """Wait (at most `timeout` seconds) for labml's file-writer threads to write what they were given and end (L15):
    after a run's `finish`, so that its labml records are whole when the run's function returns (a caller in the
    same process reads them next), and so that a failed write is known before the run is said to have ended."""
    from labml.internal.tracker import tracker_singleton
    from labml.internal.tracker.writers import file as labml_file_writer
    for writer in tracker_singleton()._Tracker__writers:
        thread = getattr(writer, 'thread', None)
        if isinstance(writer, labml_file_writer.Writer) and thread is not None and thread.is_alive():
            thread.join(timeout)


def finish_writers() -> None:
    """Queue the end for every writer of labml's tracker (its file writer's thread then ends), as a finished run
    does (L7, L15): for a run whose ``Experiment.finish`` failed before it got there."""
    from labml.internal.tracker import tracker_singleton
    tracker_singleton().finish_loop()


# ---- L12 the app client -------------------------------------------------------------------------------------------

def patch_client_upload_thread(sink: list) -> None:
    """Make labml's upload threads daemons, and append each one to `sink` when it starts (L12).

    labml retries a failed upload forever (sleeping 10 s, 20 s, …) on a non-daemon thread, so a dashboard that goes
    away mid-run would keep a finished training process alive; as daemons they cannot, and the caller waits for the
    threads in `sink` at exit for a bounded time instead.
    """
    import labml.internal.app as labml_client

    class DaemonAppTracker(labml_client.AppTracker):
        def __init__(self, app_track_url, params, *, timeout_seconds=15, daemon=True):
            super().__init__(app_track_url, params, timeout_seconds=timeout_seconds, daemon=True)

        def _check(self) -> bool:
            ok = super()._check()
            if self.thread is not None and self.thread not in sink:
                sink.append(self.thread)
            return ok

    labml_client.AppTracker = DaemonAppTracker


def patch_client_console(say: Callable[[str], None]) -> None:
    """Route the lines labml's app client prints (L17: "Monitor experiment at URL", "Still updating labml server",
    "Updating App. Please wait...", "Retrying again in …") to `say(text)`, as plain text: labml writes them with
    ANSI colours, carriage returns and a hundred spaces of padding, which a log file keeps."""
    import labml.internal.app as labml_client
    import labml.internal.app.url as labml_client_url

    class PlainConsole:
        @staticmethod
        def log(message: Any = '', *_style: Any, **_options: Any) -> None:
            parts = [message] if isinstance(message, str) else list(message or [])
            say(''.join(p if isinstance(p, str) else str(p[0]) for p in parts))

    labml_client.logger = PlainConsole
    labml_client_url.logger = PlainConsole


def patch_client_browser() -> None:
    """Stop labml from opening a web browser on the run's page; it still prints the page's URL (L12)."""
    import labml.internal.app.experiment as labml_client_experiment

    class PrintOnlyUrlHandler(labml_client_experiment.AppUrlResponseHandler):
        def __init__(self, open_browser: bool, label: str):
            super().__init__(False, label)

    labml_client_experiment.AppUrlResponseHandler = PrintOnlyUrlHandler


# ---- L13 the console ----------------------------------------------------------------------------------------------

#: what hook_console's `on_log` gets: (parts as (text, style or None), is_new_line, is_reset, write as labml would)
ConsoleHook = Callable[[list[tuple[str, Any]], bool, bool, Callable[[list[tuple[str, Any]], bool, bool], None]],
                       None]


def hook_console(on_log: ConsoleHook) -> Callable[[], None]:
    """Hand every line labml's logger writes to ``on_log(parts, is_new_line, is_reset, labml_write)`` instead of
    labml's console (L13); ``labml_write(parts, is_new_line, is_reset)`` writes parts as labml would have (colours,
    redrawn lines). Returns the function that puts labml's console back."""
    from labml.internal.logger import logger_singleton
    from labml.internal.logger.destinations import Destination
    destinations = logger_singleton()._Logger__destinations
    saved = list(destinations)

    def labml_write(parts, is_new_line, is_reset):
        for d in saved:
            d.log(parts, is_new_line=is_new_line, is_reset=is_reset)

    class Hooked(Destination):
        def log(self, parts, *, is_new_line: bool, is_reset: bool):
            tuples = [(p, None) if isinstance(p, str) else (p[0], p[1]) for p in parts]
            on_log(tuples, is_new_line, is_reset, labml_write)

    destinations[:] = [Hooked()]

    def restore() -> None:
        destinations[:] = saved

    return restore
