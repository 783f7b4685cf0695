"""Planning a sweep (issue 24): every key a user can set is sweepable; many points are checked fast and as
strictly as one at a time, with progress; a signal while they are checked is one line; `--dry-run`; `--workers` at
most the trials left."""
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lazylab import cli
from lazylab.sweeps import points as points_module
from lazylab.sweeps.grammar import Space, parse_value
from lazylab.sweeps.plan import make_plan
from lazylab.sweeps.points import PointChecker
from lazylab.sweeps.typed import check_points, type_space

TINY_RETRIEVAL = ['max_steps=2', 'valid_interval=1', 'threads=1', 'device=cpu', 'update_rule=sum']


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob('*'))


# --- keys other values are computed from ------------------------------------------------------------------------

@pytest.mark.parametrize('name, settings, key, expected', [
    ('transformer', ['seq_len=8,16'], 'seq_len', {'8': {'seq_len': 8}, '16': {'seq_len': 16}}),
    ('transformer', ['seq_len_start=4,8', 'seq_len_warmup=2', 'seq_len=16'], 'seq_len_start',
     {'4': {'seq_len_start': 4, 'seq_len': 16}, '8': {'seq_len_start': 8, 'seq_len': 16}}),
    ('retrieval', ['n_keys=4,8', *TINY_RETRIEVAL], 'n_keys', {'4': {'n_keys': 4, 'seq_len': 4},
                                                             '8': {'n_keys': 8, 'seq_len': 8}}),
    ('retrieval', ['replace=true,false', 'n_keys=4', *TINY_RETRIEVAL], 'replace',
     {'true': {'replace': True, 'seq_len': 8}, 'false': {'replace': False, 'seq_len': 4}}),
], ids=['seq_len', 'seq_len_start', 'n_keys', 'replace'])
def test_a_key_other_values_are_computed_from_can_be_swept(tmp_path, name, settings, key, expected):
    plan = make_plan([name, *settings, f'runs_dir={tmp_path}'])
    assert [p[key] for p in plan.points] == [v[key] for v in expected.values()]
    # each point's configuration is a fresh one, computed with its own value (and what follows from it)
    fixed = [s for s in settings if not s.startswith(f'{key}=')]
    checker = PointChecker(name, fixed, [key])
    for text, values in expected.items():
        conf = checker.check({key: text})
        assert {k: getattr(conf, k) for k in values} == values
    assert not any(tmp_path.iterdir())


def test_a_sweep_of_seq_len_trains_each_trial_at_its_length(tools, tmp_path, capsys):
    sizes = [t for t in tools.TINY if not t.startswith('seq_len=')]
    assert cli.main(['sweep', 'transformer', *sizes, 'seq_len=8,16', f'runs_dir={tmp_path}', '--study', 'len']) == 0
    d = tmp_path / 'transformer' / 'sweep-len'
    for trial, length in (('trial-0000', 8), ('trial-0001', 16)):
        dump = yaml.safe_load((d / trial / 'configs.yaml').read_text())
        assert dump['values']['seq_len'] == length and dump['given']['seq_len'] == 'sweep'
        assert json.loads((d / trial / 'run.json').read_text())['status'] == 'completed'
    assert 'seq_len' in capsys.readouterr().out.splitlines()[0]


# --- many points: fast, and as strict as one at a time -----------------------------------------------------------

def _space(name: str, fixed: list[str], settings: list[str]) -> tuple[Space, PointChecker]:
    dims = []
    for s in settings:
        key, _, text = s.partition('=')
        d = parse_value(key, text)
        d.key = key
        dims.append(d)
    checker = PointChecker(name, fixed, [d.key for d in dims])
    type_space(name, fixed, dims, checker)
    return Space(dims), checker


def test_points_that_differ_only_in_keys_nothing_is_computed_from_are_computed_once():
    lrs = ','.join(f'{(i + 1) * 1e-4:.4g}' for i in range(20))
    decays = ','.join(f'{i * 0.01:.2g}' for i in range(15))
    space, checker = _space('transformer', ['device=cpu'], [f'optimizer.learning_rate={lrs}',
                                                            f'optimizer.weight_decay={decays}'])
    check_points('transformer', ['device=cpu'], space, grid=True, checker=checker)
    assert (checker.computed, checker.skipped) == (1, 299)


def test_the_dataset_is_read_once_and_the_model_built_once_per_width():
    space, checker = _space('transformer', ['device=cpu', 'n_layers=1'], ['d_model=16,32', 'seed=0,1,2'])
    check_points('transformer', ['device=cpu', 'n_layers=1'], space, grid=True, checker=checker)
    assert checker.computed == 6  # the seed decides the task's data order: each point is computed
    assert list(checker.objects['dataset']) == [()]  # one, for every point
    models = checker.objects['model']
    assert sorted(models) == [(('d_model', '16'),), (('d_model', '32'),)]
    assert {f[0][1]: models[f].generator.projection.in_features for f in models} == {'16': 16, '32': 32}


def test_an_aggregate_that_selected_nothing_at_the_first_point_still_follows_its_selector():
    # glu_variant=none selects no aggregate (the activation is then its default, ReLU, and the selector is not
    # read); the GEGLU point's activation must be GELU, not the first point's ReLU, in its model too
    import torch
    checker = PointChecker('transformer', ['device=cpu', 'n_layers=1', 'd_model=16'], ['transformer.ffn.glu_variant'])
    kinds = {'none': torch.nn.ReLU, 'GEGLU': torch.nn.GELU, 'SwiGLU': torch.nn.SiLU}
    for text, kind in kinds.items():
        conf = checker.check({'transformer.ffn.glu_variant': text})
        assert isinstance(conf.transformer.ffn.activation, kind)
        assert {type(m) for m in conf.model.modules()} & set(kinds.values()) == {kind}
    assert checker.computed == 3


def test_a_point_bad_only_in_its_combination_of_values_is_found(tools, tmp_path, capsys):
    # each value is fine on its own and with the first point's others; only seq_len_start=32 with seq_len=8 is not
    runs = tmp_path / 'runs'
    sizes = [t for t in tools.TINY if not t.startswith('seq_len=')]
    assert cli.main(['sweep', 'transformer', *sizes, 'seq_len_warmup=2', 'seq_len_start=4,32', 'seq_len=64,8',
                     f'runs_dir={runs}']) == 2
    assert capsys.readouterr().err == ('lazylab: error: grid point 4 of 4 (seq_len_start=32 seq_len=8): '
                                       'seq_len_start=32 is longer than seq_len=8; the warm-up grows the length '
                                       'from seq_len_start to seq_len\n')
    assert not runs.exists()


def test_checking_many_points_says_how_far_it_got(tmp_path, monkeypatch):
    monkeypatch.setattr(points_module, 'PROGRESS_EVERY', 0.0)  # a line before every point
    lines: list[str] = []
    plan = make_plan(['transformer', 'd_model=16', 'n_layers=1', 'seed=range(0,1200)', f'runs_dir={tmp_path}'],
                     say=lines.append)
    assert len(plan.points) == 1200
    assert lines == [f'checking point {i:,} of 1,199…' for i in range(1, 1200)]  # the first is typed, then these


@pytest.mark.parametrize('sig, code, how', [(signal.SIGTERM, 143, 'killed (SIGTERM)'),
                                            (signal.SIGINT, 130, 'interrupted')], ids=['SIGTERM', 'SIGINT'])
def test_a_signal_while_the_points_are_checked_is_one_line_and_writes_nothing(tools, tmp_path, sig, code, how):
    # 3,000 points that each compute their task (the seed orders its data): long enough to be stopped midway
    runs = tmp_path / 'runs'
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', 'sweep', 'transformer', 'd_model=16',
                             'n_layers=1', 'seed=range(0,3000)', f'runs_dir={runs}'], env=tools.ENV, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()  # the first progress line: the points are being checked
    assert first.startswith('checking point '), first
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert err == f'lazylab: {how} while the sweep was being checked; nothing was written\n'
    assert out == '' and _tree(tmp_path) == []


# --- --dry-run ---------------------------------------------------------------------------------------------------

def test_a_dry_run_prints_every_point_typed_the_study_and_the_storage_and_writes_nothing(tmp_path, capsys,
                                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / 'runs'
    journal = tmp_path / 'shared.journal'
    args = ['sweep', 'transformer', 'ffn.glu_variant=GEGLU,SwiGLU', 'learning_rate=1e-3,3e-3', 'n_layers=1',
            f'runs_dir={runs}', '--study', 'glu', '--storage', str(journal), '--dry-run']
    assert cli.main(args) == 0
    assert capsys.readouterr().out.splitlines() == [
        'lazylab sweep transformer --dry-run: every point checked; nothing written',
        '4 points (the grid, in the order they run):',
        "  trial 0000  transformer.ffn.glu_variant='GEGLU' optimizer.learning_rate=0.001",
        "  trial 0001  transformer.ffn.glu_variant='GEGLU' optimizer.learning_rate=0.003",
        "  trial 0002  transformer.ffn.glu_variant='SwiGLU' optimizer.learning_rate=0.001",
        "  trial 0003  transformer.ffn.glu_variant='SwiGLU' optimizer.learning_rate=0.003",
        f'every trial: n_layers=1 runs_dir={runs}',
        'study: glu; sampler grid, 4 trials, metric loss.valid (minimize), no pruning',
        f'storage: journal file {journal}',
        f'sweep directory: {runs / "transformer" / "sweep-glu"} (not made)']
    assert _tree(tmp_path) == []  # not the runs folder, not the journal


def test_a_dry_run_of_a_sampler_prints_the_space_it_draws_from(tmp_path, capsys):
    assert cli.main(['sweep', 'transformer', 'optimizer.learning_rate=tag(log, interval(1e-4, 3e-2))',
                     'heads=choice(1,2,4)', 'seq_len=range(8,24,8)', '--trials', '5', '--prune', 'median',
                     f'runs_dir={tmp_path}', '--dry-run']) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:5] == ['5 trials, each drawn by the tpe sampler (seed 0) from:',
                        '  optimizer.learning_rate: log-uniform in [0.0001, 0.03] (float)',
                        '  heads: one of 1, 2, 4',
                        '  seq_len: one of 8, 16']
    assert out[6].startswith('study: ') and out[6].endswith(
        '(made of the start time: give --study to choose one); sampler tpe, 5 trials, metric loss.valid (minimize), '
        'pruning median')
    assert out[7] == f'storage: journal file {out[8].split()[2]}/study.journal'
    assert not any(tmp_path.iterdir())


def test_a_dry_run_checks_the_whole_plan(tmp_path, capsys):
    assert cli.main(['sweep', 'transformer', 'd_model=16,30', 'heads=2,4', f'runs_dir={tmp_path}', '--dry-run']) == 2
    assert capsys.readouterr().err.startswith('lazylab: error: grid point 4 of 4 (d_model=30 heads=4): ')


# --- workers -----------------------------------------------------------------------------------------------------

def test_workers_are_at_most_the_trials_left_and_more_than_the_cores_is_a_warning(tools, tmp_path, capsys,
                                                                                  monkeypatch):
    import lazylab.sweeps.launcher as launcher_module
    monkeypatch.setattr(launcher_module, 'cores', lambda: 1)  # (the warning, whatever this machine's cores)
    assert cli.main(['sweep', 'transformer', *tools.TINY, 'seed=0,1', '--workers', '100000',
                     f'runs_dir={tmp_path}', '--study', 'w']) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith(f'sweep {tmp_path / "transformer" / "sweep-w"}: grid of 2 (seed); '
                                                   f'2 workers × 1 thread;')
    assert captured.err == ('lazylab: warning: 2 workers (--workers 100000, at most one per trial left) on 1 CPU '
                            'core: the trials share them and each runs slower\n')
    started = [line.split()[2] for line in captured.out.splitlines() if line.split()[3:4] == ['started']]
    assert sorted(started) == ['0000', '0001']


def test_the_workers_warning_names_the_cores_and_what_was_asked(monkeypatch):
    from types import SimpleNamespace

    import lazylab.sweeps.launcher as launcher_module
    monkeypatch.setattr(launcher_module, 'cores', lambda: 4)
    assert launcher_module.workers_line(SimpleNamespace(workers=100), 4) is None
    assert launcher_module.workers_line(SimpleNamespace(workers=8), 8) == \
        'lazylab: warning: 8 workers on 4 CPU cores: the trials share them and each runs slower'
    assert launcher_module.workers_line(SimpleNamespace(workers=100), 6) == \
        'lazylab: warning: 6 workers (--workers 100, at most one per trial left) on 4 CPU cores: the trials share ' \
        'them and each runs slower'


def test_the_sweep_of_an_experiment_file_goes_to_the_folder_of_its_stem(tmp_path, monkeypatch, capsys):
    # RUNS_DIR/STEM/sweep-STUDY, as `lazylab train ./char_rnn.py` puts its runs in RUNS_DIR/STEM
    monkeypatch.chdir(tmp_path)
    assert cli.main(['new', 'char_rnn']) == 0
    capsys.readouterr()
    before = _tree(tmp_path)
    try:
        assert cli.main(['sweep', './char_rnn.py', 'd_model=16,32', '--study', 's', '--dry-run']) == 0
    finally:
        sys.modules.pop('char_rnn', None)
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == ['storage: journal file runs/char_rnn/sweep-s/study.journal',
                        'sweep directory: runs/char_rnn/sweep-s (not made)']
    assert _tree(tmp_path) == before
