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
``conf._to_json()``. Every other engine feature is a free function here, so any item name stays legal:

    parse_overrides(argv, configs=None) -> dict    'key=value' / 'child.key=value' tokens (typed if configs given)
    apply_overrides(configs, values)               text/YAML values typed by declared type; all-or-nothing
    coerce_text(text, annotation)                  one text value -> typed value (int, float, bool, Optional, ...)
    explain(configs) -> {path: {source, detail, selected_by, reads, value}}; format_explain(report) -> str
    to_dict(configs) -> {'values', 'given', 'computed', 'objects', 'hyperparams', 'meta'}
    dump(configs, path=None, run_values=None) -> YAML text (see lazylab.configs.engine.yaml_io)
    load(configs, path_or_yaml_or_dict, label=None)   replay a dump: its given values applied, the rest recomputed
    replay_changes(configs) -> [Change]            after computing: recorded computed values that came out different
    label_given(configs, keys, label)              say where given values came from (the dump's `given` section)
    expand_env(values, origins=None) -> (values, {key: EnvUse})   read ${env:NAME} / ${env:NAME,default} in values
    note_env(configs, {path: EnvUse})              label those values `env NAME`; dumps write a secret's reference
    escape_env(value) -> value                     written so that expand_env reads it back as it is ($${ for ${)
    describe(configs_or_class) -> [row]; format_description(rows) -> str     listing for --help / options
    nearest(name, names) -> [name]; suggestion(name, names) -> "; did you mean 'x'?"   for messages about names

The view of a config for tools (given vs computed values, provenance, declared types, defaults, sub-config
paths, short keys) is :mod:`lazylab.configs.inspect` (``from lazylab.configs import inspect``); nothing outside
this package needs ``lazylab.configs.engine``.

Typed items: ``typing.Annotated[T, constraint, ...]`` with the constraints of the annotated-types package::

    from annotated_types import Ge, Gt, Interval, IsFinite, MinLen

    class Configs(BaseConfigs):
        batch_size: Annotated[int, Ge(1)] = 16
        dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.1
        learning_rate: Annotated[IsFinite[float], Gt(0)] = 3e-4   # IsFinite: Predicate(math.isfinite)
        warmup: Optional[Annotated[int, Ge(0)]] = None             # None, or an int ≥ 0
        name: Annotated[str, MinLen(1)] = 'run'

Supported: Gt, Ge, Lt, Le, Interval, MultipleOf, MinLen, MaxLen, Len, Predicate (and Not); they go on the item's
type or directly inside ``Optional[...]`` (elsewhere they would go unchecked: DeclarationError). Text is typed by
``T``. Every value is checked: one given by ``_set_values``, ``apply_overrides``/``load``, assignment or
``set_default(value=...)`` when it is given, a class default when the class is declared, and a computed value
when it is stored (for an option name, given or as the default, that is what its option computes). A bad one
raises BadValueError naming the full path, the constraint and the value, e.g.
``bad value for optimizer.learning_rate: must be > 0, got 0.0``. ``describe`` shows the type with its
constraints (``int ≥ 1``) and a Literal as its choices (``float32 | bfloat16``).

Errors: every user-caused error is a :class:`ConfigError` (all importable from here) with a one-line
message naming the full config path; subclasses are also the built-in exception labml raises in that case:
UnknownItemError (AttributeError, KeyError), NoValueError (AttributeError), AlreadyComputedError,
UnknownOptionError, BadValueError, OverrideSyntaxError (ValueError), CycleError, CalculatorError
(RuntimeError; the original exception is ``__cause__``), DeclarationError (TypeError). A command line catches
``ConfigError``, prints ``lazylab: error: <message>`` and exits with status 2.

Unlike labml: a string that is neither an option of an item with options nor a value of its declared type
(``str``, a Union with ``str``, a Literal containing it) is an error, not a silent value; options registered
through ``Sub.item`` stay on ``Sub``; cycles raise CycleError with the chain.

Importing this package never imports torch.
"""
from . import inspect  # noqa: F401 - the public view of a config: `from lazylab.configs import inspect`
from .engine.base import BaseConfigs
from .engine.coerce import coerce_text
from .engine.env_refs import EnvUse, escape_env, expand_env, has_env_reference, note_env
from .engine.errors import (
    AlreadyComputedError,
    BadValueError,
    CalculatorError,
    ConfigError,
    CycleError,
    DeclarationError,
    NoValueError,
    OverrideSyntaxError,
    UnknownItemError,
    UnknownOptionError,
    nearest,
    suggestion,
)
from .engine.listing import describe, format_description
from .engine.overrides import apply_overrides, parse_overrides
from .engine.registration import aggregate, calculate, hyperparams, meta_config, option
from .engine.report import explain, format_explain
from .engine.yaml_io import Change, dump, label_given, load, replay_changes, to_dict

__all__ = [
    'BaseConfigs', 'option', 'calculate', 'aggregate', 'hyperparams', 'meta_config',
    'explain', 'format_explain', 'describe', 'format_description', 'to_dict', 'dump', 'load',
    'replay_changes', 'label_given', 'Change',
    'expand_env', 'note_env', 'escape_env', 'has_env_reference', 'EnvUse',
    'apply_overrides', 'parse_overrides', 'coerce_text', 'nearest', 'suggestion',
    'ConfigError', 'UnknownItemError', 'NoValueError', 'AlreadyComputedError', 'UnknownOptionError',
    'BadValueError', 'CycleError', 'CalculatorError', 'DeclarationError', 'OverrideSyntaxError',
]
