"""User mistakes end to end (one line, exit 2, nothing written), what resume refuses, sampling and decoding
errors, a checkpoint write that fails, help and listing, the progress line and the summary's average.
`short_run` (tests/conftest.py) is the finished run the resume and generate tests start from."""
import io
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from lazylab import cli
from lazylab.data import CharTokenizer, DataError
from lazylab.errors import CheckpointError
from lazylab.experiments import checkpoint as checkpoint_module
from lazylab.experiments.checkpoint import Position, load_checkpoint, save_checkpoint
from lazylab.experiments.metrics import Progress, read_metrics
from lazylab.models.sampling import MAX_NEW_TOKENS, NonFiniteLogitsError, check_generate_arguments, sample_next
from lazylab.runs import CHECKPOINT_PT as CHECKPOINT
from lazylab.testing import TINY, as_stopped, replaced, tiny


def _everything(folder: Path) -> set:
    return {str(p.relative_to(folder)) for p in folder.rglob('*')}


@pytest.mark.parametrize('argv, message', [
    (['prompt='], r"^bad value for prompt: must have length ≥ 1, got ''$"),
    (['sample_temperature=nan'], r'^bad value for sample_temperature: must be finite, got nan$'),
    (['optimizer.learning_rate=inf'], r'^bad value for optimizer.learning_rate: must be finite, got inf$'),
    (['optimizer.learning_rate=1e31'], r'^bad value for optimizer.learning_rate: must be ≤ 1e\+30, got 1e\+31$'),
    (['dropout=nan'], r'^bad value for dropout: must be ≥ 0, got nan$'),
    (['seed=4294967296'], r'^bad value for seed: must be < 4294967296, got 4294967296$'),
    (['threads=100000'], r'^bad value for threads: must be ≤ 1024, got 100000$'),
    (['n_layers=1e18'], r'^bad value for n_layers: expected int, got .1e18. \(write 1000000000000000000\)$'),
    (['n_layers=1000000000000000000'], r'^bad value for n_layers: must be ≤ 1024'),
    (['transformer.n_layers=5000'], r'^bad value for transformer.n_layers: must be ≤ 1024, got 5000$'),
    (['sample_tokens=1000001'], r'^bad value for sample_tokens: must be ≤ 1000000, got 1000001$'),
    (['device=meta'], r"^device 'meta' cannot train here; use auto, cpu, cuda, cuda:N or mps$"),
    (['n_tokens=3'], r'^n_tokens=3, but the text tiny_shakespeare has 65 characters; leave n_tokens out'),
    (['text=/dev/null'], r'^text file /dev/null is a character device, not a regular file$'),
    (['seq_len_start=32'], r'^seq_len_start=32 is longer than seq_len=16'),
    (['seq_len_start=8'], r'^seq_len_start needs seq_len_warmup too'),
    (['seq_len_warmup=8'], r'^seq_len_warmup needs seq_len_start too'),
    (['transformer.n_tgt_vocab=3'], r'^the model returns logits of shape \[16, 4, 3\]; a text model must return logits '
                                    r'\[seq_len, batch_size, n_tokens\] = \[16, 4, 65\] \(alone, or as'),
    (['transformer.ffn.d_model=8'], r'^the model cannot train with these settings: one batch \(16×4\) fails with '),
    (['glu_variant=SwiGLu'], r"^bad value for transformer.ffn.glu_variant: expected one of 'none', 'GLU'"),
])
def test_a_bad_value_is_one_line_naming_the_key_and_nothing_is_written(tmp_path, cli_error, argv, message):
    import re
    runs = tmp_path / 'runs'
    text = cli_error(['train', 'transformer', *replaced(TINY, drop=tuple(a.split('=')[0] for a in argv)),
                      f'runs_dir={runs}', *argv])
    assert re.search(message, text), text
    assert not runs.exists()


@pytest.mark.parametrize('runs_dir, why', [
    ('{tmp}/afile', '/afile is a file, not a folder'), ('{tmp}/afile/below', '/afile is a file, not a folder'),
    ('/proc/lazylab-cannot-be-made', 'No such file or directory'),  # (a NUL: tests/test_user_files.py)
])
def test_a_runs_dir_that_cannot_be_made_is_one_line_and_leaves_no_folder(tmp_path, cli_error, runs_dir, why):
    (tmp_path / 'afile').write_text('a file where a folder should be')
    before = _everything(tmp_path)
    runs_dir = runs_dir.format(tmp=tmp_path)
    text = cli_error(['train', 'transformer', *TINY, f'runs_dir={runs_dir}'])
    assert text.startswith(f'cannot create a run directory in runs_dir={runs_dir!r}: ') and why in text, text
    assert _everything(tmp_path) == before


def test_a_folder_made_before_the_failure_is_removed(tmp_path, cli_error, monkeypatch):
    """runs_dir/transformer is made, then the run's own folder fails: neither stays."""
    original = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.parent.name == 'transformer':
            raise PermissionError(13, 'Permission denied')
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, 'mkdir', mkdir)
    text = cli_error(['train', 'transformer', *TINY, f'runs_dir={tmp_path}/new/runs'])
    assert text == f"cannot create a run directory in runs_dir='{tmp_path}/new/runs': Permission denied"
    assert _everything(tmp_path) == set()


def test_a_run_directory_whose_files_cannot_be_written_is_removed(tmp_path, cli_error, monkeypatch):
    from lazylab.experiments import lifecycle

    def full_disk(conf, path):
        Path(path).write_text('half')
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(lifecycle, 'dump', full_disk)
    text = cli_error(['train', 'transformer', *TINY, f'runs_dir={tmp_path}/runs'])
    assert text.startswith('cannot write the run directory ') and text.endswith(': No space left on device'), text
    assert _everything(tmp_path) == set()


# --- checkpoints -------------------------------------------------------------------------------------------------

class _FullDisk:
    """Stands in for torch.save: writes part of the file, then fails as a full disk does."""

    def __init__(self):
        self.calls = 0

    def __call__(self, payload, f):
        self.calls += 1
        f.write(b'half a checkpoint')
        raise OSError(28, 'No space left on device')


def test_a_failed_checkpoint_write_leaves_no_temporary_file_and_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / CHECKPOINT
    save_checkpoint(path, {'format': checkpoint_module.FORMAT, 'step': 1})
    before = path.read_bytes()
    monkeypatch.setattr(checkpoint_module.torch, 'save', _FullDisk())
    with pytest.raises(CheckpointError, match=r'^cannot write the checkpoint .*checkpoint.pt \(the previous '
                                              r'checkpoint is kept\): No space left on device$'):
        save_checkpoint(path, {'format': checkpoint_module.FORMAT, 'step': 2})
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT] and path.read_bytes() == before
    path.unlink()
    with pytest.raises(CheckpointError, match=r'\(no checkpoint was written\): No space left on device$'):
        save_checkpoint(path, {})
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_write_interrupted_by_anything_else_leaves_no_temporary_file(tmp_path, monkeypatch):
    def interrupted(payload, f):
        f.write(b'part')
        raise KeyboardInterrupt
    monkeypatch.setattr(checkpoint_module.torch, 'save', interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / CHECKPOINT, {})
    assert list(tmp_path.iterdir()) == []


def test_training_whose_checkpoint_cannot_be_written_stops_with_one_line(tmp_path, cli_error, monkeypatch):
    real_save, calls = checkpoint_module.torch.save, []

    def second_fails(payload, f):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, 'No space left on device')
        real_save(payload, f)

    monkeypatch.setattr(checkpoint_module.torch, 'save', second_fails)
    text = cli_error(['train', 'transformer', *TINY, f'runs_dir={tmp_path}'])
    assert text.endswith('checkpoint.pt (the previous checkpoint is kept): No space left on device'), text
    run, = (tmp_path / 'transformer').iterdir()
    assert not [p for p in run.iterdir() if '.tmp' in p.name]
    assert load_checkpoint(run / CHECKPOINT)['position']['step'] == 1


def _copy_with(run: Path, folder: Path, **values) -> Path:
    copy = folder / 'run'
    shutil.copytree(run, copy)
    doc = yaml.safe_load((copy / 'configs.yaml').read_text(encoding='utf-8'))
    doc['values'].update(values)
    doc['given'].update({k: 'user' for k in values})  # as if the run had been started with key=value
    for key in [k for k, v in values.items() if v is None]:
        doc['values'].pop(key)
        doc['given'].pop(key)
    (copy / 'configs.yaml').write_text(yaml.safe_dump(doc, allow_unicode=True), encoding='utf-8')
    return as_stopped(copy)


def _files(run: Path) -> dict:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob('*') if p.is_file()}


@pytest.mark.parametrize('change, message', [
    ('same size', r"has another vocabulary than the checkpoint was trained on \(65 → 65 characters; added 'é'; "
                  r"removed 'z'\); resume with the same text$"),
    ('bigger', r"\(65 → 67 characters; added 'Ä', 'é'\)"),
    ('smaller', r"\(65 → 64 characters; removed 'z'\)"),
])
def test_resume_refuses_a_text_with_another_vocabulary_saying_what_differs(
        short_run, tmp_path, cli_error, change, message):
    import re
    original = (Path(cli.__file__).parents[1] / 'data' / 'tiny_shakespeare.txt').read_text(encoding='utf-8')
    text = {'same size': original.replace('z', 'é'), 'bigger': original + 'éÄ',
            'smaller': original.replace('z', 'y')}[change]
    (tmp_path / 'text.txt').write_text(text, encoding='utf-8')
    run = _copy_with(short_run, tmp_path, text=str(tmp_path / 'text.txt'), n_tokens=None)
    before = _files(run)
    got = cli_error(['resume', str(run)])
    assert re.search(message, got), got
    assert _files(run) == before


def test_resume_refuses_a_model_that_does_not_match_the_checkpoint_before_writing(short_run, tmp_path, cli_error):
    run = _copy_with(short_run, tmp_path, **{'transformer.ffn.d_ff': 64})
    before = _files(run)
    got = cli_error(['resume', str(run)])
    assert got.endswith("does not match the model of configs.yaml: 'encoder.layers.0.feed_forward.layer1.bias' is "
                        "(32,) there, (64,) here"), got
    assert _files(run) == before


def test_vocabulary_change_in_words():
    from lazylab.data import vocabulary_change
    assert vocabulary_change('abc', 'abc') is None
    assert vocabulary_change('abc', 'abd') == "3 → 3 characters; added 'd'; removed 'c'"
    assert vocabulary_change('abc', 'cab') == "3 → 3 characters; the same characters in another order ('c', 'a', " \
                                              "'b' moved)"
    many = ''.join(chr(0x100 + i) for i in range(12))
    assert vocabulary_change('a', 'a' + many) == \
        "1 → 13 characters; added " + ', '.join(repr(c) for c in many[:10]) + ' and 2 more'


# --- sampling and decoding ---------------------------------------------------------------------------------------

def test_nan_or_all_minus_inf_logits_are_an_error_not_token_zero():
    g = torch.Generator().manual_seed(0)
    nan_row = torch.tensor([[0.0, 1.0, 2.0], [float('nan'), 0.0, 0.0]])
    blocked = torch.tensor([[0.0, 1.0, 2.0], [float('-inf')] * 3])
    for logits, what in ((nan_row, 'NaN'), (blocked, 'all −inf')):
        for temperature in (0.0, 1.0):
            with pytest.raises(NonFiniteLogitsError, match=f'the logits of row 1 are {what}: no next token'):
                sample_next(logits, temperature, generator=g)


def test_sampling_at_extreme_temperatures_stays_a_distribution():
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0]])
    # a tiny temperature is (almost) greedy: only the two largest logits, equally likely
    draws = {int(sample_next(logits, 1e-300, generator=g)) for _ in range(50)}
    assert draws == {1, 3}
    # a huge one is (almost) uniform
    draws = [int(sample_next(logits, 1e300, generator=g)) for _ in range(400)]
    assert set(draws) == {0, 1, 2, 3} and min(draws.count(i) for i in range(4)) > 50
    # +inf logits: those tokens only
    inf = torch.tensor([[0.0, float('inf'), 1.0, float('inf')]])
    assert {int(sample_next(inf, 0.7, generator=g)) for _ in range(50)} == {1, 3}


@pytest.mark.parametrize('tokens, temperature, top_k, message', [
    (-1, 1.0, None, 'max_new_tokens must be ≥ 0, got -1'),
    (MAX_NEW_TOKENS + 1, 1.0, None, 'max_new_tokens must be ≤ 1,000,000, got 1000001'),
    (1, float('nan'), None, 'temperature must be a finite number ≥ 0, got nan'),
    (1, float('inf'), None, 'temperature must be a finite number ≥ 0, got inf'),
    (1, -0.5, None, 'temperature must be a finite number ≥ 0, got -0.5'),
    (1, 1.0, 0, 'top_k must be ≥ 1, got 0'),
])
def test_generate_arguments_out_of_range(tokens, temperature, top_k, message):
    with pytest.raises(ValueError, match=f'^{message}$'):
        check_generate_arguments(tokens, temperature, top_k)


@pytest.mark.parametrize('args, message', [
    (['--temperature', 'nan'], '--temperature must be a finite number ≥ 0, got nan'),
    (['--temperature', 'inf'], '--temperature must be a finite number ≥ 0, got inf'),
    (['--temperature', '-1'], '--temperature must be a finite number ≥ 0, got -1.0'),
    (['--tokens', '10000000000'], '--tokens must be ≤ 1,000,000, got 10000000000'),
    (['--seed', '-1'], '--seed must be in 0 … 2**64 − 1, got -1'),
    (['--seed', str(2**64)], f'--seed must be in 0 … 2**64 − 1, got {2**64}'),
    (['--prompt', ''], '--prompt must not be empty'),
])
def test_generate_refuses_bad_arguments_with_one_line(short_run, cli_error, args, message):
    argv = dict([('--prompt', 'A'), ('--tokens', '3')] + [tuple(args)])
    assert cli_error(['generate', str(short_run), *[p for kv in argv.items() for p in kv]]) == message


def test_generate_from_nan_weights_says_so(short_run, tmp_path, cli_error):
    run = tmp_path / 'run'
    shutil.copytree(short_run, run)
    ck = torch.load(run / CHECKPOINT, weights_only=True)
    ck['model'] = {k: v * float('nan') if v.is_floating_point() else v for k, v in ck['model'].items()}
    torch.save(ck, run / CHECKPOINT)
    got = cli_error(['generate', str(run), '--prompt', 'A', '--tokens', '3', '--temperature', '0'])
    assert got.endswith('checkpoint.pt: the logits of row 0 are NaN: no next token (are the weights finite?)'), got


def test_decoding_an_id_outside_the_vocabulary_is_an_error():
    tokenizer = CharTokenizer('abc')
    assert tokenizer.decode([2, 0, 1]) == 'cab'
    for ids, bad, position in (([0, 3], 3, 1), ([-1], -1, 0), (torch.tensor([1, 7]), 7, 1)):
        with pytest.raises(DataError, match=rf'^token id {bad} \(position {position}\) is outside the vocabulary of '
                                            rf'3 characters \(ids 0 … 2\)$'):
            tokenizer.decode(ids)


# --- help, listing, progress, summary ----------------------------------------------------------------------------

@pytest.mark.parametrize('command', sorted(cli.COMMANDS))
@pytest.mark.parametrize('flag', ['--help', '-h'])
def test_every_command_answers_help_with_exit_0(capsys, command, flag):
    try:
        code = cli.main([command, flag])
    except SystemExit as e:  # the dashboard's own argparse parser
        code = e.code
    out = capsys.readouterr().out
    assert code == 0 and out.startswith('usage: lazylab ' + command), out


def test_train_without_a_name_asks_for_one_and_help_names_the_experiments(capsys, cli_error):
    assert cli.main(['train', '--help']) == 0
    help_text = ' '.join(capsys.readouterr().out.split())  # (the help wraps its lines)
    assert 'experiments: feedback, fast_weights, transformer, retrieval, mqar, state_tracking (built-in)' in help_text
    assert cli_error(['train']) == ('the following arguments are required: EXPERIMENT (see: lazylab train '
                                    '--help)')


def test_options_shows_the_experiments_own_defaults_of_its_sub_configs(capsys):
    assert cli.main(['options', 'feedback']) == 0
    out = capsys.readouterr().out
    for line in ('feedback.d_model: int = 128 (follows d_model)  (≥ 1)',
                 'feedback.heads: int = 4 (follows heads)  (≥ 1)',
                 'feedback.dropout: float = 0.0 (follows dropout)  (≥ 0, < 1)',
                 'feedback.ffn.d_ff: int = 512 (follows feedback.d_ff)  (≥ 1)',
                 'feedback.ffn.dropout: float = 0.0 (follows feedback.dropout)  (≥ 0, < 1)',
                 'optimizer.d_model: int = 128 (set by the experiment)  (≥ 1)'):
        assert line in out, line
    assert cli.main(['options', 'transformer']) == 0
    out = capsys.readouterr().out
    for line in ('transformer.n_heads: int = 4 (set by the experiment)  (≥ 1)',
                 'transformer.ffn.d_ff: int = 512 (set by the experiment)  (≥ 1)',
                 'transformer.src_embed: Module = TokenAndPositionEmbeddings (set by the experiment)'):
        assert line in out, line


#: keys of the other helpers' component configs that have no help comment yet (issue 14's report lists them)
NO_HELP_YET = {'feedback.ffn', 'fast_weights.ffn', 'fast_weights.model'}


@pytest.mark.parametrize('name', ['feedback', 'fast_weights', 'transformer'])
def test_every_key_has_help(name):
    from lazylab.configs import describe
    from lazylab.experiments.discovery import load_experiment
    rows = describe(load_experiment(name).Configs)
    missing = [r['name'] for r in rows if not r['help'] and r['name'] not in NO_HELP_YET]
    assert missing == []
    still = [r['name'] for r in rows if not r['help'] and r['name'] in NO_HELP_YET]
    assert set(still) <= NO_HELP_YET


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_off_a_terminal_prints_a_line_at_a_steady_pace_and_every_validation():
    clock, stream = _Clock(), io.StringIO()
    progress = Progress(100, stream=stream, every_s=10.0, clock=clock)
    record = {'tokens_per_s': 1000.0, 'loss.train': 2.0, 'accuracy.train': 0.5}
    for step in range(1, 31):  # a record a second
        clock.t = float(step)
        progress.show(Position(step=step), record, eta=60.0, newline=False)
    lines = stream.getvalue().splitlines()
    assert [line.split(' | ')[0] for line in lines] == ['epoch 0 step 10/100', 'epoch 0 step 20/100',
                                                        'epoch 0 step 30/100']
    assert '\r' not in stream.getvalue() and lines[0].endswith('train loss 2.000 acc 0.500')
    clock.t = 31.0
    progress.show(Position(step=31), {**record, 'loss.valid': 1.5, 'accuracy.valid': 0.6}, eta=0, newline=True)
    assert stream.getvalue().splitlines()[-1].endswith('valid loss 1.500 acc 0.600')


def test_the_summary_reports_the_runs_average_tokens_per_second(tmp_path, capsys):
    assert cli.main(['train', 'transformer', *tiny('max_steps=6', 'log_interval=2', 'valid_interval=3'),
                     f'runs_dir={tmp_path}']) == 0
    out = capsys.readouterr().out
    run, = (tmp_path / 'transformer').iterdir()
    pos = load_checkpoint(run / CHECKPOINT)['position']
    assert pos['train_seconds'] > 0 and pos['tokens'] == 6 * 16 * 4
    summary = next(line for line in out.splitlines() if line.startswith('done: '))
    assert f'{pos["tokens"] / pos["train_seconds"]:,.0f} tokens/s (the run\'s average)' in summary
    # the metrics' own tokens_per_s are per interval; their token-weighted mean is the same average
    records = [r for r in read_metrics(run / 'metrics.jsonl') if 'tokens_per_s' in r]
    seconds = sum((b['tokens'] - a) / b['tokens_per_s'] for a, b in zip([0] + [r['tokens'] for r in records],
                                                                        records))
    assert math.isclose(seconds, pos['train_seconds'], rel_tol=1e-6)


def test_progress_lines_of_a_run_written_to_a_file(tmp_path):
    """`lazylab train … > log`: stdout is not a terminal; each validation has its line (the pace is the unit
    test's)."""
    import subprocess
    import sys
    env = {**os.environ, 'PYTHONPATH': str(Path(__file__).resolve().parents[2])}
    with open(tmp_path / 'log.txt', 'w') as log:
        done = subprocess.run([sys.executable, '-m', 'lazylab.cli', 'train', 'transformer', *TINY,
                               f'runs_dir={tmp_path}/runs'], stdout=log, stderr=subprocess.PIPE, text=True,
                              env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / 'log.txt').read_text(encoding='utf-8').splitlines()
    assert sum(' | valid loss ' in line for line in lines) == 3 and not any('\r' in line for line in lines)
    assert json.loads((next((tmp_path / 'runs' / 'transformer').iterdir()) / 'run.json').read_text())
