"""labml's experiment API taking lazylab configs, and the gaps between labml 0.5.3 and the labml_nn 0.5.1 /
labml-helpers 0.4.89 code that calls it.

labml has no hook for another configuration engine, so this module wraps labml's public functions
(``experiment.configs``, ``create``, ``start``, ``tracker.add``) and adds the ones labml 0.5.3 lacks. What it needs
of labml's internals (the experiment's configs processor, the lab, tracker writers and indicators, the watcher) it
asks of :mod:`lazylab.labml_internals`, the one module of lazylab that reaches into labml's private API, where each
assumption is listed and pinned by a test.

Gaps filled (labml 0.5.3 lacks what the older code calls; each only when missing): ``experiment.add_pytorch_models``
and ``experiment.save_checkpoint`` (labml_nn's scripts and labml-helpers' training loop), ``tracker.debug``
(labml_nn's ``MultiHeadAttention``), ``tracker.set_text`` and text values (labml_nn's ``NLPAutoRegressionConfigs``
samples), ``tracker.set_queue`` (a moving mean) and ``tracker.set_image`` (images are dropped: labml 0.5 records
none). ``tracker.add(name, nn.Module)`` (labml-helpers' parameter logging) raises ``ValueError: Unknown type``
in labml 0.5.3; such values are skipped with one notice.
"""
import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Optional

from lazylab import labml_internals
from lazylab.configs import inspect
from lazylab.labml import configs as served

# late imports: labml and torch are imported where used: `lazylab.labml` is imported by the CLI before a module is
# run, and labml's own import is heavy

# The attributes install() replaced: (module, name) -> the original (None when the name was missing).
_ORIGINAL: dict[tuple[Any, str], Any] = {}
_SYS_MODULES = 'sys.modules'  # stands for sys.modules (a dict, so not a key) in _ORIGINAL
# The active `lazylab labml` run (see lazylab.labml.session), or None: the wrappers then only add lazylab configs.
SESSION: Any = None


def is_lazylab_configs(value: Any) -> bool:
    return getattr(type(value), '_lazylab_is_configs', False)


# ---- the configuration engine switch ------------------------------------------------------------------------------

def switch_configs_module() -> None:
    """Serve ``labml.configs`` from :mod:`lazylab.labml.configs` (for modules imported from now on), and make its
    ``BaseConfigs`` the class ``labml.internal.configs.base.Configs`` names too, the class labml's own
    ``labml.configs.BaseConfigs`` extends (so classes declared on it directly are lazylab configs as well)."""
    import labml
    import labml.configs as labml_configs
    if sys.modules.get('labml.configs') is served:
        return
    served.LABML_CONFIGS = labml_configs
    _ORIGINAL.setdefault((_SYS_MODULES, 'labml.configs'), labml_configs)
    _ORIGINAL.setdefault((labml, 'configs'), labml_configs)
    sys.modules['labml.configs'] = served
    labml.configs = served
    _replace(labml_internals.configs_base_module(), 'Configs', served.BaseConfigs)


# ---- experiment.configs -------------------------------------------------------------------------------------------

def configs(*args: Any) -> None:
    """``labml.experiment.configs`` that also takes a lazylab config: ``configs(conf)``, ``configs(conf, dict)``.

    Anything else goes to labml's own function unchanged. As in labml, the dict (with labml's own command-line
    overrides over it) is applied with ``conf._set_values``; under ``lazylab labml`` the session applies the
    command line's ``key=value`` on top of it. labml keeps a ConfigProcessor over the config
    (:func:`lazylab.labml_internals.config_processor`), so its savers (labml's configs.yaml, the app) get
    lazylab's ``_to_json()``.

    Raises:
        RuntimeError: a call labml rejects too (wrong arguments, no experiment created, a second config object).
        ConfigError: an unknown key, a bad value or an unknown option (one line; nothing is applied).
    """
    if not args or not is_lazylab_configs(args[0]):
        if SESSION is not None and args:
            SESSION.check_not_lazylab(args[0])
        return _ORIGINAL[(_experiment_module(), 'configs')](*args)
    conf, overrides = args[0], {}
    if len(args) == 2 and isinstance(args[1], dict):
        overrides = args[1]
    elif len(args) != 1:
        raise RuntimeError('Invalid call to calculate configs')
    if labml_internals.configs_processor() is not None:
        raise RuntimeError('experiment.configs takes one config object; later calls take a dict of updates')
    values = dict(overrides)
    values.update(labml_internals.global_configs())
    if SESSION is not None:
        SESSION.apply_configs(conf, values)
    else:
        conf._set_values(values)
    labml_internals.set_configs_processor(labml_internals.config_processor(conf, values, inspect.computed))


def save_configs() -> None:
    """Send the current configs to labml's savers once more (labml's configs.yaml, the app): the last items
    computed inside a sub-config trigger no update of their own."""
    if labml_internals.experiment() is not None and labml_internals.configs_processor() is not None:
        labml_internals.configs_processor()._on_configs_updated()


# ---- experiment.create --------------------------------------------------------------------------------------------

def configure_lab(experiments_path: Path, data_path: Path, fresh: bool = True) -> None:
    """Point labml's lab at the working directory (its git state is recorded; its ``.labml.yaml``, if any, is read),
    with labml's run folders under ``experiments_path`` and its data under ``data_path``. ``fresh``: start from a
    new lab (else only add these settings, which win over earlier ones)."""
    if fresh:
        labml_internals.new_lab(Path.cwd())
    labml_internals.set_lab({'path': str(Path.cwd()), 'experiments_path': str(experiments_path),
                             'data_path': str(data_path)})


#: writer names labml had before 0.5, which labml 0.5.3 refuses (``ValueError: Unknown writer``), and the writer of
#: 0.5.3 each becomes: the labml app's ('labml', 'web_api') is 'app'; the others' records are labml's file writer
#: (lazylab's dashboard reads it) and, under ``lazylab labml``, metrics.jsonl
OLD_WRITERS = {'labml': 'app', 'web_api': 'app', 'sqlite': 'file', 'tensorboard': 'file', 'wandb': 'file',
               'comet': 'file'}


def known_writers(writers: Any) -> Any:
    """``writers`` with the names labml 0.5.3 does not know but earlier labml did replaced (:data:`OLD_WRITERS`),
    with one warning line naming them; other names unchanged (labml refuses an unknown one itself)."""
    import labml.experiment
    available = getattr(labml.experiment, 'AVAILABLE_WRITERS', ())
    old = sorted(w for w in writers if w in OLD_WRITERS and w not in available)
    if not old:
        return writers
    print(f'lazylab: warning: labml {_labml_version()} has no writer {", ".join(map(repr, old))} (a name of earlier '
          f'labml); recording with {", ".join(sorted({repr(OLD_WRITERS[w]) for w in old}))} and lazylab\'s '
          f'tracking instead', file=sys.stderr, flush=True)
    return {OLD_WRITERS.get(w, w) if w in old else w for w in writers}


def create(**kwargs: Any) -> None:
    """``labml.experiment.create``; under ``lazylab labml`` the session first sets labml's paths and writers. Writer
    names of earlier labml are mapped to labml 0.5.3's (:func:`known_writers`)."""
    kwargs = labml_internals.ignoring_caller(kwargs, __file__)  # labml names the script, not this module
    if kwargs.get('writers') is not None:
        kwargs['writers'] = known_writers(kwargs['writers'])
    if SESSION is not None:
        kwargs['writers'] = SESSION.before_create(kwargs.get('writers'))
    with labml_internals.quiet_labml_notices():
        return _ORIGINAL[(_experiment_module(), 'create')](**kwargs)


def experiment_run() -> Any:
    """labml's ``RunInfo`` of the experiment created last (``uuid``, ``name``, ``run_path``, ``configs_path``)."""
    return labml_internals.run_info()


# ---- experiment.start ---------------------------------------------------------------------------------------------

class StepLimitReached(BaseException):
    """Raised (by :class:`StepLimit`) when a run has made its ``--steps`` optimizer updates; a BaseException, like
    KeyboardInterrupt, so that a script's ``except Exception`` does not swallow it."""


class StepLimit:
    """Ends a run after exactly ``steps`` optimizer updates (every optimizer's, through torch's global hooks, so any
    labml script is covered), once the last step is whole.

    After the N-th update the run stops at the first of:

    - the next ``tracker.save()``, once it has written (labml_nn's trainers save at the end of each step);
    - the next ``tracker.add_global_step()`` (the start of step N + 1 in a script that saves less often), after
      saving the values tracked since the last save, so no step's indicators are lost;
    - the next optimizer update, before it happens (a script that does neither: its N + 1-th forward and backward
      pass has run, but not its update).

    One limit is active at a time (:data:`LIMIT`); :meth:`remove` ends it.
    """

    def __init__(self, steps: int):
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        global LIMIT
        self.steps = steps
        self.count = 0
        self._handles = [register_optimizer_step_pre_hook(self._before_update),
                         register_optimizer_step_post_hook(self._after_update)]
        LIMIT = self

    @property
    def reached(self) -> bool:
        return self.count >= self.steps

    def _before_update(self, optimizer, args, kwargs):
        if self.reached:
            self.stop(save=True)

    def _after_update(self, optimizer, args, kwargs):
        self.count += 1

    def stop(self, save: bool) -> None:
        """End the run here; ``save``: first save what labml's tracker holds unsaved (the steps since the last
        save)."""
        if save and labml_internals.has_unsaved_values():
            _ORIGINAL[(_tracker_module(), 'save')]()
        raise StepLimitReached(self.steps)

    def remove(self) -> None:
        global LIMIT
        for handle in self._handles:
            handle.remove()
        if LIMIT is self:
            LIMIT = None


#: the active step limit (see StepLimit), or None
LIMIT: Optional[StepLimit] = None


def _tracker_save(*args: Any, **kwargs: Any) -> Any:
    """``labml.tracker.save``; ends the run after it when the step limit is reached (see :class:`StepLimit`)."""
    result = _ORIGINAL[(_tracker_module(), 'save')](*args, **kwargs)
    if LIMIT is not None and LIMIT.reached:
        LIMIT.stop(save=False)
    return result


def _tracker_add_global_step(*args: Any, **kwargs: Any) -> Any:
    """``labml.tracker.add_global_step``; a step limit reached ends the run before the next step begins."""
    if LIMIT is not None and LIMIT.reached:
        LIMIT.stop(save=True)
    return _ORIGINAL[(_tracker_module(), 'add_global_step')](*args, **kwargs)


def start(*args: Any, **kwargs: Any) -> Any:
    """``labml.experiment.start``; under ``lazylab labml`` the session writes its run directory first and adds its
    metrics writer after (labml's start resets the tracker's writers). Reaching the step limit ends the run as
    'completed' and is no error."""
    if SESSION is not None:
        SESSION.before_start()
    watcher = _ORIGINAL[(_experiment_module(), 'start')](*args, **kwargs)
    if SESSION is None:
        return watcher
    SESSION.after_start()
    return labml_internals.Watcher(watcher, SESSION.on_exit, StepLimitReached)


def finish_experiment(status: str) -> None:
    """End labml's run (status 'completed', 'interrupted' or 'crashed') when the script left it open."""
    labml_internals.finish_experiment(status)


class MetricsWriter:
    """Appends each ``tracker.save()`` to ``metrics_path`` as one JSON line ``{"step": labml's global step,
    "loss.train": mean, …}``, and text indicators (samples) to ``samples_path``; ``labml`` is the writer to give
    labml's tracker (:func:`lazylab.labml_internals.tracker_writer`)."""

    def __init__(self, metrics_path: Path, samples_path: Path):
        self.metrics = open(metrics_path, 'a', encoding='utf-8')
        self.samples_path = samples_path
        self.records = 0
        self.labml = labml_internals.tracker_writer(self.write, self.flush)

    def write(self, step: int, means: dict[str, float], texts: dict[str, list[str]]) -> None:
        for name, values in texts.items():
            with open(self.samples_path, 'a', encoding='utf-8') as f:
                f.write(f'--- step {step} {name}\n' + '\n'.join(values) + '\n')
        if means:
            self.metrics.write(json.dumps({'step': step, **means}) + '\n')
            self.metrics.flush()
            self.records += 1

    def flush(self) -> None:
        if not self.metrics.closed:
            self.metrics.flush()

    def close(self) -> None:
        self.metrics.close()


def metrics_writer(metrics_path: Path, samples_path: Path) -> MetricsWriter:
    """A :class:`MetricsWriter` added to labml's tracker."""
    writer = MetricsWriter(metrics_path, samples_path)
    labml_internals.add_writer(writer.labml)
    return writer


# ---- gaps between labml 0.5.3 and older labml code ---------------------------------------------------------------

def set_text(name: str, is_print: bool = False) -> None:
    """labml 0.4's ``tracker.set_text``: values tracked under ``name`` are text (samples)."""
    labml_internals.add_indicator(labml_internals.text_indicator(name, is_print))


def set_queue(name: str, queue_size: int = 10, is_print: bool = False) -> None:
    """labml 0.4's ``tracker.set_queue`` (labml_nn's MNIST optimizer and RL experiments): the mean of the last
    ``queue_size`` values, kept across saves."""
    labml_internals.add_indicator(labml_internals.queue_indicator(name, queue_size, is_print))


def set_image(name: str, is_print: bool = False, density: Optional[float] = None) -> None:
    """labml 0.4's ``tracker.set_image``: labml 0.5.3 records no images, so values tracked under ``name`` are
    dropped (an indicator no writer reads), with one notice."""
    if 'image' not in _NOTICED:
        _NOTICED.add('image')
        print(f'lazylab: notice: labml {_labml_version()} records no images; {name!r} is not recorded',
              file=sys.stderr, flush=True)
    labml_internals.add_indicator(labml_internals.dropped_indicator(name))


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
    for key, value in values.items():
        if isinstance(value, str) and not labml_internals.has_indicator(key):
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
    if not labml_internals.is_started() or not MODELS:
        return
    folder = Path(labml_internals.run_info().checkpoint_path) / str(tracker.get_global_step())
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
    _replace(tracker, 'save', _tracker_save)
    _replace(tracker, 'add_global_step', _tracker_add_global_step)
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
