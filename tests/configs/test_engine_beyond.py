"""Where lazylab.configs goes beyond labml.configs: strict errors, typed text, provenance, dumps, listings."""
import enum
from typing import Any, List, Literal, Optional, Tuple

import pytest

import lazylab.configs as lc
from lazylab.configs import BaseConfigs, aggregate, calculate, hyperparams, meta_config, option
from lazylab.configs.engine.coerce import TypeMismatch, coerce_text, conform
from lazylab.configs.engine.errors import (
    BadValueError,
    CalculatorError,
    ConfigError,
    CycleError,
    OverrideSyntaxError,
    UnknownItemError,
    UnknownOptionError,
)
from lazylab.configs.engine.state import state_of


class Module:
    """Stands in for nn.Module: a class that is not a plain type."""


class Relu(Module):
    pass


class Gelu(Module):
    pass


class Silu(Module):
    pass


class FFNConfigs(BaseConfigs):
    # Number of features in the embedding
    d_model: int = 8
    d_ff: int = 32  # hidden width
    activation: Module = 'ReLU'
    is_gated: bool = False
    glu_variant: str = 'none'
    """Predefined GLU variant"""
    ffn: tuple


calculate(FFNConfigs.activation, 'ReLU', Relu)
calculate(FFNConfigs.activation, 'GELU', Gelu)
aggregate(FFNConfigs.glu_variant, 'SwiGLU', (FFNConfigs.is_gated, True), (FFNConfigs.activation, Silu()))


@option(FFNConfigs.ffn, 'default')
def _ffn(c: FFNConfigs):
    return 'ffn', c.d_model, c.d_ff, type(c.activation).__name__, c.is_gated


class OptimizerConfigs(BaseConfigs):
    learning_rate: float = 0.01
    betas: Tuple[float, float] = (0.9, 0.999)
    warmup: int = 0
    optimizer: tuple

    def __init__(self):
        super().__init__(_primary='optimizer')


@option(OptimizerConfigs.optimizer, 'Adam')
def _adam(c: OptimizerConfigs):
    return 'adam', c.learning_rate, c.betas


@option(OptimizerConfigs.optimizer, 'noam')
def _noam(c: OptimizerConfigs):
    return 'noam', c.learning_rate / c.warmup


class Color(enum.Enum):
    RED = 'red'
    BLUE = 'blue'


class Experiment(BaseConfigs):
    seq_len: int = 16
    epochs: int = 2
    dropout: float = 0.1
    device: str = 'cpu'
    color: Color = Color.RED
    max_steps: Optional[int] = None
    mode: Literal['fast', 'slow'] = 'fast'
    layers: List[int] = [1, 2]
    ffn: FFNConfigs
    optimizer: OptimizerConfigs
    summary: tuple


@option(Experiment.summary)
def _summary(c: Experiment):
    return c.seq_len, c.ffn.ffn, c.optimizer


hyperparams(Experiment.seq_len, Experiment.dropout)
meta_config(Experiment.device)


# --- no silent typos -------------------------------------------------------------------------------------

def test_unknown_option_lists_options_and_suggests():
    conf = FFNConfigs()
    with pytest.raises(UnknownOptionError) as info:
        conf._set_values({'activation': 'gleu'})
    assert str(info.value) == ("unknown option 'gleu' for activation (FFNConfigs); did you mean 'GELU'? "
                               "options: ReLU, GELU")
    assert isinstance(info.value, ValueError)


def test_unknown_option_names_full_path_in_sub_config():
    conf = Experiment()
    with pytest.raises(UnknownOptionError, match=r"unknown option 'gelu_' for ffn.activation \(FFNConfigs\); "
                                                 r"did you mean 'GELU' or 'ReLU'\? options: ReLU, GELU$"):
        lc.apply_overrides(conf, {'ffn.activation': 'gelu_'})


def test_unknown_option_at_compute_time_for_class_default():
    class C(BaseConfigs):
        act: Module = 'RELU_TYPO'

    calculate(C.act, 'ReLU', Relu)
    with pytest.raises(UnknownOptionError, match="unknown option 'RELU_TYPO' for act"):
        C().act


def test_string_valued_item_with_options_accepts_any_string():
    class C(BaseConfigs):
        name: str = 'x'

    calculate(C.name, 'upper', lambda: 'X')
    conf = C()
    conf._set_values({'name': 'free text'})
    assert conf.name == 'free text'


# --- cycles ---------------------------------------------------------------------------------------------

def test_cycle_shows_chain():
    class C(BaseConfigs):
        a: int
        b: int
        c: int

    calculate(C.a, lambda c: c.b)
    calculate(C.b, lambda c: c.c)
    calculate(C.c, lambda c: c.a)
    with pytest.raises(CycleError) as info:
        C().a
    assert str(info.value) == 'cycle in config dependencies: a -> b -> c -> a'
    assert info.value.chain == ['a', 'b', 'c', 'a']


def test_cycle_through_sub_config_shows_dotted_chain():
    class Inner(BaseConfigs):
        width: int

    class Outer(BaseConfigs):
        size: int
        inner: Inner

    @option(Outer.inner)
    def _inner(c):
        conf = Inner()
        conf.set_default(Inner.width, func=lambda: c.size)
        return conf

    calculate(Outer.size, lambda c: c.inner.width)
    with pytest.raises(CycleError, match=r'size -> inner.width -> size$'):
        Outer().size


def test_after_cycle_error_object_is_still_usable():
    class C(BaseConfigs):
        a: int
        b: int = 1

    calculate(C.a, lambda c: c.a)
    conf = C()
    with pytest.raises(CycleError):
        conf.a
    assert conf.b == 1


# --- calculator errors ------------------------------------------------------------------------------------

def test_calculator_error_names_path_and_option_and_chains():
    conf = Experiment()
    conf._set_values({'optimizer.optimizer': 'noam'})  # warmup = 0 -> ZeroDivisionError inside the option
    with pytest.raises(CalculatorError) as info:
        conf.summary
    assert str(info.value) == ("optimizer.optimizer: option 'noam' failed: ZeroDivisionError: "
                               "float division by zero")
    assert info.value.path == 'optimizer.optimizer' and info.value.option == 'noam'
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_attribute_error_inside_calculator_is_wrapped_not_swallowed():
    class C(BaseConfigs):
        x: int

    calculate(C.x, 'broken', lambda: None.missing)
    with pytest.raises(CalculatorError, match=r"x: option 'broken' failed: AttributeError"):
        C().x


def test_set_default_function_error_is_wrapped():
    class C(BaseConfigs):
        x: int

    conf = C()
    conf.set_default(C.x, func=lambda: 1 // 0)
    with pytest.raises(CalculatorError, match='x: set_default function failed: ZeroDivisionError'):
        conf.x


def test_undeclared_read_inside_calculator_names_item():
    class C(BaseConfigs):
        learning_rate: float = 0.1
        x: float

    calculate(C.x, lambda c: c.learning_rat)
    with pytest.raises(UnknownItemError, match="did you mean 'learning_rate'"):
        C().x


# --- typed text -------------------------------------------------------------------------------------------

@pytest.mark.parametrize('text, annotation, expected', [
    ('42', int, 42), ('-3', int, -3), ('1_000', int, 1000),
    ('1e-3', float, 0.001), ('.5', float, 0.5), ('2', float, 2.0), ('-1.5E2', float, -150.0),
    ('true', bool, True), ('False', bool, False), ('1', bool, True), ('0', bool, False),
    ('yes', bool, True), ('no', bool, False),
    ('hello', str, 'hello'), ('', str, ''),
    ('null', Optional[int], None), ('None', Optional[int], None), ('7', Optional[int], 7),
    ('[1, 2, 3]', List[int], [1, 2, 3]), ('1,2', List[int], [1, 2]), ('[]', List[int], []),
    ('(0.9, 0.98)', Tuple[float, float], (0.9, 0.98)), ('1,2,3', Tuple[int, ...], (1, 2, 3)),
    ("['a', 'b']", List[str], ['a', 'b']),
    ('slow', Literal['fast', 'slow'], 'slow'), ('2', Literal[1, 2], 2),
    ('BLUE', Color, Color.BLUE), ('blue', Color, Color.BLUE), ('red', Color, Color.RED),
    ('anything', Any, 'anything'),
])
def test_coerce_text(text, annotation, expected):
    value = coerce_text(text, annotation)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize('text, annotation', [
    ('abc', int), ('1.5', int), ('1e3', int), ('2.0', int), ('x', float), ('maybe', bool), ('null', int),
    ('3', Literal['a', 'b']),
    ('GREEN', Color), ('1,2,3', Tuple[float, float]), ('[1, x]', List[int]), ('thing', Module),
])
def test_coerce_text_rejects(text, annotation):
    with pytest.raises(TypeMismatch):
        coerce_text(text, annotation)


def test_conform_yaml_values():
    assert conform(3, float) == 3.0 and type(conform(3, float)) is float
    assert conform([0.5, 1], Tuple[float, float]) == (0.5, 1.0)
    assert conform('BLUE', Color) is Color.BLUE
    assert conform(None, Optional[int]) is None
    with pytest.raises(TypeMismatch):
        conform(1.5, int)
    with pytest.raises(TypeMismatch):
        conform(None, int)


def test_bad_text_names_key_type_and_text():
    with pytest.raises(BadValueError) as info:
        lc.apply_overrides(Experiment(), {'seq_len': 'sixteen'})
    assert str(info.value) == "bad value for seq_len: expected int, got 'sixteen'"
    with pytest.raises(BadValueError, match=r"bad value for optimizer.learning_rate: expected float, got 'fast'"):
        lc.apply_overrides(Experiment(), {'optimizer.learning_rate': 'fast'})


def test_apply_overrides_types_everything():
    conf = Experiment()
    lc.apply_overrides(conf, lc.parse_overrides([
        'seq_len=32', 'dropout=.5', 'color=BLUE', 'max_steps=null', 'mode=slow', 'layers=[4, 5]',
        'ffn.glu_variant=SwiGLU', 'ffn.d_model=64', 'optimizer.learning_rate=1e-3',
        'optimizer.betas=(0.5, 0.75)']))
    assert conf.summary == (32, ('ffn', 64, 32, 'Silu', True), ('adam', 0.001, (0.5, 0.75)))
    assert (conf.dropout, conf.color, conf.max_steps, conf.mode, conf.layers) == (0.5, Color.BLUE, None, 'slow',
                                                                                   [4, 5])


# --- all-or-nothing ---------------------------------------------------------------------------------------

def test_one_bad_key_applies_none():
    conf = Experiment()
    lc.apply_overrides(conf, {'ffn.d_model': '4'})
    assert conf.ffn.d_ff == 32  # ffn now exists; dotted keys go straight to it
    with pytest.raises(BadValueError):
        lc.apply_overrides(conf, {'seq_len': '64', 'ffn.d_ff': '128', 'optimizer.warmup': '10',
                                  'dropout': 'high'})
    assert conf.seq_len == 16 and conf.ffn.d_ff == 32 and conf.optimizer == ('adam', 0.01, (0.9, 0.999))


def test_unknown_dotted_key_for_unborn_sub_config_is_caught_up_front():
    conf = Experiment()
    with pytest.raises(UnknownItemError, match=r"FFNConfigs has no config item 'ffn.d_mdl'; did you mean 'd_model'"):
        lc.apply_overrides(conf, {'seq_len': '8', 'ffn.d_mdl': '3'})
    assert conf.seq_len == 16


# --- command line -----------------------------------------------------------------------------------------

def test_parse_overrides_text_and_typed():
    tokens = ['seq_len=32', 'optimizer.learning_rate=1e-3', 'device=', '--epochs=3', 'ffn.activation=GELU']
    assert lc.parse_overrides(tokens) == {'seq_len': '32', 'optimizer.learning_rate': '1e-3', 'device': '',
                                          'epochs': '3', 'ffn.activation': 'GELU'}
    conf = Experiment()
    typed = lc.parse_overrides(tokens, conf)
    assert typed == {'seq_len': 32, 'device': '', 'epochs': 3, 'optimizer.learning_rate': '1e-3',
                     'ffn.activation': 'GELU'}
    assert conf.seq_len == 16  # nothing applied


@pytest.mark.parametrize('token', ['seq_len', '=3', ''])
def test_parse_overrides_syntax_error(token):
    with pytest.raises(OverrideSyntaxError, match='expected key=value'):
        lc.parse_overrides([token])


# --- provenance -------------------------------------------------------------------------------------------

def test_explain_reports_source_detail_and_reads():
    conf = Experiment()
    conf.epochs = 5
    conf._set_values({'ffn.glu_variant': 'SwiGLU', 'seq_len': 8})
    conf.summary
    report = lc.explain(conf)
    assert report['seq_len']['source'] == 'override'
    assert report['summary'] == {'source': 'option', 'detail': '_summary', 'selected_by': 'first option',
                                 'reads': ['seq_len', 'ffn', 'ffn.ffn', 'optimizer'],
                                 'value': [8, ['ffn', 8, 32, 'Silu', True], ['adam', 0.01, [0.9, 0.999]]]}
    assert report['ffn']['source'] == 'from_type'
    assert report['ffn.activation']['source'] == 'aggregate'
    assert report['ffn.activation']['detail'] == 'glu_variant=SwiGLU'
    assert report['ffn.activation']['reads'] == ['ffn.glu_variant']
    assert report['ffn.is_gated']['detail'] == 'glu_variant=SwiGLU'
    assert report['ffn.d_model']['source'] == 'default'
    assert report['ffn.ffn']['reads'] == ['ffn.d_model', 'ffn.d_ff', 'ffn.activation', 'ffn.is_gated']
    assert report['optimizer.optimizer']['detail'] == 'Adam'
    assert 'epochs' not in report and 'dropout' not in report  # never read, never computed
    conf2 = FFNConfigs()
    conf2.set_default(FFNConfigs.d_model, func=lambda: 3)
    conf2.d_ff = 7
    conf2._set_values({'activation': 'GELU'})
    conf2.ffn
    r2 = lc.explain(conf2)
    assert (r2['d_model']['source'], r2['d_model']['detail']) == ('set_default', 'func')
    assert r2['d_ff']['source'] == 'assigned'
    assert (r2['activation']['source'], r2['activation']['detail'], r2['activation']['selected_by']) == \
        ('option', 'GELU', 'override')
    text = lc.format_explain(r2)
    assert 'activation  option GELU (selected by override)' in text


# --- dump and replay --------------------------------------------------------------------------------------

def _read_all(conf, paths):
    """Read every dotted path, going through sub-config objects (also those hidden behind `_primary`)."""
    for path in paths:
        *parents, last = path.split('.')
        obj = conf
        for part in parents:
            getattr(obj, part)
            obj = state_of(obj).children[part]
        getattr(obj, last)


def test_dump_and_load_round_trip(tmp_path):
    conf = Experiment()
    lc.apply_overrides(conf, {'seq_len': '24', 'ffn.glu_variant': 'SwiGLU', 'optimizer.learning_rate': '1e-3',
                              'color': 'BLUE', 'max_steps': '100', 'optimizer.betas': '(0.8, 0.9)'})
    conf.summary
    conf.color
    conf.max_steps
    conf.mode
    path = tmp_path / 'configs.yaml'
    text = lc.dump(conf, path)
    assert path.read_text() == text
    dumped = lc.to_dict(conf)
    assert dumped['values']['ffn.glu_variant'] == 'SwiGLU'
    assert dumped['values']['optimizer.optimizer'] == 'Adam'
    assert dumped['values']['optimizer.betas'] == [0.8, 0.9]
    assert dumped['values']['color'] == 'BLUE'
    assert dumped['objects']['ffn.activation'].endswith('(aggregate glu_variant=SwiGLU)')
    assert dumped['hyperparams'] == ['seq_len', 'dropout'] and dumped['meta'] == ['device']

    fresh = Experiment()
    lc.load(fresh, path)
    _read_all(fresh, dumped['values'])
    assert fresh.summary == conf.summary
    assert (fresh.color, fresh.max_steps, fresh.optimizer) == (Color.BLUE, 100, ('adam', 0.001, (0.8, 0.9)))
    assert lc.to_dict(fresh) == dumped

    from_text = Experiment()
    lc.load(from_text, text)
    assert from_text.summary == conf.summary


def test_load_rejects_bad_yaml():
    with pytest.raises(BadValueError):
        lc.load(Experiment(), 'values: [1, 2')
    with pytest.raises(UnknownItemError):
        lc.load(Experiment(), {'values': {'seq_lne': 3}})


# --- listing ----------------------------------------------------------------------------------------------

def test_describe_rows_with_comments_and_flags():
    rows = {r['name']: r for r in lc.describe(Experiment)}
    assert rows['seq_len'] == {'name': 'seq_len', 'type': 'int', 'base_type': 'int', 'rule': '', 'plain': True,
                               'default': 16, 'options': [], 'values': [], 'help': '', 'is_hyperparam': True,
                               'is_meta': False}
    assert rows['device']['is_meta'] is True
    assert rows['ffn.d_model']['help'] == 'Number of features in the embedding'
    assert rows['ffn.d_ff']['help'] == 'hidden width'
    assert rows['ffn.glu_variant']['help'] == 'Predefined GLU variant'
    assert rows['ffn.glu_variant']['options'] == ['SwiGLU']
    assert rows['ffn.activation']['options'] == ['ReLU', 'GELU']
    assert rows['ffn.activation']['values'] == ['ReLU', 'GELU']  # what a command line may name: for TAB
    assert rows['ffn.is_gated']['values'] == ['True', 'False']
    assert rows['ffn.activation']['default'] == 'ReLU'
    assert rows['optimizer.optimizer']['default'] == 'Adam'
    assert rows['max_steps']['type'] == 'Optional[int]'
    text = lc.format_description(lc.describe(FFNConfigs))
    assert "activation: Module = 'ReLU'  options: ReLU, GELU" in text
    assert "d_model: int = 8\n    Number of features in the embedding" in text


def test_describe_object_shows_computed_values():
    conf = Experiment()
    conf._set_values({'seq_len': 4})
    conf.seq_len
    rows = {r['name']: r for r in lc.describe(conf)}
    assert rows['seq_len']['value'] == 4 and rows['seq_len']['computed'] is True
    assert rows['epochs']['computed'] is False


def test_all_errors_are_config_errors():
    for cls in (UnknownItemError, UnknownOptionError, BadValueError, CycleError, CalculatorError,
                OverrideSyntaxError):
        assert issubclass(cls, ConfigError)


# --- robustness -------------------------------------------------------------------------------------------

def test_200_item_chain_within_default_recursion_limit():
    n = 200
    cls = type('Chain', (BaseConfigs,), {'__annotations__': {f'x{i}': int for i in range(n)}, 'x0': 0})

    def successor(prev):
        return lambda c: getattr(c, prev) + 1

    for i in range(1, n):
        calculate(getattr(cls, f'x{i}'), 'next', successor(f'x{i - 1}'))
    assert getattr(cls(), f'x{n - 1}') == n - 1


def test_deepcopy_and_pickle_keep_given_and_computed_values():
    import copy
    import pickle
    conf = Experiment()
    lc.apply_overrides(conf, {'seq_len': '12', 'ffn.d_ff': '64'})
    assert conf.seq_len == 12
    twin = copy.deepcopy(conf)
    assert twin.seq_len == 12 and twin.ffn.d_ff == 64 and twin.ffn is not conf.ffn
    restored = pickle.loads(pickle.dumps(twin))
    assert restored.seq_len == 12 and restored.ffn.ffn == ('ffn', 8, 64, 'Relu', False)
    assert lc.describe(Experiment)[4]['default'] == 'RED'


def test_dump_keeps_overrides_nobody_read_yet():
    from lazylab.configs import BaseConfigs, dump, load

    class Conf(BaseConfigs):
        d_model: int = 512
        d_ff: int = 2048
        name: str = 'x'

    conf = Conf()
    conf._set_values({'d_model': 256, 'name': 'y'})
    assert conf.name == 'y'  # d_model is overridden but never read
    replay = Conf()
    load(replay, dump(conf))
    assert (replay.d_model, replay.d_ff, replay.name) == (256, 2048, 'y')
