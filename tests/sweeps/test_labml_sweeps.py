"""`lazylab sweep --labml MODULE key=a,b …` (issue 26): a labml script's sweep, each trial a `lazylab labml` run in its
trial folder, so `lazylab compare` and `lazylab diff` read them; checked up front as far as the script tells.

The script minimizes w² from w = 1 by SGD: step 0's loss is 1, step 1's is (1 − 2·lr)², so with --steps 2 each
trial's last loss.train is worked out by hand: lr=0.25 → 0.25, lr=0.125 → 0.5625.
"""
import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from lazylab import cli

SCRIPT = '''
import torch
from labml import experiment, tracker
from lazylab.configs import BaseConfigs


class Configs(BaseConfigs):
    steps: int = 3
    lr: float = 0.1


def main():
    conf = Configs()
    experiment.create(name='tiny_sweep', writers={'screen'})
    experiment.configs(conf, {'steps': 4})
    w = torch.nn.Parameter(torch.tensor(1.0))
    opt = torch.optim.SGD([w], lr=conf.lr)
    with experiment.start():
        for i in range(conf.steps):
            loss = w ** 2
            opt.zero_grad()
            loss.backward()
            opt.step()
            tracker.save(i, {'loss.train': loss.item()})
'''


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / 'tiny_sweep.py'
    path.write_text(SCRIPT, encoding='utf-8')
    return path


def _lazylab(tools, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'lazylab.cli', *args], cwd=cwd, env=tools.ENV, capture_output=True,
                          text=True, timeout=600)


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob('*'))


def test_a_two_trial_sweep_of_a_labml_script_runs_each_trial_as_a_labml_run_that_compare_and_diff_read(tools, tmp_path,
                                                                                                     script):
    done = _lazylab(tools, tmp_path, 'sweep', '--labml', 'tiny_sweep.py', 'lr=0.25,0.125', '--steps', '2',
                    '--metric', 'loss.train', '--runs-dir', 'runs', '--study', 'lr', '--workers', '2')
    assert done.returncode == 0, done.stdout + done.stderr
    d = tmp_path / 'runs' / 'tiny_sweep' / 'sweep-lr'
    assert done.stdout.splitlines()[0] == ('sweep runs/tiny_sweep/sweep-lr: grid of 2 (lr); 2 workers × 1 thread; '
                                           'study lr (study.journal); loss.train, minimize')
    for trial, lr, last in (('trial-0000', 0.25, 0.25), ('trial-0001', 0.125, 0.5625)):
        record = json.loads((d / trial / 'run.json').read_text())
        assert (record['experiment'], record['source']['kind'], record['status'], record['steps']) == \
            ('tiny_sweep', 'labml', 'completed', 2)
        assert record['sweep'] == {'dir': 'runs/tiny_sweep/sweep-lr', 'study': 'lr', 'trial': int(trial[-1])}
        losses = [json.loads(line)['loss.train'] for line in (d / trial / 'metrics.jsonl').read_text().splitlines()]
        assert losses == [1.0, pytest.approx(last)]
        state = json.loads((d / trial / 'trial.json').read_text())
        assert (state['state'], state['params'], state['value']) == ('completed', {'lr': lr}, pytest.approx(last))
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(d / 'study.journal')))
    study = optuna.load_study(study_name='lr', storage=storage)
    assert [(t.params, t.state.name, t.value) for t in study.trials] == \
        [({'lr': 0.25}, 'COMPLETE', pytest.approx(0.25)), ({'lr': 0.125}, 'COMPLETE', pytest.approx(0.5625))]
    compared = _lazylab(tools, tmp_path, 'compare', 'runs/tiny_sweep/sweep-lr', '--metric', 'loss.train')
    assert compared.returncode == 0, compared.stderr
    rows = [line.split() for line in compared.stdout.splitlines()[2:]]
    assert [row[:5] for row in rows] == [['0000', '0.25', '0.2500', '0.2500', '2'],
                                         ['0001', '0.125', '0.5625', '0.5625', '2']]
    assert [row[-1] for row in rows] == ['completed', 'completed']
    diffed = _lazylab(tools, tmp_path, 'diff', str(d / 'trial-0000'), str(d / 'trial-0001'))
    assert diffed.returncode == 0, diffed.stderr
    assert diffed.stdout.splitlines()[1:3] == ['key  A                 B', 'lr   0.25  (override)  0.125  (override)']
    resumed = _lazylab(tools, tmp_path, 'sweep', '--resume', 'runs/tiny_sweep/sweep-lr')
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[0] == ('nothing to do: every trial of the sweep in runs/tiny_sweep/sweep-lr has '
                                              'ended (2 completed)')


def test_the_dry_run_of_a_labml_sweep_types_the_values_by_the_scripts_configs_and_writes_nothing(tmp_path, script,
                                                                                                monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    assert cli.main(['sweep', '--labml', 'tiny_sweep.py', 'lr=1e-1,2e-1', 'steps=range(1,3)', '--study', 'dry',
                     '--dry-run']) == 0
    assert capsys.readouterr().out.splitlines() == [
        'lazylab sweep --labml tiny_sweep.py --dry-run: every key and value checked against its configs; nothing '
        'written',
        '4 points (the grid, in the order they run):',
        '  trial 0000  lr=0.1 steps=1',  # typed by the script's items: 1e-1 a float, the range's values ints
        '  trial 0001  lr=0.1 steps=2',
        '  trial 0002  lr=0.2 steps=1',
        '  trial 0003  lr=0.2 steps=2',
        "every trial: the script's settings",
        'study: dry; sampler grid, 4 trials, metric loss.valid (minimize), no pruning',
        'storage: journal file runs/labml/tiny_sweep/sweep-dry/study.journal',
        'sweep directory: runs/labml/tiny_sweep/sweep-dry (not made)']
    assert _tree(tmp_path) == before


@pytest.mark.parametrize('args, message', [
    (['tiny_sweep.py', 'lr2=0.1,0.2'], "lr2=0.1,0.2: Configs has no config item 'lr2'; did you mean 'lr'?"),
    (['tiny_sweep.py', 'lr=0.1,fast'], "lr=0.1,fast: "),
    (['tiny_sweep.py', 'lr=0.1,0.2', 'stepz=2'], "Configs has no config item 'stepz'; did you mean 'steps'?"),
    (['tiny_swep.py', 'lr=0.1,0.2'], 'no such file: tiny_swep.py'),
    (['no_such_module_here', 'lr=0.1,0.2'], "no module named 'no_such_module_here'"),
    (['tiny_sweep.py', 'lr=0.1,0.2', '--prune', 'median'],
     "--prune median needs lazylab's trainer (its validation hook); a --labml script runs its own loop: sweep it "
     "without --prune"),
    (['tiny_sweep.py', 'lr=0.1,0.2', '--steps', '0'], '--steps must be ≥ 1, got 0'),
], ids=['unknown swept key', 'bad value', 'unknown fixed key', 'no file', 'no module', 'prune', 'steps'])
def test_a_mistake_in_a_labml_sweep_is_one_line_and_writes_nothing(tmp_path, script, monkeypatch, capsys, args,
                                                                   message):
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    assert cli.main(['sweep', '--labml', *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f'lazylab: error: {message}') and err.count('\n') == 1, err
    assert _tree(tmp_path) == before


def test_the_flags_of_a_labml_sweep_are_refused_without_labml(tmp_path, capsys):
    for flag in ('--steps', '--runs-dir'):
        assert cli.main(['sweep', 'transformer', 'd_model=16,32', flag, '2', f'runs_dir={tmp_path}']) == 2
        assert capsys.readouterr().err == (f'lazylab: error: {flag} is for --labml sweeps (an experiment is set by '
                                           f'its keys: max_steps=, runs_dir=)\n')
    assert not any(tmp_path.iterdir())
