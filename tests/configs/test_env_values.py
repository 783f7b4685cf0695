"""`${env:NAME}` and `${env:NAME,default}` in configuration values (lazylab.configs.expand_env, load, dump).

Hand-worked cases for each kind of item (the text is typed as a command line's text is), embedded references, the
defaults, the escape, the errors; a property against a model of the expansion (an `os.environ` lookup, else the
default); and the secrets: written as their references, labelled `env NAME`, never in a message.
"""
import re
from typing import Literal, Optional

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from lazylab.configs import (
    BadValueError,
    BaseConfigs,
    apply_overrides,
    dump,
    escape_env,
    expand_env,
    has_env_reference,
    inspect,
    load,
    option,
    to_dict,
)
from lazylab.errors import user_error_message


class Sizes(BaseConfigs):
    d_model: int = 8
    learning_rate: float = 0.1
    bias: bool = False
    dtype: Literal['float32', 'bfloat16'] = 'float32'
    widths: list[int] = [1]
    warmup: Optional[int] = None
    runs_dir: str = 'runs'
    activation: str = 'relu'       # an option's name
    api_key: str = ''              # a credential
    d_key: int = 4                 # a model's width, not a credential


@option(Sizes.activation, 'relu')
def _relu():
    return 'ReLU()'


@option(Sizes.activation, 'gelu')
def _gelu():
    return 'GELU()'


ENV = {'LR': '3e-4', 'WIDTH': '64', 'BIAS': 'yes', 'DTYPE': 'bfloat16', 'ACT': 'gelu', 'WIDTHS': '[2, 3]',
       'NONE': 'null', 'USERNAME_X': 'ada', 'RUN': 'r7'}


@pytest.fixture
def environ(monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    for name in ('UNSET_X', 'UNSET_Y', 'LAZYLAB_MAX_CONFIG_MB'):
        monkeypatch.delenv(name, raising=False)
    return ENV


@pytest.mark.parametrize('key, text, value', [
    ('learning_rate', '${env:LR}', 0.0003),          # LR=3e-4: the float 0.0003, as `learning_rate=3e-4` is
    ('d_model', '${env:WIDTH}', 64),
    ('bias', '${env:BIAS}', True),
    ('dtype', '${env:DTYPE}', 'bfloat16'),           # a Literal's choice
    ('activation', '${env:ACT}', 'GELU()'),          # an option's name: the option computes the value
    ('widths', '${env:WIDTHS}', [2, 3]),
    ('warmup', '${env:NONE}', None),
    ('d_model', ' ${env: WIDTH , 5 } ', 64),        # spaces around the name and the default are dropped
    ('d_model', '${env:UNSET_X,12}', 12),           # unset: the default, typed as the value would be
    ('runs_dir', 'runs/${env:USERNAME_X}/${env:RUN}', 'runs/ada/r7'),   # embedded, two variables
    ('runs_dir', 'x${env:UNSET_X,}y', 'xy'),        # an empty default is the empty text
    ('runs_dir', '$${env:LR}', '${env:LR}'),        # $${ is the text ${: read by nothing
    ('runs_dir', 'a$b$$c{d}', 'a$b$$c{d}'),         # a $ not before { is text
    ('runs_dir', 'C:\\runs\\${env:RUN}', 'C:\\runs\\r7'),   # a backslash is an ordinary character
], ids=['float', 'int', 'bool', 'Literal', 'option', 'list', 'None', 'spaces', 'default', 'embedded',
        'empty default', 'escape', 'dollars', 'backslash'])
def test_a_reference_is_typed_as_the_text_it_reads_would_be(environ, key, text, value):
    conf = Sizes()
    load(conf, {key: text})                         # a --config file's mapping
    assert getattr(conf, key) == value
    from_command_line = Sizes()
    read, uses = expand_env({key: text})
    apply_overrides(from_command_line, read)        # key=value: the same value
    assert getattr(from_command_line, key) == value
    assert (key in uses) == has_env_reference(text)


def test_the_provenance_names_the_variables_read_and_the_defaults_taken(environ):
    conf = Sizes()
    load(conf, {'learning_rate': '${env:LR}', 'runs_dir': 'runs/${env:USERNAME_X}/${env:UNSET_Y,x}',
                'd_model': '${env:UNSET_X,12}', 'bias': 'true', 'activation': '$${env:ACT}'}, label='--config a.yaml')
    assert inspect.given(conf) == {
        'learning_rate': 'env LR', 'runs_dir': 'env USERNAME_X, UNSET_Y (default)', 'd_model': 'env UNSET_X (default)',
        'bias': '--config a.yaml', 'activation': '--config a.yaml'}
    assert conf.runs_dir == 'runs/ada/x' and conf.learning_rate == 0.0003


def test_a_variables_value_is_never_read_again(environ, monkeypatch):
    monkeypatch.setenv('INNER', '${env:LR}')
    read, uses = expand_env({'runs_dir': 'a/${env:INNER}'})
    assert read == {'runs_dir': 'a/${env:LR}'} and uses['runs_dir'].names == ('INNER',)


def test_lists_and_mappings_of_a_yaml_file_are_read_inside(environ):
    read, uses = expand_env({'widths': ['${env:WIDTH}', 2, {'k': 'r-${env:RUN}'}]})
    assert read == {'widths': ['64', 2, {'k': 'r-r7'}]} and uses['widths'].names == ('WIDTH', 'RUN')
    conf = Sizes()
    load(conf, {'widths': ['${env:WIDTH}', 2]})
    assert conf.widths == [64, 2]


@pytest.mark.parametrize('text, message', [
    ('${env:UNSET_X}', 'a.yaml:3: d_model: environment variable UNSET_X is not set; set it, or give a default: '
                       '${env:UNSET_X,VALUE}'),
    ('${env:}', "a.yaml:3: d_model: no variable name in '${env:}'; write ${env:NAME} or ${env:NAME,default} ($${ "
                'for the text ${)'),
    ('${env:1BAD}', "a.yaml:3: d_model: '1BAD' is not a variable name (letters, digits and _, not starting with a "
                    "digit) in '${env:1BAD}'; write ${env:NAME} or ${env:NAME,default} ($${ for the text ${)"),
    ('${foo:X}', "a.yaml:3: d_model: unknown resolver 'foo' in '${foo:X}'; write ${env:NAME} or "
                 '${env:NAME,default} ($${ for the text ${)'),
    ('${X}', "a.yaml:3: d_model: a reference needs a resolver in '${X}'; write ${env:NAME} or ${env:NAME,default} "
             '($${ for the text ${)'),
    ('1${env:X', "a.yaml:3: d_model: a ${ never closed in '1${env:X'; write ${env:NAME} or ${env:NAME,default} "
                 '($${ for the text ${)'),
    ('${env:A,${env:B}}', "a.yaml:3: d_model: a reference inside a reference in '${env:A,${env:B}}'; write "
                          '${env:NAME} or ${env:NAME,default} ($${ for the text ${)'),
], ids=['unset', 'empty name', 'bad name', 'unknown resolver', 'no resolver', 'unclosed', 'nested'])
def test_a_mistake_is_one_line_naming_where_the_key_and_the_text(environ, text, message):
    with pytest.raises(BadValueError) as e:
        expand_env({'d_model': text}, {'d_model': 'a.yaml:3'})
    assert str(e.value) == message
    with pytest.raises(BadValueError) as e:  # the command line's: the key alone
        expand_env({'d_model': text})
    assert str(e.value) == message[len('a.yaml:3: '):]


def test_what_one_call_reads_is_bounded_by_the_config_file_limit(environ, monkeypatch):
    monkeypatch.setenv('LAZYLAB_MAX_CONFIG_MB', '0.00001')   # 10 bytes
    monkeypatch.setenv('LONG', 'x' * 6)
    assert expand_env({'a': '${env:LONG}'})[0] == {'a': 'xxxxxx'}
    with pytest.raises(BadValueError) as e:
        expand_env({'a': '${env:LONG}', 'b': 'and ${env:LONG}'})   # 12 bytes together
    assert str(e.value) == ('b: the values read from the environment are longer than 10 bytes together (a '
                            "configuration file's limit, LAZYLAB_MAX_CONFIG_MB)")


# --- the expansion is a lookup, else the default ---------------------------------------------------------------

_NAMES = st.from_regex(r'[A-Za-z_][A-Za-z0-9_]{0,8}', fullmatch=True)
_TEXT = st.text(st.characters(blacklist_characters='${}', blacklist_categories=('Cs',)), max_size=8)
_VALUES = st.text(st.characters(blacklist_categories=('Cs',)), max_size=12)  # `${env:…}` in a value is text


@st.composite
def _pieces(draw):
    """[(literal, name, default or None, spaces)] and the environment they read."""
    environ = draw(st.dictionaries(_NAMES, _VALUES, max_size=4))
    names = st.sampled_from(sorted(environ)) | _NAMES if environ else _NAMES
    defaults = st.none() | st.text(st.characters(blacklist_characters='${},', blacklist_categories=('Cs',)),
                                   max_size=6)
    pieces = draw(st.lists(st.tuples(_TEXT, names, defaults, st.sampled_from(['', ' '])), max_size=4))
    return pieces, environ, draw(_TEXT)


@given(_pieces())
def test_expansion_equals_a_lookup_in_the_environment_else_the_default(case):
    pieces, environ, tail = case
    text = ''.join(f'{lit}${{env:{sp}{name}{sp}{"" if d is None else "," + d}}}' for lit, name, d, sp in pieces) + tail
    missing = [name for _, name, d, _ in pieces if name not in environ and d is None]
    if missing:
        with pytest.raises(BadValueError, match=f'environment variable {missing[0]} is not set'):
            expand_env({'k': text}, environ=environ)
        return
    expected = ''.join(lit + (environ[name] if name in environ else d.strip())
                       for lit, name, d, _ in pieces) + tail
    read, uses = expand_env({'k': text}, environ=environ)
    assert read == {'k': expected}
    assert uses.get('k', None) is None if not pieces else \
        uses['k'].names == tuple(dict.fromkeys(name for _, name, _, _ in pieces))


@given(st.text(st.characters(blacklist_categories=('Cs',)), max_size=30))
def test_an_escaped_text_reads_back_as_it_was(text):
    read, uses = expand_env({'k': escape_env(text)}, environ={})
    assert read == {'k': text} and uses == {}


# --- dumps: a given text is written escaped, a secret as its reference ------------------------------------------

def test_a_dump_gives_back_a_text_that_looks_like_a_reference(environ):
    conf = Sizes()
    apply_overrides(conf, {'runs_dir': '${env:LR}/x'})   # code gave the text itself: no reference read
    _ = conf.runs_dir
    text = dump(conf)
    assert yaml.safe_load(text)['values']['runs_dir'] == '$${env:LR}/x'
    fresh = Sizes()
    load(fresh, text)
    assert fresh.runs_dir == '${env:LR}/x'


def test_a_secret_is_written_as_its_reference_and_replays_in_the_same_environment(environ, monkeypatch):
    monkeypatch.setenv('SERVICE', 's3cr3t-v4lue')       # an ordinary name: the key makes it a secret
    monkeypatch.setenv('HF_TOKEN', 'hf-t0ken-v4lue')     # a secret's name: any key holding it is one
    conf = Sizes()
    load(conf, {'api_key': 'k-${env:SERVICE}', 'runs_dir': 'runs/${env:HF_TOKEN}', 'd_model': '${env:WIDTH}'})
    assert (conf.api_key, conf.runs_dir, conf.d_model) == ('k-s3cr3t-v4lue', 'runs/hf-t0ken-v4lue', 64)
    text = dump(conf)
    assert 's3cr3t' not in text and 'hf-t0ken' not in text
    doc = yaml.safe_load(text)
    assert doc['values']['api_key'] == 'k-${env:SERVICE}' and doc['values']['runs_dir'] == 'runs/${env:HF_TOKEN}'
    assert doc['values']['d_model'] == 64                # not a secret: its value, replayable anywhere
    assert doc['given'] == {'api_key': 'env SERVICE', 'runs_dir': 'env HF_TOKEN', 'd_model': 'env WIDTH'}
    assert text.splitlines()[3] == ('# Not written here (secrets): api_key, runs_dir; each is the ${env:…} '
                                    'reference it was given as,')
    labml_view = repr(conf._to_json())
    assert 's3cr3t' not in labml_view and "'k-${env:SERVICE}'" in labml_view
    assert inspect.redacted(conf) == {'api_key': 'k-${env:SERVICE}', 'runs_dir': 'runs/${env:HF_TOKEN}'}
    fresh = Sizes()
    load(fresh, text)                                    # a replay in the same environment reads it again
    assert (fresh.api_key, fresh.runs_dir) == ('k-s3cr3t-v4lue', 'runs/hf-t0ken-v4lue')
    monkeypatch.delenv('SERVICE')
    with pytest.raises(BadValueError, match=r'^<dump>: api_key: environment variable SERVICE is not set'):
        load(Sizes(), text)


def test_a_value_given_again_is_no_secret_any_more(environ, monkeypatch):
    monkeypatch.setenv('API_KEY', 'first-s3cret')
    conf = Sizes()
    load(conf, {'api_key': '${env:API_KEY}'})
    apply_overrides(conf, {'api_key': 'plain'})
    assert to_dict(conf)['values']['api_key'] == 'plain' and inspect.redacted(conf) == {}


def test_a_secret_never_shows_in_an_error_message(environ, monkeypatch):
    monkeypatch.setenv('STEP_TOKEN', 'not-an-int-t0ken')
    monkeypatch.setenv('SHORT_TOKEN', 'ab')
    for text, secret in (('${env:STEP_TOKEN}', 'not-an-int-t0ken'), ('${env:SHORT_TOKEN}', "'ab'")):
        read, _ = expand_env({'d_model': text})
        with pytest.raises(BadValueError) as e:
            apply_overrides(Sizes(), read)
        assert secret in str(e.value)                    # the engine's own message quotes the value …
        shown = user_error_message(e.value)              # … what the command line prints never does
        assert secret not in shown and shown == 'bad value for d_model: expected int, got ***'


@pytest.mark.parametrize('name, secret', [
    ('GITHUB_TOKEN', True), ('PGPASSWORD', True), ('AWS_SECRET_ACCESS_KEY', True), ('WANDB_API_KEY', True),
    ('SSH_KEYS', True), ('db_credentials', True), ('PWD', False), ('TOKENIZERS_PARALLELISM', False),
    ('KEYBOARD', False), ('HOME', False), ('LR', False),
])
def test_which_environment_variables_hold_secrets(name, secret):
    read, uses = expand_env({'runs_dir': f'${{env:{name},x}}'}, environ={name: 'v'})
    assert uses['runs_dir'].secret is secret


@pytest.mark.parametrize('key, secret', [
    ('api_key', True), ('optimizer.api_key', True), ('apikey', True), ('access_key', True), ('hf_token', True),
    ('token', True), ('db_password', True), ('secret', True), ('credentials', True),
    ('key', False), ('d_key', False), ('n_keys', False), ('n_tokens', False), ('token_embeddings', False),
    ('password_file', False), ('d_model', False),
])
def test_which_config_keys_hold_secrets(key, secret):
    read, uses = expand_env({key: '${env:LR}'}, environ={'LR': 'v'})
    assert uses[key].secret is secret


def test_the_form_of_a_reference_is_what_has_env_reference_tells():
    assert [has_env_reference(t) for t in ('${env:A}', 'x${env:A,1}y', '$${env:A}', 'a$b', '${oops', '${x}')] == \
        [True, True, False, False, True, True]
    assert re.fullmatch(r'\$\$\{env:A\}', escape_env('${env:A}'))
