"""lazylab.configs: a lazy configuration engine, a drop-in for ``labml.configs``.

labml-compatible API (same semantics)::

    from lazylab.configs import BaseConfigs, option, calculate, aggregate, hyperparams, meta_config

    class Configs(BaseConfigs):
        d_model: int = 512
        activation: nn.Module = 'ReLU'     # a string naming a registered option
        ffn: FeedForward                    # computed lazily by an @option

    @option(Configs.activation, 'GELU')
    def _gelu(): return nn.GELU()

    conf = Configs(); conf._set_values({'d_model': 256}); conf.ffn   # builds only what ffn needs

Instance API: ``conf.set_default(Cls.item, value=None, func=None)``, ``conf._set_values(dict)``,
``conf._to_json()``. Every other engine feature is a free function here, so any item name stays legal.

Errors: every user-caused error is a :class:`ConfigError` (``lazylab.configs.errors``) with a one-line
message naming the full config path; subclasses are also the built-in exception labml raises in that case.

Importing this package never imports torch.
"""
from .base import BaseConfigs
from .errors import (AlreadyComputedError, BadValueError, CalculatorError, ConfigError, CycleError,
                     DeclarationError, NoValueError, OverrideSyntaxError, UnknownItemError, UnknownOptionError)
from .registration import aggregate, calculate, hyperparams, meta_config, option
from .cli import apply_overrides, parse_overrides
from .coerce import coerce_text
from .listing import describe, format_description
from .yaml_io import dump, load, to_dict
from .report import explain, format_explain

__all__ = [
    'BaseConfigs', 'option', 'calculate', 'aggregate', 'hyperparams', 'meta_config',
    'explain', 'format_explain', 'describe', 'format_description', 'to_dict', 'dump', 'load',
    'apply_overrides', 'parse_overrides', 'coerce_text',
    'ConfigError', 'UnknownItemError', 'NoValueError', 'AlreadyComputedError', 'UnknownOptionError',
    'BadValueError', 'CycleError', 'CalculatorError', 'DeclarationError', 'OverrideSyntaxError',
]
