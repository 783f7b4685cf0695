"""`labml.configs` served by lazylab's engine: the module `lazylab.labml.install()` puts in its place.

labml code imports its configuration API as ``from labml.configs import BaseConfigs, option, …``. Under the switch
that import finds this module, so every config class declared afterwards (labml_nn's, labml_helpers', a script's)
is a lazylab config: lazy items, one-line errors with suggestions, provenance, replayable dumps.

The six names of labml.configs' ``__all__`` are lazylab's; ``BaseConfigs`` here is lazylab's with labml's class-level
registration methods added (``Configs.calc(Configs.item)``, ``Configs.aggregate(...)``, which labml_nn's and
labml_helpers' dataset modules use), each a call of lazylab's own function. Any other name a module asks of
``labml.configs`` (its ``ConfigsError``, say) comes from labml's own module, as does ``FloatDynamicHyperParam`` /
``IntDynamicHyperParam`` (labml_nn imports them from here; labml 0.5.3 keeps them in its internals: see
:func:`lazylab.labml_internals.dynamic_hyperparam`).
"""
from typing import Any

from lazylab import configs as _lazylab
from lazylab import labml_internals
from lazylab.configs import aggregate, calculate, hyperparams, meta_config, option

__all__ = ['option', 'calculate', 'hyperparams', 'meta_config', 'aggregate', 'BaseConfigs']

# Set by the switch to labml's own labml.configs module, so names lazylab does not serve still resolve.
LABML_CONFIGS: Any = None


class BaseConfigs(_lazylab.BaseConfigs):
    """lazylab's BaseConfigs, with labml's class methods for registering options, aggregates and flags."""

    @classmethod
    def calc(cls, name: Any, option_name: Any = None, pass_params: Any = None):
        """``@Configs.calc(Configs.item[, 'name'][, [params]])``: labml's spelling of :func:`option`."""
        return option(name, *[a for a in (option_name, pass_params) if a is not None])

    @classmethod
    def calc_wrap(cls, func: Any, name: Any, option_name: Any = None, pass_params: Any = None):
        return calculate(name, *[a for a in (option_name, pass_params) if a is not None], func)

    @classmethod
    def aggregate(cls, name: Any, option_name: str, *pairs: Any):
        return aggregate(name, option_name, *pairs)

    @classmethod
    def set_hyperparams(cls, *items: Any, is_hyperparam: bool = True):
        return hyperparams(*items, is_hyperparam=is_hyperparam)

    @classmethod
    def set_meta(cls, *items: Any, is_meta: bool = True):
        return meta_config(*items, is_meta=is_meta)


_DYNAMIC = ('FloatDynamicHyperParam', 'IntDynamicHyperParam')


def __getattr__(name: str) -> Any:
    if name in _DYNAMIC:
        return labml_internals.dynamic_hyperparam(name)
    if LABML_CONFIGS is not None and not name.startswith('__'):
        try:
            return getattr(LABML_CONFIGS, name)
        except AttributeError:
            pass
    raise AttributeError(f"module 'labml.configs' (served by lazylab) has no attribute {name!r}")
