"""Computing item values lazily, once, in labml's order of precedence.

On first read an item's value comes from, in order:

1. an override (``_set_values`` / :func:`~lazylab.configs.apply_overrides`);
2. a value assigned as an attribute;
3. ``set_default(Cls.item, value=..., func=...)``;
4. an aggregate: its selector currently equals the aggregate's option;
5. the class default;
6. the first registered option;
7. constructing the annotated class (``T()``, or ``T(configs)`` when its constructor takes one argument).

A value that is a string naming one of the item's options runs that calculator. A value that is a config
object becomes a sub-config (dotted overrides waiting for it are applied; with ``_primary`` the parent sees
that item of it). Values are cached, so each item is computed at most once, and nothing is computed unless read.

While an item is computed its frame sits on :data:`~.state.ACTIVE`; that gives cycle detection with the full chain
and records, for provenance, which items each calculator read. (Like labml.configs, this is not thread-safe.)
"""
import copy
from enum import Enum
from typing import Any, Callable, Optional

from .constraints import check
from .declarations import AGGREGATE_MARKER, Calculator, _version
from .errors import (
    CalculatorError,
    ConfigError,
    CycleError,
    DeclarationError,
    NotBuiltError,
    NoValueError,
    UnknownItemError,
    unknown_item,
)
from .overrides import apply_pending, check_option_name
from .state import ACTIVE, NOT_BUILT, Frame, Provenance, State, state_of
from .typing_tools import describe_type

# Types labml never constructs from an annotation.
PLAIN_TYPES = frozenset({int, float, str, bool, bytes, complex, dict, list, tuple, set, frozenset, object,
                         type(None)})


def is_configs(value: Any) -> bool:
    return getattr(type(value), '_lazylab_is_configs', False)


def constructible(annotation: Any) -> bool:
    """Whether an annotation is a class labml would construct when an item has no other value."""
    return (isinstance(annotation, type) and annotation not in PLAIN_TYPES
            and not issubclass(annotation, Enum))


def read(st: State, key: str) -> Any:
    """The value of item ``key`` of ``st``, computing (and caching) it on first read.

    Raises:
        UnknownItemError: ``key`` is not declared.
        NoValueError, CycleError, CalculatorError, UnknownOptionError: see :func:`compute`.
    """
    if ACTIVE:
        frame = ACTIVE[-1]
        path = st.path_of(key)
        if path not in frame.read_set:
            frame.read_set.add(path)
            frame.reads.append(path)
    cache = st.cache
    if key in cache:
        return cache[key]
    if key not in st.spec.annotations:
        raise unknown_item(st.class_name, st.path_of(key), key, st.spec.annotations)
    compute(st, key)
    if st.update_callback is not None:
        st.update_callback()
    return cache[key]


def compute(st: State, key: str):
    """Compute item ``key`` and store it in ``st.cache`` (with its provenance).

    Raises:
        NotBuiltError: the item's type is one a caller refused (``inspect.not_built``).
        CycleError: the item is already being computed further up the chain.
        NoValueError: nothing gives the item a value.
        CalculatorError: a calculator or ``set_default`` function raised (chained).
        UnknownOptionError: the value is a string that is not an option of the item (nor of its type).
    """
    # Kept in one function (no helper per step): a chain of N items nests N computations, and each Python
    # frame here counts against the recursion limit.
    path = st.path_of(key)
    spec = st._spec  # the class's current declarations (st.spec, inlined: this runs once per item), which the
    if spec.version != _version[0]:  # helpers below read as st._spec
        spec = st.spec
    if key in st.computing:
        start = next(i for i, f in enumerate(ACTIVE) if f.state is st and f.key == key)
        raise CycleError([f.path for f in ACTIVE[start:]] + [path])
    if NOT_BUILT and any(refused(spec.types[key]) for refused in NOT_BUILT):
        raise NotBuiltError(f'{path} is not built here', path)
    frame = Frame(st, key, path)
    st.computing.add(key)
    ACTIVE.append(frame)
    try:
        if key not in st.order:
            st.order[key] = len(st.order)
        value, source, detail = find_source(st, key, path)
        calculators = spec.options.get(key)
        if isinstance(value, Calculator):  # constructing the annotated type
            calc, selected_by, source = value, '', 'from_type'
        elif isinstance(value, str) and calculators and value in calculators:
            calc, selected_by, source = calculators[value], source, 'option'
        else:
            if isinstance(value, str) and calculators:
                check_option_name(st, key, value)
            st.provenance[key] = Provenance(source, detail, '', frame.reads)
            store(st, key, value)
            return
        try:
            if calc.kind == 'configs':
                result = calc.func(st.owner)
            else:
                result = calc(st.owner, lambda k: read(st, k))
        except ConfigError:
            raise  # already names its own path
        except Exception as e:
            via = 'constructing' if source == 'from_type' else 'option'
            raise CalculatorError(f'{path}: {via} {calc.option_name!r} failed: {type(e).__name__}: {e}',
                                  path, calc.option_name) from e
        _store_result(st, key, path, calc, source, selected_by, frame, result)
    finally:
        ACTIVE.pop()
        st.computing.discard(key)


def _store_result(st: State, key: str, path: str, calc: Calculator, source: str, selected_by: str,
                  frame: Frame, result: Any):
    name = calc.option_name
    detail = name if source == 'option' else getattr(calc.func, '__qualname__', name)
    targets = calc.targets
    if len(targets) == 1:
        st.provenance[key] = Provenance(source, detail, selected_by, frame.reads)
        store(st, key, result)
        return
    if not isinstance(result, (list, tuple)) or len(result) != len(targets):
        got = f'{len(result)} values' if isinstance(result, (list, tuple)) else type(result).__name__
        raise DeclarationError(f'{path}: option {name!r} computes {", ".join(targets)} and must return a '
                               f'tuple or list of {len(targets)} values, got {got}', path)
    for target, value in zip(targets, result):
        if target == key or target not in st.cache:
            if target not in st.order:
                st.order[target] = len(st.order)
            st.provenance[target] = Provenance(source, detail, selected_by, frame.reads)
            store(st, target, value)


def find_source(st: State, key: str, path: str, seen: Optional[set[str]] = None) -> Optional[tuple[Any, str, str]]:
    """(value, source, detail) for an item, following the precedence in the module docstring.

    The one walk of the precedence, used two ways:

    - computing (``seen`` is ``None``): an aggregate's selector is read (cached, and recorded as a read), a
      class-level config object is copied, and for rule 7 the value is the :class:`Calculator` that constructs
      the type; with no value at all it raises :class:`NoValueError`.
    - peeking (``seen`` is the set of items peeked so far, see :func:`peek`): nothing is cached, and ``None``
      means the item has no value to start from.
    """
    for source, values in (('override', st.overrides), ('assigned', st.assigned)):
        if key in values:
            value = values[key]
            if not (isinstance(value, str) and value == AGGREGATE_MARKER):
                return value, source, ''
    if key in st.defaults:
        value, func = st.defaults[key]
        if func is not None:
            return _call_default(path, func), 'set_default', 'func'
        if not (isinstance(value, str) and value == AGGREGATE_MARKER):
            return value, 'set_default', 'value'
    spec = st._spec  # current: refreshed by compute (or peek's caller)
    for selector, table in spec.by_target.get(key, ()):
        selected, has = peek(st, selector, set() if seen is None else seen)
        if has and _in(selected, table):
            if seen is None:
                read(st, selector)
            return table[selected], 'aggregate', f'{selector}={selected}'
    if key in spec.defaults:
        value = spec.defaults[key]
        if seen is None and is_configs(value):  # a class-level instance is a template; each parent gets a copy
            value = copy.deepcopy(value)
        return value, 'default', ''
    options = spec.options.get(key)
    if options:
        return next(iter(options)), 'first option', ''
    if seen is not None:
        return None
    annotation = spec.types[key]
    if constructible(annotation):
        st.from_type.add(key)
        return Calculator(annotation, [key], 'from_type', construct=True), 'from_type', ''
    raise NoValueError(f'{path} ({st.class_name}) has no value: no override, default or option, '
                       f'and its type {describe_type(annotation)} is not constructed automatically', path)


def _call_default(path: str, func: Callable[[], Any]) -> Any:
    try:
        return func()
    except ConfigError:
        raise
    except Exception as e:
        raise CalculatorError(f'{path}: set_default function failed: {type(e).__name__}: {e}',
                              path, 'set_default') from e


def peek(st: State, key: str, seen: set[str]) -> tuple[Any, bool]:
    """(the value an item would start from, whether it has one), without computing or caching it: an option
    name is not run. Used to test an aggregate's selector, as labml does; ``seen`` stops aggregate loops.
    """
    if key in st.cache:
        return st.cache[key], True
    if key in seen:
        return None, False
    seen.add(key)
    found = find_source(st, key, st.path_of(key), seen)
    return (None, False) if found is None else (found[0], True)


def _in(value: Any, table: dict) -> bool:
    try:
        return value in table
    except TypeError:  # unhashable values select nothing
        return False


def store(st: State, key: str, value: Any):
    """Cache a computed value; a config object becomes a sub-config (see module docstring).

    Raises:
        BadValueError: the item has constraints (``Annotated[T, Ge(1)]``) and the value breaks one.
    """
    if is_configs(value):
        attach(st, key, value)
        primary = value.__dict__.get('_primary')
        if primary is not None:
            value = read(state_of(value), primary)
    elif key in st.pending:  # dotted overrides that waited for a sub-config which turned out a plain value
        path = st.path_of(key)
        raise UnknownItemError(f'{path} is not a sub-config (it came out a {type(value).__name__}), so '
                               f'{path}.{next(iter(st.pending.pop(key)))} does not exist', path)
    rule = st._spec.rules.get(key)  # current: refreshed by compute
    if rule is not None and rule.violation(value) is not None:
        # not stored, so not reported by explain() either
        check(rule, st.path_of(key), value, _computed_by(st.provenance.pop(key, None)))
    st.cache[key] = value


def _computed_by(p: Optional[Provenance]) -> str:
    """Where a value that breaks its constraints came from, for the error message (given values were
    checked when given, and need no note)."""
    if p is None or p.source in ('override', 'assigned') or (p.source == 'set_default' and p.detail == 'value'):
        return ''
    if p.source == 'option':
        return f' (computed by option {p.detail!r})'
    if p.source == 'from_type':
        return ' (constructed from its type)'
    if p.source == 'aggregate':
        return f' (set by aggregate {p.detail})'
    if p.source == 'set_default':
        return ' (returned by its set_default function)'
    return ' (class default)'


def attach(st: State, key: str, child: Any):
    """Make ``child`` the sub-config at ``key``: set its path and apply dotted overrides waiting for it."""
    cst = state_of(child)
    set_path(cst, st.path_of(key))
    reset_explicit(cst)
    st.children[key] = child
    pending = st.pending.pop(key, None)
    if pending:
        apply_pending(cst, pending)


def set_path(st: State, path: str):
    st.path = path
    for key, child in st.children.items():
        set_path(state_of(child), st.path_of(key))


def reset_explicit(st: State):
    st.explicit.clear()
    for child in st.children.values():
        reset_explicit(state_of(child))
