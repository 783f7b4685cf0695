"""labml-compatible semantics of lazylab.configs.

Most tests run twice, once against labml.configs (the reference) and once against lazylab.configs, through the
`engine` fixture: the same code must give the same values with both.
"""
import subprocess
import sys

import labml.configs
import pytest

import lazylab.configs
from lazylab.configs import BaseConfigs, calculate, option
from lazylab.configs.engine.errors import (
    AlreadyComputedError,
    ConfigError,
    DeclarationError,
    NoValueError,
    UnknownItemError,
)


@pytest.fixture(params=['labml', 'lazylab'])
def engine(request):
    return labml.configs if request.param == 'labml' else lazylab.configs


class Widget:
    """Constructed from an annotation with no arguments."""

    def __init__(self):
        self.made = True


class Gadget:
    """Constructed from an annotation with the config object."""

    def __init__(self, c):
        self.size = c.size


def test_annotated_items_defaults_and_inheritance(engine):
    class Base(engine.BaseConfigs):
        a: int = 1
        b: str = 'x'
        c = 3.5  # an un-annotated value is an item too

    class Child(Base):
        a = 10
        d: int = 4

    base, child = Base(), Child()
    assert (base.a, base.b, base.c) == (1, 'x', 3.5)
    assert (child.a, child.b, child.c, child.d) == (10, 'x', 3.5, 4)


def test_option_call_forms(engine):
    class C(engine.BaseConfigs):
        size: int = 3
        by_configs: int
        by_nothing: int
        by_params: int
        named: int = 'double'
        pair_a: int
        pair_b: int

    @engine.option(C.by_configs)
    def _by_configs(c):
        return c.size + 1

    @engine.option(C.by_nothing)
    def _by_nothing():
        return 7

    @engine.option(C.by_params, [C.size])
    def _by_params(size):
        return size * 100

    @engine.option(C.named, 'double', [C.size])
    def _double(size):
        return size * 2

    @engine.option([C.pair_a, C.pair_b])
    def _pair(c):
        return c.size, -c.size

    conf = C()
    assert conf.by_configs == 4
    assert conf.by_nothing == 7
    assert conf.by_params == 300
    assert conf.named == 6
    assert conf.pair_b == -3
    assert conf.pair_a == 3


def test_calculate_forms_and_class_as_function(engine):
    class C(engine.BaseConfigs):
        size: int = 2
        a: int
        b: int
        c: int
        d: int
        gadget: Gadget
        widget: Widget

    engine.calculate(C.a, lambda c: c.size + 1)
    engine.calculate(C.b, 'bee', lambda: 5)
    engine.calculate(C.c, [C.size], lambda s: s * 3)
    engine.calculate(C.d, 'dee', [C.size, C.a], lambda s, a: s * a)
    engine.calculate(C.gadget, 'g', Gadget)
    engine.calculate(C.widget, 'w', Widget)
    conf = C()
    assert (conf.a, conf.b, conf.c, conf.d) == (3, 5, 6, 6)
    assert conf.gadget.size == 2
    assert conf.widget.made


def test_string_value_selects_option_and_override_wins(engine):
    class C(engine.BaseConfigs):
        act: object = 'relu'

    engine.calculate(C.act, 'relu', lambda: 'R')
    engine.calculate(C.act, 'gelu', lambda: 'G')
    assert C().act == 'R'
    conf = C()
    conf._set_values({'act': 'gelu'})
    assert conf.act == 'G'
    conf = C()
    conf.act = 'gelu'
    assert conf.act == 'G'


def test_options_inherited_and_overridden(engine):
    class Parent(engine.BaseConfigs):
        x: object = 'a'

    engine.calculate(Parent.x, 'a', lambda: 'parent-a')
    engine.calculate(Parent.x, 'b', lambda: 'parent-b')

    class Kid(Parent):
        x: object = 'a'  # re-declared, so labml also records Kid's options on Kid

    engine.calculate(Kid.x, 'a', lambda: 'kid-a')  # same name: the subclass's wins for the subclass
    assert Parent().x == 'parent-a'
    assert Kid().x == 'kid-a'
    kid = Kid()
    kid._set_values({'x': 'b'})
    assert kid.x == 'parent-b'


def test_option_registered_on_subclass_does_not_leak_into_parent():
    """Unlike labml (which records `Kid.x` options on the declaring class), options added through a subclass
    stay on the subclass, even when the subclass does not re-declare the item."""
    class Parent(BaseConfigs):
        x: object = 'a'

    calculate(Parent.x, 'a', lambda: 1)

    class Kid(Parent):
        pass

    calculate(Kid.x, 'a', lambda: 'kid-a')
    calculate(Kid.x, 'k', lambda: 2)
    kid = Kid()
    kid._set_values({'x': 'k'})
    assert kid.x == 2
    assert Kid().x == 'kid-a'
    assert Parent().x == 1
    assert lazylab.configs.describe(Parent)[0]['options'] == ['a']


def test_option_registered_on_parent_after_subclass_exists(engine):
    class Parent(engine.BaseConfigs):
        x: object

    class Kid(Parent):
        pass

    engine.calculate(Parent.x, 'late', lambda: 'late')
    assert Kid().x == 'late'


def test_first_option_is_default_when_no_value(engine):
    class C(engine.BaseConfigs):
        x: int

    engine.calculate(C.x, 'one', lambda: 1)
    engine.calculate(C.x, 'two', lambda: 2)
    assert C().x == 1


def test_construct_from_annotated_class(engine):
    class C(engine.BaseConfigs):
        size: int = 9
        widget: Widget
        gadget: Gadget

    conf = C()
    assert conf.widget.made
    assert conf.gadget.size == 9


def test_aggregate(engine):
    class C(engine.BaseConfigs):
        variant: str = 'none'
        gated: bool = False
        act: str = 'relu'

    engine.aggregate(C.variant, 'swiglu', (C.gated, True), (C.act, 'silu'))

    assert (C().gated, C().act) == (False, 'relu')
    conf = C()
    conf._set_values({'variant': 'swiglu'})
    assert (conf.gated, conf.act) == (True, 'silu')
    conf = C()
    conf._set_values({'variant': 'swiglu', 'act': 'tanh'})  # explicit beats the aggregate
    assert (conf.gated, conf.act) == (True, 'tanh')

    class Kid(C):  # aggregates are inherited
        variant = 'swiglu'

    assert (Kid().gated, Kid().act) == (True, 'silu')


def test_precedence_order(engine):
    class C(engine.BaseConfigs):
        sel: str = 'on'
        x: int = 5

    engine.calculate(C.x, 'opt', lambda: 6)
    engine.aggregate(C.sel, 'on', (C.x, 4))

    conf = C()
    conf.set_default(C.x, value=3)
    conf.x = 2
    conf._set_values({'x': 1})
    assert conf.x == 1  # override

    conf = C()
    conf.set_default(C.x, value=3)
    conf.x = 2
    assert conf.x == 2  # assigned

    conf = C()
    conf.set_default(C.x, func=lambda: 3)
    assert conf.x == 3  # set_default beats the aggregate

    assert C().x == 4  # aggregate beats the class default
    conf = C()
    conf.sel = 'off'
    assert conf.x == 5  # class default

    class D(engine.BaseConfigs):
        x: int

    engine.calculate(D.x, 'opt', lambda: 6)
    assert D().x == 6  # first option


def test_hyperparams_and_meta_flags_in_to_json(engine):
    class C(engine.BaseConfigs):
        lr: float = 0.1
        device: str = 'cpu'
        seed: int = 1

    engine.hyperparams(C.lr, C.seed)
    engine.hyperparams(C.seed, is_hyperparam=False)
    engine.meta_config(C.device)
    js = C()._to_json()
    assert js['lr']['is_hyperparam'] is True
    assert js['seed']['is_hyperparam'] is False
    assert js['device']['is_meta'] is True
    assert js['device']['is_hyperparam'] is None


def test_caching_and_laziness(engine):
    calls = []

    class C(engine.BaseConfigs):
        a: int
        b: int
        unused: int

    @engine.option(C.a)
    def _a(c):
        calls.append('a')
        return 1

    @engine.option(C.b)
    def _b(c):
        calls.append('b')
        return c.a + c.a

    @engine.option(C.unused)
    def _unused(c):
        calls.append('unused')
        return 0

    conf = C()
    assert conf.b == 2 and conf.b == 2 and conf.a == 1
    assert calls == ['b', 'a']


def test_sub_config_dotted_keys_before_and_after_creation(engine):
    class Inner(engine.BaseConfigs):
        width: int = 4
        depth: int = 1

    class Outer(engine.BaseConfigs):
        inner: Inner
        size: int = 2

    conf = Outer()
    conf._set_values({'inner.width': 16})  # before `inner` exists: kept, applied when created
    assert conf.inner.width == 16
    conf._set_values({'inner.depth': 3})  # after: applied at once
    assert conf.inner.depth == 3


def test_sub_config_built_by_option_receives_pending_keys(engine):
    """labml_nn's TransformerConfigs.ffn pattern: an option returns a FeedForwardConfigs whose defaults read the
    parent, and `ffn.glu_variant` given before `ffn` is read still applies (and drives an aggregate)."""

    class FFN(engine.BaseConfigs):
        d_model: int
        glu_variant: str = 'none'
        is_gated: bool = False
        ffn: tuple

    engine.aggregate(FFN.glu_variant, 'SwiGLU', (FFN.is_gated, True))

    @engine.option(FFN.ffn, 'default')
    def _ffn(c):
        return 'ffn', c.d_model, c.is_gated

    class Transformer(engine.BaseConfigs):
        d_model: int = 8
        ffn: FFN

    @engine.option(Transformer.ffn, 'default')
    def _transformer_ffn(c):
        conf = FFN()
        conf.set_default(FFN.d_model, func=lambda: c.d_model)
        return conf

    conf = Transformer()
    conf._set_values({'ffn.glu_variant': 'SwiGLU', 'd_model': 32})
    assert conf.ffn.ffn == ('ffn', 32, True)
    js = conf._to_json()
    assert js['ffn.glu_variant']['is_explicitly_specified'] is True
    assert js['ffn.d_model']['computed'] == 32


def test_primary_item(engine):
    class Opt(engine.BaseConfigs):
        lr: float = 0.1
        optimizer: tuple

        def __init__(self):
            super().__init__(_primary='optimizer')

    @engine.option(Opt.optimizer, 'sgd')
    def _sgd(c):
        return 'sgd', c.lr

    class Main(engine.BaseConfigs):
        optimizer: Opt

    conf = Main()
    conf._set_values({'optimizer.lr': 0.5})
    assert conf.optimizer == ('sgd', 0.5)
    assert conf._to_json()['optimizer.lr']['computed'] == 0.5


def test_class_default_that_is_a_config_instance():
    class Inner(BaseConfigs):
        width: int = 4

    class Outer(BaseConfigs):
        inner: Inner = Inner()

    first, second = Outer(), Outer()
    first._set_values({'inner.width': 7})
    assert first.inner.width == 7
    assert second.inner.width == 4  # each parent gets its own copy of the template
    assert first.inner is not second.inner


def test_set_values_to_json_matches_labml():
    """The same class in both engines gives the same `_to_json` after the same reads."""
    def build(engine):
        class Inner(engine.BaseConfigs):
            width: int = 4
            act: object = 'relu'

        engine.calculate(Inner.act, 'relu', lambda: 'R')
        engine.calculate(Inner.act, 'gelu', lambda: 'G')

        class Outer(engine.BaseConfigs):
            size: int = 2
            lr: float = 0.1
            name: str = 'outer'
            inner: Inner
            total: int

        @engine.option(Outer.total)
        def _total(c):
            return c.size + c.inner.width

        engine.hyperparams(Outer.lr)
        engine.meta_config(Outer.name)
        conf = Outer()
        conf._set_values({'size': 3, 'inner.act': 'gelu'})
        assert conf.total == 7 and conf.inner.act == 'G'
        return conf._to_json()

    ours, theirs = build(lazylab.configs), build(labml.configs)
    # labml renders a nested local class's object as its raw repr (with an address); we name the class.
    assert ours['inner'].pop('computed').endswith('build.<locals>.Inner')
    theirs['inner'].pop('computed')
    assert ours == theirs


def test_assign_after_compute_is_value_error(engine):
    class C(engine.BaseConfigs):
        x: int = 1

    conf = C()
    assert conf.x == 1
    with pytest.raises(ValueError):
        conf.x = 2
    with pytest.raises(ValueError):
        conf._set_values({'x': 2})


def test_undeclared_names(engine):
    class C(engine.BaseConfigs):
        learning_rate: float = 0.1

    conf = C()
    with pytest.raises(AttributeError):
        conf.learning_rat = 1
    with pytest.raises(KeyError):
        conf._set_values({'learning_rat': 1})
    with pytest.raises(AttributeError):
        conf.learning_rat


def test_undeclared_names_suggest_nearest():
    class C(BaseConfigs):
        learning_rate: float = 0.1
        d_model: int = 4

    conf = C()
    with pytest.raises(UnknownItemError, match=r"C has no config item 'learning_rat'; did you mean 'learning_rate'\?"):
        conf.learning_rat = 1
    with pytest.raises(UnknownItemError, match=r"'learning_rat'; did you mean 'learning_rate'\?") as info:
        conf._set_values({'learning_rat': 1})
    assert isinstance(info.value, KeyError) and isinstance(info.value, ConfigError)
    with pytest.raises(UnknownItemError, match="'d_mdoel'; did you mean 'd_model'"):
        conf.d_mdoel
    with pytest.raises(UnknownItemError, match=r"'inner.x'"):
        conf._set_values({'inner.x': 1})


def test_set_values_is_all_or_nothing():
    class C(BaseConfigs):
        a: int = 1
        b: int = 2

    conf = C()
    with pytest.raises(UnknownItemError):
        conf._set_values({'a': 10, 'bb': 20})
    assert conf.a == 1


def test_no_value_is_attribute_error(engine):
    class C(engine.BaseConfigs):
        n: int

    conf = C()
    assert not hasattr(conf, 'n')


def test_no_value_error_names_item():
    class C(BaseConfigs):
        n_vocab: int

    with pytest.raises(NoValueError, match=r'n_vocab \(C\) has no value'):
        C().n_vocab


def test_set_default_after_compute_and_unknown():
    class C(BaseConfigs):
        x: int = 1

    conf = C()
    with pytest.raises(UnknownItemError):
        conf.set_default('y', value=1)
    assert conf.x == 1
    with pytest.raises(AlreadyComputedError):
        conf.set_default(C.x, value=2)


def test_multi_item_option_wrong_length():
    class C(BaseConfigs):
        a: int
        b: int

    calculate([C.a, C.b], 'pair', lambda: (1, 2, 3))
    with pytest.raises(DeclarationError, match=r"a: option 'pair' computes a, b and must return a tuple or list "
                                               r"of 2 values, got 3 values"):
        C().a


def test_option_needs_config_items():
    with pytest.raises(DeclarationError):
        option('not an item')
    with pytest.raises(DeclarationError):
        calculate(None, lambda: 1)


def test_method_on_config_class_is_not_an_item():
    class C(BaseConfigs):
        x: int = 2

        def doubled(self):
            return self.x * 2

    conf = C()
    assert conf.doubled() == 4
    assert 'doubled' not in lazylab.configs.describe(C)[0]['name']


def test_item_names_update_dump_explain_are_legal():
    class C(BaseConfigs):
        update: int = 1
        dump: str = 'd'
        explain: bool = True

    conf = C()
    conf._set_values({'update': 2})
    assert (conf.update, conf.dump, conf.explain) == (2, 'd', True)


def test_import_does_not_import_torch():
    code = 'import sys, lazylab.configs; print("torch" in sys.modules)'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == 'False'
