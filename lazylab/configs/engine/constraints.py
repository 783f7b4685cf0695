"""Typed items: ``Annotated[T, constraint, ...]`` with the constraints of the annotated-types package.

    batch_size: Annotated[int, Ge(1)] = 16
    dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.1
    learning_rate: Annotated[IsFinite[float], Gt(0)] = 3e-4   # IsFinite[float]: Annotated[float, Predicate(isfinite)]
    warmup: Optional[Annotated[int, Ge(0)]] = None             # None, or an int ≥ 0
    name: Annotated[str, MinLen(1)] = 'run'

:func:`split` turns an item's annotation into its type ``T`` (what text is parsed as, what listings show) and a
:class:`Rule`, the checks its values must pass. Supported: ``Gt``, ``Ge``, ``Lt``, ``Le``, ``Interval``,
``MultipleOf``, ``MinLen``, ``MaxLen``, ``Len``, ``Predicate`` (with ``Not``; a predicate function's
``constraint_text`` attribute, if it has one, is how listings and errors name it). Metadata that is not from
annotated-types (a doc string, say) is ignored, as that package asks of its consumers.

Constraints sit on the item's type or directly inside ``Optional[...]``; anywhere else (inside ``List[...]``, in
a Union of several types) they would go unchecked, so that is a :class:`~.errors.DeclarationError`.

annotated-types is imported only when an annotation carries metadata, so plain annotations cost nothing.
"""
import math
from collections.abc import Sequence
from typing import Annotated, Any, Callable, Optional, get_args, get_origin

from lazylab.errors import shown

from .errors import BadValueError, DeclarationError
from .typing_tools import UNION_ORIGINS, admits_none

# Predicates with a name a reader knows; others are shown by their function's name.
_PREDICATE_NAMES = {math.isfinite: 'finite', math.isinf: 'infinite', math.isnan: 'nan'}


class Check:
    """One constraint: ``test(value)`` is true for valid values.

    Attributes:
        text: how a listing shows it (``'≥ 1'``, ``'len ≤ 8'``, ``'finite'``).
        must: how an error states it (``'must be ≥ 1'``).
    """
    __slots__ = ('test', 'text', 'must')

    def __init__(self, test: Callable[[Any], bool], text: str, must: str):
        self.test = test
        self.text = text
        self.must = must


class Rule:
    """The checks on an item's values.

    Attributes:
        checks: the :class:`Check` s, in declaration order.
        none_ok: ``None`` is valid without checks (the item is ``Optional[Annotated[T, ...]]`` or
            ``Annotated[Optional[T], ...]``).
    """
    __slots__ = ('checks', 'none_ok')

    def __init__(self, checks: Sequence[Check], none_ok: bool):
        self.checks = tuple(checks)
        self.none_ok = none_ok

    def violation(self, value: Any) -> Optional[str]:
        """What ``value`` breaks (``'must be ≥ 1'``), or ``None`` when it passes every check."""
        if value is None and self.none_ok:
            return None
        for check in self.checks:
            try:
                ok = check.test(value)
            except Exception:  # e.g. TypeError: '>=' not supported between 'str' and 'int'
                ok = False
            if not ok:
                return check.must
        return None

    def describe(self) -> str:
        """The checks as a listing shows them, after the type: ``'> 0, ≤ 1'``."""
        return ', '.join(c.text for c in self.checks)


def check(rule: Rule, path: str, value: Any, how: str = ''):
    """Raise unless ``value`` passes ``rule``.

    Raises:
        BadValueError: ``bad value for <path>: must be ≥ 1, got 0`` (then ``how``, e.g. ``' (option 'auto')'``).
    """
    why = rule.violation(value)
    if why is not None:
        raise BadValueError(f'bad value for {path}: {why}, got {shown(value)}{how}', path)


def split(annotation: Any, where: str) -> tuple[Any, Optional[Rule]]:
    """(the item's type without constraints, its :class:`Rule` or ``None``).

    ``where`` names the item in errors (``'Configs.batch_size'``).

    Raises:
        DeclarationError: constraints where they would not be checked, or one this engine cannot check.
    """
    origin = get_origin(annotation)
    if origin is Annotated:
        inner = annotation.__origin__
        _no_nested(inner, where)
        return inner, rule_of(annotation, where)
    if origin in UNION_ORIGINS:
        members = get_args(annotation)
        constrained = [m for m in members if get_origin(m) is Annotated]
        if constrained and len(members) == 2 and type(None) in members:
            inner, rule = split(constrained[0], where)
            if rule is not None:
                rule.none_ok = True
            return Optional[inner], rule
    _no_nested(annotation, where)
    return annotation, None


def rule_of(annotated: Any, where: str) -> Optional[Rule]:
    """The :class:`Rule` of one ``Annotated[T, ...]`` (its own metadata only), or ``None`` without checks."""
    checks = _checks(annotated.__metadata__, where)
    return Rule(checks, admits_none(annotated.__origin__)) if checks else None


def _no_nested(annotation: Any, where: str):
    for arg in get_args(annotation):
        if get_origin(arg) is Annotated:
            shown = str(annotation).replace('typing.', '')
            raise DeclarationError(f'{where}: constraints inside {shown} would not be checked; put them on the '
                                   f'item (Annotated[T, ...]) or directly inside Optional[...]')
        _no_nested(arg, where)


def _checks(metadata: Sequence[Any], where: str) -> list[Check]:
    import annotated_types as at  # only for annotations with metadata: plain annotations never import it
    checks: list[Check] = []
    for meta in metadata:
        if isinstance(meta, at.GroupedMetadata):  # Interval, Len: a group of the single constraints
            checks.extend(_checks(list(meta), where))
        elif isinstance(meta, at.BaseMetadata):
            checks.append(_check(at, meta, where))
    return checks


def check_of(at: Any, meta: Any, where: str) -> Check:
    """The :class:`Check` of one annotated-types constraint ``meta`` (``at`` is the annotated_types module)."""
    return _check(at, meta, where)


def _check(at: Any, meta: Any, where: str) -> Check:
    if isinstance(meta, at.Gt):
        bound = meta.gt
        return Check(lambda v: v > bound, f'> {bound!r}', f'must be > {bound!r}')
    if isinstance(meta, at.Ge):
        bound = meta.ge
        return Check(lambda v: v >= bound, f'≥ {bound!r}', f'must be ≥ {bound!r}')
    if isinstance(meta, at.Lt):
        bound = meta.lt
        return Check(lambda v: v < bound, f'< {bound!r}', f'must be < {bound!r}')
    if isinstance(meta, at.Le):
        bound = meta.le
        return Check(lambda v: v <= bound, f'≤ {bound!r}', f'must be ≤ {bound!r}')
    if isinstance(meta, at.MultipleOf):
        step = meta.multiple_of
        return Check(lambda v: v % step == 0, f'multiple of {step!r}', f'must be a multiple of {step!r}')
    if isinstance(meta, at.MinLen):
        n = meta.min_length
        return Check(lambda v: len(v) >= n, f'len ≥ {n}', f'must have length ≥ {n}')
    if isinstance(meta, at.MaxLen):
        n = meta.max_length
        return Check(lambda v: len(v) <= n, f'len ≤ {n}', f'must have length ≤ {n}')
    if isinstance(meta, at.Predicate):
        func = meta.func
        negated = isinstance(func, at.Not)  # Not(f) is itself the test: `not f(v)`
        base = func.func if negated else func
        known = _known_name(base)
        name = known or _callable_name(base)
        if name is None:  # a lambda: nothing to call it by
            return Check(func, 'predicate', 'must pass its predicate')
        verb = 'be' if known else 'satisfy'
        if negated:
            return Check(func, f'not {name}', f'must not {verb} {name}')
        return Check(func, name, f'must {verb} {name}')
    raise DeclarationError(f'{where}: lazylab.configs cannot check {meta!r}; supported: Gt, Ge, Lt, Le, Interval, '
                           f'MultipleOf, MinLen, MaxLen, Len, Predicate')


def _known_name(func: Callable[[Any], bool]) -> Optional[str]:
    """A name a reader knows: math's predicates, or the `constraint_text` a predicate function carries
    (``'free of control characters'``: errors say ``must be free of control characters``)."""
    own = getattr(func, 'constraint_text', None)
    if isinstance(own, str):
        return own
    try:
        return _PREDICATE_NAMES.get(func)
    except TypeError:  # an unhashable callable
        return None


def _callable_name(func: Callable[[Any], bool]) -> Optional[str]:
    name = getattr(func, '__qualname__', None) or getattr(func, '__name__', None)
    return name if name and '<lambda>' not in name else None
