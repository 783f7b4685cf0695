"""The one place lazylab reaches into labml: labml's experiment API taking lazylab configs, and the gaps between
labml 0.5.3 and the labml_nn 0.5.1 / labml-helpers 0.4.89 code that calls it.

labml has no hook for another configuration engine, so this module wraps labml's public functions and subclasses
two of its classes. Every assumption it makes about labml's internals is listed here, and each is pinned by a test
in ``tests/labml/test_adapter.py`` (run it after upgrading labml):

- **A1** ``labml.experiment.configs(conf, overrides)`` checks ``isinstance(conf, labml.configs.BaseConfigs)``, then
  ``Experiment.calc_configs`` builds a ``ConfigProcessor`` and keeps it as ``experiment_singleton().
  configs_processor``; ``Experiment.start()`` adds its savers to it (labml's ``configs.yaml``, the app). For a
  lazylab config :func:`configs` builds :class:`LazylabConfigProcessor` and sets it there itself.
- **A2** ``ConfigProcessor`` reaches the config object through ``_set_update_callback``, ``_set_values``,
  ``_to_json`` and ``_get_computed`` (lazylab's ``BaseConfigs`` has all four) and ``_register_dynamic_hyper_params``
  (it has not; the subclass registers ``DynamicHyperParam`` values itself).
- **A3** ``labml.internal.experiment.global_params_singleton().configs``: labml's own command-line overrides,
  merged over the script's dict.
- **A4** Settings given with ``lab_singleton().set_configurations`` survive the ``set_path(python_file)`` that
  ``experiment.create`` does; an absolute ``experiments_path`` / ``data_path`` is used as given.
- **A5** Tracker writers: a ``labml.internal.tracker.writers.Writer`` gets ``write(global_step=, indicators=)`` on
  every ``tracker.save()`` (``NumericIndicator.get_mean()`` gives a value); ``Experiment.start()`` resets the
  writer list, so :class:`MetricsWriter` is added after it. Writers skip indicators that are not numeric.
- **A6** ``get_caller_file(ignore_callers)`` names the script that called ``experiment.create``; this module's
  frames are skipped by adding its file to ``ignore_callers``.
- **A7** The watcher ``Experiment.start()`` returns ends the run with ``Experiment.finish('completed' |
  'interrupted' | 'crashed')`` in its ``__exit__``.
- **A8** labml's notices about a missing ``.labml.yaml`` and a missing git repository go through the module
  globals ``labml.internal.lab.labml_notice`` and ``labml.internal.experiment.labml_notice``.

Gaps filled (labml 0.5.3 lacks what the older code calls; each only when missing): ``experiment.add_pytorch_models``
and ``experiment.save_checkpoint`` (labml_nn's scripts and labml-helpers' training loop), ``tracker.debug``
(labml_nn's ``MultiHeadAttention``), ``tracker.set_text`` and text values (labml_nn's ``NLPAutoRegressionConfigs``
samples), ``tracker.set_queue`` (a moving mean) and ``tracker.set_image`` (images are dropped: labml 0.5 records
none). ``tracker.add(name, nn.Module)`` (labml-helpers' parameter logging) raises ``ValueError: Unknown type``
in labml 0.5.3; such values are skipped with one notice.
"""
import contextlib
import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

# The attributes install() replaced: (module, name) -> the original (None when the name was missing).
_ORIGINAL: dict[tuple[Any, str], Any] = {}
_SYS_MODULES = 'sys.modules'  # stands for sys.modules (a dict, so not a key) in _ORIGINAL
# The active `lazylab labml` run (see lazylab.labml.session), or None: the wrappers then only add lazylab configs.
SESSION: Any = None


def is_lazylab_configs(value: Any) -> bool:
    return getattr(type(value), '_lazylab_is_configs', False)


# ---- the configuration engine switch ------------------------------------------------------------------------------

def switch_configs_module() -> None:
    """Serve ``labml.configs`` from :mod:`lazylab.labml.configs` (for modules imported from now on)."""
    import labml
    import labml.configs as labml_configs

    from lazylab.labml import configs as served
    if sys.modules.get('labml.configs') is served:
        return
    served.LABML_CONFIGS = labml_configs
    _ORIGINAL.setdefault((_SYS_MODULES, 'labml.configs'), labml_configs)
    _ORIGINAL.setdefault((labml, 'configs'), labml_configs)
    sys.modules['labml.configs'] = served
    labml.configs = served


# ---- A1, A2, A3: experiment.configs ------------------------------------------------------------------------------

@functools.cache
def _labml_processor_class():
    from labml.internal.configs.processor import ConfigProcessor

    class LazylabConfigProcessor(ConfigProcessor):
        """labml's ConfigProcessor over a lazylab config (A2): labml's savers get lazylab's ``_to_json()``."""

        def __init__(self, configs: Any, values: dict[str, Any]):
            # Not ConfigProcessor.__init__: it takes only labml's own Configs. The values are already applied.
            self.configs_dict = None
            self.configs = configs
            self.values = dict(values)
            self.savers = []
            configs._set_update_callback(self._on_configs_updated)

        def _on_configs_updated(self):
            self._register_dynamic_hyper_params()
            configs = self.to_json()
            for s in self.savers:
                s.save(configs)

        def _register_dynamic_hyper_params(self):
            from labml.internal.configs.dynamic_hyperparam import DynamicHyperParam
            for path, value in computed_values(self.configs).items():
                if isinstance(value, DynamicHyperParam):
                    value.register(path)

        def get_value(self, key):
            return computed_values(self.configs).get(key)

    return LazylabConfigProcessor


def computed_values(conf: Any) -> dict[str, Any]:
    """Every computed item of a lazylab config by dotted path (sub-configs' items included)."""
    from lazylab.configs.engine.report import walk
    from lazylab.configs.engine.state import state_of
    return {path: st.cache[key] for path, st, key in walk(state_of(conf)) if key in st.cache}


def configs(*args: Any) -> None:
    """``labml.experiment.configs`` that also takes a lazylab config: ``configs(conf)``, ``configs(conf, dict)``.

    Anything else goes to labml's own function unchanged. As in labml, the dict (with labml's own command-line
    overrides, A3, over it) is applied with ``conf._set_values``; under ``lazylab labml`` the session applies the
    command line's ``key=value`` on top of it.

    Raises:
        RuntimeError: a call labml rejects too (wrong arguments, no experiment created, a second config object).
        ConfigError: an unknown key, a bad value or an unknown option (one line; nothing is applied).
    """
    if not args or not is_lazylab_configs(args[0]):
        if SESSION is not None and args:
            SESSION.check_not_lazylab(args[0])
        return _ORIGINAL[(_experiment_module(), 'configs')](*args)
    from labml.internal.experiment import experiment_singleton, global_params_singleton
    conf, overrides = args[0], {}
    if len(args) == 2 and isinstance(args[1], dict):
        overrides = args[1]
    elif len(args) != 1:
        raise RuntimeError('Invalid call to calculate configs')
    exp = experiment_singleton()
    if exp.configs_processor is not None:
        raise RuntimeError('experiment.configs takes one config object; later calls take a dict of updates')
    values = dict(overrides)
    values.update(global_params_singleton().configs or {})
    if SESSION is not None:
        SESSION.apply_configs(conf, values)
    else:
        conf._set_values(values)
    exp.configs_processor = _labml_processor_class()(conf, values)


def save_configs() -> None:
    """Send the current configs to labml's savers once more (labml's configs.yaml, the app): the last items
    computed inside a sub-config trigger no update of their own."""
    from labml.internal.experiment import experiment_singleton, has_experiment
    if has_experiment() and experiment_singleton().configs_processor is not None:
        experiment_singleton().configs_processor._on_configs_updated()


# ---- A4, A6, A8: experiment.create --------------------------------------------------------------------------------

def configure_lab(experiments_path: Path, data_path: Path, fresh: bool = True) -> None:
    """Point labml's lab at the working directory (its git state is recorded; its ``.labml.yaml``, if any, is read),
    with labml's run folders under ``experiments_path`` and its data under ``data_path`` (A4). ``fresh``: start
    from a new lab (else only add these settings, which win over earlier ones)."""
    import labml.internal.lab as labml_lab
    if fresh:
        with quiet_labml_notices():
            labml_lab._internal = labml_lab.Lab(path=Path.cwd())
    labml_lab.lab_singleton().set_configurations({'path': str(Path.cwd()), 'experiments_path': str(experiments_path),
                                                  'data_path': str(data_path)})


@contextlib.contextmanager
def quiet_labml_notices() -> Iterator[None]:
    """Drop labml's notices about a missing ``.labml.yaml`` and git repository (A8): under lazylab the lab's paths
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


def create(**kwargs: Any) -> None:
    """``labml.experiment.create``; under ``lazylab labml`` the session first sets labml's paths and writers."""
    kwargs['ignore_callers'] = set(kwargs.get('ignore_callers') or ()) | {__file__}  # A6
    if SESSION is not None:
        kwargs['writers'] = SESSION.before_create(kwargs.get('writers'))
    with quiet_labml_notices():
        return _ORIGINAL[(_experiment_module(), 'create')](**kwargs)


def experiment_run() -> Any:
    """labml's ``RunInfo`` of the experiment created last (``uuid``, ``name``, ``run_path``, ``configs_path``)."""
    from labml.internal.experiment import experiment_singleton
    return experiment_singleton().run


# ---- A5, A7: experiment.start -------------------------------------------------------------------------------------

class StepLimitReached(BaseException):
    """Raised (by :class:`StepLimit`) when a run has made its ``--steps`` optimizer updates; a BaseException, like
    KeyboardInterrupt, so that a script's ``except Exception`` does not swallow it."""


class _Watcher:
    """labml's run watcher (A7), plus: reaching the step limit ends the run as 'completed' and is not an error."""

    def __init__(self, inner: Any, on_exit: Callable[[Optional[type]], None]):
        self._inner = inner
        self._on_exit = on_exit

    def __enter__(self):
        return self._inner.__enter__()

    def __exit__(self, exc_type, exc, tb):
        stopped = exc_type is not None and issubclass(exc_type, StepLimitReached)
        self._on_exit(exc_type)
        if stopped:
            self._inner.__exit__(None, None, None)
            return True
        return self._inner.__exit__(exc_type, exc, tb)


def start(*args: Any, **kwargs: Any) -> Any:
    """``labml.experiment.start``; under ``lazylab labml`` the session writes its run directory first and adds its
    metrics writer after (A5)."""
    if SESSION is not None:
        SESSION.before_start()
    watcher = _ORIGINAL[(_experiment_module(), 'start')](*args, **kwargs)
    if SESSION is None:
        return watcher
    SESSION.after_start()
    return _Watcher(watcher, SESSION.on_exit)


def finish_experiment(status: str) -> None:
    """End labml's run (status 'completed', 'interrupted' or 'crashed') when the script left it open."""
    from labml.internal.experiment import experiment_singleton, has_experiment
    if has_experiment() and experiment_singleton().is_started:
        experiment_singleton().finish(status)
    _finish_monitor_loop()


def _finish_monitor_loop() -> None:
    """A run stopped mid-loop leaves labml's monitor in its loop; close it so later output prints normally."""
    from labml.internal.monitor import monitor_singleton
    with contextlib.suppress(RuntimeError):
        monitor_singleton().finish_loop()


def add_writer(writer: Any) -> None:
    from labml.internal.tracker import tracker_singleton
    tracker_singleton().add_writer(writer)


def _labml_writer_base():
    from labml.internal.tracker.writers import Writer
    return Writer


def metrics_writer(metrics_path: Path, samples_path: Path) -> Any:
    """A labml tracker writer (A5) appending each ``tracker.save()`` to ``metrics_path`` as one JSON line
    ``{"step": labml's global step, "loss.train": mean, …}``, and text indicators (samples) to ``samples_path``."""
    from labml.internal.tracker.indicators.numeric import NumericIndicator

    class MetricsWriter(_labml_writer_base()):
        def __init__(self):
            super().__init__()
            self.metrics = open(metrics_path, 'a', encoding='utf-8')
            self.samples_path = samples_path
            self.records = 0

        def write(self, *, global_step: int, indicators: dict[str, Any]):
            import json
            record: dict[str, Any] = {}
            for name, ind in indicators.items():
                if ind.is_empty():
                    continue
                if isinstance(ind, NumericIndicator):
                    record[name] = ind.get_mean()
                elif isinstance(ind, text_indicator_class()):
                    with open(self.samples_path, 'a', encoding='utf-8') as f:
                        f.write(f'--- step {global_step} {name}\n' + '\n'.join(ind.values) + '\n')
            if record:
                self.metrics.write(json.dumps({'step': int(global_step), **record}) + '\n')
                self.metrics.flush()
                self.records += 1

        def finish(self):
            if not self.metrics.closed:
                self.metrics.flush()

        def close(self):
            self.metrics.close()

    return MetricsWriter()


# ---- gaps between labml 0.5.3 and older labml code ---------------------------------------------------------------

@functools.cache
def text_indicator_class() -> type:
    """labml 0.4's text indicator (labml 0.5 dropped it): collects strings, which numeric writers skip (A5)."""
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
            return Text(key, self.is_print)

    return Text


def set_text(name: str, is_print: bool = False) -> None:
    """labml 0.4's ``tracker.set_text``: values tracked under ``name`` are text (samples)."""
    from labml.internal.tracker import tracker_singleton
    tracker_singleton().add_indicator(text_indicator_class()(name, is_print))


@functools.cache
def queue_indicator_class() -> type:
    """labml 0.4's queue indicator: the mean of the last ``queue_size`` values, kept across saves."""
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


def set_queue(name: str, queue_size: int = 10, is_print: bool = False) -> None:
    """labml 0.4's ``tracker.set_queue`` (labml_nn's MNIST optimizer and RL experiments)."""
    from labml.internal.tracker import tracker_singleton
    tracker_singleton().add_indicator(queue_indicator_class()(name, queue_size, is_print))


def set_image(name: str, is_print: bool = False, density: Optional[float] = None) -> None:
    """labml 0.4's ``tracker.set_image``: labml 0.5.3 records no images, so values tracked under ``name`` are
    dropped (a text indicator no writer reads), with one notice."""
    if 'image' not in _NOTICED:
        _NOTICED.add('image')
        print(f'lazylab: notice: labml {_labml_version()} records no images; {name!r} is not recorded',
              file=sys.stderr, flush=True)
    from labml.internal.tracker import tracker_singleton
    tracker_singleton().add_indicator(_dropped_indicator_class()(name, False))


@functools.cache
def _dropped_indicator_class() -> type:
    class Dropped(text_indicator_class()):
        def collect_value(self, value):
            pass

        def copy(self, key: str):
            return Dropped(key, self.is_print)

    return Dropped


_NOTICED: set[str] = set()


def _tracker_add(*args: Any, **kwargs: Any) -> None:
    """``labml.tracker.add``, skipping ``nn.Module`` values (one notice) and tracking strings as text."""
    import torch
    if len(args) == 1 and isinstance(args[0], dict):
        values = dict(args[0])
    elif len(args) == 2 and isinstance(args[0], str) and not kwargs:
        values = {args[0]: args[1]}
    else:
        return _ORIGINAL[(_tracker_module(), 'add')](*args, **kwargs)
    values.update(kwargs)
    for key in [k for k, v in values.items() if isinstance(v, torch.nn.Module)]:
        module = values.pop(key)
        if 'module' not in _NOTICED:
            _NOTICED.add('module')
            print(f"\nlazylab: notice: labml {_labml_version()} cannot track a module as an indicator "
                  f"(tracker.add({key!r}, <{type(module).__name__}>)); skipped, here and later "
                  f"(labml-helpers: log_params_updates=0 turns it off)", file=sys.stderr, flush=True)
    from labml.internal.tracker import tracker_singleton
    tracker = tracker_singleton()
    for key, value in values.items():
        if isinstance(value, str) and key not in tracker.indicators and key not in tracker.dot_indicators:
            set_text(key)
    if values:
        _ORIGINAL[(_tracker_module(), 'add')](values)


def add_pytorch_models(models: Optional[dict[str, Any]] = None, **kwargs: Any) -> None:
    """labml 0.4's ``experiment.add_pytorch_models`` (labml 0.5 dropped it): the modules
    :func:`save_checkpoint` saves. labml_nn 0.5.1's scripts call it with ``get_modules(conf)``."""
    MODELS.update(models or {})
    MODELS.update(kwargs)


MODELS: dict[str, Any] = {}


def save_checkpoint() -> None:
    """labml 0.4's ``experiment.save_checkpoint``: each module given to :func:`add_pytorch_models` saved as
    ``RUN/checkpoints/GLOBAL_STEP/NAME.pth`` (its ``state_dict``) in labml's run folder."""
    import torch
    from labml import tracker
    from labml.internal.experiment import experiment_singleton, has_experiment
    if not has_experiment() or not experiment_singleton().is_started or not MODELS:
        return
    folder = Path(experiment_singleton().run.checkpoint_path) / str(tracker.get_global_step())
    folder.mkdir(parents=True, exist_ok=True)
    for name, module in MODELS.items():
        torch.save(module.state_dict(), folder / f'{name}.pth')


def _labml_version() -> str:
    from importlib.metadata import version
    return version('labml')


def _experiment_module():
    import labml.experiment
    return labml.experiment


def _tracker_module():
    import labml.tracker
    return labml.tracker


# ---- install / uninstall ------------------------------------------------------------------------------------------

def _replace(owner: Any, name: str, value: Any, only_if_missing: bool = False) -> None:
    if only_if_missing and (owner, name) not in _ORIGINAL and hasattr(owner, name):
        return
    _ORIGINAL.setdefault((owner, name), getattr(owner, name, None))
    setattr(owner, name, value)


def patch_labml() -> None:
    """Wrap labml's experiment functions and fill the labml 0.5.3 gaps (idempotent)."""
    experiment, tracker = _experiment_module(), _tracker_module()
    _replace(experiment, 'configs', configs)
    _replace(experiment, 'create', create)
    _replace(experiment, 'start', start)
    _replace(experiment, 'add_pytorch_models', add_pytorch_models, only_if_missing=True)
    _replace(experiment, 'save_checkpoint', save_checkpoint, only_if_missing=True)
    _replace(tracker, 'add', _tracker_add)
    _replace(tracker, 'set_text', set_text, only_if_missing=True)
    _replace(tracker, 'set_queue', set_queue, only_if_missing=True)
    _replace(tracker, 'set_image', set_image, only_if_missing=True)
    _replace(tracker, 'debug', lambda *args, **kwargs: None, only_if_missing=True)


def restore_labml() -> None:
    """Undo :func:`patch_labml` and :func:`switch_configs_module`. Modules imported under the switch keep the
    lazylab classes they were built with."""
    for (owner, name), value in _ORIGINAL.items():
        if owner == _SYS_MODULES:
            sys.modules[name] = value
        elif value is None:
            with contextlib.suppress(AttributeError):
                delattr(owner, name)
        else:
            setattr(owner, name, value)
    _ORIGINAL.clear()
