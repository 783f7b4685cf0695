"""End to end: real training on Tiny Shakespeare with tiny settings, through the command line.

One module-scoped run (`lazylab train transformer …` in this process) is the reference for the run-directory,
replay, generate, plot and resume tests; the resume test trains the same configuration with
`python -m lazylab.experiments.transformer` in a child process, SIGKILLs it mid-run, resumes it with
`lazylab resume`, and expects bitwise the same losses.
"""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lazylab import cli
from lazylab.configs import load, to_dict
from lazylab.experiments import configure, discovery, replay
from lazylab.experiments.trainer import load_checkpoint, read_metrics
from lazylab.testing import replaced

# 60 steps of 4 × 16 characters, validation + checkpoint every 10 steps; one CPU thread (fastest when the machine
# is shared, and the same in every process, so results can be compared bit for bit).
TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'max_steps=60',
        'valid_interval=10', 'valid_batches=2', 'final_valid_batches=4', 'log_interval=5', 'sample_tokens=40',
        'device=cpu', 'threads=1',
        'optimizer.optimizer=AdamW', 'optimizer.learning_rate=0.01', 'optimizer.warmup=5',
        'optimizer.schedule=cosine']

TRAIN_KEYS = {'step', 'tokens', 'epoch', 'loss.train', 'accuracy.train', 'lr', 'tokens_per_s', 'time'}
ENV = {**os.environ, 'PYTHONPATH': str(Path(__file__).resolve().parents[2])}


def _only_run(runs_dir: Path) -> Path:
    dirs = list((runs_dir / 'transformer').iterdir())
    assert len(dirs) == 1
    return dirs[0]


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
    """(run_dir, stdout) of one tiny training run via `lazylab train`."""
    runs = tmp_path_factory.mktemp('runs')
    import io
    from contextlib import redirect_stdout
    out = io.StringIO()
    threads = torch.get_num_threads()
    try:
        with redirect_stdout(out):
            assert cli.main(['train', 'transformer', *TINY, f'runs_dir={runs}']) == 0
        yield _only_run(runs), out.getvalue()
    finally:
        torch.set_num_threads(threads)


def test_loss_falls_and_run_dir_holds_configs_metrics_samples_checkpoint(reference):
    run_dir, stdout = reference
    assert {'configs.yaml', 'run.json', 'metrics.jsonl', 'samples.txt', 'checkpoint.pt', 'labml'} <= \
        {p.name for p in run_dir.iterdir()}
    records = read_metrics(run_dir / 'metrics.jsonl')
    assert [r['step'] for r in records] == [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60]
    for r in records:
        assert TRAIN_KEYS <= set(r)
        assert r['tokens'] == r['step'] * 4 * 16
        assert ('loss.valid' in r) == ('accuracy.valid' in r) == (r['step'] % 10 == 0)
    valid = [r['loss.valid'] for r in records if 'loss.valid' in r]
    assert valid[-1] < valid[0] < 4.2 and valid[-1] < 4.17 - 0.8, valid  # ln 65 = 4.17 at chance
    assert records[-1]['loss.train'] < records[0]['loss.train'] - 0.5
    # warm-up then cosine to 10%: lr(t) = 0.01 · (0.1 + 0.9 · ½(1 + cos(π (t − 5) / 55))) after step t
    assert records[-1]['lr'] == pytest.approx(0.001, rel=1e-6)
    assert 'valid loss' in stdout and 'sample: It is' in stdout and f'run dir {run_dir}' in stdout

    samples = (run_dir / 'samples.txt').read_text(encoding='utf-8')
    assert samples.count('--- step ') == 6 and '--- step 60, 3,840 tokens\nIt is' in samples
    assert len(samples.split('--- step 60, 3,840 tokens\n')[1]) == len('It is') + 40 + 1

    ck = load_checkpoint(run_dir / 'checkpoint.pt')
    assert ck['position']['step'] == 60 and ck['position']['tokens'] == 3840
    assert ck['vocabulary'] == ''.join(sorted(set((Path(configure.__file__).parents[1] / 'data' /
                                                    'tiny_shakespeare.txt').read_text(encoding='utf-8'))))
    assert {'model', 'optimizer', 'scheduler', 'rng'} <= set(ck)

    info = json.loads((run_dir / 'run.json').read_text())
    assert info['experiment'] == 'transformer' and info['run_id'] == run_dir.name
    # labml's records are inside the run directory, none next to the installed labml
    assert (run_dir / 'labml' / 'transformer' / info['uuid'] / 'run.yaml').is_file()
    import labml
    assert not (Path(labml.__file__).parent / 'logs').exists()
    assert not (Path(labml.__file__).parent.parent / 'logs').exists()


def test_configs_yaml_replays_to_the_same_configuration(reference):
    run_dir, _ = reference
    original = (run_dir / 'configs.yaml').read_text(encoding='utf-8')
    conf = discovery.load_experiment('transformer').Configs()
    load(conf, run_dir / 'configs.yaml')
    configure.prepare(conf)
    replayed = to_dict(conf)['values']
    assert replayed['d_model'] == 16 and replayed['optimizer.optimizer'] == 'AdamW'
    assert replayed['optimizer.learning_rate'] == 0.01 and replayed['max_steps'] == 60
    import yaml
    assert replayed == yaml.safe_load(original)['values']


def test_generate_from_checkpoint_is_greedy_argmax_at_temperature_zero(reference, capsys):
    run_dir, _ = reference
    assert cli.main(['generate', str(run_dir), '--prompt', 'ROMEO:', '--tokens', '25', '--temperature', '0']) == 0
    text = capsys.readouterr().out.rstrip('\n')
    assert len(text) == 6 + 25 and text.startswith('ROMEO:')
    # the same continuation, computed by hand from the checkpoint's weights
    name, conf, _ = replay.open_run(str(run_dir))
    ck = load_checkpoint(run_dir / 'checkpoint.pt')
    conf.n_tokens = len(ck['vocabulary'])
    model = conf.model
    model.load_state_dict(ck['model'])
    model.eval()
    ids = [ck['vocabulary'].index(ch) for ch in 'ROMEO:']
    with torch.no_grad():
        for _ in range(25):
            logits, _ = model(torch.tensor(ids[-16:])[:, None])
            ids.append(int(logits[-1, 0].argmax()))
    assert text == ''.join(ck['vocabulary'][i] for i in ids)
    # sampling with a seed is reproducible and stays within the vocabulary
    outputs = []
    for _ in range(2):
        assert cli.main(['generate', str(run_dir), '--prompt', 'A', '--tokens', '30', '--seed', '3',
                         '--top-k', '5']) == 0
        outputs.append(capsys.readouterr().out[:-1])  # print's newline
    a, b = outputs
    assert a == b and len(a) == 31 and set(a) <= set(ck['vocabulary'])


def test_resume_after_sigkill_gives_bitwise_the_same_losses(reference, tmp_path):
    run_dir, _ = reference
    expected = read_metrics(run_dir / 'metrics.jsonl')
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.experiments.transformer', *TINY,
                             f'runs_dir={tmp_path}'], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    killed_at = None
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = list(tmp_path.glob('transformer/*/metrics.jsonl'))
        steps = [r['step'] for r in read_metrics(metrics[0])] if metrics else []
        if steps and steps[-1] >= 25:  # checkpoints exist at 10 and 20; the run is not finished
            proc.send_signal(signal.SIGKILL)
            killed_at = steps[-1]
            break
        time.sleep(0.01)
    proc.wait(timeout=30)
    assert killed_at is not None and killed_at < 60, proc.stderr.read().decode()
    killed_dir = _only_run(tmp_path)
    assert load_checkpoint(killed_dir / 'checkpoint.pt')['position']['step'] < 60

    done = subprocess.run([sys.executable, '-m', 'lazylab.cli', 'resume', str(killed_dir)], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    resumed = read_metrics(killed_dir / 'metrics.jsonl')
    assert [r['step'] for r in resumed] == [r['step'] for r in expected]
    for got, want in zip(resumed, expected):
        for key in ('loss.train', 'accuracy.train', 'loss.valid', 'accuracy.valid', 'lr', 'tokens'):
            assert got.get(key) == want.get(key), (got['step'], key)
    ours, theirs = load_checkpoint(killed_dir / 'checkpoint.pt'), load_checkpoint(run_dir / 'checkpoint.pt')
    for k, v in theirs['model'].items():
        assert torch.equal(ours['model'][k], v), k


def test_plot_draws_several_runs(reference, tmp_path, capsys):
    run_dir, _ = reference
    out = tmp_path / 'loss.png'
    assert cli.main(['plot', str(run_dir), str(run_dir), '-o', str(out)]) == 0
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and out.stat().st_size > 10_000
    assert cli.main(['plot', str(tmp_path), '-o', str(out)]) == 2
    assert 'has no metrics.jsonl' in capsys.readouterr().err


def test_plot_leaves_out_a_run_without_losses_with_a_warning(reference, tmp_path, capsys):
    # what a glob like runs/NAME/* takes in: a run that failed before its first record (run.json, no metrics)
    run_dir, _ = reference
    failed = tmp_path / 'failed'
    failed.mkdir()
    (failed / 'run.json').write_text(json.dumps({'status': 'failed', 'error': 'training loss is nan at step 1'}))
    out = tmp_path / 'loss.png'
    assert cli.main(['plot', str(run_dir), str(failed), '-o', str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f'lazylab: warning: {failed} has no loss values yet (status failed: training loss is nan at step '
                   f'1); left out']
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    # alone, or with only runs like it, it is an error (nothing to draw), and nothing is written
    out.unlink()
    assert cli.main(['plot', str(failed), '-o', str(out)]) == 2
    assert capsys.readouterr().err.strip() == (f'lazylab: error: {failed} has no metrics.jsonl yet (status failed: '
                                               f'training loss is nan at step 1)')
    assert cli.main(['plot', str(failed), str(failed), '-o', str(out)]) == 2
    assert capsys.readouterr().err.strip() == 'lazylab: error: none of the 2 runs has loss values yet'
    assert not out.exists()


def test_plot_draws_a_labml_run_against_its_step(tmp_path, monkeypatch):
    # `lazylab labml` records labml's global step and the losses, no tokens (see lazylab.labml.session)
    run_dir = tmp_path / 'labml_run'
    run_dir.mkdir()
    (run_dir / 'metrics.jsonl').write_text('{"step": 32, "loss.train": 4.4}\n{"step": 64, "loss.train": 4.1}\n')
    from matplotlib.figure import Figure
    drawn = []
    monkeypatch.setattr(Figure, 'savefig', lambda fig, path, **kw: drawn.append(fig))
    assert cli.main(['plot', str(run_dir), '-o', str(tmp_path / 'loss.png')]) == 0
    ax, = drawn[0].axes
    line, = ax.get_lines()
    assert ax.get_xlabel() == 'step' and list(line.get_xdata()) == [32, 64] and list(line.get_ydata()) == [4.4, 4.1]


class _FakeClock:
    """Stands in for the trainer's `time` module: every reading advances 10 ms, so the time budget is spent
    the same way however busy the machine is."""

    def __init__(self):
        self.now = 0.0

    def time(self) -> float:
        self.now += 0.01
        return self.now


def test_time_budget_fits_the_step_count_and_completes_the_cosine_schedule(tmp_path, monkeypatch):
    from lazylab.experiments import trainer
    monkeypatch.setattr(trainer, 'time', _FakeClock())
    runs = tmp_path / 'runs'
    argv = replaced(TINY, 'max_minutes=0.05', 'epochs=100', 'valid_interval=40', f'runs_dir={runs}',
                    drop=('max_steps',))
    threads = torch.get_num_threads()
    try:
        assert cli.main(['train', 'transformer', *argv]) == 0
    finally:
        torch.set_num_threads(threads)
    run_dir = _only_run(runs)
    ck = load_checkpoint(run_dir / 'checkpoint.pt')
    pos = ck['position']
    # the fitted step count, not the clock, ends the run: 3 s of fake time
    assert pos['calibrated'] and 30 < pos['step'] == pos['total_steps'] and pos['elapsed'] <= 3.0
    assert ck['scheduler']['lr_lambdas'][0]['total_steps'] == pos['total_steps']
    records = read_metrics(run_dir / 'metrics.jsonl')
    assert records[-1]['step'] == pos['step'] and 'loss.valid' in records[-1]
    # the learning rate followed the cosine over the fitted step count: 0.001 at the end if it was reached
    t, total = pos['step'], pos['total_steps']
    assert records[-1]['lr'] == pytest.approx(
        0.01 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (t - 5) / (total - 5)))), rel=1e-6)


def test_fast_weights_experiment_trains_and_generates(tmp_path, capsys):
    runs = tmp_path / 'runs'
    argv = [a for a in TINY if not a.startswith('max_steps')] + ['max_steps=20', f'runs_dir={runs}']
    threads = torch.get_num_threads()
    try:
        assert cli.main(['train', 'fast_weights', *argv]) == 0
    finally:
        torch.set_num_threads(threads)
    run_dir = next((runs / 'fast_weights').iterdir())
    records = read_metrics(run_dir / 'metrics.jsonl')
    valid = [r['loss.valid'] for r in records if 'loss.valid' in r]
    assert len(valid) == 2 and valid[1] < valid[0] < 4.3
    capsys.readouterr()
    assert cli.main(['generate', str(run_dir), '--prompt', 'KING', '--tokens', '12', '--seed', '0']) == 0
    text = capsys.readouterr().out.rstrip('\n')
    assert len(text) == 16 and text.startswith('KING')


@pytest.mark.parametrize('model', ['feedback_transformer_kv', 'feedback_transformer'])
def test_feedback_experiment_trains_and_generates_incrementally(tmp_path, capsys, model):
    runs = tmp_path / 'runs'
    argv = replaced(TINY, 'max_steps=20', f'model={model}', 'n_layers=2', f'runs_dir={runs}')
    threads = torch.get_num_threads()
    try:
        assert cli.main(['train', 'feedback', *argv]) == 0
        run_dir = next((runs / 'feedback').iterdir())
        records = read_metrics(run_dir / 'metrics.jsonl')
        valid = [r['loss.valid'] for r in records if 'loss.valid' in r]
        assert len(valid) == 2 and valid[1] < valid[0] < 4.3
        capsys.readouterr()
        # greedy generation (incremental, with the feedback memory carried as state) equals re-running the
        # whole prefix and taking the argmax at every step
        assert cli.main(['generate', str(run_dir), '--prompt', 'KING', '--tokens', '12', '--temperature', '0']) == 0
        text = capsys.readouterr().out.rstrip('\n')
        _, conf, _ = replay.open_run(str(run_dir))
        ck = load_checkpoint(run_dir / 'checkpoint.pt')
        conf.n_tokens = len(ck['vocabulary'])
        m = conf.model
        m.load_state_dict(ck['model'])
        m.eval()
        ids = [ck['vocabulary'].index(ch) for ch in 'KING']
        with torch.no_grad():
            for _ in range(12):
                ids.append(int(m(torch.tensor(ids)[:, None])[0][-1, 0].argmax()))
        assert text == ''.join(ck['vocabulary'][i] for i in ids)
    finally:
        torch.set_num_threads(threads)
