"""Reports about a config object: labml's ``_to_json`` view and per-item provenance (:func:`explain`).

Both walk computed sub-configs and name their items by full dotted path. :func:`note_given` keeps the record the
dump needs to tell given values from computed ones (see :mod:`.yaml_io`).
"""
import re
from collections.abc import Iterable, Iterator
from typing import Any, Optional

from .state import ACTIVE, State, state_of

_MAX_TEXT = 5000


def plain(value: Any, depth: int = 0) -> Any:
    """A YAML/JSON-friendly rendering: primitives as they are, containers element-wise, other objects as
    their ``str`` (or ``module.Class`` when that is only the default ``<... object at 0x...>``)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) <= _MAX_TEXT else value[:_MAX_TEXT] + ' [[...]]'
    if depth > 8:
        return '[[...]]'
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    return object_name(value)


def object_name(value: Any) -> str:
    """``str(value)`` without a memory address, which would make a report differ from run to run: the type's name
    for Python's default ``<module.Class object at 0x…>``, and ``<function f>`` for ``<function f at 0x…>`` (so a
    function, method or generator keeps its name, as labml shows it)."""
    text = str(value)
    if text.startswith('<') and _ADDRESS.search(text):
        return type_name(value) if ' object at 0x' in text else _ADDRESS.sub('', text)
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + ' [[...]]'


_ADDRESS = re.compile(r' at 0x[0-9a-fA-F]+')


def type_name(value: Any) -> str:
    """``module.Class`` of a value (``Class`` for one defined in ``__main__``, builtins by their bare name)."""
    cls = type(value)
    if cls.__module__ in ('__main__', 'builtins'):
        return cls.__qualname__
    return f'{cls.__module__}.{cls.__qualname__}'


def note_given(st: State, keys: Iterable[str], label: Optional[str]) -> None:
    """Record who gave ``keys`` of ``st`` their values (called when overrides, assignments and ``set_default``
    are applied).

    Outside any computation the values are *given* (by the user, a file, a preset or top-level code) and
    ``st.__dict__['given'][key] = label`` (``'override'``, ``'assigned'``; ``None``, as for ``set_default``, records
    nothing: a default set by code is not a given value). While an item is being computed, the values are set by
    code, and ``st.__dict__['set_by'][key]`` is that item's dotted path: replay uses it to know what such a value
    was computed from. Keys are as given to ``st`` (dotted for sub-configs).
    """
    d = st.__dict__
    if ACTIVE:
        by = ACTIVE[-1].path
        set_by = d.setdefault('set_by', {})
        for key in keys:
            set_by[key] = by
    elif label is not None:
        given = d.setdefault('given', {})
        for key in keys:
            given[key] = label


def given_paths(st: State, prefix: str = '') -> tuple[dict[str, str], dict[str, str]]:
    """(given, set_by) of :func:`note_given` for a config object and its sub-configs, by full dotted path."""
    given = {prefix + k: v for k, v in st.__dict__.get('given', {}).items()}
    set_by = {prefix + k: v for k, v in st.__dict__.get('set_by', {}).items()}
    for key, child in st.children.items():
        g, s = given_paths(state_of(child), f'{prefix}{key}.')
        given.update(g)
        set_by.update(s)
    return given, set_by


def walk(st: State, prefix: str = '') -> Iterator[tuple[str, State, str]]:
    """(dotted path, state, key) for every declared item, sub-configs after their parent's items (each state's
    `spec` is current, so callers may read `st._spec`)."""
    for key in st.spec.annotations:
        yield prefix + key, st, key
    for key, child in st.children.items():
        yield from walk(state_of(child), f'{prefix}{key}.')


def labml_json(st: State) -> dict[str, dict[str, Any]]:
    """labml.configs' ``_to_json`` structure (see ``BaseConfigs._to_json``)."""
    out: dict[str, dict[str, Any]] = {}
    hidden = st.__dict__.get('redacted', {})  # secrets read from the environment: their references instead
    for path, s, key in walk(st):
        spec = s._spec  # (current: walk read s.spec)
        given = s.overrides.get(key, s.assigned.get(key))
        options = spec.option_names(key)
        if key in s.from_type:
            options = options + ['from_type']
        out[path] = {
            'name': key,
            'type': str(spec.annotations[key]),
            'value': plain(hidden.get(path, given)),
            'order': s.order.get(key, -1),
            'options': options,
            'computed': plain(hidden[path] if path in hidden else s.cache.get(key)),
            'is_hyperparam': spec.hyperparams.get(key),
            'is_meta': spec.meta.get(key),
            'is_explicitly_specified': key in s.explicit,
        }
    return out


def explain(configs: Any) -> dict[str, dict[str, Any]]:
    """Where every computed item's value came from, by full dotted path, in declaration order
    (a sub-config's items after its parent's).

    Each entry: ``source`` (override / assigned / set_default / aggregate / default / option / from_type),
    ``detail`` (option name; ``'selector=option'`` for an aggregate; ``'value'``/``'func'`` for set_default),
    ``selected_by`` (for an option: what named it, e.g. ``default``, ``override``, ``first option``),
    ``reads`` (dotted paths its calculator read), and ``value`` (a plain rendering).

    Args:
        configs: a config object; only the items computed so far are reported (nothing is computed).

    Returns:
        ``{dotted path: entry}``.
    """
    rows = []
    for path, s, key in walk(state_of(configs)):
        p = s.provenance.get(key)
        if p is None:
            continue
        rows.append((s.order.get(key, 0), path, {
            'source': p.source, 'detail': p.detail, 'selected_by': p.selected_by,
            'reads': list(p.reads), 'value': plain(s.cache.get(key)),
        }))
    return {path: row for _, path, row in rows}


def format_explain(report: dict[str, dict[str, Any]]) -> str:
    """Text table of :func:`explain`'s report, one item a line.

    Args:
        report: what :func:`explain` returned.

    Returns:
        The table: each path, its source (with detail and what selected it) and the paths it read.
    """
    lines: list[str] = []
    width = max((len(p) for p in report), default=0)
    for path, row in report.items():
        source = row['source']
        if row['detail']:
            source += f' {row["detail"]}'
        if row['selected_by']:
            source += f' (selected by {row["selected_by"]})'
        reads = f'  reads: {", ".join(row["reads"])}' if row['reads'] else ''
        lines.append(f'{path:<{width}}  {source}{reads}')
    return '\n'.join(lines)
