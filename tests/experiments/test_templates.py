"""What `lazylab new` writes shows a rule on each of its own keys, and `lazylab options` lists an experiment's own
keys before the ones it inherits (issue 36, item 7)."""
import sys

import pytest

from lazylab import cli


@pytest.fixture
def here(tmp_path, monkeypatch):
    """tmp_path as the current folder; the modules the test's experiments add are removed after it."""
    before = set(sys.modules)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], '__file__', None) and str(tmp_path) in sys.modules[name].__file__:
            del sys.modules[name]


@pytest.mark.parametrize('task, key, message', [
    ('text', 'hidden=0', 'bad value for hidden: must be ≥ 1, got 0'),
    ('text', 'n_layers=65', 'bad value for n_layers: must be ≤ 64, got 65'),
    ('custom', 'hidden=0', 'bad value for hidden: must be ≥ 1, got 0'),
    ('custom', 'seq_len=-3', 'bad value for seq_len: must be ≥ 1, got -3'),
    ('custom', 'target_accuracy=1.5', 'bad value for target_accuracy: must be ≤ 1, got 1.5'),
])
def test_a_bad_value_for_a_templates_own_key_is_one_line_naming_its_rule(here, capsys, cli_error, task, key,
                                                                         message):
    name = f'rule_{task}_{key.split("=")[0]}'
    assert cli.main(['new', name, '--task', task]) == 0
    capsys.readouterr()
    assert cli_error(['train', f'{name}.py', key, 'runs_dir=runs']) == message
    assert not (here / 'runs').exists()


def test_options_lists_the_experiments_own_keys_first_then_the_inherited_ones(here, capsys):
    assert cli.main(['new', 'sorter_o', '--task', 'custom']) == 0
    capsys.readouterr()
    assert cli.main(['options', 'sorter_o.py']) == 0
    lines = capsys.readouterr().out.splitlines()
    keys = [line.split(':')[0] for line in lines if line and not line.startswith(' ') and ': ' in line]
    assert lines[0] == "sorter_o's own keys (Configs):"
    # the file's own keys, in its order, then the optimizer's (a sub-config of its own key `optimizer`)
    assert keys[:7] == ['seq_len', 'hidden', 'target_accuracy', 'model', 'task', 'optimizer', 'total_steps']
    assert keys[7] == 'optimizer.optimizer'
    assert lines[1] == 'seq_len: int = 8  (≥ 1)' and lines[3] == 'hidden: int = 64  (≥ 1)'
    assert lines[5] == 'target_accuracy: float = 0.99  (≥ 0, ≤ 1)'
    inherited = lines.index('inherited (TrainerConfigs):')
    assert lines[inherited - 1] == '' and lines[inherited + 1].startswith('seed: int = 0')
    assert all(not k.startswith('optimizer') for k in keys[keys.index('seed'):])


def test_options_of_a_built_in_experiment_starts_with_its_own_keys(capsys):
    assert cli.main(['options', 'transformer']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "transformer's own keys (Configs):"
    assert 'inherited (NLPAutoRegressionConfigs, TrainerConfigs):' in lines
    own = lines[:lines.index('inherited (NLPAutoRegressionConfigs, TrainerConfigs):')]
    assert any(line.startswith('transformer.ffn.glu_variant: ') for line in own)
    assert not any(line.startswith(('seed: ', 'optimizer.')) for line in own)
