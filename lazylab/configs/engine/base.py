"""``BaseConfigs``: the class users subclass to declare a configuration.

The class only wires Python's attribute protocol to the engine: class-body items become :class:`ItemAttribute`
descriptors (reading one on an instance computes it; reading it on the class gives an item reference for
``@option``), assignment goes to :func:`~.overrides.assign`, and unknown names raise with suggestions. The
instance's only public method is ``set_default``; everything else the engine offers is a free function in
:mod:`lazylab.configs`, so any other name can be a config item.
"""
from collections.abc import Iterable
from typing import Any, Callable, Optional

from . import overrides
from .declarations import RESERVED, ItemRef, declare_class
from .errors import unknown_item
from .report import labml_json
from .resolver import compute, reset_explicit
from .state import ACTIVE, State, state_of


class ItemAttribute:
    """The class attribute standing for one config item.

    ``Configs.item`` gives an :class:`ItemRef` (for registrations); ``conf.item`` gives the item's value,
    computed on first read.
    """
    __slots__ = ('key',)

    def __init__(self, key: str):
        self.key = key

    def __get__(self, obj: Any, owner: Optional[type] = None) -> Any:
        if obj is None:
            return ItemRef(owner, self.key)
        st = obj.__dict__.get('_lazylab') or state_of(obj)
        key = self.key
        cache = st.cache
        if ACTIVE:  # a computation is in progress: record the read for provenance
            frame = ACTIVE[-1]
            path = st.path_of(key)
            if path not in frame.read_set:
                frame.read_set.add(path)
                frame.reads.append(path)
        if key in cache:
            return cache[key]
        try:
            compute(st, key)  # (not `read`: one Python frame less per level of a dependency chain)
        except AttributeError as e:
            # Python answers an AttributeError from a descriptor by calling __getattr__; hand it the original.
            st.rescue = (key, e)
            raise
        if st.update_callback is not None:
            st.update_callback()
        return cache[key]


class BaseConfigs:
    """Subclass this to declare a configuration (labml.configs-compatible).

    Each annotated class attribute is a config item and a class value is its default::

        class Configs(BaseConfigs):
            d_model: int = 512
            activation: nn.Module = 'ReLU'   # a string naming a registered option
            ffn: FeedForward                  # computed by an @option when first read

    Args:
        _primary: when this object is a sub-config, the name of its item that the parent sees instead of it.

    Raises (on use):
        UnknownItemError: reading or assigning an undeclared name (an AttributeError, with nearest names).
        AlreadyComputedError: assigning an item after it was computed (a ValueError).
        NoValueError, CycleError, CalculatorError, UnknownOptionError: when computing an item fails.
    """
    _lazylab_is_configs = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        declare_class(cls, ItemAttribute)

    def __init__(self, *, _primary: Optional[str] = None):
        d = self.__dict__
        d['_primary'] = _primary
        st = d.get('_lazylab')
        if st is None:
            d['_lazylab'] = State(self, _primary)
        else:
            st.primary = _primary

    def __setattr__(self, key: str, value: Any):
        if key.startswith('_'):
            object.__setattr__(self, key, value)
            if key == '_primary':
                state_of(self).primary = value
        else:
            overrides.assign(state_of(self), key, value)

    def __getattr__(self, key: str) -> Any:
        # Only called when normal lookup fails: an undeclared name, or a declared item whose computation
        # raised an AttributeError (re-raised here unchanged).
        if key.startswith('__'):
            raise AttributeError(key)
        st = state_of(self)
        rescue = st.rescue
        if rescue is not None and rescue[0] == key:
            st.rescue = None
            raise rescue[1]
        if key.startswith('_'):
            raise AttributeError(f'{type(self).__name__} object has no attribute {key!r}')
        raise unknown_item(st.class_name, st.path_of(key), key, st.spec.annotations)

    def __dir__(self) -> Iterable[str]:
        return list(state_of(self).spec.annotations) + ['set_default']

    def set_default(self, item: Any, value: Any = None, func: Optional[Callable[[], Any]] = None):
        """Give item ``Cls.item`` a per-instance default: ``value``, or ``func()`` evaluated when first needed.

        Ranks below overrides and assignments and above aggregates and the class default.

        Args:
            item: the item, as ``Cls.item`` (or its name).
            value: the default value (used when ``func`` is not given).
            func: a function of no arguments that computes the default when the item is first read.

        Raises:
            UnknownItemError: the item is not declared here.
            AlreadyComputedError: the item was already computed.
        """
        overrides.set_default(state_of(self), item, value, func)

    # labml.configs' underscore API, used by labml-style experiment code.

    def _set_values(self, values: dict[str, Any]):
        """Override items from a dict (dotted keys reach sub-configs); all-or-nothing.

        Args:
            values: ``{key: value}``; a key may be dotted (``'optimizer.learning_rate'``), and a string value for
                an item with options names one of them.

        Raises:
            UnknownItemError: an undeclared key (a KeyError, with nearest names).
            AlreadyComputedError: an item already computed (a ValueError).
            UnknownOptionError: a string that is not an option of an item that has options.
        """
        overrides.set_overrides(state_of(self), values, from_text=False)

    def _to_json(self) -> dict[str, dict[str, Any]]:
        """labml's per-item report: name, type, value, order, options, computed, is_hyperparam, is_meta,
        is_explicitly_specified; sub-config items under dotted names."""
        return labml_json(state_of(self))

    def _reset_explicitly_specified(self):
        reset_explicit(state_of(self))

    def _set_update_callback(self, update_callback: Callable[[], None]):
        state_of(self).update_callback = update_callback

    def _get_type(self, item: str) -> Any:
        # dir() lists set_default beside the items; labml.utils.pytorch.get_modules asks the type of every name in it
        if item in RESERVED:
            return None
        return state_of(self).spec.annotations[item]

    def _get_computed(self, key: str) -> Any:
        return state_of(self).cache.get(key)
