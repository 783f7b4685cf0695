"""Typed items: ``Annotated[T, constraint…]`` (annotated-types) checked on every way a value reaches an item.

The main table is constraint × entry path: each constraint is tried with a good and a bad value through every
entry (override dict, dotted override, attribute, set_default, command-line text, YAML, class default, and
the computed paths: option, set_default function, aggregate), and the error must name the full path, the
constraint and the value.
"""
import math
from typing import Annotated, Any, Callable, Literal, NamedTuple, Optional, Union

import pytest
import yaml
from annotated_types import (
    Ge,
    Gt,
    Interval,
    IsFinite,
    Le,
    Len,
    Lt,
    MaxLen,
    MinLen,
    MultipleOf,
    Not,
    Predicate,
    Timezone,
)

import lazylab.configs as lc
from lazylab.configs import BaseConfigs, aggregate, calculate, option
from lazylab.configs.engine.coerce import TypeMismatch, coerce_text, conform
from lazylab.configs.engine.errors import BadValueError, DeclarationError


def is_even(n: int) -> bool:
    return n % 2 == 0


class Case(NamedTuple):
    annotation: Any
    good: Any
    bad: Any
    must: str  # the constraint as the error states it


CASES = {
    'Ge': Case(Annotated[int, Ge(1)], 1, 0, 'must be ≥ 1'),
    'Gt': Case(Annotated[float, Gt(0)], 0.5, 0.0, 'must be > 0'),
    'Le': Case(Annotated[int, Le(8)], 8, 9, 'must be ≤ 8'),
    'Lt': Case(Annotated[float, Lt(1)], 0.5, 1.0, 'must be < 1'),
    'Interval-low': Case(Annotated[float, Interval(ge=0, lt=1)], 0.0, -0.5, 'must be ≥ 0'),
    'Interval-high': Case(Annotated[float, Interval(ge=0, lt=1)], 0.0, 1.0, 'must be < 1'),
    'MultipleOf': Case(Annotated[int, MultipleOf(8)], 16, 12, 'must be a multiple of 8'),
    'MinLen': Case(Annotated[str, MinLen(1)], 'a', '', 'must have length ≥ 1'),
    'MaxLen': Case(Annotated[list[int], MaxLen(2)], [1, 2], [1, 2, 3], 'must have length ≤ 2'),
    'Finite': Case(IsFinite[float], 1.5, math.inf, 'must be finite'),
    'NotNan': Case(Annotated[float, Predicate(Not(math.isnan))], 2.5, math.nan, 'must not be nan'),
    'Predicate': Case(Annotated[int, Predicate(is_even)], 4, 3, 'must satisfy is_even'),
}


def text_of(value: Any) -> str:
    """How the value is written on the command line."""
    if isinstance(value, list):
        return '[' + ', '.join(map(str, value)) + ']'
    return str(value)


def configs_class(case: Case, default: Any = None) -> type:
    """Configs with item ``x`` of the case's type (class default: the good value) and a selector ``mode``."""
    namespace = {'__annotations__': {'x': case.annotation, 'mode': str, 'other': int},
                 'x': case.good if default is None else default, 'mode': 'plain', 'other': 1}
    return type('Configs', (BaseConfigs,), namespace)


# Each entry path gives `value` (or its text) to item x and returns a function that reads x.

def via_set_values(case, value):
    conf = configs_class(case)()
    conf._set_values({'x': value})
    return lambda: conf.x


def via_dotted_set_values(case, value):
    child = configs_class(case)
    parent = type('Parent', (BaseConfigs,), {'__annotations__': {'sub': child}})()
    parent._set_values({'sub.x': value})  # the sub-config does not exist yet: checked against its class
    return lambda: parent.sub.x


def via_assignment(case, value):
    conf = configs_class(case)()
    conf.x = value
    return lambda: conf.x


def via_set_default(case, value):
    cls = configs_class(case)
    conf = cls()
    conf.set_default(cls.x, value=value)
    return lambda: conf.x


def via_cli_text(case, value):
    conf = configs_class(case)()
    lc.apply_overrides(conf, lc.parse_overrides([f'x={text_of(value)}']))
    return lambda: conf.x


def via_parse_overrides_typed(case, value):
    conf = configs_class(case)()
    lc.apply_overrides(conf, lc.parse_overrides([f'x={text_of(value)}'], conf))
    return lambda: conf.x


def via_yaml(case, value):
    conf = configs_class(case)()
    lc.load(conf, yaml.safe_dump({'values': {'x': value}}))
    return lambda: conf.x


def via_class_default(case, value):
    conf = configs_class(case, default=value)()
    return lambda: conf.x


def via_option(case, value):
    cls = configs_class(case)
    calculate(cls.x, 'make', lambda: value)
    conf = cls()
    conf._set_values({'x': 'make'})  # an option name is not a value: what it computes is checked
    return lambda: conf.x


def via_set_default_func(case, value):
    cls = configs_class(case)
    conf = cls()
    conf.set_default(cls.x, func=lambda: value)
    return lambda: conf.x


def via_aggregate(case, value):
    cls = configs_class(case)
    aggregate(cls.mode, 'chosen', (cls.x, value))
    conf = cls()
    conf.mode = 'chosen'
    return lambda: conf.x


class Entry(NamedTuple):
    give: Callable[[Case, Any], Callable[[], Any]]
    path: str  # the path the error names
    how: str  # the note after the value, for computed values
    when: str  # 'given': the error comes when the value is given; 'read': when x is first read


PATHS = {
    'set_values': Entry(via_set_values, 'x', '', 'given'),
    'dotted_set_values': Entry(via_dotted_set_values, 'sub.x', '', 'given'),
    'assignment': Entry(via_assignment, 'x', '', 'given'),
    'set_default': Entry(via_set_default, 'x', '', 'given'),
    'cli_text': Entry(via_cli_text, 'x', '', 'given'),
    'parse_overrides_typed': Entry(via_parse_overrides_typed, 'x', '', 'given'),
    'yaml': Entry(via_yaml, 'x', '', 'given'),
    'class_default': Entry(via_class_default, 'Configs.x', ' (class default)', 'given'),
    'option': Entry(via_option, 'x', " (computed by option 'make')", 'read'),
    'set_default_func': Entry(via_set_default_func, 'x', ' (returned by its set_default function)', 'read'),
    'aggregate': Entry(via_aggregate, 'x', ' (set by aggregate mode=chosen)', 'read'),
}


@pytest.mark.parametrize('path_name', list(PATHS), ids=list(PATHS))
@pytest.mark.parametrize('case_name', list(CASES), ids=list(CASES))
def test_bad_value_is_rejected_naming_path_constraint_and_value(case_name, path_name):
    case, entry = CASES[case_name], PATHS[path_name]
    with pytest.raises(BadValueError) as e:
        read = entry.give(case, case.bad)
        assert entry.when == 'read', 'a given value must be checked when given, not when first read'
        read()
    assert str(e.value) == f'bad value for {entry.path}: {case.must}, got {case.bad!r}{entry.how}'
    assert e.value.path == entry.path


@pytest.mark.parametrize('path_name', list(PATHS), ids=list(PATHS))
@pytest.mark.parametrize('case_name', list(CASES), ids=list(CASES))
def test_good_value_is_accepted_unchanged(case_name, path_name):
    case = CASES[case_name]
    value = PATHS[path_name].give(case, case.good)()
    assert value == case.good and type(value) is type(case.good)


def test_a_rejected_override_applies_nothing():
    case = CASES['Ge']
    cls = configs_class(case)
    conf = cls()
    with pytest.raises(BadValueError):
        conf._set_values({'other': 7, 'x': 0})
    with pytest.raises(BadValueError):
        lc.apply_overrides(conf, {'other': '7', 'x': '0'})
    assert (conf.other, conf.x) == (1, 1)


def test_optional_constrained_item_takes_none_and_checks_the_rest():
    class C(BaseConfigs):
        warmup: Optional[Annotated[int, Ge(0)]] = None
        limit: Annotated[Optional[int], Ge(1)] = None

    conf = C()
    lc.apply_overrides(conf, {'warmup': 'null', 'limit': 'none'})
    assert (conf.warmup, conf.limit) == (None, None)
    conf = C()
    lc.apply_overrides(conf, {'warmup': '3', 'limit': '2'})
    assert (conf.warmup, conf.limit) == (3, 2)
    with pytest.raises(BadValueError, match=r'^bad value for warmup: must be ≥ 0, got -1$'):
        C()._set_values({'warmup': -1})
    with pytest.raises(BadValueError, match=r'^bad value for limit: must be ≥ 1, got 0$'):
        lc.apply_overrides(C(), {'limit': '0'})


def test_several_constraints_are_all_checked_in_order():
    class C(BaseConfigs):
        learning_rate: Annotated[IsFinite[float], Gt(0), Le(1)] = 0.1

    for value, why in [(math.inf, 'must be finite'), (0.0, 'must be > 0'), (2.0, 'must be ≤ 1')]:
        with pytest.raises(BadValueError) as e:
            C()._set_values({'learning_rate': value})
        assert str(e.value) == f'bad value for learning_rate: {why}, got {value!r}'
    conf = C()
    conf._set_values({'learning_rate': 1.0})
    assert conf.learning_rate == 1.0


def test_a_value_of_the_wrong_kind_breaks_the_constraint_instead_of_raising_type_error():
    class C(BaseConfigs):
        batch_size: Annotated[int, Ge(1)] = 8

    # text given from code is typed by the same rules as text from the command line (issue 14)
    with pytest.raises(BadValueError, match=r"^bad value for batch_size: expected int, got 'many'$"):
        C()._set_values({'batch_size': 'many'})
    with pytest.raises(BadValueError, match=r"^bad value for batch_size: expected int, got 'many'$"):
        lc.apply_overrides(C(), {'batch_size': 'many'})


def test_text_is_parsed_by_the_inner_type():
    class C(BaseConfigs):
        batch_size: Annotated[int, Ge(1)] = 8
        dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.1
        name: Annotated[str, Len(1, 8)] = 'run'

    conf = C()
    assert lc.parse_overrides(['batch_size=1000', 'dropout=.25', 'name=42'], conf) == {
        'batch_size': 1000, 'dropout': 0.25, 'name': '42'}


def test_an_option_name_given_to_a_constrained_item_stays_an_option_and_its_result_is_checked():
    class C(BaseConfigs):
        batch_size: Annotated[int, Ge(1)] = 8
        micro_batch: Annotated[int, Ge(1)] = 'half'  # names an option registered below: not checked as a value

    @option(C.micro_batch, 'half')
    def _half(c):
        return c.batch_size // 2

    assert C().micro_batch == 4
    conf = C()
    lc.apply_overrides(conf, {'batch_size': '1'})
    with pytest.raises(BadValueError, match=r"^bad value for micro_batch: must be ≥ 1, got 0 "
                                            r"\(computed by option 'half'\)$"):
        _ = conf.micro_batch
    assert 'micro_batch' not in lc.explain(conf) and lc.explain(conf)['batch_size']['value'] == 1


def test_a_new_class_default_for_an_inherited_constrained_item_is_checked_at_declaration():
    class Base(BaseConfigs):
        batch_size: Annotated[int, Ge(1)] = 8

    class Good(Base):
        batch_size = 2

    assert Good().batch_size == 2
    with pytest.raises(BadValueError, match=r'^bad value for Bad.batch_size: must be ≥ 1, got 0 \(class default\)$'):
        class Bad(Base):
            batch_size = 0


def test_a_sub_config_checks_dotted_values_it_receives_once_created():
    class Sub(BaseConfigs):
        width: Annotated[int, Ge(1)] = 2

    class Parent(BaseConfigs):
        sub: Any  # an option builds it: its class is not known up front

    @option(Parent.sub)
    def _sub():
        return Sub()

    parent = Parent()
    parent._set_values({'sub.width': 0})  # waits for the sub-config
    with pytest.raises(BadValueError, match=r'^bad value for sub.width: must be ≥ 1, got 0$'):
        _ = parent.sub


@pytest.mark.parametrize('annotation, shown', [
    (int, 'int'),
    (Annotated[int, Ge(1)], 'int ≥ 1'),
    (Annotated[float, Interval(gt=0, le=1)], 'float > 0, ≤ 1'),
    (Annotated[str, MinLen(1)], 'str len ≥ 1'),
    (IsFinite[float], 'float finite'),
    (Annotated[int, Predicate(is_even)], 'int is_even'),
    (Annotated[float, Predicate(lambda v: v != 0)], 'float predicate'),
    (Optional[Annotated[int, Ge(0)]], 'Optional[int] ≥ 0'),
    (Literal['float32', 'bfloat16'], 'float32 | bfloat16'),
    (Optional[Literal['a', 'b']], 'a | b | None'),
    (Annotated[int, 'a note, not a constraint'], 'int'),
], ids=['plain', 'Ge', 'Interval', 'MinLen', 'Finite', 'Predicate', 'lambda', 'Optional', 'Literal',
        'Optional-Literal', 'other-metadata'])
def test_describe_shows_the_inner_type_and_its_constraints(annotation, shown):
    cls = type('Configs', (BaseConfigs,), {'__annotations__': {'x': annotation}})
    row = lc.describe(cls)[0]
    assert row['type'] == shown
    # the listing puts the constraints after the type (and the default): `x: int  (≥ 1)`
    listed = f"x: {row['base_type']}  ({row['rule']})" if row['rule'] else f'x: {shown}'
    assert f"{row['base_type']} {row['rule']}".strip() == shown
    assert lc.format_description([row]).splitlines()[0] == listed


def test_labml_api_still_reports_the_declared_annotation():
    class C(BaseConfigs):
        batch_size: Annotated[int, Ge(1)] = 8

    conf = C()
    assert conf._get_type('batch_size') == Annotated[int, Ge(1)]
    assert conf._to_json()['batch_size']['type'] == str(Annotated[int, Ge(1)])


@pytest.mark.parametrize('annotation', [list[Annotated[int, Ge(1)]], Union[Annotated[int, Ge(1)], str],
                                        Annotated[int, Timezone(None)]],
                         ids=['inside-List', 'inside-Union', 'unsupported-constraint'])
def test_constraints_that_would_go_unchecked_are_a_declaration_error(annotation):
    with pytest.raises(DeclarationError, match=r'^Configs.x: '):  # at the class statement, default or not
        type('Configs', (BaseConfigs,), {'__annotations__': {'x': annotation}})
    with pytest.raises(DeclarationError, match=r'^Configs.x: '):
        type('Configs', (BaseConfigs,), {'__annotations__': {'x': annotation}, 'x': 1})


@pytest.mark.parametrize('text, annotation, expected', [
    ('8', Annotated[int, Ge(1)], 8),
    ('0.5', Annotated[float, Interval(gt=0, lt=1)], 0.5),
    ('null', Optional[Annotated[int, Ge(1)]], None),
    ('[1, 2]', list[Annotated[int, Ge(1)]], [1, 2]),
], ids=['Ge', 'Interval', 'Optional-null', 'List-elements'])
def test_coerce_text_parses_by_the_inner_type(text, annotation, expected):
    assert coerce_text(text, annotation) == expected


@pytest.mark.parametrize('call, message', [
    (lambda: coerce_text('0', Annotated[int, Ge(1)]), 'must be ≥ 1, got 0'),
    (lambda: coerce_text('[1, 0]', list[Annotated[int, Ge(1)]]), 'expected list[Annotated[int, Ge(ge=1)]]: '
                                                                   'must be ≥ 1, got 0'),
    (lambda: conform(1.0, Annotated[float, Lt(1)]), 'must be < 1, got 1.0'),
    (lambda: conform(3, Annotated[int, Predicate(is_even)]), 'must satisfy is_even, got 3'),
], ids=['coerce_text', 'coerce_text-List', 'conform', 'conform-Predicate'])
def test_coerce_text_and_conform_check_the_constraints(call: Callable[[], Any], message):
    with pytest.raises(TypeMismatch) as e:
        call()
    assert str(e.value) == message


def test_plain_items_keep_accepting_any_python_value():
    class C(BaseConfigs):
        batch_size: int = 8

    conf = C()
    conf._set_values({'batch_size': 0})
    assert conf.batch_size == 0


POSTPONED = '''
from __future__ import annotations
from typing import Annotated, Optional
from annotated_types import Ge
from lazylab.configs import BaseConfigs

class Configs(BaseConfigs):
    batch_size: Annotated[int, Ge(1)] = 8
    warmup: Optional[Annotated[int, Ge(0)]] = None
'''


def test_postponed_annotations_are_typed_items_too(tmp_path, monkeypatch):
    (tmp_path / 'postponed_configs.py').write_text(POSTPONED)
    (tmp_path / 'postponed_bad_default.py').write_text(POSTPONED.replace('= 8', '= 0'))
    monkeypatch.syspath_prepend(str(tmp_path))
    import postponed_configs
    conf = postponed_configs.Configs()
    assert lc.parse_overrides(['batch_size=4', 'warmup=null'], conf) == {'batch_size': 4, 'warmup': None}
    with pytest.raises(BadValueError, match=r'^bad value for warmup: must be ≥ 0, got -1$'):
        lc.apply_overrides(conf, {'warmup': '-1'})
    assert lc.describe(postponed_configs.Configs)[0]['type'] == 'int ≥ 1'
    with pytest.raises(BadValueError, match=r'^bad value for Configs.batch_size: must be ≥ 1, got 0 '
                                            r'\(class default\)$'):
        import postponed_bad_default  # noqa: F401
