"""The launcher interface (lazylab.sweeps.launcher): a sweep asks its launcher to start each trial, polls the process
it gets back, and collects the trial's result from the trial's folder. A test double that records the trials it is
given, writes each one's result as an ordinary run would, and returns a process that has ended, drives a real
plan of a small grid; every value it reports is set by hand below, so the study, the trial records and the table
can be checked exactly."""
import json
import shlex
import sys
from pathlib import Path

import optuna
import pytest

from lazylab import runs
from lazylab.sweeps import launcher as launcher_module
from lazylab.sweeps.launcher import LocalLauncher, TrialSpec
from lazylab.sweeps.plan import make_plan
from lazylab.sweeps.workers import Sweep

#: loss.valid each point ends with: (d_model, seed) → value, set by hand
LOSSES = {('16', '0'): 2.5, ('16', '1'): 2.25, ('32', '0'): 1.75, ('32', '1'): 2.0}


class Ended:
    """A trial process that has ended with `returncode` (what `TrialProcess` asks of one)."""

    def __init__(self, returncode: int):
        self.returncode = returncode
        self.signals: list[int] = []

    def poll(self):
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)

    def wait(self, timeout=None) -> int:
        return self.returncode

    def kill(self) -> None:
        raise AssertionError('an ended process is never killed')


class RecordingLauncher:
    """Records each TrialSpec; writes the run.json and metrics.jsonl of a finished run in the trial's folder (the
    loss of `LOSSES`), or, for the points in `fail`, a `lazylab: error:` line in its log and exit code 2."""

    def __init__(self, fail: tuple = ()):
        self.trials: list[TrialSpec] = []
        self.fail = fail

    def cores_per_trial(self, workers: int) -> int:
        return 3

    def launch(self, trial: TrialSpec) -> Ended:
        self.trials.append(trial)
        settings = dict(a.split('=', 1) for a in trial.args[trial.args.index('--') + 1:])
        point = (settings['d_model'], settings['seed'])
        if point in self.fail:
            trial.log.write_text('lazylab: error: d_model=32 seed=1 is out of memory\n', encoding='utf-8')
            return Ended(2)
        runs.write_record(trial.folder, {'experiment': 'transformer', 'status': 'completed', 'steps': 4})
        records = [{'step': 2, 'tokens': 128, 'loss.valid': LOSSES[point] + 1.0},
                   {'step': 4, 'tokens': 256, 'loss.valid': LOSSES[point]}]
        (trial.folder / runs.METRICS_JSONL).write_text(''.join(json.dumps(r) + '\n' for r in records))
        return Ended(0)


def _sizes(tools) -> list[str]:
    return [t for t in tools.TINY if not t.startswith('d_model=')]


def _plan(tools, tmp_path: Path, study: str):
    return make_plan(['transformer', *_sizes(tools), 'd_model=16,32', 'seed=0,1', f'runs_dir={tmp_path}',
                      '--workers', '2', '--study', study])


def _study(sweep_dir: Path, name: str):
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(sweep_dir / runs.STUDY_JOURNAL)))
    return optuna.load_study(study_name=name, storage=storage)


def test_a_sweep_asks_its_launcher_for_every_trial_and_collects_each_result_from_its_folder(tools, tmp_path,
                                                                                            capsys):
    fake = RecordingLauncher()
    plan = _plan(tools, tmp_path, 'fake')
    assert Sweep(plan, launcher=fake).run() == 0
    d = tmp_path / 'transformer' / 'sweep-fake'
    # the grid in its order, two workers taking turns, each trial in its own folder with its settings and threads
    assert [(t.number, t.worker, t.threads, t.resume) for t in fake.trials] == \
        [(0, 0, 3, False), (1, 1, 3, False), (2, 0, 3, False), (3, 1, 3, False)]
    assert [t.folder for t in fake.trials] == [d / f'trial-{n:04d}' for n in range(4)]
    assert [t.env for t in fake.trials] == [{}] * 4  # no pruner: no study for the trial
    first = fake.trials[0].args
    assert first[:4] == [str(d / 'trial-0000'), 'transformer', '--swept', 'd_model,seed']
    assert json.loads(first[5]) == {'dir': str(d), 'study': 'fake', 'trial': 0}
    assert first[6:] == ['--', *_sizes(tools), f'runs_dir={tmp_path}', 'threads=3', 'd_model=16', 'seed=0']
    # what the launcher's trials wrote is what the study, the trial records and the table say
    study = _study(d, 'fake')
    assert [(t.params['d_model'], t.params['seed'], t.state.name, t.value) for t in study.trials] == \
        [(16, 0, 'COMPLETE', 2.5), (16, 1, 'COMPLETE', 2.25), (32, 0, 'COMPLETE', 1.75), (32, 1, 'COMPLETE', 2.0)]
    records = [json.loads((d / f'trial-{n:04d}' / 'trial.json').read_text()) for n in range(4)]
    assert [(r['state'], r['value'], r['steps'], r['returncode']) for r in records] == \
        [('completed', 2.5, 4, 0), ('completed', 2.25, 4, 0), ('completed', 1.75, 4, 0), ('completed', 2.0, 4, 0)]
    table = capsys.readouterr().out.split('\n\n', 1)[1].splitlines()
    assert [line.split()[:4] for line in table[2:]] == [['0002', '32', '0', '1.7500'], ['0003', '32', '1', '2.0000'],
                                                        ['0001', '16', '1', '2.2500'], ['0000', '16', '0', '2.5000']]


def test_a_trial_whose_process_fails_is_failed_with_its_error_line_and_the_sweep_exits_with_1(tools, tmp_path,
                                                                                              capsys):
    fake = RecordingLauncher(fail=(('32', '1'),))
    assert Sweep(_plan(tools, tmp_path, 'failing'), launcher=fake).run() == 1
    d = tmp_path / 'transformer' / 'sweep-failing'
    assert [t.state.name for t in _study(d, 'failing').trials] == ['COMPLETE', 'COMPLETE', 'COMPLETE', 'FAIL']
    record = json.loads((d / 'trial-0003' / 'trial.json').read_text())
    assert (record['state'], record['error'], record['returncode']) == \
        ('failed', 'd_model=32 seed=1 is out of memory', 2)
    out = capsys.readouterr().out
    assert 'trial 0003 failed' in out and out.rstrip().endswith('trial 0003 failed: d_model=32 seed=1 is out of memory')


def test_the_local_launcher_divides_the_cores_among_workers_and_a_torchrun_prefixs_processes(monkeypatch):
    monkeypatch.setattr(launcher_module, 'cores', lambda: 16)
    assert LocalLauncher(['python']).cores_per_trial(4) == 4
    torchrun = LocalLauncher(['torchrun', '--standalone', '--nproc_per_node=2'])
    assert (torchrun.processes_per_trial, torchrun.cores_per_trial(4)) == (2, 2)
    assert LocalLauncher(['torchrun', '--nproc-per-node', '8']).cores_per_trial(4) == 1  # at least one


@pytest.mark.parametrize('visible, worker, expected', [('0,1', 0, '0'), ('0,1', 3, '1'), ('5', 2, '5'), ('', 1, '')],
                         ids=['worker 0', 'worker 3 of 2 GPUs', 'one GPU', 'none'])
def test_the_local_launcher_gives_worker_i_gpu_i_mod_n_and_the_trials_threads(tmp_path, monkeypatch, visible,
                                                                              worker, expected):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', visible)
    stub = tmp_path / 'stub.py'  # a prefix (as --launcher COMMAND is) that prints what it was given
    stub.write_text('import json, os, sys\n'
                    'print(json.dumps([sys.argv[1:], os.environ.get("CUDA_VISIBLE_DEVICES"), '
                    'os.environ["OMP_NUM_THREADS"], os.environ["LAZYLAB_X"]]))\n')
    folder = tmp_path / 'trial-0007'
    folder.mkdir()
    spec = TrialSpec(7, folder, ['a', 'b=1'], threads=5, worker=worker, env={'LAZYLAB_X': 'y'})
    launcher = LocalLauncher([sys.executable, str(stub)], shown=lambda s: s.replace('b=1', 'b=***'))
    assert launcher.launch(spec).wait(timeout=60) == 0
    header, printed = (folder / 'output.log').read_text().splitlines()
    assert header.endswith(f' started: {shlex.join([sys.executable, str(stub)])} -m lazylab.sweeps.trial a b=***')
    assert json.loads(printed) == [['-m', 'lazylab.sweeps.trial', 'a', 'b=1'], expected, '5', 'y']
