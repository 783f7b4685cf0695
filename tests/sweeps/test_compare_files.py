"""`lazylab compare` and `lazylab diff` on run directories whose files are damaged or not what they expect: one
error line naming the file, or (for metrics.jsonl, whose torn lines are expected) the readable records only.

The run directories are written by hand (compare reads files only), so no training is needed."""
import json
import os
from pathlib import Path

import pytest

from lazylab import cli
from lazylab.runs import load_run
from lazylab.sweeps import compare

ROOT = Path(__file__).resolve().parents[2]


def make_run(folder: Path, d_model: int, losses: list[float]) -> Path:
    """A finished run directory as `lazylab train` leaves it, as far as compare reads it."""
    folder.mkdir(parents=True)
    (folder / 'run.json').write_text(json.dumps({'experiment': 'transformer', 'status': 'completed',
                                                 'parameters': 100 * d_model, 'steps': len(losses)}))
    (folder / 'configs.yaml').write_text(f'values:\n  d_model: {d_model}\n  seq_len: 16\n'
                                         f'given:\n  d_model: user\n  seq_len: user\n')
    (folder / 'metrics.jsonl').write_text(''.join(
        json.dumps({'step': i + 1, 'tokens': 64 * (i + 1), 'loss.valid': v, 'time': i + 1.0}) + '\n'
        for i, v in enumerate(losses)))
    return folder


@pytest.mark.parametrize('content', [b'\xff\xfe not utf-8', b'values: [1, 2\n', b'- 1\n- 2\n', b'values: [1]\n'],
                         ids=['not UTF-8', 'not YAML', 'a list', 'values not a mapping'])
def test_a_damaged_configs_yaml_is_a_diff_error_and_a_compare_warning_naming_it(tmp_path, cli_error, capsys,
                                                                               content):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    b = make_run(tmp_path / 'b', 32, [2.0, 1.4])
    (a / 'configs.yaml').write_bytes(content)
    assert cli_error(['diff', str(b), str(a)]) == f'{a / "configs.yaml"} is damaged (not a YAML ' \
                                                        f'configuration dump)'
    assert cli.main(['compare', str(a), str(b)]) == 0  # one damaged run of many must not hide the others
    captured = capsys.readouterr()
    assert _warnings(captured.err) == [f'lazylab: warning: {a / "configs.yaml"} is damaged (not a YAML configuration '
                                       f'dump); its settings are not shown']
    rows = {row['run']: row for row in compare.compare([str(a), str(b)]).rows}
    assert [(rows[f'{tmp_path.name}/{r}']['final'], rows[f'{tmp_path.name}/{r}']['status']) for r in 'ab'] == \
        [(1.5, 'damaged'), (1.4, 'completed')]


def test_diff_warns_of_a_damaged_run_json(tmp_path, capsys):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    b = make_run(tmp_path / 'b', 32, [2.0, 1.4])
    (a / 'run.json').write_text('{"status": "comp')
    assert cli.main(['diff', str(a), str(b)]) == 0
    captured = capsys.readouterr()
    assert _warnings(captured.err) == [f'lazylab: warning: {a / "run.json"} is damaged (not a JSON object); the '
                                       f'run\'s status is not known']
    assert captured.out.splitlines()[0] == f'lazylab diff {a} {b}: 1 key differs'


def test_unreadable_lines_of_metrics_jsonl_are_skipped(tmp_path):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    with open(a / 'metrics.jsonl', 'ab') as f:
        f.write(b'\xff\xfe\n[1]\n5\n{"step": 3, "loss.va')  # a byte that is not UTF-8, non-objects, a torn line
    table = compare.compare([str(a)])
    assert table.rows[0]['final'] == 1.5 and table.rows[0]['best'] == 1.5


def test_run_json_and_trial_json_that_are_not_objects_count_as_missing(tmp_path):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    b = make_run(tmp_path / 'b', 32, [2.0, 1.4])
    (a / 'run.json').write_text('[1, 2]')
    (b / 'trial.json').write_text('{"number": "x", "params": [1]}')
    rows = {row['run']: row for row in compare.compare([str(a), str(b)]).rows}
    assert rows[f'{tmp_path.name}/a']['params'] is None
    assert rows[f'{tmp_path.name}/b']['d_model'] == 32  # from configs.yaml; the trial's label is its folder's name


def test_a_damaged_sweep_yaml_is_one_error_line_naming_it(tmp_path, cli_error):
    sweep = tmp_path / 'sweep-x'
    make_run(sweep / 'trial-0000', 16, [2.0])
    (sweep / 'sweep.yaml').write_bytes(b'- not a mapping\n')
    assert cli_error(['compare', str(sweep)]) == f'{sweep / "sweep.yaml"} is damaged (not a YAML mapping)'


@pytest.mark.parametrize('flag, name, message', [
    ('--csv', 'folder', '--csv {out} is a folder; give a file name'),
    ('--csv', '', '--csv needs a file name'),
    ('--plot', 'folder', '--plot {out} is a folder; give a file name'),
    ('--plot', '', '--plot needs a file name'),
    ('--plot', 'table.txt', '--plot {out}: the file name must end in a figure format matplotlib writes'),
], ids=['csv folder', 'csv empty', 'plot folder', 'plot empty', 'plot format'])
def test_a_bad_output_file_is_an_error_before_anything_is_written(tmp_path, capsys, flag, name, message):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    out_dir = tmp_path / 'out'
    (out_dir / 'folder').mkdir(parents=True)
    out = str(out_dir / name) if name else ''
    good = ['--csv', str(out_dir / 'ok.csv')] if flag == '--plot' else ['--plot', str(out_dir / 'ok.png')]
    assert cli.main(['compare', str(a), flag, out, *good]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('lazylab: error: ' + message.format(out=out)), err
    assert captured.out == ''  # not even the table
    assert sorted(p.name for p in out_dir.iterdir()) == ['folder'] and not list((out_dir / 'folder').iterdir())


@pytest.mark.parametrize('name', ['run.json', 'configs.yaml', 'metrics.jsonl', 'checkpoint.pt'])
def test_compare_never_writes_its_csv_over_a_runs_own_file(tmp_path, cli_error, name):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    (a / 'checkpoint.pt').write_bytes(b'weights')
    before = (a / name).read_bytes()
    assert cli_error(['compare', str(a), '--csv', str(a / name)]) == (
        f'--csv {a / name} is a file of the run or sweep in {a}: writing there would destroy it; give another file '
        f'name')
    assert (a / name).read_bytes() == before


def test_compare_overwrites_an_existing_csv_but_no_other_file(tmp_path, cli_error, capsys):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    script = tmp_path / 'train.py'
    script.write_text('print("my experiment")\n')
    assert cli_error(['compare', str(a), '--csv', str(script)]) == (
        f'--csv {script} exists and is not a .csv file: refusing to overwrite it; give a new file name or a .csv one')
    assert script.read_text() == 'print("my experiment")\n'
    table = tmp_path / 'table.csv'
    table.write_text('old\n')
    assert cli.main(['compare', str(a), '--csv', str(table)]) == 0
    assert table.read_text().splitlines()[0].startswith('run,')


def test_compare_writes_a_pdf_when_asked(tmp_path, capsys):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    assert cli.main(['compare', str(a), '--plot', str(tmp_path / 'losses.pdf')]) == 0
    assert (tmp_path / 'losses.pdf').read_bytes()[:5] == b'%PDF-'


def test_a_run_named_twice_or_also_through_its_folder_is_one_row(tmp_path, capsys):
    a = make_run(tmp_path / 'runs' / 'transformer' / 'a', 16, [2.0, 1.5])
    b = make_run(tmp_path / 'runs' / 'transformer' / 'b', 32, [2.0, 1.4])
    table = compare.compare([str(a), str(tmp_path / 'runs' / 'transformer'), str(a / '..' / 'a')])
    assert [row['run'] for row in table.rows] == ['transformer/b', 'transformer/a']
    assert [r.path for r in table.runs] == [a, b]  # each as first named


@pytest.mark.parametrize('metric, message', [
    ('nometric', "--metric nometric: no run has it (the runs' metrics: loss.valid)"),
    ('loss.vaild', "--metric loss.vaild: no run has it; did you mean 'loss.valid'? (the runs' metrics: loss.valid)"),
], ids=['unknown', 'a typo'])
def test_a_metric_no_run_has_is_an_error_listing_the_runs_metrics(tmp_path, capsys, metric, message):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    b = make_run(tmp_path / 'b', 32, [2.0, 1.4])
    assert cli.main(['compare', str(a), str(b), '--metric', metric, '--csv', str(tmp_path / 'out.csv')]) == 2
    captured = capsys.readouterr()
    assert captured.err == f'lazylab: error: {message}\n'
    assert captured.out == '' and not (tmp_path / 'out.csv').exists()  # no table, no file


def test_a_metric_the_trainer_records_but_no_run_has_yet_is_a_column_of_dashes(tmp_path, cli_error):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'empty' / 'run.json').write_text('{"status": "running"}')  # started, nothing recorded yet
    table = compare.compare([str(a), str(tmp_path / 'empty')], metric='accuracy.valid')
    assert [row['final'] for row in table.rows] == [None, None]
    assert cli_error(['compare', str(tmp_path / 'empty'), '--metric', 'nometric']) == \
        '--metric nometric: no run has it (no run has recorded any yet; metrics: accuracy.train, accuracy.valid, ' \
        'loss.train, loss.valid, tokens_per_s)'


def _warnings(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith('lazylab: warning: ')]


def test_a_metrics_file_cut_off_mid_line_marks_the_run_damaged(tmp_path, capsys):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5, 1.2])
    data = (a / 'metrics.jsonl').read_bytes()
    (a / 'metrics.jsonl').write_bytes(data[:-12])  # a crash while the last record was written
    b = make_run(tmp_path / 'b', 32, [2.0, 1.4])
    assert cli.main(['compare', str(a), str(b)]) == 0
    captured = capsys.readouterr()
    assert _warnings(captured.err) == [f'lazylab: warning: {a / "metrics.jsonl"} is damaged: its last line is cut off '
                                       f'(a crash while it was written?); only its 2 whole records are read']
    rows = {row['run']: row for row in compare.compare([str(a), str(b)]).rows}
    assert (rows[f'{tmp_path.name}/a']['final'], rows[f'{tmp_path.name}/a']['status']) == (1.5, 'damaged')
    assert rows[f'{tmp_path.name}/b']['status'] == 'completed'


def test_lines_that_are_not_records_mark_the_run_damaged(tmp_path):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    with open(a / 'metrics.jsonl', 'ab') as f:
        f.write(b'\xff\xfe\n[1]\n{"step": 3, "loss.valid": 1.25}\n')
    t = compare.compare([str(a)])
    assert (t.rows[0]['final'], t.rows[0]['status']) == (1.25, 'damaged')
    assert t.warnings == [f'{a / "metrics.jsonl"} is damaged: 2 lines are not a JSON record; only its 3 whole records '
                          f'are read']


def test_a_run_json_that_is_not_json_marks_the_run_damaged(tmp_path, capsys):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    (a / 'run.json').write_text('{"status": "completed", "par')
    assert cli.main(['compare', str(a)]) == 0
    captured = capsys.readouterr()
    assert _warnings(captured.err) == [f'lazylab: warning: {a / "run.json"} is damaged (not a JSON object); the run\'s '
                                       f'status is not known']
    assert captured.out.splitlines()[2].split()[-1] == 'damaged'


def test_the_last_line_of_a_run_being_trained_is_not_damage(tmp_path):
    import fcntl
    import os
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5])
    (a / 'run.json').write_text(json.dumps({'experiment': 'transformer', 'status': 'running'}))
    with open(a / 'metrics.jsonl', 'ab') as f:
        f.write(b'{"step": 3, "loss.va')  # the trainer is writing this line now
    fd = os.open(a, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as lazylab.experiments.lifecycle.training_lock holds it while it trains
        t = compare.compare([str(a)])
        assert (t.rows[0]['status'], t.rows[0]['final'], t.warnings) == ('running', 1.5, [])
    finally:
        os.close(fd)
    t = compare.compare([str(a)])  # its process is gone: the cut-off line is damage now
    assert t.rows[0]['status'] == 'damaged' and len(t.warnings) == 1


def make_experiment_run(folder: Path, experiment: str, values: dict, given: dict, computed: dict) -> Path:
    run = make_run(folder, 16, [2.0, 1.5])
    (run / 'run.json').write_text(json.dumps({'experiment': experiment, 'status': 'completed'}))
    import yaml
    (run / 'configs.yaml').write_text(yaml.safe_dump({'values': values, 'given': given, 'computed': computed}))
    return run


def test_runs_of_two_experiments_show_the_experiment_and_the_keys_each_sets_itself(tmp_path, capsys):
    a = make_experiment_run(tmp_path / 'transformer' / 'r1', 'transformer',
                            {'d_model': 16, 'threads': 0, 'model': 'transformer', 'seq_len': 64,
                             'transformer.n_layers': 1},
                            {'d_model': 'user'},
                            {'threads': 'default', 'model': 'option transformer', 'seq_len': 'default',
                             'transformer.n_layers': 'assigned while computing transformer'})
    b = make_experiment_run(tmp_path / 'feedback' / 'r2', 'feedback',
                            {'d_model': 16, 'threads': 1, 'model': 'feedback_transformer_kv', 'seq_len': 64,
                             'feedback.n_layers': 2},
                            {'d_model': 'user'},
                            {'threads': 'default', 'model': 'option feedback_transformer_kv', 'seq_len': 'default',
                             'feedback.n_layers': 'set_default func while computing feedback'})
    assert cli.main(['compare', str(tmp_path / 'feedback'), str(tmp_path / 'transformer')]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith('(2 runs; keys that differ: 2; 2 more keys only some of the 2 experiments have: lazylab '
                           'diff lists them)')
    assert out[1].split() == ['run', 'experiment', 'model', 'threads', 'loss.valid', 'best', 'steps', 'tok/s',
                              'MFU', 'params', 'time', 'status']  # (the keys in the first run's dump order)
    assert [x.split()[1:4] for x in out[2:4]] == [['feedback', 'feedback_transformer_kv', '1'],
                                                 ['transformer', 'transformer', '0']]
    # within one experiment the defaults are the same for every run: only given keys count, and no column is added
    c = make_experiment_run(tmp_path / 'transformer' / 'r3', 'transformer',
                            {'d_model': 32, 'threads': 0, 'model': 'transformer', 'seq_len': 64,
                             'transformer.n_layers': 1}, {'d_model': 'user'},
                            {'threads': 'default', 'model': 'option transformer', 'seq_len': 'default'})
    t = compare.compare([str(a), str(c)])
    assert (t.keys, t.columns[:2], t.only_some) == (['d_model'], ['run', 'd_model'], [])
    assert cli.main(['diff', str(a), str(b)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(': 4 keys differ')  # threads, model and the two of one


def test_plot_of_a_metrics_file_cut_off_mid_line_warns_and_draws_the_whole_records(tmp_path, capsys):
    a = make_run(tmp_path / 'a', 16, [2.0, 1.5, 1.2])
    data = (a / 'metrics.jsonl').read_bytes()
    (a / 'metrics.jsonl').write_bytes(data[:-12])  # a crash while the last record was written
    out = tmp_path / 'loss.png'
    assert cli.main(['plot', str(a), '-o', str(out)]) == 0
    assert capsys.readouterr().err.splitlines() == [f'lazylab: warning: {a / "metrics.jsonl"} is damaged: its last '
                                                    f'line is cut off (a crash while it was written?); only its 2 '
                                                    f'whole records are read']
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


#: a process that trains a run as far as its lock goes: it holds the run's training lock (an flock on the folder, as
#: lazylab.experiments.lifecycle.training_lock) and says so, then waits to be killed
HOLD_TRAINING_LOCK = """
import sys
from lazylab.locks import exclusive_lock
with exclusive_lock(sys.argv[1]):
    print('locked', flush=True)
    sys.stdin.read()
"""


@pytest.mark.parametrize('checkpoint', [True, False], ids=['with a checkpoint', 'without one'])
def test_a_run_whose_process_was_killed_is_dead_not_running_and_says_how_to_go_on(tmp_path, capsys, checkpoint):
    import signal
    import subprocess
    import sys
    a = make_run(tmp_path / 'transformer' / 'a', 16, [2.0, 1.5])
    (a / 'run.json').write_text(json.dumps({'experiment': 'transformer', 'status': 'running'}))
    if checkpoint:
        (a / 'checkpoint.pt').write_bytes(b'weights')
    trainer = subprocess.Popen([sys.executable, '-c', HOLD_TRAINING_LOCK, str(a)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    try:
        assert trainer.stdout.readline() == 'locked\n'  # (waits until it holds the lock)
        assert compare.compare([str(a)]).rows[0]['status'] == 'running'
    finally:
        trainer.kill()  # SIGKILL: nothing is recorded; the kernel drops the lock
        trainer.wait(timeout=60)
    assert trainer.returncode == -signal.SIGKILL
    assert cli.main(['compare', str(a)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].split()[-1] == 'dead'
    then = f'lazylab resume {a} continues it from its last checkpoint' if checkpoint else \
        (f'it wrote no checkpoint, so lazylab resume cannot continue it (lazylab train with --config '
         f'{a / "configs.yaml"} starts it again with its settings)')
    assert out[3:] == [f'run transformer/a is dead: its process is gone without recording how it ended (killed by '
                       f'SIGKILL or out of memory?); {then}']
    # a lazylab labml run holds no training lock: its status is what run.json says
    (a / 'run.json').write_text(json.dumps({'experiment': 'mnist', 'status': 'running', 'labml_run': 'labml/x'}))
    assert compare.compare([str(a)]).rows[0]['status'] == 'running'


def test_a_run_json_that_is_garbage_names_no_experiment_and_counts_as_none(tmp_path, capsys):
    t1 = make_run(tmp_path / 'runs' / 'transformer' / 'r1', 16, [2.0, 1.5])
    t2 = make_run(tmp_path / 'runs' / 'transformer' / 'r2', 32, [2.0, 1.4])
    (t2 / 'run.json').write_text('garbage{')
    assert load_run(t2).experiment is None
    assert cli.main(['compare', str(t1), str(t2)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith('(2 runs; keys that differ: 1)') and 'experiment' not in out[1].split()
    # a trial's: its sweep's experiment, as sweep.yaml records it (not the folder above the sweep: here `runs`)
    sweep = tmp_path / 'runs' / 'sweep-x'
    trial = make_run(sweep / 'trial-0000', 64, [2.0, 1.3])
    (trial / 'trial.json').write_text(json.dumps({'number': 0, 'state': 'completed', 'sweep': str(sweep)}))
    (trial / 'run.json').write_text('garbage{')
    (sweep / 'sweep.yaml').write_text('experiment: transformer\nmetric: loss.valid\ndirection: minimize\n')
    assert load_run(trial).experiment == 'transformer'
    t = compare.compare([str(sweep), str(t1)])
    assert 'experiment' not in t.columns and len(t.rows) == 2
    # among runs of two experiments, the damaged one shows none and the header counts two
    f = make_experiment_run(tmp_path / 'runs' / 'feedback' / 'r3', 'feedback', {'d_model': 16, 'n': 1},
                            {'d_model': 'user', 'n': 'user'}, {})
    assert cli.main(['compare', str(t1), str(t2), str(f)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith('(3 runs; keys that differ: 1; 2 more keys only some of the 2 experiments have: lazylab '
                           'diff lists them)'), out[0]
    assert sorted(line.split()[1] for line in out[2:5]) == ['feedback', 'transformer', '—']


@pytest.mark.parametrize('record, name', [('experiment: ./my_exp.py\n', 'my_exp'), ('experiment: pkg.conv\n', 'conv'),
                                          ('experiment: pkg.mnist\nlabml: true\n', 'pkg.mnist'), ('metric: x\n', None)],
                         ids=['a file', 'a module', 'a labml script', 'none recorded'])
def test_a_trial_without_its_run_json_is_named_as_its_sweep_names_its_runs(tmp_path, record, name):
    sweep = tmp_path / 'elsewhere' / 'sweep-x'
    trial = sweep / 'trial-0000'
    trial.mkdir(parents=True)
    (trial / 'trial.json').write_text(json.dumps({'number': 0, 'state': 'failed', 'error': 'x'}))  # (never started)
    (sweep / 'sweep.yaml').write_text(record)
    assert load_run(trial).experiment == name
