"""Values read from the environment on the command line: `lazylab options --resolved`, `train`, `resume`, `sweep`
and `labml` (`${env:NAME}`, `${env:NAME,default}`; issue 36, item 5).

Each kind of item typed from a variable and labelled `env NAME`; a variable unset without a default is one line,
exit 2, nothing written; a tiny run's configs.yaml and run.json record the provenance; a secret is in no file a run
writes, in none of its output, and a replay in the same environment reads it again; `sweep` and `labml` stack
`--config` files as `train` does.
"""
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from lazylab import cli
from lazylab.experiments.configure import make_configs
from lazylab.testing import ROOT, TINY, lazylab_env, replaced, run_lazylab

SECRET = 'hunter2-s3cr3t-v4lue'
#: an experiment of the user's with a credential the run uses but never prints
SECRET_EXPERIMENT = '''"""The transformer with a credential (lazylab's tests of redaction)."""
from lazylab.experiments.transformer import Configs as Transformer


class Configs(Transformer):
    api_token: str = ''     # a credential: read from the environment, never written
'''


def _table(capsys, argv: list[str]) -> dict[str, list[str]]:
    """key → [value, source words …] of `lazylab options … --resolved`."""
    assert cli.main(['options', *argv, '--resolved']) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        key, _, rest = line.partition(' = ')
        rows[key.strip()] = rest.split()
    return rows


@pytest.fixture
def environ(monkeypatch):
    for name, value in {'LR': '3e-4', 'SEED': '11', 'BIAS': 'no', 'DTYPE': 'bfloat16', 'ACT': 'GELU'}.items():
        monkeypatch.setenv(name, value)
    for name in ('UNSET_WIDTH', 'HF_TOKEN', 'SWEEP_SEED', 'LABML_WIDTH'):
        monkeypatch.delenv(name, raising=False)


def test_each_kind_of_item_is_typed_from_the_variable_and_labelled_env_name(environ, tmp_path, capsys):
    (tmp_path / 'a.yaml').write_text('heads: 2\noptimizer.learning_rate: ${env:LR}\nd_model: ${env:UNSET_WIDTH,32}\n',
                                     encoding='utf-8')
    t = _table(capsys, ['transformer', '--config', str(tmp_path / 'a.yaml'), 'seed=${env:SEED}',
                        'ffn.bias1=${env:BIAS}', 'dtype=${env:DTYPE}', 'ffn.activation=${env:ACT}',
                        'runs_dir=runs/${env:DTYPE}/${env:SEED}'])
    assert t['optimizer.learning_rate'][:3] == ['0.0003', 'env', 'LR']       # LR=3e-4 → the float 0.0003
    assert t['d_model'] == ['32', 'env', 'UNSET_WIDTH', '(default)']
    assert t['heads'] == ['2', f'{tmp_path / "a.yaml"}:1']
    assert t['seed'] == ['11', 'env', 'SEED']
    assert t['transformer.ffn.bias1'] == ['False', 'env', 'BIAS']
    assert t['dtype'] == ["'bfloat16'", 'env', 'DTYPE']
    assert t['transformer.ffn.activation'][:3] == ["'GELU'", 'env', 'ACT']      # an option's name
    assert t['runs_dir'] == ["'runs/bfloat16/11'", 'env', 'DTYPE,', 'SEED']  # embedded: both named


def test_an_unset_variable_is_one_line_naming_it_and_the_key_and_nothing_is_written(environ, tmp_path, cli_error):
    runs = f'runs_dir={tmp_path / "runs"}'
    assert cli_error(['train', 'transformer', *replaced(TINY, runs, 'd_model=${env:UNSET_WIDTH}')]) == \
        'd_model: environment variable UNSET_WIDTH is not set; set it, or give a default: ${env:UNSET_WIDTH,VALUE}'
    (tmp_path / 'a.yaml').write_text('# sizes\nheads: ${env:UNSET_WIDTH}\n', encoding='utf-8')
    assert cli_error(['train', 'transformer', *replaced(TINY, runs, drop=('heads',)), '--config',
                      str(tmp_path / 'a.yaml')]) == \
        f'{tmp_path / "a.yaml"}:2: heads: environment variable UNSET_WIDTH is not set; set it, or give a default: ' \
        f'${{env:UNSET_WIDTH,VALUE}}'
    assert cli_error(['options', 'transformer', 'seed=${env:}', '--resolved']) == \
        "seed: no variable name in '${env:}'; write ${env:NAME} or ${env:NAME,default} ($${ for the text ${)"
    assert not (tmp_path / 'runs').exists()


def test_an_unset_variable_in_a_child_process_is_one_line_exit_2(tmp_path):
    env = lazylab_env()
    env.pop('UNSET_WIDTH', None)
    done = run_lazylab('options', 'transformer', 'd_model=${env:UNSET_WIDTH}', '--resolved', env=env, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, '', 'lazylab: error: d_model: environment variable UNSET_WIDTH is not set; set it, or give a default: '
               '${env:UNSET_WIDTH,VALUE}\n')


def test_a_tiny_run_records_env_name_in_its_configs_yaml_and_its_command_in_run_json(environ, tmp_path, capsys):
    (tmp_path / 'a.yaml').write_text('seed: ${env:SEED}\n', encoding='utf-8')
    settings = replaced(TINY, 'max_steps=2', f'runs_dir={tmp_path / "runs"}', 'optimizer.learning_rate=${env:LR}')
    assert cli.main(['train', 'transformer', *settings, '--config', str(tmp_path / 'a.yaml')]) == 0
    capsys.readouterr()
    run, = (tmp_path / 'runs' / 'transformer').iterdir()
    doc = yaml.safe_load((run / 'configs.yaml').read_text(encoding='utf-8'))
    assert (doc['values']['optimizer.learning_rate'], doc['given']['optimizer.learning_rate']) == (0.0003, 'env LR')
    assert (doc['values']['seed'], doc['given']['seed']) == (11, 'env SEED')
    record = json.loads((run / 'run.json').read_text(encoding='utf-8'))
    assert 'optimizer.learning_rate=${env:LR}' in record['argv']   # the command as given: it reads LR again


def _every_file_holds_no(secret: bytes, folder: Path) -> list[str]:
    """The files under `folder` (and the members of zip files among them: checkpoint.pt) that hold `secret`."""
    found = []
    for path in sorted(p for p in folder.rglob('*') if p.is_file()):
        data = path.read_bytes()
        if secret in data:
            found.append(str(path))
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                found += [f'{path}:{m}' for m in z.namelist() if secret in z.read(m)]
    return found


def test_a_secret_is_in_no_file_of_the_run_and_in_none_of_its_output_and_replays(tmp_path, capsys, monkeypatch):
    (tmp_path / 'secret_exp.py').write_text(SECRET_EXPERIMENT, encoding='utf-8')
    (tmp_path / 'creds.yaml').write_text('api_token: ${env:HF_TOKEN}\n', encoding='utf-8')
    settings = replaced(TINY, 'max_steps=2', 'runs_dir=runs')
    env = {**lazylab_env(), 'HF_TOKEN': SECRET}
    done = run_lazylab('train', 'secret_exp.py', *settings, '--config', 'creds.yaml', env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert SECRET not in done.stdout + done.stderr
    run, = (tmp_path / 'runs' / 'secret_exp').iterdir()
    assert {p.name for p in run.iterdir()} >= {'configs.yaml', 'run.json', 'metrics.jsonl', 'checkpoint.pt', 'labml'}
    assert _every_file_holds_no(SECRET.encode(), tmp_path) == []
    doc = yaml.safe_load((run / 'configs.yaml').read_text(encoding='utf-8'))
    assert (doc['values']['api_token'], doc['given']['api_token']) == ('${env:HF_TOKEN}', 'env HF_TOKEN')
    # the run used it: a replay in the same environment reads it again, from the reference the dump holds
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv('HF_TOKEN', SECRET)
    assert make_configs('secret_exp.py', config=[str(run / 'configs.yaml')]).api_token == SECRET
    t = _table(capsys, ['secret_exp.py', '--config', str(run / 'configs.yaml')])
    assert t['api_token'] == ["'${env:HF_TOKEN}'", 'env', 'HF_TOKEN']     # --resolved: the reference, not it
    # a value that does not fit, and the error says so without showing it
    monkeypatch.setenv('STEP_TOKEN', 'n0t-a-numb3r-' + SECRET)
    code = cli.main(['options', 'secret_exp.py', 'max_steps=${env:STEP_TOKEN}', '--resolved'])
    err = capsys.readouterr().err
    assert code == 2 and SECRET not in err and err.startswith('lazylab: error: bad value for max_steps: ')
    # resume reads the reference again: without the variable, one line naming it
    monkeypatch.delenv('HF_TOKEN')
    code = cli.main(['resume', str(run)])
    err = capsys.readouterr().err
    assert code == 2 and err == (f'lazylab: error: {run / "configs.yaml"}:'
                                 f'{_line_of(run / "configs.yaml", "api_token")}: api_token: environment variable '
                                 'HF_TOKEN is not set; set it, or give a default: ${env:HF_TOKEN,VALUE}\n')


def _line_of(path: Path, key: str) -> int:
    """The line of `  key:` in the values section of a dump."""
    lines = path.read_text(encoding='utf-8').splitlines()
    start = lines.index('values:')
    return next(i for i, line in enumerate(lines, 1) if i > start and line.startswith(f'  {key}:'))


def test_a_sweep_stacks_config_files_as_train_does_and_its_trials_read_the_environment(tmp_path, capsys,
                                                                                        monkeypatch):
    sizes = [t for t in TINY if not t.startswith(('heads=', 'max_steps='))]
    a, b = tmp_path / 'a.yaml', tmp_path / 'b.yaml'
    a.write_text(''.join(f'{t.replace("=", ": ", 1)}\n' for t in sizes) + 'heads: 3\nmax_steps: 2\n', encoding='utf-8')
    b.write_text('heads: 2\n', encoding='utf-8')   # later wins: d_model=16 takes 2 heads, not 3
    monkeypatch.setenv('SWEEP_SEED', '5')
    rc = cli.main(['sweep', 'transformer', '--config', str(a), '--config', str(b), 'd_model=choice(16)',
                   'seed=${env:SWEEP_SEED,1}', f'runs_dir={tmp_path}'])
    out = capsys.readouterr().out
    assert rc == 0, out
    d = next((tmp_path / 'transformer').glob('sweep-*'))
    assert (d / 'config.yaml').read_text() == a.read_text() and (d / 'config-2.yaml').read_text() == b.read_text()
    assert yaml.safe_load((d / 'sweep.yaml').read_text())['config_copy'] == ['config.yaml', 'config-2.yaml']
    doc = yaml.safe_load((d / 'trial-0000' / 'configs.yaml').read_text())
    assert (doc['values']['heads'], doc['given']['heads']) == (2, f'--config {d / "config-2.yaml"}:1')
    assert (doc['values']['seed'], doc['given']['seed']) == (5, 'env SWEEP_SEED')
    assert doc['values']['max_steps'] == 2
    # the other order: the grid point is refused before anything is written
    code = cli.main(['sweep', 'transformer', '--config', str(b), '--config', str(a), 'd_model=choice(16)',
                     f'runs_dir={tmp_path / "other"}'])
    assert code == 2 and 'heads' in capsys.readouterr().err and not (tmp_path / 'other').exists()
    assert cli.main(['sweep', 'transformer', 'seed=${env:SWEEP_SEED},2', '--dry-run']) == 2
    assert capsys.readouterr().err == ('lazylab: error: seed=${env:SWEEP_SEED},2: a swept value cannot read the '
                                       'environment; read it in a fixed key=${env:NAME} or in a --config file\n')


HELPERS_SCRIPT = ROOT / 'tests' / 'labml' / 'char_helpers_experiment.py'


def test_labml_stacks_config_files_as_train_does(tmp_path):
    (tmp_path / 'a.yaml').write_text('seq_len: 16\nd_model: 20\n', encoding='utf-8')
    (tmp_path / 'b.yaml').write_text('d_model: ${env:LABML_WIDTH}\n', encoding='utf-8')
    env = {**lazylab_env(), 'LABML_DISABLE_GIT': '1', 'OMP_NUM_THREADS': '1', 'LABML_WIDTH': '24'}
    done = subprocess.run([sys.executable, '-m', 'lazylab.cli', 'labml', str(HELPERS_SCRIPT), '--config', 'a.yaml',
                           '--config', 'b.yaml', 'n_chars=2000', '--steps', '1', '--runs-dir', 'runs'],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run, = (tmp_path / 'runs' / 'char_helpers_experiment').iterdir()
    doc = yaml.safe_load((run / 'configs.yaml').read_text(encoding='utf-8'))
    assert (doc['values']['d_model'], doc['given']['d_model']) == (24, 'env LABML_WIDTH')
    assert (doc['values']['seq_len'], doc['given']['seq_len']) == (16, '--config a.yaml:1')
