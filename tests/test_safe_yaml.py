"""lazylab.safe_yaml: yaml.safe_load's answers, except for a document whose aliases expand past MAX_VALUES (the
"billion laughs") or that contains itself; and `shown`, which keeps a huge value in an error message to one line."""
import time

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lazylab import safe_yaml
from lazylab.errors import shown

BOMB = 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + ''.join(
    f'a{i}: &a{i} [{", ".join([f"*a{i - 1}"] * 9)}]\n' for i in range(1, 9))  # a8 alone stands for 9⁹ strings

# (no subnormal floats: a library built with -ffast-math, loaded earlier in the same test process, can flush them)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_subnormal=False) | \
    st.text(max_size=8)
plain = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                         max_size=4), max_leaves=30)


@given(plain)
@settings(max_examples=150, deadline=None)
def test_plain_data_loads_as_safe_load_loads_it(value):
    text = yaml.safe_dump(value)
    assert safe_yaml.load(text) == yaml.safe_load(text)


def test_aliases_of_a_reasonable_size_load_and_share_their_value():
    doc = safe_yaml.load('base: &base {d_model: 64, heads: 4}\nsmall: *base\nlarge: {<<: *base, d_model: 256}\n')
    assert doc == {'base': {'d_model': 64, 'heads': 4}, 'small': {'d_model': 64, 'heads': 4},
                   'large': {'d_model': 256, 'heads': 4}}


def test_the_expanded_size_counts_every_alias_at_its_size(monkeypatch):
    # by hand: the root mapping 1, key 'a' 1, the list a 1 + 3, key 'b' 1, the list b 1 + 4 + 4: 16 values
    text = 'a: &a [1, 2, 3]\nb: [*a, *a]\n'
    monkeypatch.setattr(safe_yaml, 'MAX_VALUES', 16)
    assert safe_yaml.load(text) == {'a': [1, 2, 3], 'b': [[1, 2, 3], [1, 2, 3]]}
    monkeypatch.setattr(safe_yaml, 'MAX_VALUES', 15)
    with pytest.raises(yaml.YAMLError, match='expands to more than 15 values through its aliases'):
        safe_yaml.load(text)


def test_a_billion_laughs_is_refused_at_once():  # at a6, the first value past the limit (9⁷ strings)
    start = time.process_time()
    with pytest.raises(yaml.YAMLError) as e:
        safe_yaml.load(BOMB)
    assert time.process_time() - start < 5  # walking its 387 million strings would take minutes
    assert safe_yaml.problem(e.value) == ('line 7: the document expands to more than 1,000,000 values through its '
                                          'aliases (*name): refused, as no configuration is that large')


@pytest.mark.parametrize('text', ['a: &a [1, *a]\n', 'a: &a {b: *a}\n'])
def test_a_value_that_contains_itself_is_refused(text):
    with pytest.raises(yaml.YAMLError, match='contains itself through an alias'):
        safe_yaml.load(text)


def test_a_python_tag_is_named_as_not_plain_data():
    with pytest.raises(yaml.YAMLError) as e:
        safe_yaml.load('d_model: !!python/object/apply:os.system ["true"]\n')
    assert safe_yaml.problem(e.value) == ("line 1: not plain data: the tag 'tag:yaml.org,2002:python/object/apply:"
                                          "os.system' is refused (lazylab reads YAML as plain data only)")


def test_shown_keeps_a_huge_value_to_one_short_line():
    assert shown(list(range(10 ** 7))) == '[0, 1, 2, 3, 4, 5, ...]'
    assert shown('x' * 1000) == repr('x' * 1000)[:28] + '...' + repr('x' * 1000)[-29:]
    assert shown({'d_model': 64}) == "{'d_model': 64}"
    assert len(shown([[[[['deep'] * 100] * 100] * 100] * 100])) <= 120


def test_a_config_file_with_a_billion_laughs_is_one_error_line(tmp_path, cli_error):
    bomb = tmp_path / 'bomb.yaml'
    bomb.write_text(BOMB.replace('a8: &a8', 'd_model: &a8'))
    assert cli_error(['train', 'transformer', '--config', str(bomb), f'runs_dir={tmp_path}']) == (
        f'cannot read config file {bomb}: line 7: the document expands to more than 1,000,000 values through its '
        f'aliases (*name): refused, as no configuration is that large')
    assert not (tmp_path / 'transformer').exists()


def test_a_bad_value_from_a_config_file_is_shown_cut_short(tmp_path, cli_error):
    big = tmp_path / 'big.yaml'
    big.write_text('d_model: [' + ', '.join(['12345'] * 2000) + ']\n')
    assert cli_error(['train', 'transformer', '--config', str(big), f'runs_dir={tmp_path}']) == (
        'bad value for d_model: expected int, got [12345, 12345, 12345, 12345, 12345, 12345, ...]')


@pytest.mark.parametrize('command', [['resume'], ['generate', '--tokens', '5', '--prompt', 'a']])
def test_a_run_whose_configs_yaml_is_a_billion_laughs_is_one_error_line(tmp_path, cli_error, command):
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'run.json').write_text('{"experiment": "transformer", "status": "completed"}')
    (run / 'configs.yaml').write_text(BOMB.replace('a8: &a8', 'd_model: &a8'))
    assert cli_error([*command[:1], str(run), *command[1:]]) == (
        f'cannot read configuration YAML {run / "configs.yaml"}: line 7: the document expands to more than '
        f'1,000,000 values through its aliases (*name): refused, as no configuration is that large')


def test_a_sweep_over_a_billion_laughs_config_is_one_error_line(tmp_path, cli_error):
    bomb = tmp_path / 'bomb.yaml'
    bomb.write_text(BOMB.replace('a8: &a8', 'd_model: &a8'))
    assert cli_error(['sweep', 'transformer', '--config', str(bomb), 'n_layers=1,2', '--dry-run']).startswith(
        f'cannot read config file {bomb}: line 7: the document expands to more than 1,000,000 values')
