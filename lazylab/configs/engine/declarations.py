"""What a config class declares: its items, their defaults, options, aggregates and flags.

A config class's body declares items (``d_model: int = 512``). Registrations made after the class body
(``@option``, ``aggregate``, ``hyperparams``...) are recorded on the class named by the item reference
(``Configs.item``). Each class keeps only what it declared itself in a :class:`ClassDecl`; :func:`spec_of`
merges those along the method resolution order into a :class:`Spec` (parents first, so a subclass can change
a default or replace an option of the same name) and caches it until the next registration anywhere.

Nothing here computes values; that is :mod:`.resolver`'s job.
"""
import inspect
import sys
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Callable, Optional

from .constraints import Rule, check, split
from .errors import DeclarationError
from .typing_tools import takes_any_string

# Bumped by every registration, so cached merged specs are rebuilt when a parent class gains an option.
_version = [0]

# A direct value equal to this falls through to the aggregates (labml's convention).
AGGREGATE_MARKER = '__aggregate__'

# Names a config item may not take: BaseConfigs's own public method.
RESERVED = frozenset({'set_default'})


def bump_version():
    _version[0] += 1


class ItemRef:
    """What ``Configs.item`` evaluates to on the class: a reference to item ``key`` as seen from ``configs_class``.

    Registrations through it (``@option(Configs.item)``) are recorded on ``configs_class``, so options added
    through a subclass do not leak into its parent.
    """
    __slots__ = ('configs_class', 'key')

    def __init__(self, configs_class: type, key: str):
        self.configs_class = configs_class
        self.key = key

    def __repr__(self):
        return f'{self.configs_class.__name__}.{self.key}'

    def __eq__(self, other):
        return isinstance(other, ItemRef) and other.key == self.key and other.configs_class is self.configs_class

    def __hash__(self):
        return hash((self.configs_class, self.key))


class ItemDecl:
    """One item as declared by one class body.

    Attributes:
        key: the item name.
        annotation: the declared type, or ``None`` when the class body gave a value without an annotation.
        has_default: whether the class body gave a value.
        default: that value.
    """
    __slots__ = ('key', 'annotation', 'has_default', 'default')

    def __init__(self, key: str, annotation: Any, has_default: bool, default: Any):
        self.key = key
        self.annotation = annotation
        self.has_default = has_default
        self.default = default


class Calculator:
    """A registered option: a function (or class) that computes one or more items.

    Attributes:
        func: the callable.
        targets: the item names it computes; with more than one the callable returns a tuple/list of that length.
        option_name: the option's name (the function's ``__name__`` unless given).
        pass_params: item names whose values are passed positionally, or ``None``.
        kind: how it is called: ``'configs'`` (the config object), ``'nothing'``, ``'params'`` (``pass_params``
            values) or ``'kwargs'`` (keyword-only parameters named after items).
    """
    __slots__ = ('func', 'targets', 'option_name', 'pass_params', 'kind', 'kwarg_names')

    def __init__(self, func: Callable, targets: list[str], option_name: Optional[str] = None,
                 pass_params: Optional[list[str]] = None, *, construct: bool = False):
        self.func = func
        self.targets = targets
        self.option_name = option_name if option_name is not None else getattr(func, '__name__', repr(func))
        self.pass_params = pass_params
        self.kwarg_names: tuple[str, ...] = ()
        self.kind = self._kind(construct)

    def _kind(self, construct: bool) -> str:
        if self.pass_params is not None:
            return 'params'
        try:
            params = list(inspect.signature(self.func).parameters.values())
        except (TypeError, ValueError):  # builtins without a signature
            return 'nothing'
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in positional if p.default is p.empty]
        keyword = [p for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
        if len(required) > 1:
            raise DeclarationError(f'calculator {self.option_name!r} for {", ".join(self.targets)} takes '
                                   f'{len(required)} arguments; it should take the config object, nothing, '
                                   f'or be registered with pass_params')
        # A type is constructed with the config object only when its constructor requires one argument;
        # a function gets it whenever it accepts a positional argument (labml's rule).
        if (required if construct else positional):
            return 'configs'
        if keyword:
            self.kwarg_names = tuple(p.name for p in keyword)
            return 'kwargs'
        return 'nothing'

    def __call__(self, configs: Any, read: Callable[[str], Any]) -> Any:
        """Run the calculator; ``read(key)`` gives the value of an item of ``configs``."""
        kind = self.kind
        if kind == 'configs':
            return self.func(configs)
        if kind == 'nothing':
            return self.func()
        if kind == 'params':
            return self.func(*[read(k) for k in self.pass_params])
        return self.func(**{k: read(k) for k in self.kwarg_names})


class ClassDecl:
    """What one class declared itself (not inherited): items, options, aggregates, flags."""

    def __init__(self):
        self.items: dict[str, ItemDecl] = OrderedDict()
        self.options: dict[str, dict[str, Calculator]] = {}
        # selector -> option -> target -> value
        self.aggregates: dict[str, dict[str, dict[str, Any]]] = {}
        self.hyperparams: dict[str, bool] = {}
        self.meta: dict[str, bool] = {}


class Spec:
    """The merged declarations of a config class and all its bases.

    Attributes:
        name: the class name, for messages.
        annotations: item -> declared type (``type(default)`` when never annotated), in declaration order.
        types: item -> its type without constraints (``int`` for ``Annotated[int, Ge(1)]``).
        rules: item -> the :class:`~.constraints.Rule` its values must pass, for items with constraints.
        defaults: item -> class default, for items with one.
        options: item -> ordered option name -> Calculator (first = the default option).
        aggregates: selector -> option -> {target: value}.
        by_target: target -> list of (selector, {option: value}).
        hyperparams, meta: item -> flag, where set.
    """

    def __init__(self, cls: type):
        self.name = cls.__name__
        self.version = _version[0]
        self.annotations: dict[str, Any] = OrderedDict()
        self.types: dict[str, Any] = {}
        self.rules: dict[str, Rule] = {}
        self.defaults: dict[str, Any] = {}
        self.options: dict[str, dict[str, Calculator]] = {}
        self.aggregates: dict[str, dict[str, dict[str, Any]]] = {}
        self.by_target: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        self.hyperparams: dict[str, bool] = {}
        self.meta: dict[str, bool] = {}
        for c in reversed(cls.__mro__):
            decl = c.__dict__.get('_lazylab_decl')
            if decl is not None:
                self._merge(c, decl)
        for selector, per_option in self.aggregates.items():
            by_target: dict[str, dict[str, Any]] = {}
            for option_name, pairs in per_option.items():
                for target, value in pairs.items():
                    by_target.setdefault(target, {})[option_name] = value
            for target, table in by_target.items():
                self.by_target.setdefault(target, []).append((selector, table))

    def _merge(self, c: type, decl: ClassDecl):
        for key, item in decl.items.items():
            annotation = item.annotation
            if annotation is None:
                annotation = self.annotations.get(key, type(item.default))
            elif isinstance(annotation, str):
                annotation = _resolve_string_annotation(c, annotation)
            self.annotations[key] = annotation
            self.types[key], rule = split(annotation, f'{c.__name__}.{key}')
            if rule is not None:
                self.rules[key] = rule
            else:
                self.rules.pop(key, None)
            if item.has_default:
                self.defaults[key] = item.default
        for key, calculators in decl.options.items():
            merged = self.options.setdefault(key, OrderedDict())
            merged.update(calculators)
        for selector, per_option in decl.aggregates.items():
            self.aggregates.setdefault(selector, OrderedDict()).update(per_option)
        self.hyperparams.update(decl.hyperparams)
        self.meta.update(decl.meta)

    def option_names(self, key: str) -> list[str]:
        """The item's calculator options, or (labml's listing) the options of the aggregate it selects."""
        names = list(self.options.get(key, ()))
        return names if names else list(self.aggregates.get(key, ()))


def _resolve_string_annotation(cls: type, annotation: str) -> Any:
    """Evaluate a postponed (``from __future__ import annotations``) annotation; keep the text if it fails."""
    module = sys.modules.get(cls.__module__)
    try:
        return eval(annotation, dict(vars(module)) if module else {}, dict(vars(cls)))
    except Exception:
        return annotation


def own_decl(cls: type) -> ClassDecl:
    """The :class:`ClassDecl` of ``cls`` itself, created on first use."""
    decl = cls.__dict__.get('_lazylab_decl')
    if decl is None:
        decl = ClassDecl()
        cls._lazylab_decl = decl
    return decl


def spec_of(cls: type) -> Spec:
    """The merged :class:`Spec` of a config class (cached; rebuilt after any new registration)."""
    spec = cls.__dict__.get('_lazylab_spec')
    if spec is None or spec.version != _version[0]:
        spec = Spec(cls)
        cls._lazylab_spec = spec
    return spec


def is_item_name(key: str) -> bool:
    return not key.startswith('_') and key not in RESERVED


def _is_item_value(value: Any) -> bool:
    """Whether an un-annotated class attribute is a config item (labml: anything but methods)."""
    return not isinstance(value, (staticmethod, classmethod, property)) and not inspect.isfunction(value)


def declare_class(cls: type, attribute_factory: Callable[[str], Any]):
    """Record the items of a class body (called from ``__init_subclass__``) and replace each class attribute
    by ``attribute_factory(key)``, the descriptor that computes the item on instances."""
    decl = own_decl(cls)
    annotations = cls.__dict__.get('__annotations__', {})
    for key, annotation in annotations.items():
        if key.startswith('_'):
            continue
        if key in RESERVED:
            raise DeclarationError(f'{cls.__name__}: {key!r} is a BaseConfigs method and cannot be a config item')
        has_default = key in cls.__dict__
        decl.items[key] = ItemDecl(key, annotation, has_default, cls.__dict__.get(key))
    for key, value in list(cls.__dict__.items()):
        if key in annotations or not is_item_name(key) or not _is_item_value(value):
            continue
        if isinstance(value, ItemRef):  # e.g. `x = Base.x` re-exported; not a value
            continue
        decl.items[key] = ItemDecl(key, None, True, value)
    for item in decl.items.values():
        _check_item(cls, item)
    for key in decl.items:
        setattr(cls, key, attribute_factory(key))
    bump_version()


def _check_item(cls: type, item: ItemDecl):
    """Check an item's constraints, and its class default against them, when the class is declared.

    A string default for an item whose type takes no strings names an option (registered after the class
    body), so it is checked later, once that option computed the value.

    Raises:
        BadValueError: ``bad value for Configs.batch_size: must be ≥ 1, got 0 (class default)``.
        DeclarationError: constraints placed where they would not be checked (see :func:`~.constraints.split`).
    """
    annotation, owner = item.annotation, cls
    if annotation is None:  # a new default for an inherited item: the nearest base's annotation
        for base in cls.__mro__[1:]:
            decl = base.__dict__.get('_lazylab_decl')
            if decl is not None and item.key in decl.items and decl.items[item.key].annotation is not None:
                annotation, owner = decl.items[item.key].annotation, base
                break
    if isinstance(annotation, str):
        annotation = _resolve_string_annotation(owner, annotation)
    where = f'{cls.__name__}.{item.key}'
    item_type, rule = split(annotation, where)
    value = item.default
    if rule is None or not item.has_default:
        return
    if isinstance(value, str) and (value == AGGREGATE_MARKER or not takes_any_string(item_type)):
        return
    check(rule, where, value, ' (class default)')


def item_keys(items: Any, what: str) -> tuple[type, list[str], bool]:
    """Normalise ``Configs.item`` or ``[Configs.a, Configs.b]`` to (class, keys, is_list).

    Raises:
        DeclarationError: when ``items`` is not an item reference or a non-empty list of them.
    """
    if isinstance(items, ItemRef):
        return items.configs_class, [items.key], False
    if isinstance(items, (list, tuple)) and items and all(isinstance(i, ItemRef) for i in items):
        return items[0].configs_class, [i.key for i in items], True
    raise DeclarationError(f'{what} needs config items such as Configs.item or [Configs.a, Configs.b], '
                           f'got {items!r}')


def param_keys(params: Optional[Sequence[Any]]) -> Optional[list[str]]:
    """``pass_params=[Configs.a, 'b']`` -> ``['a', 'b']``."""
    if params is None:
        return None
    return [p.key if isinstance(p, ItemRef) else str(p) for p in params]
