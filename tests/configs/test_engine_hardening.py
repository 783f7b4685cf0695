"""The engine's typed values (one set of rules wherever a value enters), options registered late, help comments
with continuation lines, short forms of dotted keys, and the listing of an experiment's own defaults."""
from typing import Any, List, Optional, Tuple

import pytest

import lazylab.configs as lc
from lazylab.configs import BadValueError, BaseConfigs, UnknownItemError, UnknownOptionError, option
from lazylab.configs.engine.comments import _parse
from lazylab.configs.engine.overrides import declared_paths, expand_short_keys


class Flags(BaseConfigs):
    flag: bool = True
    size: int = 4
    rate: float = 0.5
    name: str = 'x'
    maybe: Optional[int] = None
    names: List[str] = ['a']
    anything: List[Any] = []
    pair: Tuple[int, int] = (1, 2)


# (how a value enters, the function that gives it)
ENTRIES = [
    ('_set_values', lambda conf, key, value: conf._set_values({key: value})),
    ('attribute', lambda conf, key, value: setattr(conf, key, value)),
    ('set_default', lambda conf, key, value: conf.set_default(getattr(Flags, key), value=value)),
    ('apply_overrides', lambda conf, key, value: lc.apply_overrides(conf, {key: value})),
    ('yaml', lambda conf, key, value: lc.load(conf, f'{key}: {value!r}\n' if isinstance(value, str) else
                                              {key: value})),
    ('command line', lambda conf, key, value: lc.apply_overrides(conf, lc.parse_overrides([f'{key}={value}']))),
]


@pytest.mark.parametrize('entry, give', ENTRIES, ids=[e for e, _ in ENTRIES])
@pytest.mark.parametrize('key, text, value', [
    ('flag', 'False', False), ('flag', 'no', False), ('flag', 'true', True), ('size', '12', 12),
    ('rate', '2', 2.0), ('maybe', 'null', None), ('maybe', '7', 7), ('names', '[a, b]', ['a', 'b']),
    ('names', "['a,b', c]", ['a,b', 'c']), ('anything', '[1, x]', ['1', 'x']), ('pair', '(3, 4)', (3, 4)),
])
def test_text_means_the_same_value_wherever_it_enters(entry, give, key, text, value):
    conf = Flags()
    give(conf, key, text)
    got = getattr(conf, key)
    assert got == value and type(got) is type(value), (entry, got)


@pytest.mark.parametrize('entry, give', ENTRIES, ids=[e for e, _ in ENTRIES])
@pytest.mark.parametrize('key, text, why', [
    ('flag', 'maybe', 'expected bool'), ('size', '2.5', 'expected int'), ('size', '1e300', 'expected int'),
    ('size', '1e3', r"expected int, got '1e3' \(write 1000\)$"),
    ('names', '[a, b', 'unbalanced brackets'), ('anything', '[1, 2', 'unbalanced brackets'),
    ('names', 'a, b]', 'unbalanced brackets'), ('names', '[a, (b]', 'unbalanced brackets'),
    ('names', "['a, b]", 'unbalanced quotes'), ('names', 'a,,b', 'an empty element'),
    ('pair', '(1, 2', 'unbalanced brackets'), ('pair', '(1, 2, 3)', '2 values, got 3'),
])
def test_text_that_is_not_a_value_of_the_type_is_refused_wherever_it_enters(entry, give, key, text, why):
    conf = Flags()
    with pytest.raises(BadValueError, match=f'bad value for {key}: .*{why}'):
        give(conf, key, text)
    assert conf.flag is True and conf.names == ['a']  # nothing applied


def test_python_values_are_fitted_to_the_type_or_refused():
    conf = Flags()
    conf._set_values({'size': 3.0, 'rate': 1, 'flag': 0})
    assert (conf.size, conf.rate, conf.flag) == (3, 1.0, False)
    assert type(conf.size) is int and type(conf.rate) is float and type(conf.flag) is bool
    with pytest.raises(BadValueError, match=r'bad value for size: expected int, got 2\.5'):
        Flags()._set_values({'size': 2.5})
    with pytest.raises(BadValueError, match=r'bad value for name: expected str'):
        Flags().name = 3
    with pytest.raises(BadValueError, match=r'bad value for flag: expected bool, got 2'):
        Flags().flag = 2


def test_numpy_numbers_are_numbers():
    import numpy as np
    conf = Flags()
    conf._set_values({'size': np.int64(5), 'rate': np.float32(0.25)})
    assert conf.size == 5 and type(conf.size) is int and conf.rate == 0.25


class Module:
    """Stands for a class that is not plain data (an nn.Module)."""


class WithObject(BaseConfigs):
    part: Module = 'small'


@option(WithObject.part, 'small')
def _small():
    return Module()


def test_an_object_item_takes_objects_from_code_but_only_option_names_from_yaml():
    given = Module()
    conf = WithObject()
    conf._set_values({'part': given})
    assert conf.part is given
    for value in (5, [1], {'a': 1}):
        with pytest.raises(BadValueError, match=r"bad value for part: expected one of its options \(small\)"):
            lc.load(WithObject(), {'part': value})
    with pytest.raises(UnknownOptionError, match="unknown option 'Small' for part"):
        WithObject().part = 'Small'


class Late(BaseConfigs):
    kind: str = 'a'
    value: int


@option(Late.value, 'a')
def _late_a(c):
    return 1


def test_an_option_registered_after_an_instance_exists_is_one_of_its_options():
    conf, other = Late(), Late()
    with pytest.raises(UnknownOptionError):
        other._set_values({'value': 'b'})

    @option(Late.value, 'b')
    def _late_b(c):
        return 2

    conf._set_values({'value': 'b'})
    assert conf.value == 2
    assert lc.describe(Late())[1]['options'] == ['a', 'b']


def test_help_comment_continuation_lines_stay_with_their_item():
    source = '''
class Configs:
    # the model width
    d_model: int = 512
    threads: int = 1  # one CPU thread: the per-token steps
                      # are too small to share
    heads: int = 4    # attention heads
    a: int = 1  # help for a
    # help for b
    b: int = 2
    c: int = 3
    """c's docstring"""
    d: int = 4  # d, one line
        # (an odd indent, not the trailing comment's column: not a continuation)
    e: int = 5
'''
    assert _parse(source) == {
        'd_model': 'the model width', 'threads': 'one CPU thread: the per-token steps are too small to share',
        'heads': 'attention heads', 'a': 'help for a', 'b': 'help for b', 'c': "c's docstring", 'd': 'd, one line',
        'e': "(an odd indent, not the trailing comment's column: not a continuation)"}


class Inner(BaseConfigs):
    glu_variant: str = 'none'
    dropout: float = 0.1


class Middle(BaseConfigs):
    ffn: Inner
    attn_dropout: float = 0.0


class Top(BaseConfigs):
    transformer: Middle
    other: Inner
    d_model: int = 8


def test_declared_paths_list_sub_configs_by_annotation():
    assert declared_paths(Top) == ['transformer', 'other', 'd_model', 'transformer.ffn', 'transformer.attn_dropout',
                                   'transformer.ffn.glu_variant', 'transformer.ffn.dropout', 'other.glu_variant',
                                   'other.dropout']


def test_a_unique_end_of_a_dotted_key_stands_for_the_whole_key():
    conf = Top()
    assert expand_short_keys(conf, {'ffn.glu_variant': 'SwiGLU', 'attn_dropout': 0.1, 'd_model': 4}) == \
        {'transformer.ffn.glu_variant': 'SwiGLU', 'transformer.attn_dropout': 0.1, 'd_model': 4}
    # a key whose first part is an item is never expanded; one that matches nothing is left for the usual error
    assert expand_short_keys(conf, {'other.glu_variant': 'a', 'nothing.here': 1}) == \
        {'other.glu_variant': 'a', 'nothing.here': 1}
    # later keys win, whichever form they take
    assert expand_short_keys(conf, {'transformer.attn_dropout': 0.2, 'attn_dropout': 0.3}) == \
        {'transformer.attn_dropout': 0.3}


def test_an_ambiguous_short_key_is_an_error_listing_the_candidates():
    with pytest.raises(UnknownItemError, match=r"'glu_variant' is ambiguous: it could be "
                                               r"transformer\.ffn\.glu_variant, other\.glu_variant; give the full key"):
        expand_short_keys(Top(), {'glu_variant': 'SwiGLU'})


def test_format_description_shows_given_defaults():
    rows = lc.describe(Inner)
    text = lc.format_description(rows, {'dropout': '0.0 (follows attn_dropout)'})
    assert "glu_variant: str = 'none'" in text and 'dropout: float = 0.0 (follows attn_dropout)' in text


def test_a_dotted_key_below_a_plain_item_is_an_error_before_anything_is_computed():
    from typing import Annotated, Literal

    from annotated_types import Ge

    from lazylab.configs.engine.state import state_of

    class Sub(BaseConfigs):
        width: int = 4

    class C(BaseConfigs):
        d_model: Annotated[int, Ge(1)] = 8
        name: Optional[str] = None
        mode: Literal['a', 'b'] = 'a'
        sub: Sub
        thing: Any = 'x'

    for key in ('d_model.x', 'name.x', 'mode.x'):
        conf = C()
        with pytest.raises(UnknownItemError, match=rf'{key.split(".")[0]} is not a sub-config \(its type is .*\), '
                                                   rf'so {key} does not exist'):
            conf._set_values({key: '3'})
        st = state_of(conf)
        assert st.cache == {} and st.overrides == {}  # refused while planning: nothing computed or applied
    conf = C()
    conf._set_values({'sub.width': '16'})  # a sub-config's dotted key still waits for it, and applies
    assert conf.sub.width == 16
    # an item whose type does not say (Any): the key waits, and is refused when the value is no config
    conf = C()
    conf._set_values({'thing.width': '16'})
    with pytest.raises(UnknownItemError, match=r'thing is not a sub-config \(it came out a str\), so thing.width'):
        conf.thing


def test_a_key_beside_a_dumps_sections_is_refused_and_nothing_applied():
    class C(BaseConfigs):
        d_model: int = 8
        seq_len: int = 4

    doc = {'values': {'d_model': 16}, 'given': {'d_model': 'user'}, 'computed': {}, 'seq_len': 32}
    conf = C()
    with pytest.raises(UnknownItemError, match=r"^<dump>: 'seq_len' is not a section of a dump \(its sections: "
                                               r"values, given, .*\); a setting belongs under values:$"):
        lc.load(conf, doc)
    assert (conf.d_model, conf.seq_len) == (8, 4)
    flat = C()
    lc.load(flat, {'d_model': 16, 'seq_len': 32})  # a flat mapping (no values: section) is settings throughout
    assert (flat.d_model, flat.seq_len) == (16, 32)
