"""Dumping a computed configuration to YAML, and replaying a dump as overrides.

The dump's ``values`` hold, for every computed item (sub-config items under dotted names), what reproduces
it: a plain value as itself (tuples as lists, enums by name), and a value computed by an option as the
option's name. Values nothing can give as text (objects from aggregates, defaults or constructed types) are
listed under ``objects`` for reading only; replay recomputes them from the same selections (an object
that code passed in directly, e.g. ``_set_values({'activation': nn.SiLU()})``, must be passed again).
``hyperparams`` and ``meta`` list the flagged items.

    text = dump(conf)               # or dump(conf, 'configs.yaml')
    fresh = Configs(); load(fresh, text)    # same values and option selections when read
"""
import os
from enum import Enum
from typing import Any, Optional, Union

from .errors import BadValueError
from .overrides import apply_overrides
from .report import object_name, walk
from .state import state_of

_NOT_TEXT = object()


def _text_value(value: Any) -> Any:
    """A YAML-safe rendering of a plain value, or ``_NOT_TEXT``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        items = [_text_value(v) for v in value]
        return _NOT_TEXT if any(i is _NOT_TEXT for i in items) else items
    if isinstance(value, dict):
        if not all(isinstance(k, (str, int, float, bool)) for k in value):
            return _NOT_TEXT
        items = {k: _text_value(v) for k, v in value.items()}
        return _NOT_TEXT if any(i is _NOT_TEXT for i in items.values()) else items
    return _NOT_TEXT


def to_dict(configs: Any) -> dict[str, Any]:
    """The dump as a dict: ``{'values': {...}, 'objects': {...}, 'hyperparams': [...], 'meta': [...]}``
    (see the module docstring)."""
    values: dict[str, Any] = {}
    objects: dict[str, str] = {}
    hyper, meta = [], []
    for path, st, key in walk(state_of(configs)):
        if st.spec.hyperparams.get(key):
            hyper.append(path)
        if st.spec.meta.get(key):
            meta.append(path)
        if key not in st.cache:
            # a value the user gave but nothing read yet is still part of the configuration to replay
            given = st.overrides.get(key, st.assigned.get(key, _NOT_TEXT))
            text = _NOT_TEXT if given is _NOT_TEXT else _text_value(given)
            if text is not _NOT_TEXT:
                values[path] = text
            continue
        p = st.provenance.get(key)
        value = st.cache[key]
        if p is not None and p.source == 'option':
            values[path] = p.detail
            continue
        # A sub-config (even one whose parent sees only its `_primary` item) and a constructed type are
        # rebuilt by the same code on replay; their own items are dumped under dotted names.
        rebuilt = key in st.children or (p is not None and p.source == 'from_type')
        text = _NOT_TEXT if rebuilt else _text_value(value)
        if text is not _NOT_TEXT:
            values[path] = text
        else:
            how = p.source + (f' {p.detail}' if p and p.detail else '') if p else 'computed'
            objects[path] = f'{object_name(value)} ({how})'
    return {'values': values, 'objects': objects, 'hyperparams': hyper, 'meta': meta}


def dump(configs: Any, path: Optional[Union[str, os.PathLike]] = None) -> str:
    """The YAML text of :func:`to_dict`; also written to ``path`` when given."""
    import yaml
    text = ('# lazylab configuration; replay with lazylab.configs.load(conf, this_file)\n'
            + yaml.safe_dump(to_dict(configs), sort_keys=False, default_flow_style=False, allow_unicode=True))
    if path is not None:
        with open(path, 'w', encoding='utf-8') as f:
            f.write(text)
    return text


def load(configs: Any, source: Union[str, os.PathLike, dict[str, Any]]):
    """Replay a dump as overrides into a fresh config object (all-or-nothing).

    ``source`` is a path, YAML text, or a dict as from :func:`to_dict` (a flat ``{key: value}`` mapping
    without a ``values`` section is accepted too).

    Raises:
        BadValueError: the YAML is malformed or not a mapping.
        UnknownItemError, UnknownOptionError, BadValueError, AlreadyComputedError: see ``apply_overrides``.
    """
    if isinstance(source, dict):
        doc = source
    else:
        import yaml
        text = str(source)
        if isinstance(source, os.PathLike) or ('\n' not in text and os.path.exists(text)):
            with open(source, encoding='utf-8') as f:
                text = f.read()
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise BadValueError(f'cannot read configuration YAML: {" ".join(str(e).split())}') from None
        if doc is None:
            doc = {}
    if not isinstance(doc, dict):
        raise BadValueError('a configuration YAML must be a mapping of keys to values')
    values = doc.get('values', doc)
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise BadValueError("the configuration YAML's 'values' must be a mapping")
    apply_overrides(configs, values)
