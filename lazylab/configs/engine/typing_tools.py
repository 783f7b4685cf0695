"""Predicates on type annotations, shared by the engine's modules (a leaf: it imports nothing of lazylab).

Coercion (:mod:`.coerce`), constraints (:mod:`.constraints`), overrides and the listing all ask the same questions
of an annotation (is it a Union? does it take any string? can it hold a config object?); answering them here, below
all of those modules, keeps them from importing one another for a predicate (omegaconf keeps its typing predicates
in one leaf module for the same reason).

    is_union(Optional[int]) is True            admits_none(Optional[int]) is True
    takes_any_string(Union[int, str]) is True  is_plain_value(list[int]) is True
    describe_type(int) == 'int'                describe_type(Optional[int]) == 'Optional[int]'
"""
from enum import Enum
from typing import Annotated, Any, Literal, Union, get_args, get_origin

#: the origins of a Union annotation: ``typing.Union`` and, from Python 3.10, ``X | Y`` (``types.UnionType``)
UNION_ORIGINS = {Union}
try:  # `int | None` (PEP 604)
    from types import UnionType
    UNION_ORIGINS.add(UnionType)
except ImportError:  # pragma: no cover - Python < 3.10
    pass


def is_union(annotation: Any) -> bool:
    """Whether ``annotation`` is a Union (``Optional[T]``, ``Union[A, B]``, ``A | B``)."""
    return get_origin(annotation) in UNION_ORIGINS


def admits_none(annotation: Any) -> bool:
    """Whether ``None`` is a value of ``annotation`` by declaration: ``NoneType`` or a Union with it."""
    return annotation is type(None) or (is_union(annotation) and type(None) in get_args(annotation))


def is_any(annotation: Any) -> bool:
    """Annotations that accept anything: missing, ``Any``, ``object``, labml's ``any``, unresolved strings."""
    return (annotation is None or annotation is Any or annotation is object or annotation is any
            or isinstance(annotation, str))


def takes_any_string(annotation: Any) -> bool:
    """Whether every string is a value of ``annotation`` by declaration: ``str``, a Union with ``str``, or an
    unresolved (postponed) annotation. ``Any``/``object`` do not count here, so a mistyped option name for an
    item declared ``Any`` with options is still caught."""
    if annotation is str or isinstance(annotation, str):
        return True
    if is_union(annotation):
        return any(takes_any_string(a) for a in get_args(annotation))
    return isinstance(annotation, type) and issubclass(annotation, str)


#: value types that never hold config items: a dotted key below an item of one of these cannot exist
_PLAIN_VALUES = (bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset, Enum)


def is_plain_value(annotation: Any) -> bool:
    """Whether ``annotation`` only admits plain values (numbers, strings, containers, enums, ``Literal``
    choices, ``Annotated`` or ``Optional`` forms of those), never a config object."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return is_plain_value(get_args(annotation)[0])
    if origin is Literal:
        return True
    if origin in UNION_ORIGINS:
        return all(a is type(None) or is_plain_value(a) for a in get_args(annotation))
    if origin is not None:
        return isinstance(origin, type) and issubclass(origin, _PLAIN_VALUES)
    return isinstance(annotation, type) and issubclass(annotation, _PLAIN_VALUES)


def is_configs_class(annotation: Any) -> bool:
    """Whether ``annotation`` is a config class (a ``BaseConfigs`` subclass), whose items are sub-config keys."""
    return isinstance(annotation, type) and getattr(annotation, '_lazylab_is_configs', False)


def describe_type(annotation: Any) -> str:
    """An annotation as messages show it: a class by its name, anything else without ``typing.``."""
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace('typing.', '')
