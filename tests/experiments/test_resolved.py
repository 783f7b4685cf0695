"""`lazylab options EXPERIMENT key=value … [--config FILE …] --resolved [--format yaml]`: every value a run would get
and who set it, checked as train checks it, without building the model (issue 36, items 2 and 5)."""
import pytest
import yaml
from torch import nn

from lazylab import cli
from lazylab.configs import inspect
from lazylab.experiments.resolved import resolve
from lazylab.testing import TINY, replaced


def _table(capsys, argv: list[str]) -> dict[str, list[str]]:
    """key → [value, source words …] of `lazylab options … --resolved`."""
    assert cli.main(['options', *argv, '--resolved']) == 0
    out = capsys.readouterr().out
    table = {}
    for line in out.splitlines():
        key, _, rest = line.partition(' = ')
        table[key.strip()] = rest.split()
    return table


def test_resolved_names_where_each_value_came_from(tmp_path, capsys):
    (tmp_path / 'a.yaml').write_text('optimizer.learning_rate: 0.001\n# heads below\nheads: 3\n', encoding='utf-8')
    t = _table(capsys, ['transformer', 'd_model=48', 'preset=labml_nn', '--config', str(tmp_path / 'a.yaml')])
    a = str(tmp_path / 'a.yaml')
    assert t['d_model'] == ['48', 'command', 'line']
    assert t['heads'] == ['3', f'{a}:3']
    assert t['n_layers'] == ['6', 'preset', 'labml_nn']  # labml_nn's 6 layers
    assert t['seq_len'] == ['128', 'preset', 'labml_nn'] and t['log_interval'] == ['10', 'default']
    assert t['n_tokens'] == ['65', 'option', 'vocabulary_size', '←', 'dataset']
    assert t['transformer.d_model'] == ['48', 'set', 'by', 'transformer']
    assert t['transformer.ffn.d_model'] == ['48', 'set', 'by', 'transformer.ffn', '←', 'transformer.d_model']
    # the step count, from what it read: 1,003,854 training characters, windows of 128, 64 a step, 128 epochs:
    # ⌈⌊1,003,853 / 128⌋ / 64⌉ · 128 = ⌈7842 / 64⌉ · 128 = 123 · 128
    assert t['total_steps'][0] == '15744'
    assert t['total_steps'][1:] == ['option', 'epochs_or_max_steps', '←', 'dataset,', 'seq_len,', 'batch_size,',
                                    'epochs,', 'max_steps']
    # the model and what needs it are not built: their values as they start, computed when the run starts
    assert t['model'] == ["'transformer'", 'default', '(built', 'when', 'the', 'run', 'starts)']
    assert t['optimizer.learning_rate'] == ['0.001', f'{a}:1', '(when', 'the', 'run', 'starts:', 'needs', 'model)']


def test_resolved_builds_no_model_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conf, later = resolve('transformer', ['d_model=32'])
    built = [item.path for item in inspect.items(conf) if item.computed and isinstance(item.value, nn.Module)]
    assert built == []
    assert later['model'] == 'model' and later['optimizer.learning_rate'] == 'model'
    assert conf.transformer.d_model == 32 and conf.n_tokens == 65
    assert list(tmp_path.iterdir()) == []


def test_the_resolved_yaml_replays_with_train(tmp_path, capsys):
    settings = replaced(TINY, 'max_steps=2', 'optimizer.learning_rate=0.01', f'runs_dir={tmp_path / "runs"}')
    assert cli.main(['options', 'transformer', *settings, '--resolved', '--format', 'yaml']) == 0
    resolved = tmp_path / 'resolved.yaml'
    resolved.write_text(capsys.readouterr().out, encoding='utf-8')
    doc = yaml.safe_load(resolved.read_text(encoding='utf-8'))
    assert doc['given']['optimizer.learning_rate'] == 'user' and doc['values']['optimizer.learning_rate'] == 0.01
    assert cli.main(['train', 'transformer', '--config', str(resolved)]) == 0
    capsys.readouterr()
    run, = (tmp_path / 'runs' / 'transformer').iterdir()
    ran = yaml.safe_load((run / 'configs.yaml').read_text(encoding='utf-8'))
    assert {k: ran['values'][k] for k in doc['values']} == doc['values']
    assert ran['given']['optimizer.learning_rate'].startswith(f'--config {resolved}:')


@pytest.mark.parametrize('settings', [
    ['d_model=0'],
    ['d_modle=8'],
    ['device=cuda:7'],
    ['seq_len_start=100'],
    ['learning_rate=-1'],
    ['d_model=8', 'd_model=9'],
    ['text=no_such_file.txt'],
    ['preset=nope'],
])
def test_resolved_refuses_what_train_refuses_with_the_same_line(tmp_path, cli_error, settings):
    runs = f'runs_dir={tmp_path / "runs"}'
    assert cli_error(['options', 'transformer', *settings, runs, '--resolved']) == \
        cli_error(['train', 'transformer', *settings, runs])
    assert not (tmp_path / 'runs').exists()


@pytest.mark.parametrize('argv, message', [
    (['transformer', 'd_model=8'], 'key=value settings need --resolved or --graph (lazylab options EXPERIMENT '
                                   'key=value … --resolved): without it, options lists the declarations'),
    (['transformer', '--format', 'yaml'], '--format needs --resolved or --graph (lazylab options EXPERIMENT '
                                          'key=value … --resolved): without it, options lists the declarations'),
])
def test_settings_without_resolved_are_one_line(cli_error, argv, message):
    assert cli_error(['options', *argv]) == message


def test_stacked_config_files_later_wins_and_each_value_names_its_file_and_line(tmp_path, capsys):
    a, b = tmp_path / 'a.yaml', tmp_path / 'b.yaml'
    a.write_text('d_model: 32\nheads: 2\nlearning_rate: 0.002\n', encoding='utf-8')
    b.write_text('\n# b gives a wider model\nd_model: 64\n', encoding='utf-8')
    t = _table(capsys, ['transformer', '--config', str(a), '--config', str(b), 'heads=4'])
    assert t['d_model'] == ['64', f'{b}:3']
    assert t['heads'] == ['4', 'command', 'line']
    assert t['optimizer.learning_rate'][:2] == ['0.002', f'{a}:3']


def test_two_run_dumps_do_not_stack(tmp_path, cli_error, capsys):
    assert cli.main(['options', 'transformer', 'd_model=32', '--resolved', '--format', 'yaml']) == 0
    dump = capsys.readouterr().out
    (tmp_path / 'one.yaml').write_text(dump, encoding='utf-8')
    (tmp_path / 'two.yaml').write_text(dump, encoding='utf-8')
    assert cli_error(['options', 'transformer', '--config', str(tmp_path / 'one.yaml'), '--config',
                      str(tmp_path / 'two.yaml'), '--resolved']) == \
        f"--config {tmp_path / 'two.yaml'}: {tmp_path / 'one.yaml'} is a run's dump already; stack flat key: value " \
        f"files on one dump"
