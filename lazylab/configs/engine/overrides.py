"""Giving values to items before they are computed: overrides, assignments and ``set_default``.

Overrides (``conf._set_values(d)``, :func:`apply_overrides`) are all-or-nothing: every key is checked first
(declared? not yet computed? a known option? text that parses as the declared type?) and only then is anything
applied. Dotted keys (``'optimizer.learning_rate'``) go to the sub-config at once if it exists, and otherwise
wait in the parent until it is created; when the sub-config's class is known from the annotation they are
checked against it up front.

Command-line overrides are ``key=value`` and ``child.key=value`` tokens::

    parse_overrides(['d_model=256', 'optimizer.learning_rate=1e-3'])
        == {'d_model': '256', 'optimizer.learning_rate': '1e-3'}
    parse_overrides([...], conf)      # the same, typed and checked against conf (nothing applied)
    apply_overrides(conf, {...})      # type, check, then apply all (or raise and apply none)

Every value is typed by the same rules wherever it enters (command line, YAML, ``_set_values``, assignment,
``set_default``; see :func:`typed_value` and :mod:`.coerce`): a string naming one of an item's options stays the
option name, other text is parsed as the declared type (``'False'`` for a bool item is ``False``, ``'[a, b'`` for a
list item is an error), and other values are fitted to the type or refused.
"""
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Optional, get_args, get_origin

from lazylab.command_line import split_setting
from lazylab.errors import given_twice, shown

from .coerce import TypeMismatch, coerce_text, conform
from .constraints import check
from .declarations import AGGREGATE_MARKER, ItemRef, Spec, spec_of
from .env_refs import forget_env
from .errors import (
    AlreadyComputedError,
    BadValueError,
    ConfigError,
    OverrideSyntaxError,
    UnknownItemError,
    UnknownOptionError,
    suggestion,
    unknown_item,
)
from .report import note_given
from .state import State, state_of
from .typing_tools import describe_type, is_configs_class, is_plain_value, takes_any_string


class Unborn:
    """Stands in for a sub-config not created yet, so dotted keys can be checked against its class."""
    cache: dict[str, Any] = {}
    children: dict[str, Any] = {}

    def __init__(self, spec: Spec, path: str):
        self.spec = self._spec = spec
        self.path = path
        self.class_name = spec.name

    def path_of(self, key: str) -> str:
        return f'{self.path}.{key}'


class Plan:
    """Checked overrides, ready to apply: direct values, plans for existing sub-configs, and dotted values
    waiting for sub-configs not created yet (``top -> {sub_key: (value, from_text)}``)."""

    def __init__(self):
        self.direct: dict[str, Any] = {}
        self.children: dict[str, Plan] = {}
        self.pending: dict[str, dict[str, tuple[Any, bool]]] = {}


def check_option_name(view: Any, key: str, value: Any):
    """Reject a string that is not an option of an item with options, unless the item is declared ``str``
    (or a Union with ``str``, or a Literal containing it).

    Raises:
        UnknownOptionError: naming the path, the nearest option and all options.
    """
    spec = view._spec  # current: every caller has just read view.spec
    options = spec.options.get(key)
    if not options or not isinstance(value, str) or value in options or value == AGGREGATE_MARKER:
        return
    annotation = spec.types[key]
    if takes_any_string(annotation) or (get_origin(annotation) is Literal and value in get_args(annotation)):
        return
    path = view.path_of(key)
    hint = suggestion(value, options)
    listing = f'options: {", ".join(options)}'
    raise UnknownOptionError(f'unknown option {shown(value)} for {path} ({view.class_name})'
                             + (f'{hint} {listing}' if hint else f'; {listing}'), path)


# plain types and built-in containers: conform() checks their values (True is an int, but not a value of an int item)
_CHECKED = frozenset({int, float, bool, str, list, tuple, set, frozenset, dict})


def typed_value(view: Any, key: str, value: Any, from_text: bool = True) -> Any:
    """The value a given value stands for, by one set of rules wherever it comes from (command line, YAML,
    ``_set_values``, assignment, ``set_default``): a string naming one of the item's options stays the option
    name; other strings are parsed as the declared type (``'False'`` for a bool item is ``False``); other values
    are fitted to it (an int for a float item). Objects of types that are not plain data pass unchanged when code
    gives them (``from_text=False``); from text or YAML (``from_text=True``) only an option name can stand for one.

    Raises:
        UnknownOptionError: a string that is neither an option nor a value of the type, for an item with options.
        BadValueError: a value that does not fit the type (names the key, the type and the value).
    """
    spec = view._spec  # current: every caller has just read view.spec
    annotation = spec.types[key]
    if type(value) is annotation and annotation is not str:  # already a value of the type (an int for an int item)
        return value
    if _defaults_to_none(spec, key) and (value is None or (isinstance(value, str) and annotation is not str
                                                          and _is_null_text(value))):
        return None  # `n: int = None`: the default's type widens the annotation
    options = spec.options.get(key)
    if isinstance(value, str) and (value == AGGREGATE_MARKER or (options and value in options)):
        return value
    if not from_text and isinstance(annotation, type) and annotation not in _CHECKED \
            and isinstance(value, annotation) and not isinstance(value, str):
        return value  # an object of the declared class, given by code (an optimizer for an Optimizer item)
    try:
        return coerce_text(value, annotation) if isinstance(value, str) else \
            conform(value, annotation, strict=from_text)
    except TypeMismatch as e:
        if options and isinstance(value, str):
            check_option_name(view, key, value)
        path = view.path_of(key)
        why = f'expected one of its options ({", ".join(options)})' if options and not isinstance(value, str) \
            else str(e)
        raise BadValueError(f'bad value for {path}: {why}, got {shown(value)}{e.hint}', path) from None


def _defaults_to_none(spec: Any, key: str) -> bool:
    """Whether item ``key``'s class default is None: labml code declares ``n: int = None`` for an item that may be
    left unset, and such an item takes None as a value too, as its default does (given by code, as YAML null)."""
    return key in spec.defaults and spec.defaults[key] is None


def _is_null_text(text: str) -> bool:
    try:
        return coerce_text(text, type(None)) is None
    except TypeMismatch:
        return False


def check_given(view: Any, key: str, value: Any):
    """Check a value given for item ``key`` against its constraints (``Annotated[int, Ge(1)]``); an option
    name is not a value yet, and what its option computes is checked when stored.

    Raises:
        BadValueError: ``bad value for <path>: must be ≥ 1, got 0``.
    """
    spec = view._spec  # current: every caller has just read view.spec
    rule = spec.rules.get(key)
    if rule is None or (value is None and _defaults_to_none(spec, key)):
        return
    if isinstance(value, str) and (value == AGGREGATE_MARKER or value in spec.options.get(key, ())):
        return
    check(rule, view.path_of(key), value)


def plan(view: Any, values: dict[str, Any], from_text: bool) -> Plan:
    """Check ``values`` against ``view`` (a :class:`State` or an unborn sub-config) without changing anything.

    Raises:
        UnknownItemError: an undeclared key (with the nearest declared names).
        AlreadyComputedError: a key whose item was already computed.
        UnknownOptionError, BadValueError: see :func:`check_option_name`, :func:`typed_value`, :func:`check_given`.
    """
    spec = view.spec
    result = Plan()
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key or key.startswith('_'):
            raise UnknownItemError(f'invalid config key {key!r} for {view.class_name}', view.path)
        top, dot, rest = key.partition('.')
        if top not in spec.annotations:
            raise unknown_item(view.class_name, view.path_of(key), top, spec.annotations)
        if dot:
            if not rest:
                raise UnknownItemError(f'invalid config key {view.path_of(key)!r}', view.path_of(key))
            grouped.setdefault(top, {})[rest] = value
            continue
        if top in view.cache:
            raise AlreadyComputedError(f'cannot set {view.path_of(top)}: it was already computed',
                                       view.path_of(top))
        value = typed_value(view, top, value, from_text)
        check_given(view, top, value)
        result.direct[top] = value
    for top, sub in grouped.items():
        child = view.children.get(top)
        if child is not None:
            result.children[top] = plan(state_of(child), sub, from_text)
            continue
        path = view.path_of(top)
        if top in view.cache:
            raise UnknownItemError(f'{path} is not a sub-config, so {path}.{next(iter(sub))} does not exist',
                                   path)
        _check_unborn(view, top, sub, from_text)
        result.pending[top] = {k: (v, from_text) for k, v in sub.items()}
    return result


def _check_unborn(view: Any, top: str, sub: dict[str, Any], from_text: bool):
    """Check dotted keys for a sub-config not created yet against its annotated class, when that is known.

    An option may return a subclass with more items, so unknown keys wait (and are checked on creation)
    unless the item can only be constructed from its annotation.
    """
    spec = view.spec
    annotation = spec.types[top]
    if is_plain_value(annotation):
        path = view.path_of(top)
        raise UnknownItemError(f'{path} is not a sub-config (its type is {describe_type(annotation)}), so '
                               f'{path}.{next(iter(sub))} does not exist', path)
    if not (isinstance(annotation, type) and getattr(annotation, '_lazylab_is_configs', False)):
        return
    try:
        plan(Unborn(spec_of(annotation), view.path_of(top)), sub, from_text)
    except UnknownItemError:
        if top in spec.options or top in spec.defaults or top in spec.by_target:
            return
        raise


def typed_pending(st: State, top: str, key: str, value: Any, from_text: bool) -> Any:
    """A value waiting in ``st`` for its sub-config ``top`` (``st.pending``), typed as that item of the sub-config's
    declared class will type it; text stays text when the class is not known until an option makes it."""
    annotation = st.spec.types[top]
    if '.' in key or not is_configs_class(annotation) or key not in spec_of(annotation).annotations:
        return value
    try:
        return plan(Unborn(spec_of(annotation), st.path_of(top)), {key: value}, from_text).direct[key]
    except ConfigError:  # checked when given; an option may make a subclass that types it otherwise
        return value


def apply(st: State, p: Plan):
    """Apply a checked :class:`Plan`."""
    st.overrides.update(p.direct)
    st.explicit.update(p.direct)
    for top, child_plan in p.children.items():
        apply(state_of(st.children[top]), child_plan)
    for top, sub in p.pending.items():
        st.pending.setdefault(top, {}).update(sub)


def set_overrides(st: State, values: dict[str, Any], from_text: bool = False):
    """Check all of ``values``, then apply all of them (see module docstring)."""
    apply(st, plan(st, values, from_text))
    forget_env(st, values)  # a value given again: its record of reading the environment is gone
    note_given(st, values, 'override')  # given, or set by code (see report.note_given): what a dump replays


def apply_pending(st: State, pending: dict[str, tuple[Any, bool]]):
    """Apply the dotted overrides that waited for this sub-config to be created."""
    python_values = {k: v for k, (v, text) in pending.items() if not text}
    text_values = {k: v for k, (v, text) in pending.items() if text}
    plans = [plan(st, python_values, False), plan(st, text_values, True)]
    for p in plans:
        apply(st, p)


def assign(st: State, key: str, value: Any):
    """``conf.key = value``.

    Raises:
        UnknownItemError: ``key`` is not declared (an AttributeError).
        AlreadyComputedError: the item was already computed (a ValueError, as in labml).
        UnknownOptionError: a string that is not an option (see :func:`check_option_name`).
        BadValueError: a value that does not fit the declared type or breaks the item's constraints (see
            :func:`typed_value`, :func:`check_given`).
    """
    if key not in st.spec.annotations:
        raise unknown_item(st.class_name, st.path_of(key), key, st.spec.annotations)
    if key in st.cache:
        raise AlreadyComputedError(f'cannot set {st.path_of(key)}: it was already computed', st.path_of(key))
    value = typed_value(st, key, value, from_text=False)
    check_given(st, key, value)
    st.assigned[key] = value
    forget_env(st, (key,))
    note_given(st, (key,), 'assigned')


def set_default(st: State, item: Any, value: Any = None, func: Any = None):
    """``conf.set_default(Cls.item, value=..., func=...)``: a per-instance default (``func()`` wins over value).

    Raises:
        UnknownItemError: the item is not declared on this config.
        AlreadyComputedError: the item was already computed.
        BadValueError: ``value`` (when no ``func`` is given) breaks the item's constraints.
    """
    key = item.key if isinstance(item, ItemRef) else item
    if not isinstance(key, str) or key not in st.spec.annotations:
        name = key if isinstance(key, str) else repr(item)
        raise unknown_item(st.class_name, st.path_of(name), name, st.spec.annotations)
    if key in st.cache:
        raise AlreadyComputedError(f'cannot set the default of {st.path_of(key)}: it was already computed',
                                   st.path_of(key))
    if func is None:
        value = typed_value(st, key, value, from_text=False)
        check_given(st, key, value)
    st.defaults[key] = (value, func)
    note_given(st, (key,), None)  # a default set by code while computing an item: what it was computed from


def parse_overrides(argv: Sequence[str], configs: Optional[Any] = None) -> dict[str, Any]:
    """Split ``key=value`` tokens into a dict; a key may be given once.

    Without ``configs`` the values are the text given. With a config object they are typed and checked
    against its declared items (nothing is applied); dotted keys for sub-configs not created yet stay text
    when their class is not known.

    Args:
        argv: the tokens, e.g. ``['d_model=256', 'optimizer.learning_rate=1e-3']`` (a leading ``--`` on a key is
            dropped).
        configs: a config object to type and check the values against, or ``None`` to keep them as text.

    Returns:
        ``{dotted key: value}``.

    Raises:
        OverrideSyntaxError: a token without ``=``, with an empty key, or a key with a control character
            (``\\n``, ``\\t``, …: shown escaped); a key given twice (``d_model=8 d_model=16``: both named).
        UnknownItemError, UnknownOptionError, BadValueError, AlreadyComputedError: with ``configs``.
    """
    values: dict[str, str] = {}
    tokens: dict[str, str] = {}  # key → the token that gave it
    for token in argv:
        key, text = split_setting(token, error=OverrideSyntaxError)
        if key.startswith('--'):  # tolerate `--key=value`
            key = key[2:]
        if key in values:
            raise OverrideSyntaxError(given_twice(key, tokens[key], token))
        values[key] = text
        tokens[key] = token
    if configs is None:
        return values
    checked = plan(state_of(configs), values, from_text=True)
    return _flatten(checked, '')


def _flatten(p: Plan, prefix: str) -> dict[str, Any]:
    out = {prefix + k: v for k, v in p.direct.items()}
    for top, child in p.children.items():
        out.update(_flatten(child, f'{prefix}{top}.'))
    for top, sub in p.pending.items():
        out.update({f'{prefix}{top}.{k}': v for k, (v, _) in sub.items()})
    return out


def apply_overrides(configs: Any, values: Mapping[str, Any]):
    """Apply overrides given as text or YAML-parsed values (dotted keys reach sub-configs), all-or-nothing.

    Strings are parsed by each item's declared type (an option name stays a string); other values are fitted
    to it (an int for a float item, a list for a tuple item).

    Args:
        configs: the config object to apply them to.
        values: ``{dotted key: value}``, e.g. from :func:`parse_overrides` or a YAML mapping.

    Raises:
        UnknownItemError: an undeclared key (names the nearest declared ones); nothing is applied.
        UnknownOptionError: text that is neither an option nor a value of the item's type.
        BadValueError: text that does not parse as the declared type (names key, type and text).
        AlreadyComputedError: an item that was already computed.
    """
    set_overrides(state_of(configs), dict(values), from_text=True)


def declared_paths(configs_or_class: Any) -> list[str]:
    """Every item's full dotted path: the class's items, then those of the sub-configs its annotations name
    (``optimizer.learning_rate``), as ``lazylab options`` lists them."""
    cls = configs_or_class if isinstance(configs_or_class, type) else type(configs_or_class)
    paths: list[str] = []

    def visit(c: type, prefix: str, seen: frozenset):
        spec = spec_of(c)
        subs = []
        for key in spec.annotations:
            paths.append(prefix + key)
            sub = spec.types[key]
            if isinstance(sub, type) and getattr(sub, '_lazylab_is_configs', False) and sub not in seen:
                subs.append((key, sub))
        for key, sub in subs:
            visit(sub, f'{prefix}{key}.', seen | {sub})

    visit(cls, '', frozenset({cls}))
    return paths


def expand_short_keys(configs: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each short key replaced by the one declared path it ends with (for command lines):
    ``ffn.glu_variant`` → ``transformer.ffn.glu_variant`` when exactly one declared path ends in
    ``.ffn.glu_variant``. A key whose first part is an item of ``configs`` is left as it is (so is one that
    matches nothing: applying it names the nearest items). Two keys that name one item (``ffn.glu_variant`` and
    ``transformer.ffn.glu_variant``) are refused, as :func:`parse_overrides` refuses a key given twice.

    Raises:
        UnknownItemError: a short key that several declared paths end with (the message lists them).
        OverrideSyntaxError: two keys of ``values`` name one item (both named, as ``KEY=VALUE``).
    """
    spec = state_of(configs).spec if not isinstance(configs, type) else spec_of(configs)
    paths = None
    out: dict[str, Any] = {}
    written: dict[str, Any] = {}  # full key → the key as given
    for key, value in values.items():
        written_key = key
        if isinstance(key, str) and key and key.partition('.')[0] not in spec.annotations:
            paths = declared_paths(configs) if paths is None else paths
            matches = [p for p in paths if p.endswith('.' + key)]
            if len(matches) > 1:
                raise UnknownItemError(f'{key!r} is ambiguous: it could be {", ".join(matches)}; give the full key',
                                       key)
            if matches:
                key = matches[0]
        if key in out:
            raise OverrideSyntaxError(given_twice(key, f'{written[key]}={out[key]}', f'{written_key}={value}'))
        out[key] = value
        written[key] = written_key
    return out
