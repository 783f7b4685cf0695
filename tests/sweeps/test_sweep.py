"""`lazylab sweep`, `compare` and `diff` end to end, on real (tiny) training runs in child processes.

Every README command of "Sweeps and comparisons" is run here with tiny sizes (see conftest.tiny); the last test
checks that none is left out.
"""
import io
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml

from lazylab import cli
from lazylab.errors import plural
from lazylab.experiments.metrics import read_metrics
from lazylab.sweeps import compare

GRID = list(itertools.product(['GEGLU', 'SwiGLU'], [0.003, 0.01]))
SWEPT = ['transformer.ffn.glu_variant', 'optimizer.learning_rate']
#: the README's grid sweep (GLU variants × learning rates), as far as its three forms share it
GRID_COMMAND = ('lazylab sweep transformer transformer.ffn.glu_variant=GEGLU,SwiGLU optimizer.learning_rate=3e-3,1e-2 '
                'd_model=64 n_layers=2 max_minutes=0 max_steps=400 valid_interval=50')
#: the README commands each test runs (by their first words), checked by the last test
README_RUN_BY = {
    GRID_COMMAND + ' --workers 2': 'test_grid_sweep_with_two_workers_runs_every_point_once',
    'lazylab compare runs/transformer/sweep-ID --plot': 'test_compare_shows_exactly_the_swept_keys',
    'lazylab diff runs/transformer/sweep-ID/trial-0000': 'test_diff_names_the_keys_both_values_and_their_sources',
    'lazylab sweep --resume runs/transformer/sweep-ID': 'test_sigkill_of_the_sweep_then_resume_runs_every_point_once',
    "lazylab sweep transformer 'optimizer.learning_rate=tag(log, interval(1e-4, 3e-2))' --sampler tpe":
        'test_readme_tpe_sweep_draws_log_uniform_learning_rates',
    GRID_COMMAND + ' --storage postgresql': 'test_two_sweeps_on_one_postgresql_study_split_the_grid',
    GRID_COMMAND + ' --storage /shared': 'test_two_sweeps_on_one_journal_file_split_the_grid',
    # a labml_nn experiment takes minutes a trial: a tiny labml script is swept the same way
    'lazylab sweep --labml labml_nn.transformers.feedback.experiment':
        'test_labml_sweeps.py::test_a_two_trial_sweep_of_a_labml_script_runs_each_trial_as_a_labml_run_that_compare_'
        'and_diff_read',
}


def readme(tools, start: str) -> str:
    found = [c for c in tools.readme_commands() if c.startswith(start)]
    assert len(found) == 1, (start, tools.readme_commands())
    return found[0]


def run_in_process(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        rc = cli.main(args)
    return rc, out.getvalue()


def journal_study(sweep_dir: Path, storage=None):
    import optuna
    from optuna.storages.journal import JournalFileBackend
    record = yaml.safe_load((sweep_dir / 'sweep.yaml').read_text())
    if storage is None:
        storage = optuna.storages.JournalStorage(JournalFileBackend(str(sweep_dir / 'study.journal')))
    return optuna.load_study(study_name=record['study'], storage=storage)


def grid_points(sweep_dir: Path) -> list[tuple]:
    points = []
    for t in sorted(sweep_dir.glob('trial-*')):
        values = yaml.safe_load((t / 'configs.yaml').read_text())['values']
        points.append(tuple(values[k] for k in SWEPT))
    return points


@pytest.fixture(scope='module')
def glu_sweep(tmp_path_factory, tools):
    """The README's grid sweep (GLU variants × learning rates, 2 workers), tiny: (exit code, output, sweep dir)."""
    runs = tmp_path_factory.mktemp('runs')
    rc, out = run_in_process(tools.tiny(readme(tools, GRID_COMMAND + ' --workers 2'), runs))
    dirs = list((runs / 'transformer').glob('sweep-*'))
    assert len(dirs) == 1, out
    return rc, out, dirs[0]


def test_grid_sweep_with_two_workers_runs_every_point_once(glu_sweep):
    rc, out, d = glu_sweep
    assert rc == 0, out
    lines = out.splitlines()
    assert lines[0].startswith(f'sweep {d}: grid of 4 (transformer.ffn.glu_variant × optimizer.learning_rate); '
                               f'2 workers × 1 thread')
    assert [t.name for t in sorted(d.glob('trial-*'))] == [f'trial-{i:04d}' for i in range(4)]
    # the stable grid order: the last key fastest; each point exactly once
    assert grid_points(d) == GRID
    for t in sorted(d.glob('trial-*')):
        doc = yaml.safe_load((t / 'configs.yaml').read_text())
        assert doc['given']['transformer.ffn.glu_variant'] == doc['given']['optimizer.learning_rate'] == 'sweep'
        assert doc['given']['d_model'] == 'user' and doc['values']['threads'] == 1
        info = json.loads((t / 'run.json').read_text())
        assert info['status'] == 'completed' and info['steps'] == 4 and info['sweep']['trial'] == int(t.name[-4:])
        record = json.loads((t / 'trial.json').read_text())
        assert record['state'] == 'completed'
        assert record['value'] == read_metrics(t / 'metrics.jsonl')[-1]['loss.valid']
    study = journal_study(d)
    assert [t.state.name for t in study.trials] == ['COMPLETE'] * 4
    assert [(t.params['transformer.ffn.glu_variant'], t.params['optimizer.learning_rate']) for t in study.trials] \
        == GRID
    for t in study.trials:
        assert t.value == read_metrics(d / f'trial-{t.number:04d}' / 'metrics.jsonl')[-1]['loss.valid']
    # one line per start and end; two workers: the second trial starts before the first ends, and the third
    # only when a worker is free
    events = [(w[2], w[3]) for w in (line.split() for line in lines) if len(w) > 3 and w[1] == 'trial']
    assert sorted(events) == sorted([(f'{i:04d}', s) for i in range(4) for s in ('started', 'completed')])
    assert events.index(('0001', 'started')) < events.index(('0000', 'completed'))
    assert events.index(('0002', 'started')) > min(events.index(('0000', 'completed')),
                                                   events.index(('0001', 'completed')))
    record = yaml.safe_load((d / 'sweep.yaml').read_text())
    assert record['sampler'] == 'grid' and record['trials'] == 4 and record['lazylab'] == '0.1.0'
    assert record['space'] == {'transformer.ffn.glu_variant': {'choice': ['GEGLU', 'SwiGLU']},
                               'optimizer.learning_rate': {'choice': [0.003, 0.01]}}
    assert 'lazylab compare' in out and out.count('completed') >= 8


def test_a_trial_is_an_ordinary_run(glu_sweep, tmp_path, capsys):
    _, _, d = glu_sweep
    trial = d / 'trial-0000'
    assert cli.main(['generate', str(trial), '--prompt', 'It', '--tokens', '5', '--seed', '1']) == 0
    assert len(capsys.readouterr().out.rstrip('\n')) == 7
    assert cli.main(['plot', str(trial), '-o', str(tmp_path / 'loss.png')]) == 0
    before = {p.name: p.read_bytes() for p in trial.iterdir() if p.is_file()}
    import torch
    threads = torch.get_num_threads()
    try:
        assert cli.main(['resume', str(trial)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert 'has already finished' in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in trial.iterdir() if p.is_file()} == before


def test_compare_shows_exactly_the_swept_keys(glu_sweep, tools, tmp_path, capsys):
    _, _, d = glu_sweep
    png = tmp_path / 'sweep.png'
    args = tools.tiny(readme(tools, 'lazylab compare runs/transformer/sweep-ID --plot'), tmp_path,
                      sweep_dir=str(d), plot=str(png))
    assert cli.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f'lazylab compare {d}      (4 trials; keys that differ: 2)'
    assert out[1].split() == ['trial', *SWEPT, 'loss.valid', 'best', 'steps', 'tok/s', 'MFU', 'params', 'time',
                              'status']
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    table = compare.compare([str(d)])
    assert table.keys == SWEPT
    finals = {f'{i:04d}': read_metrics(d / f'trial-{i:04d}' / 'metrics.jsonl') for i in range(4)}
    assert [row['final'] for row in table.rows] == sorted(r[-1]['loss.valid'] for r in finals.values())
    for row, line in zip(table.rows, out[2:6]):
        records = finals[row['trial']]
        assert row['best'] == min(r['loss.valid'] for r in records if 'loss.valid' in r)
        assert row['steps'] == 4 and row['status'] == 'completed'
        assert row['params'] == json.loads((d / f'trial-{row["trial"]}' / 'run.json').read_text())['parameters']
        assert (row[SWEPT[0]], row[SWEPT[1]]) == GRID[int(row['trial'])]
        assert line.split()[:4] == [row['trial'], row[SWEPT[0]], f'{row[SWEPT[1]]:g}', f'{row["final"]:.4f}']
    labels = compare.plot(table, str(tmp_path / 'again.png'))
    assert labels == [f'{row["trial"]}: glu_variant={row[SWEPT[0]]}, learning_rate={row[SWEPT[1]]:g}'
                      for row in table.rows]
    path = compare.write_csv(table, str(tmp_path / 'sweep.csv'))
    import csv
    rows = list(csv.DictReader(path.open()))
    assert [float(r['loss.valid']) for r in rows] == [row['final'] for row in table.rows]
    assert cli.main(['compare', str(d), '--sort=-steps']) == 0
    assert cli.main(['compare', str(d), '--sort', 'nope']) == 2
    assert 'no such column' in capsys.readouterr().err


def test_diff_names_the_keys_both_values_and_their_sources(glu_sweep, tools, capsys):
    _, _, d = glu_sweep
    args = tools.tiny(readme(tools, 'lazylab diff runs/transformer/sweep-ID/trial-0000'), d, sweep_dir=str(d))
    assert cli.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith('lazylab diff ') and lines[0].endswith('keys differ')
    rows = {line.split()[0]: line for line in lines[2:] if not line.startswith('run.json')}
    assert rows['transformer.ffn.glu_variant'].split() == ['transformer.ffn.glu_variant', 'GEGLU', '(sweep)',
                                                           'SwiGLU', '(sweep)']
    assert rows['optimizer.learning_rate'].split() == ['optimizer.learning_rate', '0.003', '(sweep)', '0.01',
                                                       '(sweep)']
    # what the GLU variant implies, with where it came from: its aggregate
    assert rows['transformer.ffn.activation'].split() == [
        'transformer.ffn.activation', 'torch.nn.modules.activation.GELU', '(aggregate', 'glu_variant=GEGLU)',
        'torch.nn.modules.activation.SiLU', '(aggregate', 'glu_variant=SwiGLU)']
    assert not any(k.startswith(('d_model', 'heads', 'seq_len')) for k in rows)
    assert cli.main(['diff', str(d / 'trial-0001'), str(d / 'trial-0001')]) == 0
    assert capsys.readouterr().out.endswith('the configurations are the same\n')


def test_zipped_keys_move_together_and_a_failing_trial_is_recorded(tools, tmp_path, capsys):
    # the sizes come from a --config file this time: the sweep keeps a copy, which its trials read
    sizes = tmp_path / 'tiny.yaml'
    sizes.write_text(''.join(f'{t.replace("=", ": ", 1)}\n' for t in tools.TINY if not t.startswith(('d_model=',
                                                                                                       'heads='))))
    # the second point's learning rate makes the loss NaN: its trial fails while training (a point whose values
    # cannot make a run, say heads=4 for d_model=30, is refused before the sweep starts: see the test below)
    rc = cli.main(['sweep', 'transformer', '--config', str(sizes), 'd_model=16,30', 'heads=2,3',
                   'optimizer.learning_rate=1e-3,1e30', '--zip', 'd_model,heads,optimizer.learning_rate',
                   '--workers', '2', f'runs_dir={tmp_path}'])
    out = capsys.readouterr().out
    assert rc == 1, out  # a trial failed
    d = next((tmp_path / 'transformer').glob('sweep-*'))
    assert (d / 'config.yaml').read_text() == sizes.read_text()
    doc = yaml.safe_load((d / 'trial-0000' / 'configs.yaml').read_text())
    first = doc['values']
    assert (first['d_model'], first['heads'], first['transformer.n_heads'], first['max_steps']) == (16, 2, 2, 4)
    assert doc['given']['max_steps'].startswith(f'--config {d / "config.yaml"}:') and doc['given']['heads'] == 'sweep'
    failed = json.loads((d / 'trial-0001' / 'trial.json').read_text())
    assert failed['state'] == 'failed' and failed['params'] == {'d_model': 30, 'heads': 3,
                                                                'optimizer.learning_rate': 1e30}
    assert failed['error'].startswith('training loss is nan at step 2; no checkpoint was written')
    assert json.loads((d / 'trial-0001' / 'run.json').read_text())['error'] == failed['error']
    study = journal_study(d)
    assert [t.state.name for t in study.trials] == ['COMPLETE', 'FAIL']
    assert study.trials[1].user_attrs['error'] == failed['error']
    assert 'grid of 2 (d_model,heads,optimizer.learning_rate)' in out.splitlines()[0]
    assert f'trial 0001 failed: {failed["error"]}' in out


def test_seeded_random_sweep_draws_the_same_points_twice(tools, tmp_path):
    import optuna
    args = ['sweep', 'transformer', *tools.TINY[2:], 'optimizer.learning_rate=tag(log, interval(1e-4, 1e-2))',
            'heads=choice(1,2,4)', 'd_model=16', '--sampler', 'random', '--trials', '2', '--seed', '7',
            '--workers', '2']
    draws = []
    for name in ('a', 'b'):
        rc, out = run_in_process(args + [f'runs_dir={tmp_path / name}'])
        assert rc == 0, out
        d = next((tmp_path / name / 'transformer').glob('sweep-*'))
        params = [json.loads((t / 'trial.json').read_text())['params'] for t in sorted(d.glob('trial-*'))]
        for t, p in zip(sorted(d.glob('trial-*')), params):
            values = yaml.safe_load((t / 'configs.yaml').read_text())['values']
            assert values['optimizer.learning_rate'] == p['optimizer.learning_rate']
            assert values['heads'] == p['heads'] and values['transformer.n_heads'] == p['heads']
        draws.append(params)
    assert draws[0] == draws[1]
    # the points are Optuna's seeded RandomSampler's, drawn in trial order
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    expected = []
    for _ in range(2):
        t = study.ask()
        expected.append({'optimizer.learning_rate': t.suggest_float('optimizer.learning_rate', 1e-4, 1e-2, log=True),
                         'heads': t.suggest_categorical('heads', [1, 2, 4])})
    assert draws[0] == expected


def test_readme_tpe_sweep_draws_log_uniform_learning_rates(tools, tmp_path):
    rc, out = run_in_process(tools.tiny(readme(tools, "lazylab sweep transformer 'optimizer.learning_rate=tag(log, "
                                                      "interval(1e-4, 3e-2))' --sampler tpe"), tmp_path, trials=2))
    assert rc == 0, out
    d = next((tmp_path / 'transformer').glob('sweep-*'))
    study = journal_study(d)
    assert len(study.trials) == 2 and all(t.state.name == 'COMPLETE' for t in study.trials)
    for t in study.trials:
        assert 1e-4 <= t.params['optimizer.learning_rate'] <= 3e-2
        assert t.distributions['optimizer.learning_rate'].log
    record = yaml.safe_load((d / 'sweep.yaml').read_text())
    assert (record['sampler'], record['prune'], record['trials']) == ('tpe', 'median', 2)
    # the progress lines show each drawn learning rate with 4 significant digits; the trial keeps it in full
    for t in study.trials:
        shown = f'optimizer.learning_rate={t.params["optimizer.learning_rate"]:.4g}'
        lines = [x for x in out.splitlines() if x.split()[1:3] == ['trial', f'{t.number:04d}']]
        assert len(lines) == 2 and all(shown in x.split() for x in lines), out
        trial = json.loads((d / f'trial-{t.number:04d}' / 'trial.json').read_text())
        assert trial['params']['optimizer.learning_rate'] == t.params['optimizer.learning_rate']
        assert trial['overrides'] == [f'optimizer.learning_rate={t.params["optimizer.learning_rate"]!r}']


@pytest.mark.parametrize('args, message', [
    (['d_modl=16,32'], "no config item 'd_modl'"),
    (['transformer.ffn.glu_variant=SwiGLU,GEGLUU'], "got 'GEGLUU'"),
    (['optimizer.lerning_rate=0.1,0.2'], "'optimizer.lerning_rate'"),
    (['d_model=range(1,a)'], "d_model=range(1,a): 'a' is not a number"),
    (['d_model=16,32', 'heads=1,2,4', '--zip', 'd_model,heads'], 'different numbers of values (d_model: 2, heads: 3)'),
    (['d_model=16,32', '--zip', 'd_model,heads'], '--zip d_model,heads: heads is not swept'),
    (['optimizer.learning_rate=interval(1e-3,1e-2)', '--sampler', 'grid'], 'is an interval: the grid needs'),
    (['optimizer.learning_rate=interval(1e-3,1e-2)'], 'give --trials'),
    (['optimizer.learning_rate=interval(1e-2,1e-3)', '--trials', '2'], 'the interval is empty'),
    (['d_model=glob(*)'], 'glob() is not supported'),
    (['d_model=16,16'], '16 is given twice'),
    (['dropout=0.5,1.5'], 'must be < 1, got 1.5'),
    (['d_model=16,32', '--metric', 'loss.vald'], "did you mean 'loss.valid'?"),
    (['d_model=16,32', '--trials', '3'], '--trials is for --sampler random|tpe'),
    (['d_model=16,32', '--workers', '0'], '--workers must be ≥ 1'),
    (['d_model=16,32', '--study', 'a b'], '--study'),
    (['d_model=16,32', '--sampler', 'grdi'], "invalid choice: 'grdi'"),
    (['d_model=16,32', 'd_model=8'], 'd_model is given twice'),
    (['d_model=16,32', '--launcher', ''], '--launcher is empty'),
    (['d_model=16,32', '--launcher', '/no/such/torchrun --standalone'],
     "--launcher '/no/such/torchrun --standalone': no program '/no/such/torchrun' (not on PATH, or not executable)"),
    (['d_model=16,32', '--launcher', "torchrun '--standalone"], "--launcher \"torchrun '--standalone\": No closing"),
], ids=['unknown key', 'misspelt option', 'unknown sub-config key', 'bad range', 'zip lengths', 'zip unswept',
        'interval on grid', 'interval without trials', 'empty interval', 'glob', 'duplicate', 'constraint',
        'metric', 'trials on grid', 'workers', 'study name', 'sampler', 'key twice', 'empty launcher',
        'launcher not found', 'launcher quote'])
def test_a_bad_sweep_is_one_error_line_and_writes_nothing(tmp_path, capsys, args, message):
    runs = tmp_path / 'runs'
    assert cli.main(['sweep', 'transformer', *args, f'runs_dir={runs}']) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('lazylab: error: ') and message in err[0], captured.err
    assert captured.out == '' and not runs.exists()


@pytest.mark.parametrize('args, message', [
    (['prompt=he', 'text={tmp}/ok.txt,{tmp}/missing.txt'],
     'grid point 2 of 2 (text={tmp}/missing.txt): text file not found: {tmp}/missing.txt'),
    (['d_model=16,30', 'heads=2,4'], "grid point 4 of 4 (d_model=30 heads=4): transformer.encoder_attn: option 'mha' "
                                     "failed: ValueError: MultiHeadAttention: d_model=30 is not divisible by heads=4"),
    (['prompt=he', 'text={tmp}/ok.txt,{tmp}/missing.txt', 'seed=range(0,3)', '--sampler', 'random', '--trials', '2'],
     'text={tmp}/missing.txt (the other swept keys at their first values): text file not found: {tmp}/missing.txt'),
    (['d_model=tag(log, interval(16, 10000000))', '--trials', '2'],
     'd_model=10000000: the run needs at least 1.6 PB of memory, more than the '),
], ids=['a missing text', 'a grid point whose heads do not divide d_model', 'a value for the sampler',
        'the end of an interval'])
def test_every_point_of_a_sweep_is_checked_before_anything_is_written(tools, tmp_path, capsys, args, message):
    (tmp_path / 'ok.txt').write_text('hello world, ' * 200)
    runs = tmp_path / 'runs'
    sizes = [t for t in tools.TINY if t.split('=')[0] not in {a.split('=')[0] for a in args}]
    argv = ['sweep', 'transformer', *sizes, *(a.format(tmp=tmp_path) for a in args), f'runs_dir={runs}']
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f'lazylab: error: {message.format(tmp=tmp_path)}') and \
        captured.err.count('\n') == 1, captured.err
    assert captured.out == '' and not runs.exists()


@pytest.mark.parametrize('storage, message', [
    ('folder', '--storage {path} is a folder; give a journal file or a database URL'),
    ('notes.txt', 'cannot open the study storage {path}: not an Optuna journal file'),
    ('binary.journal', 'cannot open the study storage {path}: not an Optuna journal file'),
], ids=['a folder', 'a text file', 'a binary file'])
def test_a_storage_that_is_not_a_journal_file_is_one_error_line_and_writes_nothing(tmp_path, capsys, storage,
                                                                                   message):
    runs = tmp_path / 'runs'
    (tmp_path / 'folder').mkdir()
    (tmp_path / 'notes.txt').write_text('my notes, not a journal\n')
    (tmp_path / 'binary.journal').write_bytes(b'\x80\x02 not a journal')
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    path = tmp_path / storage
    assert cli.main(['sweep', 'transformer', 'd_model=16,32', '--storage', str(path), f'runs_dir={runs}']) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == 'lazylab: error: ' + message.format(path=path) and captured.out == ''
    assert not runs.exists() and {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_the_threads_a_sweep_reports_are_the_ones_its_trials_use(tmp_path):
    from lazylab.sweeps.sweep import Sweep, make_plan
    given = Sweep(make_plan(['transformer', 'd_model=16,32', 'threads=3', f'runs_dir={tmp_path}']))
    assert given.threads() == 3 and 'threads=3' in given.plan.fixed  # the trials' own setting, unchanged
    two = Sweep(make_plan(['transformer', 'd_model=16,32', '--workers', '2', f'runs_dir={tmp_path}']))
    from lazylab.experiments.transformer import Configs
    cores, default = len(os.sched_getaffinity(0)), Configs().threads
    assert two.threads() == (min(max(1, cores // 2), default) if default > 0 else max(1, cores // 2))
    assert not any(tmp_path.iterdir())


def test_a_study_of_another_sweep_is_refused_and_nothing_is_written(tmp_path, capsys):
    journal = tmp_path / 'shared.journal'
    tiny = ['n_keys=4', 'max_steps=2', 'valid_interval=1', 'threads=1', 'device=cpu', '--study', 'glu',
            '--storage', str(journal)]
    first = tmp_path / 'runs'
    assert cli.main(['sweep', 'retrieval', 'update_rule=sum', 'nu=1,2', *tiny, f'runs_dir={first}']) == 0
    sweep = first / 'retrieval' / 'sweep-glu'
    before = sorted(str(p.relative_to(sweep)) for p in sweep.rglob('*'))
    capsys.readouterr()
    for runs in (first, tmp_path / 'other'):  # the same folder, and another machine's runs folder
        assert cli.main(['sweep', 'retrieval', 'update_rule=sum', 'nu=1,3', *tiny, f'runs_dir={runs}']) == 2
        assert capsys.readouterr().err == 'lazylab: error: study glu holds another sweep (space differ); give ' \
                                          'another --study name\n'
    assert sorted(str(p.relative_to(sweep)) for p in sweep.rglob('*')) == before
    assert not (tmp_path / 'other').exists()


def test_resume_of_a_folder_that_is_not_a_sweep_is_an_error(tmp_path, capsys):
    assert cli.main(['sweep', '--resume', str(tmp_path)]) == 2
    assert 'is not a sweep directory' in capsys.readouterr().err


@pytest.mark.parametrize('content', [b'argv: [1\n', b'\xff\xfe', b'- 1\n', b'study: x\n'],
                         ids=['not YAML', 'not UTF-8', 'a list', 'no argv'])
def test_resume_of_a_sweep_whose_sweep_yaml_is_damaged_is_an_error(tmp_path, capsys, content):
    sweep = tmp_path / 'transformer' / 'sweep-x'
    sweep.mkdir(parents=True)
    (sweep / 'sweep.yaml').write_bytes(content)
    assert cli.main(['sweep', '--resume', str(sweep)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f'lazylab: error: {sweep / "sweep.yaml"} is damaged (no command and study recorded)\n'
    assert [p.name for p in sweep.iterdir()] == ['sweep.yaml']


def _lock_is_free(path: Path) -> bool:
    import fcntl
    with open(path, 'a') as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob('*'))
            if p.is_file() and p.name != '.lock'}


def test_sigkill_of_the_sweep_then_resume_runs_every_point_once(tools, tmp_path):
    # the swept key is each trial's time budget: the second trial trains for 6 s, long enough to be killed between
    # two checkpoints on any machine; the others for 1–2 s
    sizes = [t for t in tools.TINY if not t.startswith(('max_minutes=', 'max_steps=', 'valid_interval='))]
    args = ['sweep', 'transformer', *sizes, 'max_steps=0', 'epochs=1000', 'valid_interval=5',
            'max_minutes=0.02,0.1,0.03', f'runs_dir={tmp_path}', '--workers', '1']
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', *args], env=tools.ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline, killed, dirs = time.monotonic() + 180, False, []
    while time.monotonic() < deadline and proc.poll() is None:
        dirs = list((tmp_path / 'transformer').glob('sweep-*'))
        second = dirs[0] / 'trial-0001' if dirs else None
        if second is not None and (second / 'checkpoint.pt').exists() and (second / 'metrics.jsonl').exists():
            first = json.loads((dirs[0] / 'trial-0000' / 'trial.json').read_text())
            steps = [r['step'] for r in read_metrics(second / 'metrics.jsonl')]
            if first.get('state') == 'completed' and steps and steps[-1] >= 5:
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
        time.sleep(0.02)
    out = proc.communicate(timeout=60)[0]
    assert killed, out
    d = dirs[0]
    deadline = time.monotonic() + 30  # the trial process dies with its sweep (PR_SET_PDEATHSIG)
    while not _lock_is_free(d / 'trial-0001' / '.lock'):
        assert time.monotonic() < deadline, 'the trial outlived its sweep'
        time.sleep(0.1)
    assert json.loads((d / 'trial-0001' / 'run.json').read_text())['status'] == 'running'  # it was killed
    assert not (d / 'trial-0002').exists()
    # its process is gone: compare says so (the sweep's lock is free)
    assert {row['trial']: row['status'] for row in compare.compare([str(d)]).rows} == \
        {'0000': 'completed', '0001': 'interrupted'}
    done_before = _files(d / 'trial-0000')
    assert len(list((d / '.owners').iterdir())) == 1  # the killed sweep's lock file: the resume takes over through it
    checkpoint_step = __import__('torch').load(d / 'trial-0001' / 'checkpoint.pt',
                                               weights_only=True)['position']['step']

    args = tools.tiny(readme(tools, 'lazylab sweep --resume runs/transformer/sweep-ID'), tmp_path, sweep_dir=str(d))
    resumed = tools.lazylab(args)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.splitlines()[0].startswith(f'sweep {d}:')
    progress = resumed.stdout.split('lazylab compare')[0]
    assert 'trial 0001 resumed' in progress and 'trial 0000' not in progress
    assert _files(d / 'trial-0000') == done_before  # a completed trial is untouched
    study = journal_study(d)
    assert [t.state.name for t in study.trials] == ['COMPLETE'] * 3
    assert [t.params['max_minutes'] for t in study.trials] == [0.02, 0.1, 0.03]  # every point, once
    second = json.loads((d / 'trial-0001' / 'trial.json').read_text())
    assert [a['how'] for a in second['attempts']] == ['started', 'resumed'] and second['state'] == 'completed'
    assert f'resuming {d / "trial-0001"} from its checkpoint' in (d / 'trial-0001' / 'output.log').read_text()
    # continued from the checkpoint: the steps after it are logged once, the run ends where its budget says
    records = read_metrics(d / 'trial-0001' / 'metrics.jsonl')
    steps = [r['step'] for r in records]
    assert steps == sorted(set(steps)) and steps[-1] == json.loads((d / 'trial-0001' / 'run.json').read_text())[
        'steps'] > checkpoint_step
    assert json.loads((d / 'trial-0002' / 'trial.json').read_text())['attempts'][0]['how'] == 'started'
    assert not list((d / '.owners').iterdir())  # the dead owner's lock file went with its last trial, and the resume's


def test_resuming_a_sweep_again_and_again_leaves_no_lock_files(tools, tmp_path):
    rc, out = run_in_process(['sweep', 'transformer', *tools.TINY, 'seed=0,1', f'runs_dir={tmp_path}'])
    assert rc == 0, out
    d, = (tmp_path / 'transformer').glob('sweep-*')
    counts = [len(list((d / '.owners').iterdir()))]
    for _ in range(2):
        rc, out = run_in_process(['sweep', '--resume', str(d)])
        assert rc == 0 and '2 trials; keys that differ: 1' in out, out
        counts.append(len(list((d / '.owners').iterdir())))
    assert counts == [0, 0, 0]  # each process removed its own when it ended (it used to leave one per resume)


def _two_sweeps(tools, command: str, tmp_path: Path, **replace) -> Path:
    """The README's multi-machine command run twice at once (as two machines would, here on one runs folder)."""
    args = tools.tiny(command, tmp_path, **replace)
    procs = [subprocess.Popen([sys.executable, '-m', 'lazylab.cli', *args], env=tools.ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    started = [[w[2] for w in (line.split() for line in out.splitlines()) if len(w) > 3 and w[3] == 'started']
               for out in outs]
    assert sorted(started[0] + started[1]) == ['0000', '0001', '0002', '0003'], outs  # the union, no duplicates
    d = tmp_path / 'transformer' / 'sweep-glu'
    assert grid_points(d) == GRID
    return d


def test_two_sweeps_on_one_journal_file_split_the_grid(tools, tmp_path):
    journal = tmp_path / 'shared' / 'glu.journal'
    journal.parent.mkdir()
    d = _two_sweeps(tools, readme(tools, GRID_COMMAND + ' --storage /shared'), tmp_path, journal=str(journal))
    import optuna
    from optuna.storages.journal import JournalFileBackend
    study = journal_study(d, optuna.storages.JournalStorage(JournalFileBackend(str(journal))))
    assert [t.state.name for t in study.trials] == ['COMPLETE'] * 4
    assert sorted((t.params[SWEPT[0]], t.params[SWEPT[1]]) for t in study.trials) == GRID


def test_two_sweeps_on_one_postgresql_study_split_the_grid(tools, tmp_path, postgres_url):
    d = _two_sweeps(tools, readme(tools, GRID_COMMAND + ' --storage postgresql'), tmp_path, postgres=postgres_url)
    from lazylab.sweeps.study import open_storage
    study = journal_study(d, open_storage(postgres_url))
    assert [t.state.name for t in study.trials] == ['COMPLETE'] * 4
    assert sorted((t.params[SWEPT[0]], t.params[SWEPT[1]]) for t in study.trials) == GRID
    assert yaml.safe_load((d / 'sweep.yaml').read_text())['storage_url'] == postgres_url


def test_median_pruner_stops_a_much_worse_trial_early(tools, tmp_path):
    sizes = [t for t in tools.TINY if not t.startswith(('max_steps=', 'batch_size=', 'seq_len='))]
    rc, out = run_in_process(['sweep', 'transformer', *sizes, 'max_steps=20', 'batch_size=8', 'seq_len=32',
                              'optimizer.warmup=1', 'optimizer.learning_rate=0.03,0.01,1e-7', '--prune', 'median',
                              f'runs_dir={tmp_path}'])
    assert rc == 0, out
    d = next((tmp_path / 'transformer').glob('sweep-*'))
    study = journal_study(d)
    assert [t.state.name for t in study.trials] == ['COMPLETE', 'COMPLETE', 'PRUNED']
    worse = d / 'trial-0002'
    steps = [r['step'] for r in read_metrics(worse / 'metrics.jsonl')]
    assert steps[-1] < 20 and json.loads((worse / 'run.json').read_text())['status'] == 'pruned'
    assert json.loads((worse / 'trial.json').read_text())['state'] == 'pruned'
    assert (worse / 'checkpoint.pt').is_file() and (worse / 'configs.yaml').is_file()  # its files are kept
    # reported at every validation until it was stopped, at the per-mille of its 20 steps; the pruned value is its
    # last one
    assert sorted(study.trials[2].intermediate_values) == [s * 1000 // 20 for s in steps if s % 2 == 0]
    assert study.trials[2].value == read_metrics(worse / 'metrics.jsonl')[-1]['loss.valid']
    assert 'trial 0002 pruned' in out


def test_every_readme_command_is_run_by_a_test(tools):
    commands = tools.readme_commands()
    for c in commands:
        assert any(c.startswith(start) for start in README_RUN_BY), f'no test runs the README command: {c}'
    for start, test in README_RUN_BY.items():
        file, _, name = test.rpartition('::')
        assert (f'def {name}(' in (Path(__file__).parent / file).read_text()) if file else test in globals(), test
        assert sum(c.startswith(start) for c in commands) == 1, start


def test_a_swept_key_may_be_the_unique_end_of_its_path_and_is_recorded_in_full(tools, tmp_path, capsys):
    args = ['sweep', 'transformer', 'ffn.glu_variant=GEGLU,SwiGLU', 'learning_rate=1e-3,1e-2',
            '--zip', 'ffn.glu_variant,learning_rate', *tools.TINY, f'runs_dir={tmp_path}',
            '--workers', '2', '--study', 'short']
    rc, out = run_in_process(args)
    assert rc == 0, out
    d = tmp_path / 'transformer' / 'sweep-short'
    assert out.splitlines()[0].startswith(f'sweep {d}: grid of 2 ({SWEPT[0]},{SWEPT[1]});')
    expected = {0: ('GEGLU', 0.001), 1: ('SwiGLU', 0.01)}
    for n, (glu, lr) in expected.items():
        trial = d / f'trial-{n:04d}'
        record = json.loads((trial / 'trial.json').read_text())
        assert record['params'] == {SWEPT[0]: glu, SWEPT[1]: lr}
        assert record['overrides'] == [f'{SWEPT[0]}={glu}', f'{SWEPT[1]}={"1e-3" if n == 0 else "1e-2"}']
        dump = yaml.safe_load((trial / 'configs.yaml').read_text())
        assert (dump['values'][SWEPT[0]], dump['values'][SWEPT[1]]) == (glu, lr)
        assert [k for k, v in dump['given'].items() if v == 'sweep'] == SWEPT
    assert [t.params for t in journal_study(d).trials] == [{SWEPT[0]: g, SWEPT[1]: lr} for g, lr in expected.values()]
    assert list(yaml.safe_load((d / 'sweep.yaml').read_text())['space']) == SWEPT
    assert yaml.safe_load((d / 'sweep.yaml').read_text())['zip'] == [SWEPT]
    assert compare.compare([str(d)]).keys == SWEPT


@pytest.mark.parametrize('args, message', [
    (['transformer', 'glu_varant=GEGLU,SwiGLU'], "glu_varant=GEGLU,SwiGLU: transformer has no config item "
                                                 "'glu_varant'; did you mean 'transformer.ffn.glu_variant'?"),
    (['transformer', 'dropout_prob=0.1,0.2'], "dropout_prob=0.1,0.2: transformer has no config item "
                                              "'dropout_prob'; did you mean 'dropout'?"),
    (['transformer', 'optimizer.lerning_rate=0.1,0.2'],
     "optimizer.lerning_rate=0.1,0.2: transformer has no config item 'optimizer.lerning_rate'; did you mean "
     "'optimizer.learning_rate' or 'optimizer.min_lr_ratio' or 'optimizer.weight_decay'?"),
    (['feedback', 'ffn=x,y'], "'ffn' is ambiguous: it could be feedback.ffn, feedback.ffn.ffn; give the full key"),
    (['transformer', 'ffn.glu_variant=GEGLU,SwiGLU', 'transformer.ffn.glu_variant=GEGLU'],
     'transformer.ffn.glu_variant is given twice: ffn.glu_variant=GEGLU,SwiGLU and transformer.ffn.glu_variant=GEGLU; '
     'give it once'),
    (['transformer', 'seed=choice(3)', '--trials', '3'],
     '--trials is for --sampler random|tpe; the grid runs its one point once'),
], ids=['an unknown end', 'an unknown top-level key', 'an unknown key of a sub-config', 'an ambiguous end',
        'a key given twice, short and in full', 'trials for a grid of one point'])
def test_an_unknown_or_ambiguous_swept_key_is_one_error_naming_the_experiment(tmp_path, capsys, args, message):
    runs = tmp_path / 'runs'
    assert cli.main(['sweep', *args, f'runs_dir={runs}']) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ('', f'lazylab: error: {message}\n') and not runs.exists()


def test_an_ambiguous_swept_key_is_the_error_train_gives(tmp_path, capsys):
    assert cli.main(['train', 'feedback', 'ffn=x', f'runs_dir={tmp_path}']) == 2
    train = capsys.readouterr().err
    assert cli.main(['sweep', 'feedback', 'ffn=x,y', f'runs_dir={tmp_path}']) == 2
    assert capsys.readouterr().err == train and not any(tmp_path.iterdir())


def test_sigterm_of_the_sweep_then_resume_records_the_runs_dir_as_given(tools, tmp_path):
    # from the folder the sweep was started in, with a relative runs_dir; 200 steps a trial, so that the SIGTERM
    # comes while the first two run (2 workers)
    sizes = [t for t in tools.TINY if not t.startswith('max_steps=')]
    args = ['sweep', 'transformer', 'seed=0,1,2', *sizes, 'max_steps=200', 'runs_dir=runs_sw2', '--workers', '2',
            '--study', 'term']
    d = tmp_path / 'runs_sw2' / 'transformer' / 'sweep-term'
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', *args], env=tools.ENV, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not (d / 'trial-0000' / 'run.json').exists():
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert json.loads((d / 'trial-0000' / 'trial.json').read_text())['state'] == 'interrupted', out + err
    assert (proc.returncode, err) == (143, 'lazylab: killed (SIGTERM); lazylab sweep --resume '
                                           'runs_sw2/transformer/sweep-term finishes the sweep\n')
    resumed = tools.lazylab(['sweep', '--resume', 'runs_sw2/transformer/sweep-term'], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert 'trial 0000 resumed' in resumed.stdout
    trials = sorted(d.glob('trial-*'))
    assert [json.loads((t / 'trial.json').read_text())['sweep'] for t in trials] == \
        ['runs_sw2/transformer/sweep-term'] * 3
    assert [yaml.safe_load((t / 'configs.yaml').read_text())['values']['runs_dir'] for t in trials] == \
        ['runs_sw2'] * 3
    assert compare.compare([str(d)]).keys == ['seed']
    for a, b in ((0, 1), (1, 2), (0, 2)):
        lines = tools.lazylab(['diff', str(trials[a]), str(trials[b])]).stdout.splitlines()
        assert lines[0].endswith(': 1 key differs') and [x.split()[:2] for x in lines[2:]] == [['seed', str(a)]], \
            lines
    # from another folder the sweep directory is found by the path given (nothing is left to run)
    (tmp_path / 'elsewhere').mkdir()
    again = tools.lazylab(['sweep', '--resume', str(d)], cwd=tmp_path / 'elsewhere')
    assert again.returncode == 0 and again.stdout.splitlines()[0] == \
        f'nothing to do: every trial of the sweep in {d} has ended (3 completed)', again.stderr
    assert 'trial 0' not in again.stdout.split('lazylab compare')[0]


@pytest.mark.parametrize('when', ['run.json', 'trial.json'], ids=['while a trial trains', 'while one starts'])
def test_ctrl_c_of_the_sweep_says_interrupted_and_exits_with_130(tools, tmp_path, when):
    # trial.json is written just before the trial's process is started: a Ctrl-C then waits until the process is
    # held (it used to be lost in the fork's hooks, and the sweep went on), and the trial is interrupted, not failed
    sizes = [t for t in tools.TINY if not t.startswith('max_steps=')]
    d = tmp_path / 'transformer' / 'sweep-int'
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', 'sweep', 'transformer', 'seed=0,1', *sizes,
                             'max_steps=200', f'runs_dir={tmp_path}', '--study', 'int'], env=tools.ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not (d / 'trial-0000' / when).exists():
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (130, f'lazylab: interrupted; lazylab sweep --resume {d} finishes the sweep\n')
    assert json.loads((d / 'trial-0000' / 'trial.json').read_text())['state'] == 'interrupted'
    assert out.splitlines()[-1].split()[1:4] == ['trial', '0000', 'interrupted'], out
    assert compare.compare_text([str(d)]).splitlines()[0] == f'lazylab compare {d}      (1 trial; keys that differ: 0)'


def test_a_sweep_of_one_trial_says_trial(tmp_path):
    rc, out = run_in_process(['sweep', 'retrieval', 'update_rule=sum', 'nu=1,2', 'n_keys=4', 'max_steps=2',
                              'valid_interval=1', 'threads=1', 'device=cpu', '--sampler', 'random', '--trials', '1',
                              f'runs_dir={tmp_path}', '--study', 'one'])
    assert rc == 0, out
    d = tmp_path / 'retrieval' / 'sweep-one'
    assert out.splitlines()[0].startswith(f'sweep {d}: 1 random trial (nu); 1 worker × 1 thread;'), out
    assert f'lazylab compare {d}      (1 trial; keys that differ: 0)' in out.splitlines()


def test_count_is_singular_for_one():
    assert [plural(n, 'trial') for n in (0, 1, 2, 1000)] == ['0 trials', '1 trial', '2 trials', '1,000 trials']
