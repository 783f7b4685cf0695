"""Property tests of the config engine against a tiny reference evaluator written here."""
from typing import Literal, Optional

from hypothesis import given, settings
from hypothesis import strategies as st

import lazylab.configs as lc
from lazylab.configs import BaseConfigs, calculate
from lazylab.configs.engine.errors import ConfigError, CycleError
from lazylab.configs.engine.state import state_of

SETTINGS = settings(max_examples=50, deadline=None)


@st.composite
def acyclic_graphs(draw):
    """Items x0..x{n-1}; item i has a class default, or 1-2 options each reading items with a smaller index
    (so the graph is acyclic) and adding a constant. Some items get overrides or set_default values."""
    n = draw(st.integers(2, 8))
    items = []
    for i in range(n):
        kind = draw(st.sampled_from(['default', 'options']) if i else st.just('default'))
        item = {'default': None, 'options': {}, 'selected': None}
        if kind == 'default':
            item['default'] = draw(st.integers(-5, 5))
        else:
            for k in range(draw(st.integers(1, 2))):
                deps = draw(st.lists(st.integers(0, i - 1), max_size=3))
                item['options'][f'opt{k}'] = (deps, draw(st.integers(-3, 3)))
            # choose an option by class default, or leave it to "first option"
            if draw(st.booleans()):
                item['default'] = draw(st.sampled_from(sorted(item['options'])))
        items.append(item)
    overrides = draw(st.dictionaries(st.integers(0, n - 1), st.integers(-9, 9), max_size=3))
    for i, item in enumerate(items):  # some overrides select an option by name
        if item['options'] and i not in overrides and draw(st.booleans()):
            overrides[i] = draw(st.sampled_from(sorted(item['options'])))
    set_defaults = draw(st.dictionaries(st.integers(0, n - 1), st.integers(-9, 9), max_size=2))
    target = draw(st.integers(0, n - 1))
    return items, overrides, set_defaults, target


def _build_class(items):
    annotations = {f'x{i}': int for i in range(len(items))}
    body = {'__annotations__': annotations}
    for i, item in enumerate(items):
        if item['default'] is not None:
            body[f'x{i}'] = item['default']
    cls = type('Graph', (BaseConfigs,), body)
    for i, item in enumerate(items):
        for name, (deps, const) in item['options'].items():
            def calc(c, deps=deps, const=const):
                return const + sum(getattr(c, f'x{d}') for d in deps)
            calculate(getattr(cls, f'x{i}'), name, calc)
    return cls


def _reference(items, overrides, set_defaults, target):
    """Value of x{target} and the set of items computed, by the precedence rules written out plainly."""
    values = {}

    def value(i):
        if i in values:
            return values[i]
        item = items[i]
        if i in overrides:
            v = overrides[i]
        elif i in set_defaults:
            v = set_defaults[i]
        elif item['default'] is not None:
            v = item['default']
        else:
            v = next(iter(item['options']))
        if isinstance(v, str):
            deps, const = item['options'][v]
            v = const + sum(value(d) for d in deps)
        values[i] = v
        return v

    return value(target), set(values)


@SETTINGS
@given(acyclic_graphs())
def test_acyclic_graph_resolves_like_reference_evaluator(graph):
    items, overrides, set_defaults, target = graph
    cls = _build_class(items)
    conf = cls()
    for i, v in set_defaults.items():
        conf.set_default(getattr(cls, f'x{i}'), value=v)
    conf._set_values({f'x{i}': v for i, v in overrides.items()})
    expected, computed = _reference(items, overrides, set_defaults, target)
    assert getattr(conf, f'x{target}') == expected
    assert set(state_of(conf).cache) == {f'x{i}' for i in computed}  # exactly the needed items, no more


@st.composite
def cyclic_graphs(draw):
    """A cycle c0 -> c1 -> ... -> c0 among n items, other items reading anything, and an item to read that
    depends on the cycle."""
    n = draw(st.integers(1, 7))
    cycle = draw(st.permutations(range(n)).map(lambda p: p[:max(1, len(p) // 2 + 1)]))
    edges = {}
    for k, i in enumerate(cycle):
        edges[i] = [cycle[(k + 1) % len(cycle)]]
    for i in range(n):
        if i not in edges:
            # reads some cycle member first, so reading it must hit the cycle
            edges[i] = [draw(st.sampled_from(cycle))] + draw(st.lists(st.integers(0, n - 1), max_size=2))
    start = draw(st.integers(0, n - 1))
    return n, edges, cycle, start


@SETTINGS
@given(cyclic_graphs())
def test_cyclic_graph_always_raises_cycle_error_with_chain(graph):
    n, edges, cycle, start = graph
    cls = type('Cyclic', (BaseConfigs,), {'__annotations__': {f'x{i}': int for i in range(n)}})
    for i, deps in edges.items():
        calculate(getattr(cls, f'x{i}'), 'f', lambda c, deps=deps: sum(getattr(c, f'x{d}') for d in deps))
    conf = cls()
    try:
        getattr(conf, f'x{start}')
    except CycleError as e:
        chain, message = e.chain, str(e)
    else:
        raise AssertionError('no CycleError')
    # the chain is the loop itself: starts and ends at the same item, every step a real dependency edge,
    # and its members are exactly the declared cycle
    assert chain[0] == chain[-1] and len(chain) >= 2
    for a, b in zip(chain, chain[1:]):
        assert int(b[1:]) in edges[int(a[1:])]
    assert {int(p[1:]) for p in chain} == set(cycle)
    assert message == 'cycle in config dependencies: ' + ' -> '.join(chain)
    assert not state_of(conf).computing  # nothing left marked in progress


class Inner(BaseConfigs):
    width: int = 4
    ratio: float = 0.5


class Typed(BaseConfigs):
    count: int = 1
    rate: float = 0.1
    flag: bool = False
    limit: Optional[int] = 3
    mode: Literal['a', 'b'] = 'a'
    name: str = 'n'
    inner: Inner


_TEXTS = {
    'count': ['2', '-7', 'x', '1.5'],
    'rate': ['1e-3', '.5', 'fast'],
    'flag': ['true', 'no', 'maybe'],
    'limit': ['null', '9', 'none!'],
    'mode': ['b', 'c'],
    'name': ['text', ''],
    'inner.width': ['8', 'wide'],
    'inner.ratio': ['0.25', 'half'],
    'countt': ['1'],
    'inner.widht': ['1'],
}
_DEFAULTS = {'count': 1, 'rate': 0.1, 'flag': False, 'limit': 3, 'mode': 'a', 'name': 'n', 'inner.width': 4,
             'inner.ratio': 0.5}
_GOOD = {('count', '2'): 2, ('count', '-7'): -7, ('rate', '1e-3'): 0.001, ('rate', '.5'): 0.5,
         ('flag', 'true'): True, ('flag', 'no'): False, ('limit', 'null'): None, ('limit', '9'): 9,
         ('mode', 'b'): 'b', ('name', 'text'): 'text', ('name', ''): '', ('inner.width', '8'): 8,
         ('inner.ratio', '0.25'): 0.25}


def _read(conf, key):
    if key.startswith('inner.'):
        return getattr(conf.inner, key[len('inner.'):])
    return getattr(conf, key)


@SETTINGS
@given(st.dictionaries(st.sampled_from(sorted(_TEXTS)), st.integers(0, 3), min_size=1, max_size=6),
       st.booleans())
def test_override_dict_applies_fully_or_not_at_all(choice, inner_exists):
    overrides = {k: _TEXTS[k][i % len(_TEXTS[k])] for k, i in choice.items()}
    conf = Typed()
    if inner_exists:
        conf.inner  # dotted keys then go straight to the existing sub-config
    all_good = all((k, v) in _GOOD for k, v in overrides.items())
    try:
        lc.apply_overrides(conf, overrides)
    except ConfigError:
        assert not all_good
        for key, default in _DEFAULTS.items():
            assert _read(conf, key) == default, key
    else:
        assert all_good
        for key, default in _DEFAULTS.items():
            expected = _GOOD[(key, overrides[key])] if key in overrides else default
            assert _read(conf, key) == expected, key
