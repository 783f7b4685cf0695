"""The public view of a config object, for the tools outside the engine (the run's life, the option listing, the
sweeps, the labml layer): what was given and what was computed, where each value came from, the declared types and
defaults, and the paths of the sub-configs. Nothing outside :mod:`lazylab.configs` needs ``lazylab.configs.engine``.

    from lazylab.configs import inspect

    inspect.computed(conf)           {'d_model': 256, 'optimizer.learning_rate': 0.001, ...}   computed values
    inspect.given(conf)              {'d_model': 'user', ...}       given values, labelled as the dump labels them
    for item in inspect.items(conf): item.path, item.value, item.origin ('given' / 'default' / 'computed'), ...
    inspect.sub_configs(conf)        {'optimizer': <OptimizerConfigs>, ...}       the sub-configs made so far
    inspect.selected_option(conf, 'model')   'transformer': the option an item is computed with, computing nothing
    inspect.class_defaults(Configs)  {'d_model': 512, ...}         the class defaults, inherited ones included
    inspect.declared_by(Configs)     {'d_model': NLPAutoRegressionConfigs, 'hidden': Configs, ...}  who declares each
    inspect.expand_short_keys(conf, {'ffn.glu_variant': 'SwiGLU'})  {'transformer.ffn.glu_variant': 'SwiGLU'}
    inspect.set_by(conf)             {'transformer.ffn.d_ff': 'transformer', ...}  values set while another item is
                                     computed, by that item
    with inspect.reads_outside(conf) as reads: ...     reads: the items the block itself read, in first-read order
    with inspect.not_built(is_module): ...   computing an item of such a type raises NotBuiltError (naming it)
    inspect.waiting(conf)            {'optimizer.learning_rate': 0.001}   given values waiting for their sub-config
    inspect.redacted(conf)           {'api_key': '${env:API_KEY}'}   secrets read from the environment, as written:
                                     what listings and dumps show in their place (lazylab.configs.note_env)

Paths are full dotted paths from the root config (``optimizer.learning_rate``), a sub-config's items after its
parent's, in declaration order. Apart from :func:`build_addressed` and :func:`compute_plain`, which compute items on
purpose, nothing here computes anything. (Like the engine, torch-free.)
"""
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .engine.declarations import spec_of
from .engine.env_refs import redacted
from .engine.errors import NotBuiltError, UnknownItemError, unknown_item
from .engine.listing import is_plain
from .engine.overrides import declared_paths, expand_short_keys, typed_pending
from .engine.report import given_paths, walk
from .engine.resolver import is_configs, peek
from .engine.state import ACTIVE, NOT_BUILT, Frame, state_of
from .engine.typing_tools import is_configs_class

__all__ = ['Item', 'items', 'computed', 'given', 'sub_configs', 'selected_option', 'class_defaults', 'declared_by',
           'is_configs', 'declared_paths', 'expand_short_keys', 'fresh_sub_config', 'build_addressed', 'compute_plain',
           'effective_defaults', 'set_by', 'reads_outside', 'not_built', 'NotBuiltError', 'waiting', 'redacted']


@dataclass(frozen=True)
class Item:
    """One declared item of a config object, as :func:`items` sees it.

    Attributes:
        path: its full dotted path from the root config (``'optimizer.learning_rate'``).
        key: its name in the config object that declares it (``'learning_rate'``).
        owner: that config object.
        type: its declared type without constraints (``int`` for ``Annotated[int, Ge(1)]``).
        plain: whether values of ``type`` are plain data (int, float, str, bool, a Literal or Union of those).
        computed: whether it has been computed.
        value: its computed value (for a sub-config with ``_primary``, the primary item's value), or ``None``.
        source: how it was computed (``None`` until it is): ``'override'``, ``'assigned'``, ``'set_default'``,
            ``'aggregate'``, ``'default'`` (the class default), ``'option'`` or ``'from_type'``.
        detail: for ``'option'`` the option's name, for ``'aggregate'`` ``'selector=option'``, for ``'set_default'``
            ``'value'`` or ``'func'``; else ``''``.
        selected_by: for ``'option'``, what named the option (``'default'``, ``'override'``, ``'first option'``, …).
        reads: the full dotted paths its calculator read while computing it, in first-read order.
        given: where a *given* value came from, as a dump's ``given`` section labels it (``'override'``,
            ``'assigned'``, or a label such as ``'user'`` or ``'preset NAME'``); ``None`` for a value not given
            (computed, a default, or one set by code while another item was being computed).
        waiting: for an item not computed yet, the value set for it on its config object that it will start from:
            ``'override'``, ``'assigned'`` or ``'set_default'``; ``None`` once computed, or when none is set.
        sub_config: the sub-config object it computed to, or ``None``.
        selectors: the full dotted paths of the selectors of the aggregates that can set it: what decides its value
            whether or not an aggregate was selected (an aggregate that selected nothing does not read its selector).
    """
    path: str
    key: str
    owner: Any
    type: Any
    plain: bool
    computed: bool
    value: Any
    source: Optional[str]
    detail: str
    selected_by: str
    reads: tuple[str, ...]
    given: Optional[str]
    waiting: Optional[str]
    sub_config: Any
    selectors: tuple[str, ...] = ()

    @property
    def origin(self) -> Optional[str]:
        """``'given'`` (a value given from outside any computation, computed yet or not), ``'default'`` (the class
        default), ``'computed'`` (any other computed value), or ``None`` (neither given nor computed yet)."""
        if self.given is not None:
            return 'given'
        if not self.computed:
            return None
        return 'default' if self.source == 'default' else 'computed'


def items(configs: Any) -> Iterator[Item]:
    """Every declared item of ``configs`` and of its sub-configs made so far, as :class:`Item` s, by full dotted
    path (a sub-config's items after its parent's, each in declaration order)."""
    root = state_of(configs)
    labels = given_paths(root)[0]
    for path, st, key in walk(root):
        spec = st._spec  # current: walk read st.spec
        p = st.provenance.get(key)
        done = key in st.cache
        waiting = None
        if not done:
            waiting = next((name for name, values in (('override', st.overrides), ('assigned', st.assigned),
                                                       ('set_default', st.defaults)) if key in values), None)
        yield Item(path=path, key=key, owner=st.owner, type=spec.types[key], plain=is_plain(spec.types[key]),
                   computed=done, value=st.cache.get(key), source=p.source if p is not None else None,
                   detail=p.detail if p is not None else '', selected_by=p.selected_by if p is not None else '',
                   reads=tuple(p.reads) if p is not None else (), given=labels.get(path), waiting=waiting,
                   sub_config=st.children.get(key),
                   selectors=tuple(st.path_of(selector) for selector, _ in spec.by_target.get(key, ())))


def computed(configs: Any) -> dict[str, Any]:
    """{full dotted path: computed value} of every item computed so far, sub-configs' items included."""
    return {path: st.cache[key] for path, st, key in walk(state_of(configs)) if key in st.cache}


def given(configs: Any) -> dict[str, str]:
    """{full dotted path: label} of the values given to ``configs`` from outside any computation, labelled as the
    dump's ``given`` section labels them (``'override'``, ``'assigned'``, or the label given with
    :func:`~lazylab.configs.label_given`: ``'user'``, ``'preset NAME'``, ``'--config FILE'``, ``'sweep'``).
    Values not computed yet are included; a ``set_default`` and a value set by code while an item was computed are
    not given."""
    return given_paths(state_of(configs))[0]


def set_by(configs: Any) -> dict[str, str]:
    """{full dotted path: the full dotted path of the item whose computation set it} of the values set by code while
    another item was computed (a calculator's ``set_default``, assignment or override): what such a value was
    computed from. Values given from outside any computation are :func:`given` instead; values set inside a
    :func:`reads_outside` block are set by ``''``."""
    return given_paths(state_of(configs))[1]


@contextlib.contextmanager
def reads_outside(configs: Any) -> Iterator[list[str]]:
    """While the block runs, record the items of ``configs`` that are read outside any item's computation (by the
    block's own code, not by a calculator), as the engine records what each calculator reads.

    Yields the list it fills: full dotted paths, in first-read order, each once. A value given to ``configs``
    inside the block counts as set by code (:func:`set_by` names ``''``), not as given: use it for checks, not to
    set up a run. (Like the engine, not thread-safe.)
    """
    frame = Frame(state_of(configs), '', '')
    ACTIVE.append(frame)
    try:
        yield frame.reads
    finally:
        ACTIVE.remove(frame)


@contextlib.contextmanager
def not_built(refused: Callable[[Any], bool]) -> Iterator[None]:
    """While the block runs, computing an item whose declared type (without constraints) ``refused`` says yes to
    raises :class:`NotBuiltError` naming that item, in any config object: what resolves a configuration without
    building its model (``lazylab options --resolved``) computes every item that does not need one, and learns which
    one each other item needs. (Like the engine, not thread-safe.)

    Args:
        refused: a predicate on a declared type (``nn.Module``, ``int``, a Literal, …).
    """
    NOT_BUILT.append(refused)
    try:
        yield
    finally:
        NOT_BUILT.remove(refused)


def waiting(configs: Any) -> dict[str, Any]:
    """{full dotted path: value} of the values given for the items of sub-configs not made yet
    (``optimizer.learning_rate`` given before ``optimizer`` is computed): typed and checked when given, applied when
    the sub-config is made."""
    out: dict[str, Any] = {}

    def visit(st, prefix: str):
        for top, values in st.pending.items():
            for key, (value, from_text) in values.items():
                out[f'{prefix}{top}.{key}'] = typed_pending(st, top, key, value, from_text)
        for key, child in st.children.items():
            visit(state_of(child), f'{prefix}{key}.')

    visit(state_of(configs), '')
    return out


def sub_configs(configs: Any) -> dict[str, Any]:
    """{full dotted path: sub-config object} of the sub-configs made so far, parents before their children."""
    out: dict[str, Any] = {}

    def visit(st, prefix: str):
        for key, child in st.children.items():
            out[prefix + key] = child
            visit(state_of(child), f'{prefix}{key}.')

    visit(state_of(configs), '')
    return out


def selected_option(configs: Any, key: str) -> Optional[str]:
    """The name of the option item ``key`` of ``configs`` is computed with: the option that computed it, or, not
    computed yet, the option name its value starts from (given, set as a default, chosen by an aggregate, the class
    default or the first option), found without computing anything. ``None`` when its value is not an option's (an
    object or a plain value, or none at all).

    Raises:
        UnknownItemError: ``key`` is not an item of ``configs`` (the message names the nearest items).
    """
    st = state_of(configs)
    spec = st.spec  # (peek reads the current declarations as st._spec)
    if key not in spec.annotations:
        raise unknown_item(st.class_name, st.path_of(key), key, spec.annotations)
    if key in st.cache:
        p = st.provenance.get(key)
        return p.detail if p is not None and p.source == 'option' else None
    value, has = peek(st, key, set())
    return value if has and isinstance(value, str) and value in spec.options.get(key, ()) else None


def class_defaults(configs_class: type) -> dict[str, Any]:
    """{item: class default} of a config class, inherited ones included (the nearest class's wins); items without
    a class default are left out. A new dict: changing it changes nothing."""
    return dict(spec_of(configs_class).defaults)


def declared_by(configs_class: type) -> dict[str, type]:
    """{item: the nearest class of ``configs_class``'s MRO whose body declares it} (an annotation, or a new default
    for an inherited item), in declaration order: which items an experiment's own file declares, and which it
    inherits (``lazylab options`` lists its own first)."""
    out: dict[str, type] = {}
    for key in spec_of(configs_class).annotations:
        out[key] = next(c for c in configs_class.__mro__
                        if '_lazylab_decl' in c.__dict__ and key in c.__dict__['_lazylab_decl'].items)
    return out


def fresh_sub_config(configs: Any, path: str) -> Any:
    """A new config object of the class of the sub-config at dotted ``path`` of ``configs`` (``configs``' own class
    for ``''``), with nothing given or computed, that names its items by their full paths in ``configs``: typing a
    value against it (``parse_overrides(['learning_rate=-1'], fresh)``) names ``optimizer.learning_rate``. It is not
    attached to ``configs``.

    Raises:
        UnknownItemError: ``path`` is not a sub-config made so far (the message names it).
        TypeError: the class cannot be made without arguments.
    """
    if path:
        subs = sub_configs(configs)
        if path not in subs:
            raise UnknownItemError(f'{path} is not a sub-config of {type(configs).__name__}', path)
        template = subs[path]
    else:
        template = configs
    fresh = type(template)()
    state_of(fresh).path = path
    return fresh


def build_addressed(configs: Any) -> None:
    """Compute every sub-config that a dotted key given to ``configs`` waits for (``optimizer.learning_rate``
    given before ``optimizer`` was made), in sub-configs too, so a misspelt key there raises now.

    Raises:
        UnknownItemError, BadValueError, …: what applying the waiting keys raises; whatever computing the
            sub-config raises.
    """
    st = state_of(configs)
    for key in list(st.pending):
        getattr(configs, key)
    for child in list(st.children.values()):
        build_addressed(child)


def compute_plain(configs: Any) -> None:
    """Compute every plain item (see :attr:`Item.plain`) of ``configs``, every item whose type is a config class,
    and the same in each sub-config made so; an item that fails to compute is skipped (left uncomputed). For a
    listing of what an experiment sets: call it with what the computation needs around it (the caller's device,
    random state), then :func:`effective_defaults`."""
    st = state_of(configs)
    for key in list(st.spec.annotations):
        kind = st.spec.types[key]
        if is_plain(kind) or is_configs_class(kind):
            try:
                value = getattr(configs, key)
            except Exception:  # noqa: BLE001 - what cannot be computed here keeps its class default in a listing
                continue
            if is_configs(value):
                compute_plain(value)
    for child in list(st.children.values()):
        if not state_of(child).cache:
            compute_plain(child)


def effective_defaults(configs: Any) -> dict[str, str]:
    """{dotted path: how ``configs`` sets it} for the sub-configs' items whose value the config itself gives rather
    than the sub-config's class, after :func:`compute_plain`; what ``lazylab options`` shows after ``=``:

    - ``'128 (follows d_model)'``: computed by a ``set_default`` function that read one other item;
    - ``'4 (set by the experiment)'``: a value it assigned, overrode or set as a default (an object by its type's
      name: ``'Adam (set by the experiment)'``);
    - ``'(set by the experiment)'``: a value set but not computed (an object not built for the listing).

    The root's own items are left out (their class defaults are the config's own).
    """
    out: dict[str, str] = {}
    for item in items(configs):
        if '.' not in item.path:
            continue
        if item.computed and item.source in ('set_default', 'assigned', 'override'):
            shown = repr(item.value) if item.plain else type(item.value).__name__
            reads = [r for r in item.reads if r != item.path]
            follows = item.source == 'set_default' and item.detail == 'func' and len(reads) == 1
            out[item.path] = f'{shown} ({f"follows {reads[0]}" if follows else "set by the experiment"})'
        elif not item.computed and item.waiting is not None:
            out[item.path] = '(set by the experiment)'
    return out
