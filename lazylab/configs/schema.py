"""The JSON Schema (draft 2020-12) of a `--config` YAML file for a config class: what `lazylab schema EXPERIMENT`
prints, so that an editor with the YAML language server completes and checks the file.

    from lazylab.configs.schema import json_schema
    json_schema(Configs)     {'$schema': …, 'type': 'object', 'properties': {'d_model': {'type': 'integer', …}}}

A config file is a mapping of dotted keys (`optimizer.learning_rate: 0.001`) to values, so the schema is one object
whose properties are the declared keys in full, sub-configs' keys under their dotted paths (nested sub-configs
included). Each key's schema says its type (`integer`, `number`, `boolean`, `string`, `null` for an Optional, an
array or an object), a Literal's or an Enum's values and an item's option names as `enum`, its annotated-types
constraints (`Ge` → `minimum`, `Gt` → `exclusiveMinimum`, `Le`/`Lt` → `maximum`/`exclusiveMaximum`, `MultipleOf`,
`MinLen`/`MaxLen` → `minLength`/`maxLength` or `minItems`/`maxItems`), its help (the comment beside its declaration)
as `description`, and a plain default as `default`. A key whose values have no text form and no options (a module
built by its type) cannot be given in a file, and is left out (`additionalProperties: false`).

What the engine checks that JSON Schema cannot say (each is named in the description of the keys it concerns,
where it concerns one):

- a `Predicate` constraint (`finite`, a user's function): a Python call;
- an int key refuses a whole float (`2.0`): JSON Schema counts 2.0 as an integer;
- the engine also takes other spellings of a value (`'64'` for an int, `'true'` or 1 for a bool, `'1,2'` for a
  list, an Enum member's value) where the schema asks for the YAML type itself (an Enum's member by its name), and
  a key's unique end (`glu_variant` for `transformer.ffn.glu_variant`) where the schema names keys in full:
  the schema is the stricter of the two, on purpose (it says what a file should say);
- a value that reads the environment (`${env:LR}`, lazylab.configs.expand_env) is text until it is read, so the
  schema refuses it for a key that is not a string: an editor flags it, the engine reads it;
- checks between keys (`d_model` divisible by `heads`), which run when the configuration is computed;
- a run's configs.yaml (sections `values`, `given`, …) is not a flat file: the schema is for files one writes.
"""
import enum
from typing import Annotated, Any, Literal, Optional, get_args, get_origin

from .engine.comments import item_help
from .engine.constraints import check_of
from .engine.declarations import spec_of
from .engine.report import plain
from .engine.typing_tools import UNION_ORIGINS, is_configs_class

__all__ = ['json_schema', 'DRAFT']

#: the dialect the schema declares
DRAFT = 'https://json-schema.org/draft/2020-12/schema'

_SCALARS = {bool: 'boolean', int: 'integer', float: 'number', str: 'string', type(None): 'null'}


def json_schema(configs_class: type, *, title: str = '', presets: Optional[list[str]] = None) -> dict[str, Any]:
    """The JSON Schema of a `--config` file of `configs_class` (see the module docstring).

    Args:
        configs_class: a `BaseConfigs` subclass (an experiment's `Configs`).
        title: the schema's title (`lazylab schema` names the experiment).
        presets: the experiment's preset names: a file may say `preset: NAME`.
    """
    properties: dict[str, Any] = {}
    _walk(configs_class, '', properties, set())
    if presets:
        properties['preset'] = {'enum': list(presets), 'description': 'a named set of settings, applied first'}
    out: dict[str, Any] = {'$schema': DRAFT}
    if title:
        out['title'] = title
    out.update({'type': 'object', 'properties': properties, 'additionalProperties': False, 'minProperties': 1})
    return out


def _walk(cls: type, prefix: str, properties: dict[str, Any], seen: set[type]) -> None:
    spec, help_text = spec_of(cls), item_help(cls)
    subs = []
    for key in spec.annotations:
        item = item_schema(cls, key, help_text.get(key, ''))
        if item is not None:
            properties[prefix + key] = item
        sub = spec.types[key]
        if is_configs_class(sub) and sub not in seen | {cls}:
            subs.append((key, sub))
    for key, sub in subs:
        _walk(sub, f'{prefix}{key}.', properties, seen | {cls})


def item_schema(cls: type, key: str, help_text: str = '') -> Optional[dict[str, Any]]:
    """The schema of item `key` of `cls`, or None when a file cannot give it a value (no text form, no options)."""
    spec = spec_of(cls)
    base = type_schema(spec.types[key])
    options = [str(o) for o in spec.option_names(key)]
    if base is None and not options:
        return None
    if base is None:
        out: dict[str, Any] = {'enum': options}
    elif options and set(base) == {'enum'}:  # a Literal or Enum selector: its values and the option names, once
        out = {'enum': list(dict.fromkeys([*base['enum'], *options]))}
    elif options and base:
        out = {'anyOf': [{'enum': options}, base]}
    else:
        out = dict(base)
    unchecked = []
    for name, value in _bounds(spec.annotations[key]):
        if name == 'predicate':
            unchecked.append(value)
        else:
            out[_sized(name, spec.types[key])] = value
    notes = [help_text] if help_text else []
    if key in spec.rules:
        notes.append(f'({spec.rules[key].describe()})')
    if unchecked:
        notes.append(f'[{", ".join(unchecked)}: checked by lazylab, not by this schema]')
    if notes:
        out['description'] = ' '.join(notes)
    if key in spec.defaults:
        given = spec.defaults[key]
        default = given.name if isinstance(given, enum.Enum) else plain(given)
        if default is None or isinstance(default, (bool, int, float, str)):
            out['default'] = default
    return out


def type_schema(annotation: Any) -> Optional[dict[str, Any]]:
    """The schema of a declared type's values in YAML: `{}` for any value (`Any`, `object`), None for a type with
    no YAML form (a class other than the plain ones)."""
    if annotation in (Any, object):
        return {}
    if annotation in _SCALARS:
        return {'type': _SCALARS[annotation]}
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return {'enum': list(args)}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {'enum': [m.name for m in annotation]}
    if origin in UNION_ORIGINS:
        members = [type_schema(m) for m in args]
        if any(m is None for m in members):
            return None
        return {} if any(m == {} for m in members) else {'anyOf': members}
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple, set, frozenset):
        inner = type_schema(args[0]) if args and args[-1] is not Ellipsis and len(set(args)) == 1 else {}
        return {'type': 'array', **({'items': inner} if inner else {})}
    if origin is dict or annotation is dict:
        return {'type': 'object'}
    return None


def _bounds(annotation: Any) -> list[tuple[str, Any]]:
    """(keyword, value) of the annotated-types constraints on an item's declared type (or inside its Optional)."""
    if get_origin(annotation) in UNION_ORIGINS:
        annotation = next((m for m in get_args(annotation) if get_origin(m) is Annotated), None)
    if annotation is None or get_origin(annotation) is not Annotated:
        return []
    import annotated_types as at  # only for constrained items, as the engine does
    out: list[tuple[str, Any]] = []
    for meta in annotation.__metadata__:
        for single in (list(meta) if isinstance(meta, at.GroupedMetadata) else [meta]):
            for kind, keyword, attribute in ((at.Gt, 'exclusiveMinimum', 'gt'), (at.Ge, 'minimum', 'ge'),
                                             (at.Lt, 'exclusiveMaximum', 'lt'), (at.Le, 'maximum', 'le'),
                                             (at.MultipleOf, 'multipleOf', 'multiple_of'),
                                             (at.MinLen, 'min', 'min_length'), (at.MaxLen, 'max', 'max_length')):
                if isinstance(single, kind):
                    out.append((keyword, getattr(single, attribute)))
            if isinstance(single, at.Predicate):  # named as listings name it ('finite')
                out.append(('predicate', check_of(at, single, "").text))
    return out


def _sized(keyword: str, annotation: Any) -> str:
    """`min`/`max` of a length, as the keyword of the item's kind: a string's `minLength`, an array's `minItems`."""
    if keyword not in ('min', 'max'):
        return keyword
    args = [annotation, *get_args(annotation)]
    text = str in args
    return keyword + ('Length' if text else 'Items')
