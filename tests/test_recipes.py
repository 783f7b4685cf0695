"""scripts/recipes.sh, the recipe searches of issue 29: each experiment's search is a sweep `lazylab sweep` accepts
(checked with --dry-run: every swept value is typed and each is tried on a configuration; nothing is written)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAZYLAB = Path(sys.executable).with_name('lazylab')  # the environment's console script (make install puts it there)


def recipes(*args: str, runs_dir: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    assert LAZYLAB.is_file(), f'{LAZYLAB}: lazylab is not installed in this environment'
    return subprocess.run(['bash', str(ROOT / 'scripts' / 'recipes.sh'), *args], capture_output=True, text=True,
                          timeout=300, env={**(env or os.environ), 'LAZYLAB': str(LAZYLAB), 'OMP_NUM_THREADS': '1'},
                          cwd=runs_dir)


@pytest.mark.parametrize('experiment, own', [
    ('feedback', ['seq_len']),
    ('fast_weights', ['seq_len', 'fast_weights.update_rule', 'fast_weights.ffn.is_gated']),
    ('transformer', ['seq_len', 'transformer.ffn.activation', 'transformer.ffn.is_gated']),
])
def test_each_recipe_search_is_a_tpe_sweep_that_lazylab_accepts(tmp_path, experiment, own):
    done = recipes(experiment, '--dry-run', runs_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert 'sampler tpe, 32 trials, metric loss.valid (minimize), pruning median' in done.stdout
    assert 'every trial: max_minutes=5 threads=1 valid_interval=100' in done.stdout
    swept = [line.split(':')[0].strip() for line in done.stdout.splitlines() if line.startswith('  ')]
    assert swept == ['optimizer.learning_rate', 'optimizer.warmup', 'd_model', 'n_layers', 'heads', 'd_ff',
                     'batch_size', 'dropout', *own]
    assert list(tmp_path.iterdir()) == []  # a dry run makes no sweep directory


def test_the_transformers_first_search_is_replayed_by_its_trial_count_and_length(tmp_path):
    env = {**os.environ, 'RECIPE_TRIALS': '80', 'RECIPE_MINUTES': '2'}
    done = recipes('transformer', '--dry-run', runs_dir=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert 'sampler tpe, 80 trials' in done.stdout and 'every trial: max_minutes=2 threads=1' in done.stdout


def test_an_unknown_experiment_is_one_line_and_exit_2(tmp_path):
    done = recipes('feedbak', runs_dir=tmp_path)
    assert (done.returncode, done.stderr) == (2, "scripts/recipes.sh: unknown experiment 'feedbak' (feedback, "
                                                 "fast_weights or transformer)\n")


def _study_figures():
    import importlib.util
    spec = importlib.util.spec_from_file_location('study_figures', ROOT / 'scripts' / 'study_figures.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_study_figures_writes_the_plots_and_finds_the_key_that_matters(tmp_path, capsys):
    import json

    import optuna
    from optuna.storages.journal import JournalFileBackend
    sweep = tmp_path / 'sweep-x'
    sweep.mkdir()
    (sweep / 'sweep.yaml').write_text('study: s\nexperiment: transformer\n')
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(sweep / 'study.journal')))
    study = optuna.create_study(study_name='s', storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    # the loss depends on the learning rate only; the FFN's kind is noise-free and irrelevant
    study.optimize(lambda t: (t.suggest_float('lr', 1e-3, 1e-1, log=True) - 0.01) ** 2
                   + 0 * len(t.suggest_categorical('ffn', ['GELU', 'SiLU'])), n_trials=40)
    pruned = study.ask({'lr': optuna.distributions.FloatDistribution(1e-3, 1e-1, log=True)})
    study.tell(pruned, state=optuna.trial.TrialState.PRUNED)
    assert _study_figures().main([str(sweep), str(tmp_path / 'out' / 'fig'), '--json']) == 0
    facts = json.loads(capsys.readouterr().out)
    assert (facts['trials'], facts['states']) == (41, {'complete': 40, 'pruned': 1})
    assert set(facts['importances']) == {'lr', 'ffn'} and abs(sum(facts['importances'].values()) - 1) < 1e-9
    assert facts['importances']['lr'] > facts['importances']['ffn']
    for name in ('history', 'parallel', 'importances'):
        png = tmp_path / 'out' / f'fig-{name}.png'
        assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and png.stat().st_size > 10_000
