"""lazylab.configs.inspect, the public view of a config, on small hand-worked configs: every value below is worked
out from the declarations and the precedence rules (override > assigned > set_default > aggregate > class default
> first option > the annotated class), not read back from the engine."""
from typing import Annotated, Literal

import pytest
from annotated_types import Gt

from lazylab.configs import (
    BadValueError,
    BaseConfigs,
    CalculatorError,
    UnknownItemError,
    aggregate,
    apply_overrides,
    inspect,
    label_given,
    nearest,
    option,
    parse_overrides,
    suggestion,
)


class Act:
    """Stands for a module an option builds (not plain data)."""

    def __init__(self, name: str):
        self.name = name


class Optim(BaseConfigs):
    learning_rate: Annotated[float, Gt(0)] = 1e-3
    momentum: float = 0.9
    scale: float = 1.0


class Norm(BaseConfigs):
    eps: float = 1e-5


class Block(BaseConfigs):
    width: int = 8
    heads: int = 2
    scale: float = 2.0
    activation: Act = 'relu'
    norm: Norm


@option(Block.activation, 'relu')
def _relu():
    return Act('relu')


@option(Block.activation, 'gelu')
def _gelu():
    return Act('gelu')


class Root(BaseConfigs):
    d_model: int = 16
    n_layers: int
    optim: Optim
    block: Block
    mode: Literal['fast', 'slow'] = 'fast'
    backend: Act
    ratio: float


@option(Root.n_layers)
def _n_layers(c: Root):
    return c.d_model // 4


@option(Root.block)
def _block(c: Root):
    b = Block()
    b.set_default(Block.width, func=lambda: c.d_model)  # follows d_model
    b.heads = 4                                          # set by the experiment, while `block` is computed
    b.set_default(Block.activation, value=Act('tanh'))   # an object the experiment gives
    return b


@option(Root.backend, 'cpu')
def _cpu():
    return Act('cpu')


@option(Root.backend, 'cuda')
def _cuda():
    return Act('cuda')


@option(Root.ratio)
def _ratio(c: Root):
    return c.d_model / 0  # fails: a listing skips it


ROOT_PATHS = ['d_model', 'n_layers', 'optim', 'block', 'mode', 'backend', 'ratio']


def _computed_root() -> Root:
    conf = Root()
    conf._set_values({'d_model': 32})
    label_given(conf, ['d_model'], 'user')
    apply_overrides(conf, {'optim.learning_rate': '0.01'})  # waits for optim, which is not made yet
    assert conf.n_layers == 8
    assert conf.optim.momentum == 0.9
    assert conf.block.width == 32
    return conf


def _row(item: inspect.Item) -> tuple:
    return (item.computed, item.source, item.detail, item.selected_by, item.reads, item.given, item.waiting,
            item.origin)


def test_items_give_value_provenance_given_label_and_origin_of_every_item():
    conf = _computed_root()
    found = {item.path: item for item in inspect.items(conf)}
    assert list(found) == ROOT_PATHS + ['optim.learning_rate', 'optim.momentum', 'optim.scale',
                                        'block.width', 'block.heads', 'block.scale', 'block.activation',
                                        'block.norm']
    rows = {path: _row(item) for path, item in found.items()}
    assert rows == {
        # computed, source, detail, selected_by, reads, given, waiting, origin
        'd_model': (True, 'override', '', '', (), 'user', None, 'given'),
        'n_layers': (True, 'option', '_n_layers', 'first option', ('d_model',), None, None, 'computed'),
        'optim': (True, 'from_type', 'Optim', '', (), None, None, 'computed'),
        'block': (True, 'option', '_block', 'first option', (), None, None, 'computed'),
        'mode': (False, None, '', '', (), None, None, None),
        'backend': (False, None, '', '', (), None, None, None),
        'ratio': (False, None, '', '', (), None, None, None),
        'optim.learning_rate': (False, None, '', '', (), 'override', 'override', 'given'),
        'optim.momentum': (True, 'default', '', '', (), None, None, 'default'),
        'optim.scale': (False, None, '', '', (), None, None, None),
        'block.width': (True, 'set_default', 'func', '', ('d_model',), None, None, 'computed'),
        'block.heads': (False, None, '', '', (), None, 'assigned', None),
        'block.scale': (False, None, '', '', (), None, None, None),
        'block.activation': (False, None, '', '', (), None, 'set_default', None),
        'block.norm': (False, None, '', '', (), None, None, None),
    }
    assert [found[p].value for p in ('d_model', 'n_layers', 'optim.momentum', 'block.width')] == [32, 8, 0.9, 32]
    assert found['mode'].value is None and found['optim.learning_rate'].value is None
    assert found['optim'].value is conf.optim and found['optim'].sub_config is conf.optim
    assert found['block'].sub_config is conf.block and found['d_model'].sub_config is None
    assert (found['block.width'].key, found['block.width'].owner) == ('width', conf.block)
    assert found['optim.learning_rate'].type is float  # the declared type without its constraint
    assert [p for p, item in found.items() if item.plain] == [
        'd_model', 'n_layers', 'mode', 'ratio', 'optim.learning_rate', 'optim.momentum', 'optim.scale',
        'block.width', 'block.heads', 'block.scale']


def test_items_of_a_fresh_config_are_its_own_items_uncomputed():
    found = list(inspect.items(Root()))
    assert [i.path for i in found] == ROOT_PATHS  # no sub-config made yet
    assert not any(i.computed or i.given or i.waiting for i in found)


def test_computed_lists_the_computed_values_by_dotted_path():
    conf = _computed_root()
    values = inspect.computed(conf)
    assert list(values) == ['d_model', 'n_layers', 'optim', 'block', 'optim.momentum', 'block.width']
    assert {k: v for k, v in values.items() if k not in ('optim', 'block')} == {
        'd_model': 32, 'n_layers': 8, 'optim.momentum': 0.9, 'block.width': 32}
    assert values['optim'] is conf.optim and values['block'] is conf.block
    assert conf.optim.learning_rate == 0.01
    assert inspect.computed(conf)['optim.learning_rate'] == 0.01  # the text override, typed float
    assert inspect.computed(Root()) == {}


def test_given_labels_values_given_from_outside_and_not_those_set_by_code():
    conf = Root()
    conf._set_values({'d_model': 32})
    label_given(conf, ['d_model'], 'user')
    apply_overrides(conf, {'optim.momentum': '0.5'})
    conf.mode = 'slow'
    assert conf.block.heads == 4  # block's option assigns heads and sets width's default: code, not given
    assert inspect.given(conf) == {'d_model': 'user', 'optim.momentum': 'override', 'mode': 'assigned'}
    assert inspect.given(Root()) == {}


def test_sub_configs_by_dotted_path_parents_first():
    conf = _computed_root()
    assert inspect.sub_configs(conf) == {'optim': conf.optim, 'block': conf.block}
    assert isinstance(conf.block.norm, Norm)
    subs = inspect.sub_configs(conf)
    assert list(subs) == ['optim', 'block', 'block.norm'] and subs['block.norm'] is conf.block.norm
    assert inspect.sub_configs(conf.block) == {'norm': conf.block.norm}  # relative to the object asked
    assert inspect.sub_configs(Root()) == {}


def test_selected_option_is_found_without_computing():
    conf = Root()
    assert inspect.selected_option(conf, 'backend') == 'cpu'  # the first option
    conf.backend = 'cuda'
    assert inspect.selected_option(conf, 'backend') == 'cuda'  # assigned
    assert 'backend' not in inspect.computed(conf)
    assert conf.backend.name == 'cuda'
    assert inspect.selected_option(conf, 'backend') == 'cuda'  # computed: the option that computed it
    block = Block()
    assert inspect.selected_option(block, 'activation') == 'relu'  # the class default
    block._set_values({'activation': 'gelu'})
    assert inspect.selected_option(block, 'activation') == 'gelu'  # overridden
    assert inspect.selected_option(conf.block, 'activation') is None  # an object was given (set_default)
    assert inspect.selected_option(conf, 'd_model') is None  # a plain value
    assert inspect.selected_option(conf, 'mode') is None  # a string, but not an option's name
    with pytest.raises(UnknownItemError, match=r"Root has no config item 'backnd'; did you mean 'backend'\?"):
        inspect.selected_option(conf, 'backnd')


class Agg(BaseConfigs):
    variant: str = 'plain'
    act: Act


@option(Agg.act, 'relu')
def _agg_relu():
    return Act('relu')


@option(Agg.act, 'gelu')
def _agg_gelu():
    return Act('gelu')


aggregate(Agg.variant, 'fancy', (Agg.act, 'gelu'))


def test_selected_option_follows_an_aggregate():
    conf = Agg()
    assert inspect.selected_option(conf, 'act') == 'relu'  # 'plain' selects nothing: the first option
    conf.variant = 'fancy'
    assert inspect.selected_option(conf, 'act') == 'gelu'
    assert inspect.computed(conf) == {}  # the selector was peeked at, not computed


def test_class_defaults_include_inherited_ones_and_are_a_copy():
    assert inspect.class_defaults(Root) == {'d_model': 16, 'mode': 'fast'}
    assert inspect.class_defaults(Optim) == {'learning_rate': 1e-3, 'momentum': 0.9, 'scale': 1.0}

    class Wider(Root):
        d_model = 64

    defaults = inspect.class_defaults(Wider)
    assert defaults == {'d_model': 64, 'mode': 'fast'}
    defaults['d_model'] = 1
    assert inspect.class_defaults(Wider)['d_model'] == 64 and Wider().d_model == 64


def test_is_configs():
    assert inspect.is_configs(Root()) and inspect.is_configs(Norm())
    assert not inspect.is_configs(Root) and not inspect.is_configs(3) and not inspect.is_configs(Act('x'))


ALL_PATHS = ROOT_PATHS + ['optim.learning_rate', 'optim.momentum', 'optim.scale', 'block.width', 'block.heads',
                          'block.scale', 'block.activation', 'block.norm', 'block.norm.eps']


def test_declared_paths_follow_annotated_sub_config_classes():
    assert inspect.declared_paths(Root) == ALL_PATHS
    assert inspect.declared_paths(Root()) == ALL_PATHS
    assert inspect.declared_paths(Block) == ['width', 'heads', 'scale', 'activation', 'norm', 'norm.eps']


def test_expand_short_keys_names_the_one_path_a_key_ends():
    values = {'learning_rate': '0.1', 'd_model': '8', 'nothing': '1', 'norm.eps': 2}
    expected = {'optim.learning_rate': '0.1', 'd_model': '8', 'nothing': '1', 'block.norm.eps': 2}
    assert inspect.expand_short_keys(Root(), values) == expected
    assert list(inspect.expand_short_keys(Root, values)) == list(expected)
    assert inspect.expand_short_keys(Root(), {'optim.scale': 3}) == {'optim.scale': 3}  # a full key stays


def test_expand_short_keys_refuses_an_ambiguous_end():
    with pytest.raises(UnknownItemError) as info:
        inspect.expand_short_keys(Root(), {'scale': '2'})
    assert str(info.value) == "'scale' is ambiguous: it could be optim.scale, block.scale; give the full key"
    assert info.value.path == 'scale'


def test_fresh_sub_config_names_its_items_by_their_full_path():
    conf = _computed_root()
    fresh = inspect.fresh_sub_config(conf, 'optim')
    assert type(fresh) is Optim and fresh is not conf.optim and inspect.computed(fresh) == {}
    assert parse_overrides(['learning_rate=0.5'], fresh) == {'learning_rate': 0.5}
    with pytest.raises(BadValueError) as info:
        parse_overrides(['learning_rate=-1'], fresh)
    assert str(info.value) == 'bad value for optim.learning_rate: must be > 0, got -1.0'
    assert info.value.path == 'optim.learning_rate'
    assert conf.optim.learning_rate == 0.01  # the computed config is untouched
    assert isinstance(conf.block.norm, Norm)
    with pytest.raises(UnknownItemError, match="'block.norm.epss'"):
        parse_overrides(['epss=1'], inspect.fresh_sub_config(conf, 'block.norm'))
    top = inspect.fresh_sub_config(conf, '')
    assert type(top) is Root and inspect.computed(top) == {}
    with pytest.raises(BadValueError, match='^bad value for d_model: '):
        parse_overrides(['d_model=x'], top)


@pytest.mark.parametrize('path', ['mode', 'optim.nothing', 'block.norm'])
def test_fresh_sub_config_refuses_a_path_that_is_no_sub_config_made_so_far(path):
    conf = _computed_root()  # block.norm is declared, but not made yet
    with pytest.raises(UnknownItemError, match=f'^{path} is not a sub-config of Root$'):
        inspect.fresh_sub_config(conf, path)


def test_build_addressed_builds_the_sub_configs_dotted_keys_wait_for():
    conf = Root()
    apply_overrides(conf, {'block.norm.eps': '0.1'})
    assert inspect.sub_configs(conf) == {}
    inspect.build_addressed(conf)
    assert list(inspect.sub_configs(conf)) == ['block', 'block.norm']  # optim is addressed by no key: not made
    assert conf.block.norm.eps == 0.1
    assert 'n_layers' not in inspect.computed(conf)


def test_build_addressed_raises_for_a_misspelt_key_below_a_sub_config_an_option_makes():
    conf = Root()
    apply_overrides(conf, {'block.norm.epss': '1'})  # block is made by an option: checked when it is made
    with pytest.raises(UnknownItemError, match="'block.norm.epss'; did you mean 'eps'"):
        inspect.build_addressed(conf)


def test_compute_plain_computes_plain_items_and_sub_configs_and_skips_failures():
    conf = Root()
    inspect.compute_plain(conf)
    values = inspect.computed(conf)
    subs = inspect.sub_configs(conf)
    assert list(subs) == ['optim', 'block', 'block.norm']  # items typed by a config class are made too
    assert {k: v for k, v in values.items() if k not in subs} == {
        'd_model': 16, 'n_layers': 4, 'mode': 'fast', 'optim.learning_rate': 1e-3, 'optim.momentum': 0.9,
        'optim.scale': 1.0, 'block.width': 16, 'block.heads': 4, 'block.scale': 2.0, 'block.norm.eps': 1e-5}
    # not plain (backend, block.activation), or failing (ratio: division by zero)
    assert {'backend', 'ratio', 'block.activation'}.isdisjoint(values)


def test_effective_defaults_say_how_the_config_sets_its_sub_configs_items():
    conf = Root()
    inspect.compute_plain(conf)
    assert inspect.effective_defaults(conf) == {
        'block.width': '16 (follows d_model)',         # set_default(func) reading d_model
        'block.heads': '4 (set by the experiment)',    # assigned by block's option
        'block.activation': '(set by the experiment)',  # an object set, not computed here
    }
    assert conf.block.activation.name == 'tanh'
    assert inspect.effective_defaults(conf)['block.activation'] == 'Act (set by the experiment)'


def test_effective_defaults_follow_a_given_value():
    conf = Root()
    conf._set_values({'d_model': 40})
    inspect.compute_plain(conf)
    assert inspect.effective_defaults(conf)['block.width'] == '40 (follows d_model)'
    assert inspect.effective_defaults(Root()) == {}  # nothing computed: nothing to say


def test_nearest_and_suggestion_for_messages():
    assert nearest('momentun', ['momentum', 'mode', 'scale']) == ['momentum']
    assert suggestion('momentun', ['momentum', 'scale']) == "; did you mean 'momentum'?"
    assert suggestion('zzz', ['momentum']) == ''


def test_set_by_names_the_item_whose_computation_set_each_value():
    conf = _computed_root()
    # block's option sets width's default, assigns heads and gives activation an object, all while `block` is
    # computed; d_model (given by the user) and optim.learning_rate (an override waiting for optim) are given
    assert inspect.set_by(conf) == {'block.width': 'block', 'block.heads': 'block', 'block.activation': 'block'}
    assert set(inspect.given(conf)) == {'d_model', 'optim.learning_rate'}
    assert inspect.set_by(Root()) == {}


def test_items_name_the_selectors_of_the_aggregates_that_can_set_them():
    conf = Agg()
    assert conf.act.name == 'relu'  # 'plain' selects no aggregate: the selector was not read …
    found = {item.path: item for item in inspect.items(conf)}
    assert found['act'].reads == ()
    assert found['act'].selectors == ('variant',)  # … but it decides the value all the same
    assert found['variant'].selectors == ()
    block = {item.path: item.selectors for item in inspect.items(_computed_root())}
    assert set(block.values()) == {()}  # no aggregate in Root, Optim or Block


def test_reads_outside_records_what_the_block_reads_itself_not_what_calculators_read():
    conf = Root()
    with inspect.reads_outside(conf) as reads:
        assert conf.n_layers == 4   # n_layers' option reads d_model: recorded on n_layers, not here
        assert conf.d_model == 16   # read by the block itself
        assert conf.block.width == 16
        assert conf.n_layers == 4   # a second read is not listed again
        conf.mode = 'slow'          # given inside the block: set by code ('')
    assert reads == ['n_layers', 'd_model', 'block', 'block.width']
    assert {i.path: i.reads for i in inspect.items(conf) if i.computed}['n_layers'] == ('d_model',)
    assert inspect.set_by(conf)['mode'] == '' and 'mode' not in inspect.given(conf)
    assert conf.backend.name == 'cpu'  # after the block: nothing more is recorded
    assert reads == ['n_layers', 'd_model', 'block', 'block.width']


def test_reads_outside_stops_recording_when_the_block_raises():
    conf = Root()
    with pytest.raises(CalculatorError, match='ratio'), inspect.reads_outside(conf) as reads:
        assert conf.d_model == 16
        assert conf.ratio  # its option divides by zero
    assert conf.n_layers == 4
    assert reads == ['d_model', 'ratio']
