"""An experiment of your own, written outside the package, through every command (issue 26): a .py file, a
`Task`-based one, an installed plugin, `lazylab new`'s output, `python FILE` ≡ `lazylab train FILE`, SIGTERM then
resume, torchrun, and the mistakes (one line, exit 2, nothing written; a bug in the user's code keeps its
traceback)."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lazylab import cli
from lazylab.configs import apply_overrides
from lazylab.data import CharTokenizer
from lazylab.experiments.checkpoint import load_checkpoint
from lazylab.experiments.metrics import read_metrics
from lazylab.experiments.replay import open_run
from lazylab.runs import CHECKPOINT_PT, read_record
from lazylab.testing import as_stopped, replaced

ROOT = Path(__file__).resolve().parents[2]
TINY = ['d_model=16', 'seq_len=16', 'batch_size=4', 'max_steps=3', 'valid_interval=1', 'valid_batches=1',
        'final_valid_batches=1', 'sample_tokens=5', 'device=cpu', 'threads=1']

#: a plain nn.Module text model (no lazylab base class): logits alone, or labml_nn's (logits, state) with pair=true
GRU = '''\
"""A character GRU: a plain nn.Module."""
import sys

from torch import nn

from lazylab.configs import option
from lazylab.experiments import NLPAutoRegressionConfigs, device_of, main


class CharGRU(nn.Module):
    def __init__(self, n_tokens, d_model, hidden, pair):
        super().__init__()
        self.embed, self.gru = nn.Embedding(n_tokens, d_model), nn.GRU(d_model, hidden)
        self.out, self.pair = nn.Linear(hidden, n_tokens), pair

    def forward(self, x):
        h, state = self.gru(self.embed(x))
        return (self.out(h), state) if self.pair else self.out(h)


class Configs(NLPAutoRegressionConfigs):
    model: nn.Module = 'gru'
    hidden: int = 12      # GRU width
    pair: bool = False    # return (logits, state), as labml_nn's models do


@option(Configs.model, 'gru')
def _gru(c):
    return CharGRU(c.n_tokens, c.d_model, c.hidden, c.pair).to(device_of(c))


if __name__ == '__main__':
    sys.exit(main(Configs))
'''


@pytest.fixture
def here(tmp_path, monkeypatch):
    """tmp_path as the current folder; the modules (imported from tmp_path) and sys.path entries a test's
    experiments add are removed."""
    before, path = set(sys.modules), list(sys.path)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in set(sys.modules) - before:
        if str(tmp_path) in str(getattr(sys.modules[name], '__file__', None) or ''):
            del sys.modules[name]
    sys.path[:] = path


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding='utf-8')
    return path


def _only_run(runs: Path) -> Path:
    found = [p for p in runs.iterdir() if p.is_dir()]
    assert len(found) == 1, found
    return found[0]


def _env() -> dict[str, str]:
    return {**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}


def _greedy(model: torch.nn.Module, ids: list[int], tokens: int, context: int) -> list[int]:
    """Greedy decoding by re-running the model on the last `context` ids (the reference for `lazylab generate`)."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(tokens):
            out = model(torch.tensor(ids[-context:]).unsqueeze(1))
            logits = out[0] if isinstance(out, tuple) else out
            ids.append(int(logits[-1, 0].argmax()))
    return ids


@pytest.mark.parametrize('pair', [False, True], ids=['logits', 'logits_and_state'])
def test_a_file_experiment_trains_lists_generates_plots_compares_and_diffs(here, capsys, pair):
    _write(here / 'exp' / 'char_gru_a.py', GRU)
    flag = [f'pair={str(pair).lower()}']
    assert cli.main(['train', 'exp/char_gru_a.py', *TINY, *flag]) == 0
    out = capsys.readouterr().out
    run = _only_run(here / 'runs' / 'char_gru_a')
    record = read_record(run)
    assert record['experiment'] == 'char_gru_a' and record['status'] == 'completed' and record['steps'] == 3
    path = (here / 'exp' / 'char_gru_a.py').resolve()
    assert record['source'] == {'kind': 'file', 'module': 'char_gru_a', 'path': str(path),
                                'sha256': hashlib.sha256(path.read_bytes()).hexdigest()}
    assert [r['step'] for r in read_metrics(run / 'metrics.jsonl') if 'loss.valid' in r] == [1, 2, 3]
    assert (run / 'samples.txt').read_text().count('--- step') == 3  # sampled at each validation, by re-running
    assert out.splitlines()[-1].startswith('done: step 3, valid loss ') and 'stopped at max_steps=3' in out
    assert list((run / 'labml' / 'char_gru_a').iterdir())  # labml's records (the dashboard's source) are there

    assert cli.main(['options', 'exp/char_gru_a.py']) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[listing.index('hidden: int = 12') + 1].strip() == 'GRU width'

    assert cli.main(['generate', str(run), '--prompt', 'It is', '--tokens', '9', '--temperature', '0']) == 0
    text = capsys.readouterr().out.rstrip('\n')
    ck = load_checkpoint(run / CHECKPOINT_PT)
    _, conf, _ = open_run(str(run))
    tokenizer = CharTokenizer(ck['vocabulary'])
    apply_overrides(conf, {'n_tokens': tokenizer.n_tokens})
    model = conf.model.eval()
    model.load_state_dict(ck['model'])
    expected = _greedy(model, tokenizer.encode('It is').tolist(), 9, context=16)
    assert text == tokenizer.decode(torch.tensor(expected)) and len(text) == 5 + 9

    assert cli.main(['train', 'exp/char_gru_a.py', *TINY, *flag, 'hidden=8']) == 0
    capsys.readouterr()
    a, b = sorted((here / 'runs' / 'char_gru_a').iterdir())
    assert cli.main(['compare', str(a), str(b)]) == 0
    table = capsys.readouterr().out
    assert 'hidden' in table and 'char_gru_a' in table
    assert cli.main(['diff', str(a), str(b)]) == 0
    assert 'hidden' in capsys.readouterr().out
    assert cli.main(['plot', str(a), str(b), '-o', str(here / 'loss.png')]) == 0
    assert (here / 'loss.png').stat().st_size > 1000


def test_python_file_is_the_same_run_as_lazylab_train_file(here):
    f = _write(here / 'char_gru_b.py', GRU)
    done = subprocess.run([sys.executable, str(f), *TINY, 'runs_dir=by_python'], cwd=here, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert cli.main(['train', 'char_gru_b.py', *TINY, 'runs_dir=by_lazylab']) == 0
    one, two = _only_run(here / 'by_python' / 'char_gru_b'), _only_run(here / 'by_lazylab' / 'char_gru_b')
    ra, rb = read_record(one), read_record(two)
    assert (ra['experiment'], ra['source'], ra['argv'][:-1]) == (rb['experiment'], rb['source'], rb['argv'][:-1])
    losses = [[(r['step'], r.get('loss.train'), r.get('loss.valid')) for r in read_metrics(d / 'metrics.jsonl')]
              for d in (one, two)]
    assert losses[0] == losses[1] and len(losses[0]) == 3  # bitwise: the same module, seed and batches
    assert (one / 'configs.yaml').read_text().replace('by_python', 'by_lazylab') == \
        (two / 'configs.yaml').read_text()


def test_sigterm_then_resume_finishes_a_file_experiment_as_if_it_never_stopped(here):
    _write(here / 'char_gru_c.py', GRU)
    long = [a for a in TINY if not a.startswith(('max_steps', 'valid_interval'))] + \
        ['max_steps=400', 'valid_interval=5', 'log_interval=5']
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', 'train', 'char_gru_c.py', *long,
                             'runs_dir=stopped'], cwd=here, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(here.glob('stopped/char_gru_c/*/checkpoint.pt')):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    run = _only_run(here / 'stopped' / 'char_gru_c')
    assert read_record(run)['status'] == 'killed'
    assert cli.main(['resume', str(run)]) == 0
    assert read_record(run)['status'] == 'completed'
    assert cli.main(['train', 'char_gru_c.py', *long, 'runs_dir=straight']) == 0
    straight = _only_run(here / 'straight' / 'char_gru_c')
    records = [[(r['step'], r.get('loss.train'), r.get('loss.valid')) for r in read_metrics(d / 'metrics.jsonl')]
               for d in (run, straight)]
    assert records[0] == records[1] and records[0][-1][0] == 400


def test_resume_of_an_edited_file_warns_once_and_still_checks_the_run(here, capsys):
    f = _write(here / 'char_gru_d.py', GRU)
    assert cli.main(['train', 'char_gru_d.py', *TINY]) == 0
    run = _only_run(here / 'runs' / 'char_gru_d')
    capsys.readouterr()
    assert cli.main(['resume', str(run)]) == 0
    assert capsys.readouterr().err == ''
    f.write_text(GRU + '\n# edited\n')
    for name in [n for n in sys.modules if n == 'char_gru_d']:
        del sys.modules[name]
    assert cli.main(['resume', str(run)]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f'lazylab: warning: {f.resolve()} changed since the run started (its sha256 '
                                f'differs); the configuration is still checked against the run\'s']
    assert 'nothing to do' in out
    f.write_text(GRU.replace('hidden: int = 12', 'hidden: int = 10'))  # another model than the checkpoint's
    del sys.modules['char_gru_d']
    as_stopped(run)  # with steps left to train, the resume checks the model against the checkpoint
    assert cli.main(['resume', str(run)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and 'changed since the run started' in err[0] and err[1] == (
        f"lazylab: error: {run / CHECKPOINT_PT} does not match the model of configs.yaml: 'gru.bias_hh_l0' is (36,) "
        f"there, (30,) here")


TASK = '''\
"""A Task of its own: predict the parity of a sequence's bits (batches of any shape the loss understands)."""
import sys

import torch
from torch import nn

from lazylab.configs import option
from lazylab.experiments import BatchLoss, Task, TrainerConfigs, device_of, evaluate, main
from lazylab.experiments.optimizers import OptimizerConfigs


class Parity(Task):
    batches_per_epoch = 50
    position_unit, loss_unit, loss_label = 'bits', 'nats', 'cross-entropy (nats)'

    def __init__(self, bits, batch_size, seed, device, target):
        self.bits, self.batch_size, self.seed, self.device, self.target = bits, batch_size, seed, device, target
        self.valid = [self._batch(10_000 + i) for i in range(2)]

    def _batch(self, index):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randint(0, 2, (self.bits, self.batch_size), generator=g).float()
        return x, (x.sum(0) % 2).long()

    def batches(self, epoch, start=0):
        for index in range(start, self.batches_per_epoch):
            yield self._batch(epoch * self.batches_per_epoch + index)

    def loss(self, model, x, y, reduction='mean'):
        logits = model(x.T)                        # [batch, 2]
        loss = nn.functional.cross_entropy(logits, y, reduction=reduction)
        return BatchLoss(loss, int((logits.argmax(-1) == y).sum()), y.numel())

    def evaluate(self, model, final):
        return evaluate(model, [(x.unsqueeze(0), y.unsqueeze(0)) for x, y in self.valid], self.device,
                        loss=lambda m, x, y, reduction: self.loss(m, x[0], y[0], reduction))

    def converged(self, valid):
        return valid['loss'] <= self.target


class Configs(TrainerConfigs):
    bits: int = 4                   # bits per sequence
    target: float = 0.0             # stop once the validation loss is at most this
    model: nn.Module = 'mlp'
    task: Task = 'parity'
    optimizer: OptimizerConfigs
    total_steps: int


@option(Configs.model, 'mlp')
def _mlp(c):
    return nn.Sequential(nn.Linear(c.bits, 16), nn.ReLU(), nn.Linear(16, 2)).to(device_of(c))


@option(Configs.task, 'parity')
def _parity(c):
    return Parity(c.bits, c.batch_size, c.seed, device_of(c), c.target)


@option(Configs.optimizer, 'adam')
def _optimizer(c):
    conf = OptimizerConfigs()
    conf.parameters = c.model.parameters()
    conf.total_steps = c.total_steps
    return conf


@option(Configs.total_steps, 'steps')
def _total_steps(c):
    return c.max_steps or c.epochs * c.task.batches_per_epoch


if __name__ == '__main__':
    sys.exit(main(Configs))
'''


def test_a_task_based_experiment_trains_resumes_and_says_when_its_target_stopped_it(here, capsys, cli_error):
    _write(here / 'parity_e.py', TASK)
    assert cli.main(['train', 'parity_e.py', 'max_steps=20', 'valid_interval=5', 'device=cpu', 'threads=1']) == 0
    out = capsys.readouterr().out
    run = _only_run(here / 'runs' / 'parity_e')
    assert out.splitlines()[0].startswith('parity_e: 114 parameters, 20 steps of ')  # (4 + 1)·16 + (16 + 1)·2
    assert out.splitlines()[-1].endswith(f'stopped at max_steps=20; run dir {run.relative_to(here)}')
    assert read_record(run)['loss_label'] == 'cross-entropy (nats)'
    assert cli.main(['resume', str(run)]) == 0
    assert 'nothing to do' in capsys.readouterr().out
    # a target any validation reaches: the run stops at its first validation, and its last line says why
    assert cli.main(['train', 'parity_e.py', 'max_steps=20', 'valid_interval=5', 'target=100', 'device=cpu',
                     'threads=1', 'runs_dir=early']) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert 'stopped early, at step 5 of 20: the task\'s target was reached (Parity.converged, valid loss ' in last
    assert read_record(_only_run(here / 'early' / 'parity_e'))['steps'] == 5
    assert cli_error(['generate', str(run), '--prompt', 'a', '--tokens', '2']).endswith(
        'which does not generate text; lazylab generate takes a run of a text model (an NLPAutoRegressionConfigs '
        'experiment)')


@pytest.mark.parametrize('item', ['task', 'total_steps', 'optimizer'])
def test_a_task_based_configs_without_an_item_the_trainer_reads_is_one_line_naming_it(here, cli_error, item):
    name = f'no_{item}_f'
    option_of = {'task': "@option(Configs.task, 'parity')", 'total_steps': "@option(Configs.total_steps, 'steps')",
                 'optimizer': "@option(Configs.optimizer, 'adam')"}[item]
    text = TASK.replace(option_of + '\n', '')  # the function stays, no option says it makes the item
    _write(here / f'{name}.py', text)
    message = cli_error(['train', f'{name}.py', 'max_steps=2', 'device=cpu'])
    assert message == (f"{(here / f'{name}.py').resolve()}: Configs has no option for {item!r}; an experiment on "
                       f"TrainerConfigs provides task, model, total_steps, optimizer, each declared and made by an "
                       f"@option(Configs.{item}) (see TrainerConfigs)")
    assert not (here / 'runs').exists()


def _plugin(site: Path, name: str) -> None:
    """An installed package `plugpkg_NAME` (a dist-info with the entry point) registering experiment NAME."""
    pkg = site / f'plugpkg_{name}'
    _write(pkg / '__init__.py', '')
    _write(pkg / 'lstm.py', GRU)
    info = site / f'plugpkg_{name}-1.2.dist-info'
    _write(info / 'METADATA', f'Metadata-Version: 2.1\nName: plugpkg_{name}\nVersion: 1.2\n')
    _write(info / 'entry_points.txt', f'[lazylab.experiments]\n{name} = plugpkg_{name}.lstm\n')


def test_an_installed_plugin_is_listed_trained_and_resumed(here, capsys, monkeypatch):
    _plugin(here / 'site', 'lstm_g7')
    monkeypatch.syspath_prepend(str(here / 'site'))
    assert cli.main(['--help']) == 0
    assert 'installed: lstm_g7 (plugpkg_lstm_g7)' in capsys.readouterr().out
    assert cli.main(['train', '--help']) == 0
    assert 'lstm_g7 (plugpkg_lstm_g7)' in capsys.readouterr().out
    assert cli.main(['train', 'lstm_g7', *TINY]) == 0
    run = _only_run(here / 'runs' / 'lstm_g7')
    assert read_record(run)['source'] == {'kind': 'entry_point', 'module': 'plugpkg_lstm_g7.lstm',
                                          'distribution': 'plugpkg_lstm_g7', 'version': '1.2'}
    assert cli.main(['resume', str(run)]) == 0 and cli.main(['options', 'lstm_g7']) == 0


@pytest.mark.parametrize('task, unit', [('text', 'characters'), ('custom', 'digits')])
def test_lazylab_new_writes_an_experiment_that_trains_as_written_and_never_overwrites(here, capsys, cli_error,
                                                                                       task, unit):
    name = f'mine_{task}'
    assert cli.main(['new', name, '--task', task]) == 0
    f = here / f'{name}.py'
    assert capsys.readouterr().out.startswith(f'wrote {name}.py: train it with `lazylab train {name}.py`')
    written = f.read_text()
    assert 'EXPERIMENT_NAME' not in written and f'lazylab train {name}.py' in written
    small = ['d_model=16', 'hidden=16'] if task == 'text' else ['hidden=8']
    assert cli.main(['train', f'{name}.py', *small, 'seq_len=16', 'batch_size=4', 'max_steps=4', 'valid_interval=2',
                     'valid_batches=1', *(['final_valid_batches=1', 'sample_tokens=5'] if task == 'text' else []),
                     'device=cpu', 'threads=1']) == 0
    out = capsys.readouterr().out
    assert f'of 4×16 {unit} on cpu' in out.splitlines()[0] and 'stopped at max_steps=4' in out.splitlines()[-1]
    assert cli_error(['new', name]) == f'{name}.py exists already; lazylab new does not overwrite it (choose ' \
                                       f'another NAME, or remove the file)'
    assert f.read_text() == written


@pytest.mark.parametrize('argv, message', [
    (['my-lstm'], "NAME must be a Python name (letters, digits and _, not starting with a digit), got 'my-lstm'"),
    (['feedback'], "'feedback' is the name of the builtin experiment lazylab.experiments.feedback; choose another "
                   "NAME"),
    (['class'], "NAME 'class' is a Python keyword: a module cannot be named so; choose another NAME"),
    (['torch.py'], "NAME 'torch' is the name of the Python module torch, which torch.py would hide from any code that "
                   "imports it; choose another NAME"),
    (['random'], "NAME 'random' is the name of the Python module random, which random.py would hide from any code "
                 "that imports it; choose another NAME"),
    (['x', '--task', 'images'], "argument --task: invalid choice: 'images' (choose from 'text', 'custom') (see: "
                                "lazylab new --help)"),
])
def test_lazylab_new_mistakes_are_one_line_and_write_nothing(here, cli_error, argv, message):
    assert cli_error(['new', *argv]) == message
    assert list(here.iterdir()) == []


NOT_AN_EXPERIMENT = {'no_configs_h.py': 'x = 1\n',
                     'not_trainer_h.py': 'from lazylab.configs import BaseConfigs\n\n\nclass Configs(BaseConfigs):\n'
                                         '    a: int = 1\n'}


@pytest.mark.parametrize('experiment, message', [
    ('missing_h.py', 'experiment file not found: missing_h.py'),
    ('nowhere_h.lstm', "unknown experiment 'nowhere_h.lstm' (experiments: feedback, fast_weights, transformer, "
                       "retrieval, mqar, state_tracking; or a .py file, or a module importable from here)"),
    ('no_configs_h.py', 'no_configs_h.py has no Configs: an experiment defines `class Configs(TrainerConfigs)` (from '
                        'lazylab.experiments import TrainerConfigs, or NLPAutoRegressionConfigs for a text model)'),
    ('not_trainer_h.py', 'not_trainer_h.py: its Configs is not a TrainerConfigs subclass; an experiment defines '
                         '`class Configs(TrainerConfigs)`'),
    ('transformer', "'transformer' is the builtin experiment lazylab.experiments.transformer, and also a file here "
                    "(transformer.py); name the file ./transformer.py, or the builtin one "
                    "lazylab.experiments.transformer"),
])
@pytest.mark.parametrize('command', ['train', 'options'])
def test_experiment_mistakes_are_one_line_and_write_nothing(here, cli_error, experiment, message, command):
    for name, text in NOT_AN_EXPERIMENT.items():
        _write(here / name, text)
    _write(here / 'transformer.py', GRU)
    before = sorted(here.iterdir())
    assert cli_error([command, experiment, *(['device=cpu'] if command == 'train' else [])]).startswith(message)
    assert sorted(here.iterdir()) == before


def test_a_bug_in_the_users_own_code_is_a_line_naming_the_option_then_their_traceback(here):
    f = _write(here / 'boom_i.py', GRU.replace("        super().__init__()\n",
                                           "        super().__init__()\n        raise ValueError('my bug: ' + "
                                           "str(n_tokens))\n", 1))
    done = subprocess.run([sys.executable, '-m', 'lazylab.cli', 'train', 'boom_i.py', *TINY], cwd=here, env=_env(),
                          capture_output=True, text=True, timeout=300)
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and lines[0] == ("lazylab: error: model: option 'gru' failed: ValueError: my bug: 65 "
                                                 "(a bug in boom_i.py's code: its traceback follows)"), done.stderr
    assert lines[1] == 'Traceback (most recent call last):' and lines[-1] == 'ValueError: my bug: 65'
    line = f.read_text().splitlines().index("        raise ValueError('my bug: ' + str(n_tokens))") + 1
    assert f'{f}", line {line}, in __init__' in done.stderr  # their frame, with its line
    assert not (here / 'runs').exists()


@pytest.mark.parametrize('command', [['train'], ['options'], ['sweep', 'hidden=8,16', '--dry-run']])
@pytest.mark.parametrize('broken, helper, message', [
    ('def f(:\n    pass\n', None, '{here}/syntax_q.py, line 1: SyntaxError: invalid syntax'),
    ('import helper_q\n', 'x = (\n', "{here}/helper_q.py, line 1: SyntaxError: '(' was never closed"),
    ('if True:\npass\n', None, "{here}/syntax_q.py, line 2: IndentationError: expected an indented block after "
                               "'if' statement on line 1"),
], ids=['its syntax', 'a neighbour it imports', 'indentation'])
def test_a_syntax_error_in_an_experiment_file_is_one_line_naming_file_and_line(here, cli_error, command, broken,
                                                                                helper, message):
    _write(here / 'syntax_q.py', broken + GRU)
    if helper is not None:
        _write(here / 'helper_q.py', helper)
    assert cli_error([command[0], 'syntax_q.py', *command[1:]]) == \
        message.format(here=here) + ' (the experiment syntax_q.py cannot be imported)'
    assert not (here / 'runs').exists()


@pytest.mark.parametrize('command', [['train'], ['options'], ['sweep', 'hidden=8,16', '--dry-run']])
def test_an_exception_an_experiment_raises_on_import_is_a_line_naming_it_then_its_traceback(here, command):
    f = _write(here / 'raises_r.py', 'import os\n\nraise RuntimeError("no data at " + os.sep + "x")\n' + GRU)
    done = subprocess.run([sys.executable, '-m', 'lazylab.cli', command[0], 'raises_r.py', *command[1:]], cwd=here,
                          env=_env(), capture_output=True, text=True, timeout=300)
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and lines[0] == ('lazylab: error: importing raises_r.py raised RuntimeError: no data '
                                                 'at /x (a bug in its code: its traceback follows)'), done.stderr
    assert lines[1] == 'Traceback (most recent call last):' and lines[-1] == 'RuntimeError: no data at /x'
    assert f'{f}", line 3, in <module>' in done.stderr  # their frame, with its line
    assert not (here / 'runs').exists()


def test_a_text_model_with_the_wrong_output_shape_is_refused_naming_both_shapes(here, cli_error):
    _write(here / 'wide_j.py', GRU.replace('nn.Linear(hidden, n_tokens)', 'nn.Linear(hidden, 7)'))
    assert cli_error(['train', 'wide_j.py', *TINY]) == (
        'the model returns logits of shape [16, 4, 7]; a text model must return logits [seq_len, batch_size, '
        'n_tokens] = [16, 4, 65] (alone, or as (logits, state))')
    assert not (here / 'runs').exists()


@pytest.mark.parametrize('launch', ['module', 'file'])
def test_torchrun_trains_a_file_experiment_on_two_processes(here, launch):
    _write(here / 'char_gru_k.py', GRU)
    head = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    command = [*head, '-m', 'lazylab.cli', 'train', './char_gru_k.py'] if launch == 'module' else \
        [*head, 'char_gru_k.py']
    proc = subprocess.Popen([*command, *replaced(TINY, 'batch_size=2')], cwd=here, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    run = _only_run(here / 'runs' / 'char_gru_k')
    info = read_record(run)
    assert info['status'] == 'completed' and info['source']['kind'] == 'file'
    assert load_checkpoint(run / CHECKPOINT_PT)['world_size'] == 2
    assert '2 processes (effective batch 4)' in out and out.count('done: step 3') == 1, out
    assert json.loads((run / 'run.json').read_text())['experiment'] == 'char_gru_k'


def test_the_tutorials_code_is_what_lazylab_new_writes():
    """docs/tutorial.md shows lstm.py whole and sorter.py's Task: they must be what `lazylab new` writes."""
    import re
    page = (ROOT / 'docs' / 'tutorial.md').read_text(encoding='utf-8')
    blocks = re.findall(r'^```python\n(.*?)^```$', page, flags=re.S | re.M)
    templates = ROOT / 'lazylab' / 'experiments' / 'templates'
    text = (templates / 'text.py').read_text().replace('EXPERIMENT_NAME', 'lstm')
    custom = (templates / 'custom.py').read_text()
    assert blocks[0] == text
    task = blocks[1].split('\n\n\nclass SortDigits')[1]
    assert '\n\n\nclass SortDigits' + task in custom and 'def converged' in task


def test_lazylab_new_is_not_fooled_by_a_folder_an_earlier_experiment_put_on_sys_path(here, tmp_path_factory,
                                                                                     monkeypatch, capsys):
    # training ../other/lstm_z.py in this process put its folder on sys.path: lstm_z is importable here, but it
    # is not an installed module that a new lstm_z.py would hide
    other = tmp_path_factory.mktemp('other')
    _write(other / 'lstm_z.py', 'x = 1\n')
    monkeypatch.syspath_prepend(str(other))
    assert cli.main(['new', 'lstm_z']) == 0 and (here / 'lstm_z.py').is_file()
