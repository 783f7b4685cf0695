"""The per-instance state of a config object: what was given, and what has been computed.

A :class:`State` is plain data kept in the instance's ``__dict__`` under ``_lazylab``, so config objects
pickle and deep-copy like ordinary objects. The resolver reads and fills it.
"""
from typing import Any, Callable, Optional

from .declarations import Spec, _version, spec_of


class Provenance:
    """Where a computed value came from.

    Attributes:
        source: ``'override'`` (``_set_values``/overrides), ``'assigned'`` (attribute assignment),
            ``'set_default'``, ``'aggregate'``, ``'default'`` (class default), ``'option'`` (a calculator ran),
            or ``'from_type'`` (the annotated class was constructed).
        detail: for ``'option'`` the option name; for ``'aggregate'`` ``'selector=option'``; for
            ``'set_default'`` ``'value'`` or ``'func'``; otherwise ``''``.
        selected_by: for ``'option'``, the source that named the option (``'default'``, ``'override'``,
            ``'first option'``, ...).
        reads: the full dotted paths of the items read while computing the value, in first-read order.
    """
    __slots__ = ('source', 'detail', 'selected_by', 'reads')

    def __init__(self, source: str, detail: str = '', selected_by: str = '', reads: Optional[list[str]] = None):
        self.source = source
        self.detail = detail
        self.selected_by = selected_by
        self.reads = reads if reads is not None else []

    def __repr__(self):
        return f'Provenance({self.source!r}, {self.detail!r}, selected_by={self.selected_by!r}, reads={self.reads!r})'


class State:
    """Everything one config instance knows.

    Attributes:
        owner: the config object.
        spec: the merged declarations of its class, looked up on use (as labml does): an option registered after
            this object was made is one of its options too.
        path: its dotted path from the root config (``''`` for the root), set when it becomes a sub-config.
        overrides: values given with ``_set_values`` / ``apply_overrides`` (highest precedence).
        assigned: values given by attribute assignment.
        defaults: ``set_default`` values, item -> (value, func).
        cache: computed values (for a sub-config with ``_primary``, its primary item's value).
        children: item -> the sub-config object it computed to.
        pending: dotted overrides for sub-configs not created yet, item -> {sub_key: (value, from_text)}.
        explicit: items given through ``_set_values`` (labml's ``is_explicitly_specified``).
        order: item -> order in which its computation started.
        provenance: item -> :class:`Provenance`.
        computing: items whose computation is in progress (for cycle detection).
    """

    def __init__(self, owner: Any, primary: Optional[str] = None):
        self.owner = owner
        self._spec: Spec = spec_of(type(owner))
        self.path = ''
        self.primary = primary
        self.overrides: dict[str, Any] = {}
        self.assigned: dict[str, Any] = {}
        self.defaults: dict[str, tuple[Any, Optional[Callable]]] = {}
        self.cache: dict[str, Any] = {}
        self.children: dict[str, Any] = {}
        self.pending: dict[str, dict[str, tuple[Any, bool]]] = {}
        self.explicit: set[str] = set()
        self.order: dict[str, int] = {}
        self.provenance: dict[str, Provenance] = {}
        self.computing: set[str] = set()
        self.from_type: set[str] = set()
        self.rescue: Optional[tuple[str, BaseException]] = None
        self.update_callback: Optional[Callable[[], None]] = None

    @property
    def spec(self) -> Spec:
        spec = self._spec
        if spec.version != _version[0]:  # something was registered since: the class's current declarations
            spec = self._spec = spec_of(type(self.owner))
        return spec

    def __getstate__(self):
        # The merged spec belongs to the class (and holds calculators, often lambdas): not copied or pickled.
        d = dict(self.__dict__)
        del d['_spec']
        d['rescue'] = None
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._spec = spec_of(type(self.owner))

    @property
    def class_name(self) -> str:
        return self.spec.name

    def path_of(self, key: str) -> str:
        return f'{self.path}.{key}' if self.path else key


class Frame:
    """One computation in progress: the item being computed and the dotted paths it has read so far."""
    __slots__ = ('state', 'key', 'path', 'reads', 'read_set')

    def __init__(self, state: State, key: str, path: str):
        self.state = state
        self.key = key
        self.path = path
        self.reads: list[str] = []
        self.read_set: set[str] = set()


#: Predicates on an item's declared type (its type without constraints): while one is here and says yes, computing
#: such an item raises NotBuiltError instead (see inspect.not_built).
NOT_BUILT: list[Callable[[Any], bool]] = []

#: Computations in progress, innermost last: the resolver pushes and pops them; reading an item records itself on
#: the innermost (provenance), and a value given while one is in progress is "set by" it (see report.note_given).
ACTIVE: list[Frame] = []


def state_of(configs: Any) -> State:
    """The :class:`State` of a config object, created if a subclass's ``__init__`` skipped ``super().__init__``."""
    d = configs.__dict__
    st = d.get('_lazylab')
    if st is None:
        st = State(configs, d.get('_primary'))
        d['_lazylab'] = st
        d.setdefault('_primary', None)
    return st
