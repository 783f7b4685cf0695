"""Turning text (command line, YAML) into values of an item's declared type.

    coerce_text('1e-3', float) == 0.001        coerce_text('.5', float) == 0.5
    coerce_text('yes', bool) is True            coerce_text('null', Optional[int]) is None
    coerce_text('[1, 2]', List[int]) == [1, 2]  coerce_text('(0.9, 0.98)', Tuple[float, float]) == (0.9, 0.98)
    coerce_text('b', Literal['a', 'b']) == 'b'  coerce_text('RED', Color) is Color.RED
    coerce_text('8', Annotated[int, Ge(1)]) == 8   coerce_text('0', Annotated[int, Ge(1)]) raises TypeMismatch
    coerce_text('1e3', int) raises TypeMismatch     (an int's spelling only; its hint says ' (write 1000)')

:func:`coerce_text` raises :class:`TypeMismatch` (a plain ``ValueError`` with a description of what was
expected); callers that know the item turn it into :class:`~.errors.BadValueError` naming the key.
:func:`conform` does the same for values YAML already parsed (an int for a float item, a list for a tuple).
Both read ``Annotated[T, ...]`` as ``T`` and then check its constraints (see :mod:`.constraints`).
"""
import json
import math
import numbers
from enum import Enum
from typing import Annotated, Any, Literal, get_args, get_origin

from lazylab import safe_yaml
from lazylab.errors import shown

from .constraints import rule_of
from .typing_tools import UNION_ORIGINS, describe_type, is_any

_TRUE = frozenset({'true', 'yes', 'on', '1', 'y', 't'})
_FALSE = frozenset({'false', 'no', 'off', '0', 'n', 'f'})
_NULL = frozenset({'null', 'none', '~'})


class TypeMismatch(ValueError):
    """Text or a value that does not fit a type; ``str(e)`` says what was expected.

    Attributes:
        hint: what to write instead, shown after the value (``' (write 1000)'``), or ``''``.
    """

    def __init__(self, message: str, hint: str = ''):
        super().__init__(message)
        self.hint = hint


def coerce_text(text: str, annotation: Any) -> Any:
    """Parse ``text`` as a value of ``annotation`` (an ``Annotated`` type's constraints are checked too).

    Args:
        text, annotation: the text given (``'0.5'``, ``'False'``, ``'[1, 2]'``, ``'none'``) and the declared type.

    Raises:
        TypeMismatch: the text is not a valid value of that type."""
    if is_any(annotation) or annotation is str:
        return text
    origin = get_origin(annotation)
    if origin is Annotated:
        return _checked(coerce_text(text, annotation.__origin__), annotation)
    stripped = text.strip()
    if origin in UNION_ORIGINS:
        members = get_args(annotation)
        if type(None) in members and stripped.lower() in _NULL:
            return None
        for member in members:  # first member that parses wins; str last so '5' stays an int for Union[int, str]
            if member is type(None) or member is str:
                continue
            try:
                return coerce_text(text, member)
            except TypeMismatch:
                pass
        if str in members:
            return text
        raise TypeMismatch(f'expected {describe_type(annotation)}')
    if origin is Literal:
        for choice in get_args(annotation):
            if isinstance(choice, str) and choice == text:
                return choice
            if not isinstance(choice, str):
                try:
                    if coerce_text(text, type(choice)) == choice:
                        return choice
                except TypeMismatch:
                    pass
        raise TypeMismatch('expected one of ' + ', '.join(repr(c) for c in get_args(annotation)))
    if annotation is type(None):
        if stripped.lower() in _NULL:
            return None
        raise TypeMismatch('expected null')
    if annotation is bool:
        low = stripped.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise TypeMismatch('expected bool (true/false, yes/no, 1/0)')
    if annotation is int:
        try:
            return int(stripped)
        except ValueError:  # '1e3' and '2.0' too: a float's spelling is refused, not rounded (see _integer_hint)
            raise TypeMismatch('expected int', _integer_hint(stripped)) from None
    if annotation is float:
        try:
            return float(stripped)
        except ValueError:
            raise TypeMismatch('expected float') from None
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return _coerce_enum(stripped, annotation)
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple, set, frozenset):
        return _coerce_sequence(stripped, annotation)
    if origin is dict or annotation is dict:
        try:
            value = _parse_structured(stripped)
        except ValueError:
            raise TypeMismatch(f'expected {describe_type(annotation)}') from None
        if not isinstance(value, dict):
            raise TypeMismatch(f'expected {describe_type(annotation)}')
        return conform(value, annotation)
    if _built_from_text(annotation):
        try:
            return annotation(stripped)
        except (RuntimeError, ValueError, TypeError):
            raise TypeMismatch(f'expected a {describe_type(annotation)} such as cpu, cuda or cuda:0') from None
    raise TypeMismatch(f'a {describe_type(annotation)} cannot be given as text')


#: classes whose value a text names, built by calling the class on it (``torch.device('cuda:0')``); named by
#: (module, name) so the engine imports no torch (the class is imported wherever an item is declared with it)
_BUILT_FROM_TEXT = frozenset({('torch', 'device')})


def _built_from_text(annotation: Any) -> bool:
    return isinstance(annotation, type) and (annotation.__module__, annotation.__qualname__) in _BUILT_FROM_TEXT


def _integer_hint(text: str) -> str:
    """``' (write 1000)'`` for text that spells a whole number as a float (``'1e3'``, ``'2.0'``), else ``''``.

    An int item takes an integer's spelling only, as Python's ``int()``, argparse and OmegaConf do: a float's
    spelling for a count is as often a value meant for another key (a rate given to a step count) as a count, and
    taking the whole ones (``1e3``) while refusing the others (``1.5``) is a rule a user has to know before the
    value means what it says. The hint says what to write instead.
    """
    from decimal import Decimal, InvalidOperation  # only for a mistake's message
    try:
        d = Decimal(text.replace('_', ''))
    except InvalidOperation:
        return ''
    if not d.is_finite() or d != d.to_integral_value() or d.adjusted() > 30:
        return ''
    return f' (write {int(d)})'


def _checked(value: Any, annotated: Any) -> Any:
    """``value`` if it passes the constraints of ``Annotated[T, ...]`` (see :mod:`.constraints`)."""
    rule = rule_of(annotated, 'value')
    why = None if rule is None else rule.violation(value)
    if why is not None:
        raise TypeMismatch(f'{why}, got {shown(value)}')
    return value


def _coerce_enum(text: str, enum: type) -> Any:
    for member in enum:
        if member.name == text or member.name.lower() == text.lower():
            return member
    for member in enum:
        try:
            if member.value == coerce_text(text, type(member.value)):
                return member
        except TypeMismatch:
            pass
    raise TypeMismatch('expected one of ' + ', '.join(m.name for m in enum))


_CLOSING = {'[': ']', '(': ')'}


def _split_items(text: str):
    """'[1, 2]', '(1, 2)', '1,2' -> ['1', '2']; nested brackets and quotes are kept together.

    The same rules for every element type (``List[int]``, ``List[str]``, ``List[Any]``, tuples): brackets and
    quotes must be balanced and an element must not be empty (``''`` quoted is an empty string).

    Raises:
        TypeMismatch: unbalanced brackets or quotes (``'[a, b'``), or an empty element (``'a,,b'``).
    """
    opened, closed = text[:1] in _CLOSING, text[-1:] in _CLOSING.values()
    if opened or closed:
        if not (opened and text[-1:] == _CLOSING[text[0]]):
            raise TypeMismatch('unbalanced brackets')
        text = text[1:-1]
    if not text.strip():
        return []
    items, stack, quote, start = [], [], None, 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in '\'"' and not text[start:i].strip():  # a quote opens only at an element's start: "it's" is text
            quote = ch
        elif ch in _CLOSING:
            stack.append(_CLOSING[ch])
        elif ch in '])':
            if not stack or stack.pop() != ch:
                raise TypeMismatch('unbalanced brackets')
        elif ch == ',' and not stack:
            items.append(text[start:i])
            start = i + 1
    if stack or quote:
        raise TypeMismatch(f'unbalanced {"quotes" if quote else "brackets"}')
    items.append(text[start:])
    if len(items) > 1 and not items[-1].strip():  # trailing comma: '(1,)'
        items.pop()
    out = []
    for item in items:
        item = item.strip()
        if len(item) >= 2 and item[0] == item[-1] and item[0] in '\'"':
            item = item[1:-1]
        elif not item:
            raise TypeMismatch("an empty element (write '' for an empty string)")
        out.append(item)
    return out


def _coerce_sequence(text: str, annotation: Any) -> Any:
    origin = get_origin(annotation) or annotation
    args = get_args(annotation)
    try:
        items = _split_items(text)
    except TypeMismatch as e:
        raise TypeMismatch(f'expected {describe_type(annotation)}: {e}') from None
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(items) != len(args):
            raise TypeMismatch(f'expected {describe_type(annotation)} ({len(args)} values, got {len(items)})')
        return tuple(coerce_text(t, a) for t, a in zip(items, args))
    element = args[0] if args else Any
    try:
        values = [coerce_text(t, element) for t in items]
    except TypeMismatch as e:
        raise TypeMismatch(f'expected {describe_type(annotation)}: {e}') from None
    return origin(values)


def _parse_structured(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        import yaml  # only for flow-style YAML mappings given on the command line
        try:
            return safe_yaml.load(text)
        except yaml.YAMLError as e:
            raise ValueError(str(e)) from None


def conform(value: Any, annotation: Any, *, strict: bool = False) -> Any:
    """Fit an already-parsed value (from YAML, or given by code) to ``annotation``: strings are parsed as text,
    whole numbers become ints and numbers floats, lists become tuples, names become enum members.

    Args:
        strict: for a type that is not plain data (a class such as ``nn.Module``), refuse a value that is not an
            instance of it (what a YAML file gives: numbers, lists, mappings); otherwise such values pass unchanged
            (code may give any object, as labml allows).

    Raises:
        TypeMismatch: the value does not fit (a float for an int item, a number for a str item, ...).
    """
    if isinstance(value, str):
        return coerce_text(value, annotation)
    if is_any(annotation):
        return value
    origin = get_origin(annotation)
    if origin is Annotated:
        return _checked(conform(value, annotation.__origin__, strict=strict), annotation)
    if value is None:
        if origin in UNION_ORIGINS and type(None) in get_args(annotation):
            return None
        if annotation is type(None):
            return None
        raise TypeMismatch(f'expected {describe_type(annotation)}, not null')
    if origin in UNION_ORIGINS:
        for member in get_args(annotation):
            try:
                return conform(value, member, strict=strict)
            except TypeMismatch:
                pass
        raise TypeMismatch(f'expected {describe_type(annotation)}')
    if origin is Literal:
        if any(value == c and type(value) is type(c) for c in get_args(annotation)):
            return value
        raise TypeMismatch('expected one of ' + ', '.join(repr(c) for c in get_args(annotation)))
    if annotation in (bool, int, float, str):
        return _conform_scalar(value, annotation, strict)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        if isinstance(value, annotation):
            return value
        for member in annotation:
            if member.value == value:
                return member
        raise TypeMismatch('expected one of ' + ', '.join(m.name for m in annotation))
    if origin in (list, tuple, set, frozenset, dict) or annotation in (list, tuple, set, frozenset, dict):
        return _conform_container(value, annotation, strict)
    if strict and isinstance(annotation, type) and not isinstance(value, annotation):
        raise TypeMismatch(f'a {describe_type(annotation)} cannot be given as {type(value).__name__}')
    return value


def _conform_scalar(value: Any, annotation: type, strict: bool = False) -> Any:
    """:func:`conform` for a bool, int, float or str item (``value`` is not a string). ``strict`` (a value from
    YAML): a float is no int, whole or not (``max_steps: 1.0e3`` is refused as ``'1e3'`` is on a command line);
    code may give a whole float (``1e3``) for an int item, as labml lets it."""
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, numbers.Integral) and value in (0, 1):
            return bool(value)
        raise TypeMismatch('expected bool')
    if annotation is str:
        raise TypeMismatch('expected str (text; quote it in YAML)')
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeMismatch(f'expected {annotation.__name__}')
    if annotation is float:
        return float(value)
    if not isinstance(value, numbers.Integral):
        whole = math.isfinite(value) and float(value).is_integer() and abs(value) <= 2**53  # held exactly
        if strict or not whole:
            raise TypeMismatch('expected int', f' (write {int(value)})' if whole else '')
    return int(value)


def _conform_container(value: Any, annotation: Any, strict: bool) -> Any:
    """:func:`conform` for a list, tuple, set, frozenset or dict item, element by element."""
    container = get_origin(annotation) or annotation
    args = get_args(annotation)
    if container is dict:
        if not isinstance(value, dict):
            raise TypeMismatch(f'expected {describe_type(annotation)}')
        if len(args) == 2:
            return {conform(k, args[0], strict=strict): conform(v, args[1], strict=strict) for k, v in value.items()}
        return dict(value)
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise TypeMismatch(f'expected {describe_type(annotation)}')
    if container is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise TypeMismatch(f'expected {describe_type(annotation)} ({len(args)} values, got {len(value)})')
        return tuple(conform(v, a, strict=strict) for v, a in zip(value, args))
    element = args[0] if args else Any
    return container(conform(v, element, strict=strict) for v in value)
