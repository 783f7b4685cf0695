"""A key given twice on a command line is one line and exit 2, naming both settings: a later token never quietly
replaces an earlier one (issue 36, item 6)."""
import pytest

from lazylab.command_line import Parser
from lazylab.configs import OverrideSyntaxError, parse_overrides
from lazylab.errors import UsageError


def test_the_parser_refuses_a_key_given_twice_naming_both_settings():
    p = Parser('train')
    p.add_argument('experiment')
    with pytest.raises(UsageError) as info:
        p.parse_with_settings(['transformer', 'learning_rate=1e-2', 'd_model=8', 'learning_rate=1e-3'])
    assert str(info.value) == 'learning_rate is given twice: learning_rate=1e-2 and learning_rate=1e-3; give it once'
    # spaces around a key do not make it another key
    with pytest.raises(UsageError, match=r"^d_model is given twice: d_model=8 and d_model =16; give it once$"):
        p.parse_with_settings(['transformer', 'd_model=8', 'd_model =16'])


def test_parse_overrides_refuses_a_key_given_twice_in_any_spelling():
    with pytest.raises(OverrideSyntaxError) as info:
        parse_overrides(['seed=1', '--seed=2'])
    assert str(info.value) == 'seed is given twice: seed=1 and --seed=2; give it once'
    assert parse_overrides(['seed=1', 'sub.seed=2']) == {'seed': '1', 'sub.seed': '2'}  # two keys, one name


@pytest.mark.parametrize('argv, message', [
    (['optimizer.learning_rate=1e-2', 'optimizer.learning_rate=1e-3'],
     'optimizer.learning_rate is given twice: optimizer.learning_rate=1e-2 and optimizer.learning_rate=1e-3; give it '
     'once'),
    # a unique end of a key and the key in full are one key
    (['ffn.glu_variant=GLU', 'transformer.ffn.glu_variant=SwiGLU'],
     'transformer.ffn.glu_variant is given twice: ffn.glu_variant=GLU and transformer.ffn.glu_variant=SwiGLU; give '
     'it once'),
    (['learning_rate=1e-2', 'optimizer.learning_rate=1e-3'],
     'optimizer.learning_rate is given twice: learning_rate=1e-2 and optimizer.learning_rate=1e-3; give it once'),
])
def test_train_refuses_a_key_given_twice_before_it_writes_anything(tmp_path, cli_error, argv, message):
    runs = tmp_path / 'runs'
    assert cli_error(['train', 'transformer', *argv, f'runs_dir={runs}']) == message
    assert not runs.exists()


def test_a_sweep_names_both_settings_of_a_key_given_twice(cli_error):
    assert cli_error(['sweep', 'transformer', 'd_model=16,32', 'd_model=8']) == \
        'd_model is given twice: d_model=16,32 and d_model=8; give it once'


def test_a_key_from_a_config_file_and_the_command_line_is_no_key_given_twice(tmp_path):
    """The command line wins over a --config file: two sources, not one key given twice."""
    (tmp_path / 'c.yaml').write_text('seed: 3\n', encoding='utf-8')
    from lazylab.experiments.configure import make_configs
    conf = make_configs('transformer', ['seed=5'], config=str(tmp_path / 'c.yaml'))
    assert conf.seed == 5
