"""Listing every item of a config class or object, for ``lazylab options`` and ``--help``.

:func:`describe` returns one row per item (sub-config items under dotted names); :func:`format_description`
renders the rows as text.
"""
from enum import Enum
from typing import Any, Literal, Optional, get_args, get_origin

from .comments import item_help
from .declarations import spec_of
from .report import plain
from .state import state_of
from .typing_tools import UNION_ORIGINS, describe_type


def describe(configs_or_class: Any) -> list[dict[str, Any]]:
    """One row per item: ``name`` (dotted path), ``type`` (see :func:`type_text`; ``base_type`` and ``rule`` are
    its two parts, e.g. ``'int'`` and ``'≥ 1'``), ``plain`` (whether values are plain data: numbers, strings, flags
    or a Literal/Optional of those), ``default`` (class default, or the first option, or ``None``), ``options``,
    ``values`` (the values a command line may name, as text: the options, ``True``/``False`` for a bool, a
    Literal's choices; shell completion offers them), ``help`` (comment above the declaration), ``is_hyperparam``,
    ``is_meta``; for a config object also ``value``
    (its computed value, or ``None``) and ``computed``.

    Items of sub-configs appear under dotted names: for a class, those whose annotation is a config class; for an
    object, the sub-configs created so far (or annotated ones not created yet).

    Args:
        configs_or_class: a config class (its declarations) or a config object (also its values so far).
    """
    rows: list[dict[str, Any]] = []
    if isinstance(configs_or_class, type):
        _describe_class(configs_or_class, '', rows, set())
    else:
        _describe_object(configs_or_class, '', rows, set())
    return rows


def _row(cls: type, key: str, prefix: str, help_text: dict[str, str]) -> dict[str, Any]:
    spec = spec_of(cls)
    options = spec.option_names(key)
    if key in spec.defaults:
        default = spec.defaults[key]
        if getattr(type(default), '_lazylab_is_configs', False):
            default = type(default).__name__ + '()'
        elif isinstance(default, Enum):
            default = default.name
        else:
            default = plain(default)
    elif spec.options.get(key):
        default = next(iter(spec.options[key]))
    else:
        default = None
    return {
        'name': prefix + key,
        'type': type_text(spec, key),
        'base_type': _choices_or_name(spec.types[key]),
        'rule': spec.rules[key].describe() if key in spec.rules else '',
        'plain': is_plain(spec.types[key]),
        'default': default,
        'options': options,
        'values': list(dict.fromkeys([*map(str, options), *value_names(spec.types[key])])),
        'help': help_text.get(key, ''),
        'is_hyperparam': bool(spec.hyperparams.get(key, False)),
        'is_meta': bool(spec.meta.get(key, False)),
    }


def type_text(spec: Any, key: str) -> str:
    """An item's type as a listing shows it: its constraints after the type (``int ≥ 1``, ``float > 0, ≤ 1``),
    a Literal as its choices (``float32 | bfloat16``)."""
    text = _choices_or_name(spec.types[key])
    rule = spec.rules.get(key)
    return f'{text} {rule.describe()}' if rule is not None else text


_PLAIN = (int, float, str, bool, type(None))


def value_names(annotation: Any) -> list[str]:
    """The values of a type that can be listed, as text: ``['True', 'False']`` for ``bool``, a Literal's choices, an
    Enum's names (and ``'None'`` beside them in an Optional); ``[]`` for other types."""
    origin = get_origin(annotation)
    if annotation is bool:
        return ['True', 'False']
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return [m.name for m in annotation]
    if origin is Literal:
        return [str(c) for c in get_args(annotation)]
    if origin in UNION_ORIGINS:
        members = [value_names(m) for m in get_args(annotation) if m is not type(None)]
        if any(members):
            return [v for m in members for v in m] + (['None'] if type(None) in get_args(annotation) else [])
    return []


def is_plain(annotation: Any) -> bool:
    """Whether values of ``annotation`` are plain data: int, float, str, bool, or a Literal/Union of those."""
    origin = get_origin(annotation)
    if origin is Literal:
        return all(isinstance(c, _PLAIN) for c in get_args(annotation))
    if origin in UNION_ORIGINS:
        return all(is_plain(m) for m in get_args(annotation))
    return annotation in _PLAIN


def _choices_or_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return ' | '.join(str(c) for c in get_args(annotation))
    if origin in UNION_ORIGINS and any(get_origin(m) is Literal for m in get_args(annotation)):
        return ' | '.join('None' if m is type(None) else _choices_or_name(m) for m in get_args(annotation))
    return describe_type(annotation)


def _sub_class(cls: type, key: str) -> Optional[type]:
    annotation = spec_of(cls).types[key]
    if isinstance(annotation, type) and getattr(annotation, '_lazylab_is_configs', False):
        return annotation
    return None


def _describe_class(cls: type, prefix: str, rows: list[dict[str, Any]], seen: set[type]):
    seen = seen | {cls}
    help_text = item_help(cls)
    subs = []
    for key in spec_of(cls).annotations:
        rows.append(_row(cls, key, prefix, help_text))
        sub = _sub_class(cls, key)
        if sub is not None and sub not in seen:
            subs.append((key, sub))
    for key, sub in subs:
        _describe_class(sub, f'{prefix}{key}.', rows, seen)


def _describe_object(configs: Any, prefix: str, rows: list[dict[str, Any]], seen: set[type]):
    st = state_of(configs)
    cls = type(configs)
    seen = seen | {cls}
    help_text = item_help(cls)
    subs = []
    for key in st.spec.annotations:
        row = _row(cls, key, prefix, help_text)
        row['computed'] = key in st.cache
        row['value'] = plain(st.cache[key]) if key in st.cache else None
        rows.append(row)
        if key in st.children:
            subs.append((key, st.children[key], None))
        else:
            sub = _sub_class(cls, key)
            if sub is not None and sub not in seen:
                subs.append((key, None, sub))
    for key, child, sub in subs:
        if child is not None:
            _describe_object(child, f'{prefix}{key}.', rows, seen)
        else:
            _describe_class(sub, f'{prefix}{key}.', rows, seen)


def format_description(rows: list[dict[str, Any]], defaults: Optional[dict[str, str]] = None) -> str:
    """Text listing of :func:`describe` rows, one item a line plus an indented help line::

        d_model: int = 512  (≥ 1)  [hyperparam]
            Number of features in the embedding
        activation: Module = 'ReLU'  options: ReLU, GELU

    ``defaults``: dotted name → the text to show after ``=`` instead of the row's default (an experiment's own
    default for a sub-config's item, e.g. ``'128 (follows d_model)'``).

    Args:
        rows: what :func:`describe` returned.
        defaults: dotted name → the default text to show instead of the row's (see above).
    """
    lines = []
    defaults = defaults or {}
    for row in rows:
        line = f'{row["name"]}: {row["base_type"]}'
        if row['name'] in defaults:
            line += f' = {defaults[row["name"]]}'
        elif row['default'] is not None:
            line += f' = {row["default"]!r}'
        if row['rule']:
            line += f'  ({row["rule"]})'
        if row['options']:
            line += f'  options: {", ".join(map(str, row["options"]))}'
        flags = [f for f, on in (('hyperparam', row['is_hyperparam']), ('meta', row['is_meta'])) if on]
        if flags:
            line += f'  [{", ".join(flags)}]'
        lines.append(line)
        if row['help']:
            lines.append(f'    {row["help"]}')
    return '\n'.join(lines)
