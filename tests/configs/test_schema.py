"""The JSON Schema of a --config file (issue 36, item 3): `lazylab.configs.schema.json_schema` and `lazylab schema`.

The property: for generated config files, the engine accepts a file exactly when jsonschema validates it against the
schema. The values are drawn around each rule the schema states (types, enums, bounds, nullability, unknown keys);
what JSON Schema cannot say (lazylab.configs.schema's docstring lists it) is left out of the draw: a whole float for
an int key (2.0 is an integer to JSON Schema), text spellings of numbers and bools ('64', 'true', 1 for a bool),
which the engine takes and the schema does not (0 and 1 for a bool key, a string for a list key, an Enum
member's value: `beyond_json_schema`), keys by their unique ends, and Predicate constraints.
"""
import enum
import json
from typing import Annotated, Any, Literal, Optional

import jsonschema
import pytest
import yaml
from annotated_types import Ge, Gt, Interval, Le, MaxLen, MinLen, MultipleOf
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lazylab.configs import BaseConfigs, ConfigError, load, option
from lazylab.configs.schema import DRAFT, json_schema
from lazylab.testing import run_lazylab


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Block(BaseConfigs):
    width: Annotated[int, Ge(1), Le(64)] = 8           # block width
    kind: Literal['plain', 'gated'] = 'plain'


class Inner(BaseConfigs):
    block: Block
    rate: Annotated[float, Gt(0)] = 0.5


class Thing:
    """A value with no text form: only an option can make it."""


class Experiment(BaseConfigs):
    steps: Annotated[int, Ge(1)] = 10                   # optimizer steps
    dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.1
    gated: bool = False
    mode: Literal['fast', 'slow'] = 'fast'
    name: Annotated[str, MinLen(1), MaxLen(8)] = 'run'
    warmup: Optional[Annotated[int, Ge(0)]] = None
    color: Color = Color.RED
    sizes: list[int] = [1, 2]
    stride: Annotated[int, MultipleOf(4)] = 8
    heads: int                                          # computed by its option, or given
    thing: Thing                                        # built by its option only
    inner: Inner


@option(Experiment.heads, 'auto')
def _heads(c: Experiment):
    return 2


@option(Experiment.thing, 'small')
def _small():
    return Thing()


@option(Experiment.thing, 'large')
def _large():
    return Thing()


SCHEMA = json_schema(Experiment, title='test')

#: values around each rule: right and wrong types, bounds, enums, null; no text spelling of a number or a bool
#: ('x', 'qq' parse as nothing) and no whole float (2.0), which JSON Schema cannot tell from an int
ANY = st.one_of(st.integers(-3, 70), st.sampled_from([0.5, -0.5, 1.5, 0.999, 63.5]), st.booleans(), st.none(),
                st.sampled_from(['x', 'qq', 'fast', 'slow', 'gated', 'plain', 'RED', 'BLUE', 'GREEN', 'auto', 'small',
                                 'large', 'averylongname', '']),
                st.lists(st.integers(0, 3), max_size=3), st.lists(st.sampled_from(['x', 1.5]), min_size=1, max_size=2))
KEYS = list(SCHEMA['properties']) + ['nosuch', 'inner.nosuch']
#: each key's default and enum values, so that a fair share of the files is accepted
GOOD = {k: [*([v['default']] if 'default' in v else []), *v.get('enum', []), *(e for a in v.get('anyOf', [])
                                                                              for e in a.get('enum', []))] or [None]
        for k, v in SCHEMA['properties'].items()}
SETTING = st.sampled_from(KEYS).flatmap(lambda k: st.tuples(st.just(k), st.one_of(ANY, st.sampled_from(GOOD.get(k,
                                                                                                            [0])))))


def beyond_json_schema(doc: dict[str, Any]) -> list[str]:
    """The keys of `doc` whose values are spellings the engine reads and the schema does not follow: 0 or 1 for a bool
    key (False and True), a string for a list key (`1,2`, as on the command line), an Enum member's value for an Enum
    key (1 or True for Color.RED: the schema names members by name)."""
    kinds = {k: v.get('type') for k, v in SCHEMA['properties'].items()}
    return [k for k, v in doc.items() if (kinds.get(k) == 'boolean' and type(v) is int and v in (0, 1))
            or (kinds.get(k) == 'array' and isinstance(v, str))
            or (k == 'color' and any(v == m.value for m in Color))]


def engine_accepts(doc: Any) -> bool:
    try:
        load(Experiment(), doc)
    except ConfigError:
        return False
    return True


def schema_accepts(doc: Any) -> bool:
    return jsonschema.Draft202012Validator(SCHEMA).is_valid(doc)


def test_the_schema_is_a_valid_draft_2020_12_schema_with_each_rule():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    p = SCHEMA['properties']
    assert SCHEMA['$schema'] == DRAFT and SCHEMA['additionalProperties'] is False
    assert p['steps'] == {'type': 'integer', 'minimum': 1, 'description': 'optimizer steps (≥ 1)', 'default': 10}
    assert p['dropout'] == {'type': 'number', 'minimum': 0, 'exclusiveMaximum': 1, 'description': '(≥ 0, < 1)',
                            'default': 0.1}
    assert p['mode'] == {'enum': ['fast', 'slow'], 'default': 'fast'}
    assert p['name'] == {'type': 'string', 'minLength': 1, 'maxLength': 8, 'description': '(len ≥ 1, len ≤ 8)',
                         'default': 'run'}
    assert p['warmup'] == {'anyOf': [{'type': 'integer'}, {'type': 'null'}], 'minimum': 0, 'description': '(≥ 0)',
                           'default': None}
    assert p['color'] == {'enum': ['RED', 'BLUE'], 'default': 'RED'}
    assert p['sizes'] == {'type': 'array', 'items': {'type': 'integer'}, 'default': [1, 2]} or \
        p['sizes'] == {'type': 'array', 'items': {'type': 'integer'}}
    assert p['heads'] == {'anyOf': [{'enum': ['auto']}, {'type': 'integer'}], 'description': 'computed by its option, '
                          'or given'}
    assert p['thing'] == {'enum': ['small', 'large'], 'description': 'built by its option only'}
    assert p['inner.block.width'] == {'type': 'integer', 'minimum': 1, 'maximum': 64,
                                      'description': 'block width (≥ 1, ≤ 64)', 'default': 8}
    assert 'inner' not in p and 'inner.block' not in p  # sub-configs: no value of their own in a file
    assert list(p).index('inner.rate') < list(p).index('inner.block.width')


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SETTING, min_size=1, max_size=4))
def test_the_engine_accepts_a_config_file_exactly_when_jsonschema_validates_it(settings_):
    doc = yaml.safe_load(yaml.safe_dump(dict(settings_)))  # as a --config file reads back
    assume(not beyond_json_schema(doc))
    assert engine_accepts(doc) == schema_accepts(doc), doc


@pytest.mark.parametrize('doc, accepted', [
    ({'steps': 0}, False), ({'steps': 5, 'inner.block.width': 64}, True), ({'inner.block.width': 65}, False),
    ({'stride': 12}, True), ({'stride': 6}, False), ({'warmup': None}, True), ({'thing': 'large'}, True),
    ({'thing': 'huge'}, False), ({'heads': 'auto'}, True), ({'heads': 3}, True), ({'dropout': 1}, False),
])
def test_chosen_files_are_accepted_by_both_or_by_neither(doc, accepted):
    assert (engine_accepts(doc), schema_accepts(doc)) == (accepted, accepted)


def test_lazylab_schema_of_a_builtin_checks_a_config_file(tmp_path):
    done = run_lazylab('schema', 'transformer')
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema['title'] == 'lazylab transformer --config file'
    good = {'d_model': 64, 'optimizer.learning_rate': 0.001, 'transformer.ffn.glu_variant': 'SwiGLU',
            'preset': 'labml_nn'}
    assert jsonschema.Draft202012Validator(schema).is_valid(good)
    errors = sorted(e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(
        {'d_model': 0, 'transformer.ffn.glu_variant': 'SwiGLUU', 'd_modle': 3}))
    assert errors == ["'SwiGLUU' is not one of ['none', 'GLU', 'Bilinear', 'ReGLU', 'GEGLU', 'SwiGLU']",
                      '0 is less than the minimum of 1',
                      "Additional properties are not allowed ('d_modle' was unexpected)"]
