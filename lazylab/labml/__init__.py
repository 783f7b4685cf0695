"""labml compatibility: labml's experiment API takes lazylab configs, and labml code runs on lazylab's engine.

In a notebook or script, one line before importing any labml-based code (labml_nn, labml_helpers, your own)::

    import lazylab.labml; lazylab.labml.install()

    from labml import experiment
    from labml_nn.transformers.feedback.experiment import Configs   # now a lazylab config
    experiment.create(name='feedback')
    conf = Configs()
    experiment.configs(conf, {'d_model': 64, 'optimizr.learning_rate': 1e-3})
    # UnknownItemError: Configs has no config item 'optimizr.learning_rate'; did you mean 'optimizer'?

From the command line, ``lazylab labml MODULE key=value …`` does the same for a module's ``main()`` and adds a
lazylab run directory (:mod:`lazylab.labml.runner`, :mod:`lazylab.labml.session`).

What :func:`install` does (all of it in :mod:`lazylab.labml.adapter`, which asks :mod:`lazylab.labml_internals`,
the one module of lazylab that reaches into labml's private API):

- ``labml.experiment.configs(conf[, overrides])`` accepts lazylab configs; labml saves their ``_to_json()`` in its
  run folder and sends it to the labml dashboard, the items given in ``overrides`` marked as explicitly specified.
  ``labml.utils.pytorch.get_modules(conf)`` works on them, so ``experiment.add_pytorch_models(get_modules(conf))``
  does too (labml 0.5.3 lacks ``add_pytorch_models``; it is provided).
- With ``engine=True`` (the default) ``labml.configs`` is served by lazylab's engine
  (:mod:`lazylab.labml.configs`): every config class declared from now on through ``from labml.configs import …``
  (labml_nn's NLPAutoRegressionConfigs, TrainValidConfigs, OptimizerConfigs, DeviceConfigs; labml_helpers'
  TrainValidConfigs, SimpleTrainValidConfigs, DeviceConfigs, …) is a lazylab config. Classes imported before
  the call stay labml's (and keep working with labml's engine): call it first.
- Where torchvision cannot be imported, a placeholder stands in (:mod:`lazylab.labml.placeholders`), so labml_nn's
  text experiments import; using anything from it raises MissingPackageError naming the package. labml_nn 0.5.1's
  Transformer-XL and Compressive Transformer experiments import ``SimpleStateModule`` from
  ``labml_nn.helpers.metrics``, which lacks it; lazylab's own is added there when that module is imported.
- Writer names of earlier labml (``labml``, ``web_api``, ``sqlite``, ``tensorboard``, …) given to
  ``experiment.create`` become labml 0.5.3's (``app``, ``file``) and lazylab's tracking, with one warning, where
  labml 0.5.3 raises ``ValueError: Unknown writer``.
- labml 0.5.3's gaps for older labml code are filled: ``experiment.add_pytorch_models`` / ``save_checkpoint``,
  ``tracker.set_text`` and text values, ``tracker.set_queue``, ``tracker.set_image`` (images dropped),
  ``tracker.debug``; ``tracker.add(name, nn.Module)`` is skipped with one notice instead of
  ``ValueError: Unknown type``.

:func:`uninstall` puts labml's functions and module back.
"""
import sys

from lazylab.labml import adapter, configs
from lazylab.labml.placeholders import (
    MissingPackageError,
    install_missing_names,
    install_placeholder,
    remove_placeholders,
)

__all__ = ['install', 'uninstall', 'is_installed', 'MissingPackageError']

_ENGINE_PACKAGES = ('labml_nn', 'labml_helpers')


def install(engine: bool = True) -> None:
    """Make labml's experiment API take lazylab configs, fill labml 0.5.3's gaps and stand in for a missing
    torchvision; with ``engine=True`` serve ``labml.configs`` from lazylab's engine too. Idempotent. Call it
    before importing labml-based code (see the module docstring).

    Prints one warning when labml_nn or labml_helpers modules were imported already: their config classes stay
    labml's.
    """
    adapter.patch_labml()
    install_placeholder('torchvision')
    install_missing_names()
    if not engine:
        return
    early = sorted(name for name in sys.modules if name.split('.')[0] in _ENGINE_PACKAGES)
    if early and sys.modules.get('labml.configs') is not sys.modules.get('lazylab.labml.configs'):
        print(f'lazylab: warning: {", ".join(early[:3])}{" …" if len(early) > 3 else ""} were imported before '
              f'lazylab.labml.install(); their config classes stay labml\'s (restart and install first)',
              file=sys.stderr, flush=True)
    adapter.switch_configs_module()


def uninstall() -> None:
    """Put labml's own functions and ``labml.configs`` back and take out the torchvision placeholder. Modules
    imported in between keep lazylab's classes."""
    adapter.restore_labml()
    remove_placeholders()


def is_installed() -> bool:
    """Whether ``labml.configs`` is currently served by lazylab's engine."""
    return sys.modules.get('labml.configs') is configs
