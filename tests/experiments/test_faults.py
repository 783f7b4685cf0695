"""Faults of the machine, not of the user's settings: a checkpoint that cannot be written (a full disk at the first
checkpoint or a later one, torch's own RuntimeError from its writer, a read-only folder) is one line and exit 2
with run.json `failed`, no temporary file and the earlier checkpoint intact; run.json is replaced atomically;
run directories are made without a race when several runs start together on a new runs_dir.

A full disk is simulated without root: the checkpoint module's `open` gives a file with a few bytes of room
(`_FullDiskFile`), so the real `torch.save` meets a real ENOSPC OSError from a write and raises what it raises on
a full disk (its `[enforce fail at inline_container.cc…]` RuntimeError, with the OSError as its context)."""
import errno
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lazylab import cli
from lazylab import runs as runs_module
from lazylab.errors import CheckpointError, UsageError
from lazylab.experiments import checkpoint as checkpoint_module
from lazylab.experiments.checkpoint import load_checkpoint, save_checkpoint
from lazylab.runs import CHECKPOINT_PT as CHECKPOINT
from lazylab.testing import TINY, lazylab_argv, lazylab_env, tiny, wait_until

ROOT = Path(__file__).resolve().parents[2]
ENOSPC = os.strerror(errno.ENOSPC)  # 'No space left on device'


class _FullDiskFile(io.FileIO):
    """A file on a disk with `room` bytes free: the write that would go past them fails as on a full disk."""

    def __init__(self, path, mode: str, room: int):
        super().__init__(path, mode)
        self.room = room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, ENOSPC)
        self.room -= len(data)
        return super().write(data)


def full_disk_after(opens: int, room: int = 64):
    """An `open` for the checkpoint module: the first `opens` files are ordinary, later ones fill the disk."""
    calls = []

    def fake_open(file, mode='r', *args, **kwargs):
        calls.append(file)
        if len(calls) <= opens:
            return open(file, mode, *args, **kwargs)
        return _FullDiskFile(file, mode, room)
    return fake_open


def _temporary_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob('*') if '.tmp' in p.name)


def _only_run(runs: Path) -> Path:
    run, = (runs / 'transformer').iterdir()
    return run


# --- save_checkpoint --------------------------------------------------------------------------------------------

#: bytes of room on the full disk, and what the real torch.save raises there (torch 2.13, the payload below):
#: the zip writer's RuntimeError (the issue's case) when the disk fills after its first records, the file's
#: OSError when it fills at the very first write or only at the end (the last record, before close)
ROOMS = {16: OSError, 64: RuntimeError, 4000: RuntimeError, 5000: OSError}
PAYLOAD = {'format': checkpoint_module.FORMAT, 'a': torch.zeros(1000), 'b': 'x' * 100}


@pytest.mark.parametrize('room', ROOMS)
def test_what_the_real_torch_save_raises_on_a_full_disk(room):
    """The premise of the simulation; both kinds must become the one CheckpointError."""
    with pytest.raises(ROOMS[room]) as caught:
        with _FullDiskFile(os.devnull, 'wb', room=room) as f:
            torch.save(PAYLOAD, f)
    if ROOMS[room] is RuntimeError:
        assert str(caught.value).startswith('[enforce fail at inline_container.cc')
        assert isinstance(caught.value.__context__, OSError) and caught.value.__context__.errno == errno.ENOSPC


@pytest.mark.parametrize('room', ROOMS)
def test_a_full_disk_anywhere_in_the_write_is_one_checkpoint_error(tmp_path, monkeypatch, room):
    monkeypatch.setattr(checkpoint_module, 'open', lambda file, mode: _FullDiskFile(file, mode, room), raising=False)
    with pytest.raises(CheckpointError) as caught:
        save_checkpoint(tmp_path / CHECKPOINT, PAYLOAD)
    assert str(caught.value) == f'cannot write the checkpoint {tmp_path / CHECKPOINT} (no checkpoint was written): ' \
                                f'{ENOSPC}'
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('earlier', [False, True], ids=['first checkpoint', 'earlier checkpoint'])
def test_a_full_disk_is_one_checkpoint_error_whether_or_not_an_earlier_checkpoint_exists(
        tmp_path, monkeypatch, earlier):
    path = tmp_path / CHECKPOINT
    if earlier:
        save_checkpoint(path, {'format': checkpoint_module.FORMAT, 'step': 1})
    before = path.read_bytes() if earlier else None
    monkeypatch.setattr(checkpoint_module, 'open', full_disk_after(0), raising=False)
    kept = 'the previous checkpoint is kept' if earlier else 'no checkpoint was written'
    with pytest.raises(CheckpointError) as caught:
        save_checkpoint(path, {'format': checkpoint_module.FORMAT, 'step': 2, 'w': torch.zeros(4096)})
    assert str(caught.value) == f'cannot write the checkpoint {path} ({kept}): {ENOSPC}'
    assert _temporary_files(tmp_path) == []
    assert (path.read_bytes() if earlier else path.exists()) == (before if earlier else False)


@pytest.mark.parametrize('raised, reason', [
    (RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 46 vs 0'),
     '[enforce fail at inline_container.cc:672] . unexpected pos 46 vs 0'),
    (RuntimeError('PytorchStreamWriter failed writing file data/0: file write failed\nmore'),
     'PytorchStreamWriter failed writing file data/0: file write failed'),
    (OSError(errno.EROFS, os.strerror(errno.EROFS)), os.strerror(errno.EROFS)),
], ids=['zip writer', 'stream writer', 'read-only file system'])
def test_a_writer_error_of_torch_is_a_checkpoint_error_with_its_first_line(tmp_path, monkeypatch, raised, reason):
    def writer(payload, f):
        f.write(b'part of a checkpoint')
        raise raised
    monkeypatch.setattr(checkpoint_module.torch, 'save', writer)
    with pytest.raises(CheckpointError) as caught:
        save_checkpoint(tmp_path / CHECKPOINT, {})
    assert str(caught.value) == f'cannot write the checkpoint {tmp_path / CHECKPOINT} (no checkpoint was written): ' \
                                f'{reason}'
    assert list(tmp_path.iterdir()) == []


def test_a_runtime_error_that_is_not_the_writers_keeps_its_traceback(tmp_path, monkeypatch):
    def writer(payload, f):
        raise RuntimeError('a bug in the payload')
    monkeypatch.setattr(checkpoint_module.torch, 'save', writer)
    with pytest.raises(RuntimeError, match='^a bug in the payload$'):
        save_checkpoint(tmp_path / CHECKPOINT, {})
    assert list(tmp_path.iterdir()) == []


def _make_read_only(folder: Path, monkeypatch) -> str:
    """chmod `folder` read-only; where that does not stop this process (root), make the checkpoint module's
    writes there fail as the mode says they would (EACCES). Returns which of the two it did."""
    folder.chmod(0o555)
    probe = folder / 'probe'
    try:
        probe.touch()
    except PermissionError:
        return 'chmod'
    probe.unlink()

    def guarded_open(file, mode='r', *args, **kwargs):
        if Path(file).parent == folder and set(mode) & set('wxa+'):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return open(file, mode, *args, **kwargs)
    monkeypatch.setattr(checkpoint_module, 'open', guarded_open, raising=False)
    return 'simulated'


@pytest.mark.parametrize('earlier', [False, True], ids=['first checkpoint', 'earlier checkpoint'])
def test_a_read_only_checkpoint_folder_is_one_checkpoint_error(tmp_path, monkeypatch, earlier):
    folder = tmp_path / 'run'
    folder.mkdir()
    path = folder / CHECKPOINT
    if earlier:
        save_checkpoint(path, {'format': checkpoint_module.FORMAT, 'step': 1})
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    try:
        how = _make_read_only(folder, monkeypatch)
        kept = 'the previous checkpoint is kept' if earlier else 'no checkpoint was written'
        with pytest.raises(CheckpointError) as caught:
            save_checkpoint(path, {'format': checkpoint_module.FORMAT, 'step': 2})
    finally:
        folder.chmod(0o755)
    assert how in ('chmod', 'simulated')
    assert str(caught.value) == f'cannot write the checkpoint {path} ({kept}): {os.strerror(errno.EACCES)}'
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# --- a run whose checkpoint cannot be written -------------------------------------------------------------------

@pytest.mark.parametrize('opens', [0, 1], ids=['at the first checkpoint', 'at the second checkpoint'])
def test_training_on_a_full_disk_is_one_line_exit_2_and_run_json_failed(tmp_path, cli_error, monkeypatch, opens):
    monkeypatch.setattr(checkpoint_module, 'open', full_disk_after(opens), raising=False)
    message = cli_error(['train', 'transformer', *TINY, f'runs_dir={tmp_path}'])
    run = _only_run(tmp_path)
    kept = 'the previous checkpoint is kept' if opens else 'no checkpoint was written'
    assert message == f'cannot write the checkpoint {run / CHECKPOINT} ({kept}): {ENOSPC}'
    info = json.loads((run / 'run.json').read_text(encoding='utf-8'))
    assert (info['status'], info['error']) == ('failed', message)
    assert _temporary_files(tmp_path) == []
    if opens:
        assert load_checkpoint(run / CHECKPOINT)['position']['step'] == 1
    else:
        assert not (run / CHECKPOINT).exists()


def test_resume_on_a_full_disk_is_one_line_and_keeps_the_checkpoint(tmp_path, cli_error, monkeypatch):
    monkeypatch.setattr(checkpoint_module, 'open', full_disk_after(1), raising=False)
    cli_error(['train', 'transformer', *TINY, f'runs_dir={tmp_path}'])  # fails at step 2, keeps step 1
    run = _only_run(tmp_path)
    saved = (run / CHECKPOINT).read_bytes()
    monkeypatch.setattr(checkpoint_module, 'open', full_disk_after(0), raising=False)
    message = cli_error(['resume', str(run)])
    assert message == f'cannot write the checkpoint {run / CHECKPOINT} (the previous checkpoint is kept): {ENOSPC}'
    info = json.loads((run / 'run.json').read_text(encoding='utf-8'))
    assert (info['status'], info['error']) == ('failed', message)
    assert (run / CHECKPOINT).read_bytes() == saved and _temporary_files(tmp_path) == []


WRAPPER = '''
import errno, io, os, sys
from lazylab import cli
from lazylab.experiments import checkpoint


class FullDisk(io.FileIO):
    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


checkpoint.open = FullDisk  # every checkpoint file is on a full disk; the real torch.save writes to it
sys.exit(cli.main(sys.argv[1:]))
'''


def test_a_full_disk_at_the_first_checkpoint_of_a_lazylab_process(tmp_path):
    """The whole process, as the user sees it: stderr is the one line, exit code 2."""
    wrapper = tmp_path / 'full_disk.py'
    wrapper.write_text(WRAPPER, encoding='utf-8')
    runs = tmp_path / 'runs'
    done = subprocess.run([sys.executable, str(wrapper), 'train', 'transformer', *TINY, f'runs_dir={runs}'],
                          env={**os.environ, 'PYTHONPATH': str(ROOT)}, capture_output=True, text=True, timeout=300)
    run = _only_run(runs)
    line = f'lazylab: error: cannot write the checkpoint {run / CHECKPOINT} (no checkpoint was written): {ENOSPC}'
    assert (done.returncode, done.stderr) == (2, line + '\n')
    info = json.loads((run / 'run.json').read_text(encoding='utf-8'))
    assert (info['status'], info['error']) == ('failed', line[len('lazylab: error: '):])
    assert _temporary_files(runs) == [] and not (run / CHECKPOINT).exists()


def test_a_failure_that_run_json_cannot_record_is_still_one_error_line(tmp_path, capsys, monkeypatch):
    """The disk is still full when the failure is recorded: the one error line ends saying run.json could not
    take it; no traceback, exit 2, and run.json is the one written at the start (status running)."""
    monkeypatch.setattr(checkpoint_module, 'open', full_disk_after(0), raising=False)
    real = runs_module.write_record

    def full(run_dir, info):
        if info.get('status') == 'failed':
            raise OSError(errno.ENOSPC, ENOSPC)
        real(run_dir, info)
    monkeypatch.setattr(runs_module, 'write_record', full)
    assert cli.main(['train', 'transformer', *TINY, f'runs_dir={tmp_path}']) == 2
    run = _only_run(tmp_path)
    assert capsys.readouterr().err.splitlines() == [
        f'lazylab: error: cannot write the checkpoint {run / CHECKPOINT} (no checkpoint was written): {ENOSPC} '
        f'({run / "run.json"} could not record the failure: {ENOSPC})']
    assert json.loads((run / 'run.json').read_text(encoding='utf-8'))['status'] == 'running'


def test_run_json_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    runs_module.write_record(tmp_path, {'status': 'running'})
    before = (tmp_path / 'run.json').read_bytes()
    real = Path.write_text

    def half_then_full(self, data, *args, **kwargs):
        real(self, data[:len(data) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, ENOSPC)
    monkeypatch.setattr(Path, 'write_text', half_then_full)
    with pytest.raises(OSError, match=ENOSPC):
        runs_module.write_record(tmp_path, {'status': 'failed', 'error': 'x' * 1000})
    assert (tmp_path / 'run.json').read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ['run.json']


class _HalfThenFull(io.FileIO):
    """Takes half of the first write, then the disk is full."""

    def write(self, data) -> int:
        if getattr(self, 'written', False):
            raise OSError(errno.ENOSPC, ENOSPC)
        self.written = True
        return super().write(bytes(data)[:max(1, len(data) // 2)])


def test_a_metrics_line_that_does_not_fit_is_not_left_half_written(tmp_path, monkeypatch):
    from lazylab.errors import TrainingError
    from lazylab.experiments import metrics
    path = tmp_path / 'metrics.jsonl'
    path.write_text('{"step": 1}\n')
    monkeypatch.setattr(metrics, 'open', lambda file, mode, buffering=-1: _HalfThenFull(file, mode), raising=False)
    with pytest.raises(TrainingError, match=rf'^cannot write {path}: {ENOSPC}$'):
        metrics.MetricsLog(path).write({'step': 2, 'loss.train': 1.5})
    assert path.read_text() == '{"step": 1}\n'


def test_training_whose_metrics_cannot_be_written_is_one_line_and_run_json_failed(tmp_path, cli_error, monkeypatch):
    from lazylab.experiments import metrics
    monkeypatch.setattr(metrics, 'open', lambda file, mode, buffering=-1: _HalfThenFull(file, mode), raising=False)
    message = cli_error(['train', 'transformer', *TINY, f'runs_dir={tmp_path}'])
    run = _only_run(tmp_path)
    assert message == f'cannot write {run / "metrics.jsonl"}: {ENOSPC}'
    info = json.loads((run / 'run.json').read_text(encoding='utf-8'))
    assert (info['status'], info['error']) == ('failed', message)
    assert (run / 'metrics.jsonl').read_bytes() == b''


# --- run directories made without a race ------------------------------------------------------------------------

def test_a_runs_dir_another_process_makes_first_is_used(tmp_path, monkeypatch):
    """Between `is_dir()` and `mkdir()` another run makes runs_dir (and runs_dir/NAME): this one uses them, and
    does not count them as its own (a failure after would leave them to the other run)."""
    runs = tmp_path / 'runs'
    real = Path.mkdir

    def the_other_process_first(self, *args, **kwargs):
        if self in (runs, runs / 'transformer'):
            real(self)  # the other process
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(self))
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Path, 'mkdir', the_other_process_first)
    made = []
    run_dir = runs_module.make_run_dir(runs / 'transformer', made)
    assert run_dir.parent == runs / 'transformer' and run_dir.is_dir()
    assert made == [run_dir]


def test_a_run_id_another_run_took_is_drawn_again(tmp_path, monkeypatch):
    ids = iter(['20261201-120000-aaaa', '20261201-120000-aaaa', '20261201-120000-bbbb'])
    monkeypatch.setattr(runs_module, 'new_run_id', lambda: next(ids))
    first = runs_module.make_run_dir(tmp_path / 'transformer')
    second = runs_module.make_run_dir(tmp_path / 'transformer')
    assert (first.name, second.name) == ('20261201-120000-aaaa', '20261201-120000-bbbb')
    monkeypatch.setattr(runs_module, 'new_run_id', lambda: '20261201-120000-aaaa')  # every id taken
    with pytest.raises(UsageError, match=rf"^cannot create a run directory in runs_dir='{tmp_path}': "
                                         rf'20 new run ids in a row were taken in '):
        runs_module.make_run_dir(tmp_path / 'transformer', where=f'runs_dir={str(tmp_path)!r}')


def test_a_failed_start_removes_only_its_own_run_not_one_started_beside_it(tmp_path):
    """Run A made runs_dir and runs_dir/NAME, run B started inside them, then A's first files failed: A's folder
    goes, B's run and the folders holding it stay."""
    runs = tmp_path / 'runs'
    made = []
    a = runs_module.make_run_dir(runs / 'transformer', made)
    b = runs_module.make_run_dir(runs / 'transformer')
    (b / 'run.json').write_text('{}')
    runs_module.remove_made(made, a)
    assert not a.exists() and (b / 'run.json').read_text() == '{}'


def _start_together(barrier, runs_dir: str, queue) -> None:
    barrier.wait()
    try:
        queue.put(str(runs_module.make_run_dir(Path(runs_dir) / 'transformer')))
    except UsageError as e:
        queue.put(f'error: {e}')


def test_runs_started_together_on_a_new_runs_dir_each_get_their_own_directory(tmp_path):
    """Real processes, released together by a barrier, each make a run directory in the same new runs_dir (a few
    levels deep, so they meet at every parent): every one succeeds, and no two share a folder."""
    context = multiprocessing.get_context('fork')
    processes, rounds = 6, 5
    for k in range(rounds):
        runs_dir = str(tmp_path / f'round{k}' / 'runs' / 'deep')
        barrier, queue = context.Barrier(processes), context.Queue()
        children = [context.Process(target=_start_together, args=(barrier, runs_dir, queue))
                    for _ in range(processes)]
        for child in children:
            child.start()
        got = [queue.get(timeout=120) for _ in children]
        for child in children:
            child.join(timeout=120)
        assert [child.exitcode for child in children] == [0] * processes
        assert not [g for g in got if g.startswith('error: ')], got
        assert len(set(got)) == processes
        assert sorted(p.name for p in (Path(runs_dir) / 'transformer').iterdir()) == sorted(Path(g).name for g in got)


def test_three_lazylab_trains_started_together_on_a_new_runs_dir_all_complete(tmp_path):
    """The issue's case end to end: three `lazylab train` processes at once, one new runs_dir."""
    runs = tmp_path / 'runs'
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'}
    one_step = tiny('max_steps=1')
    argv = [sys.executable, '-m', 'lazylab.cli', 'train', 'transformer', *one_step, f'runs_dir={runs}']
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    done = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in done]
    runs_made = sorted((runs / 'transformer').iterdir())
    assert len(runs_made) == 3
    assert [json.loads((r / 'run.json').read_text())['status'] for r in runs_made] == ['completed'] * 3


# --- a run directory that fails mid-run -------------------------------------------------------------------------

def _read_only_mounts_allowed(folder: Path) -> bool:
    """Whether this process may bind-mount a folder read-only over itself (root, with mount rights)."""
    probe = folder / 'probe'
    probe.mkdir()
    try:
        done = subprocess.run(['mount', '--bind', str(probe), str(probe)], capture_output=True)
        if done.returncode != 0:
            return False
        subprocess.run(['umount', str(probe)], capture_output=True)
        return True
    except OSError:
        return False


def test_a_run_directory_that_turns_read_only_mid_run_ends_it_at_once_with_one_line(tmp_path):
    """The issue's case: `mount -o remount,ro,bind` on the run directory while it trains. Before, labml's own
    OSError hid lazylab's, and the process hung for good on labml's writer thread."""
    if os.geteuid() != 0 or not _read_only_mounts_allowed(tmp_path):
        pytest.skip('needs root with mount rights, to make the run directory read-only under the running process')
    proc = subprocess.Popen(lazylab_argv('train', 'transformer', *tiny('max_steps=100000', 'valid_interval=10'),
                                         f'runs_dir={tmp_path / "runs"}'),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=lazylab_env())
    mounted = None
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / 'runs').glob('transformer/*/checkpoint.pt')):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        run = _only_run(tmp_path / 'runs')
        subprocess.run(['mount', '--bind', str(run), str(run)], check=True)
        mounted = run
        # a read-only remount fails (EBUSY) while the run has a file open for writing through the new mount:
        # try again until it lands between two writes
        wait_until(lambda: subprocess.run(['mount', '-o', 'remount,ro,bind', str(run)],
                                          stderr=subprocess.DEVNULL).returncode == 0,
                   30, 'a read-only remount between two writes', every=0.01)
        out, err = proc.communicate(timeout=60)  # within seconds; a minute only guards against a hang
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if mounted is not None:
            subprocess.run(['umount', '-l', str(mounted)], check=True)
    assert proc.returncode == 2, err
    assert 'Traceback' not in err and len(err.strip().splitlines()) == 1, err
    rofs = os.strerror(errno.EROFS)
    line = re.fullmatch(rf'lazylab: error: cannot write (the checkpoint )?{re.escape(str(run))}/(\S+?):? .*'
                        rf'\({re.escape(str(run / "run.json"))} could not record the failure: {rofs}\)', err.strip())
    assert line and rofs in err, err
    assert json.loads((run / 'run.json').read_text())['status'] == 'running'  # as it was: it could not be written
    assert load_checkpoint(run / CHECKPOINT)['position']['step'] % 10 == 0  # the last one written whole is kept


LABML_FAILS = '''
import errno, sys
import labml.internal.experiment as experiment
import labml.internal.tracker.writers.file as file_writer
from lazylab import cli

def read_only(path, *args, **kwargs):
    raise OSError(errno.EROFS, 'Read-only file system', str(path))

for module in {modules}:
    module.open = read_only  # labml's files only; lazylab's own are written as usual
sys.exit(cli.main(sys.argv[1:]))
'''


@pytest.mark.parametrize('modules, culprit', [('[experiment]', 'run_log.jsonl'), ('[file_writer]', 'log.jsonl'),
                                              ('[experiment, file_writer]', 'run_log.jsonl')])
def test_labmls_own_files_failing_end_the_run_with_one_line_and_no_hang(tmp_path, modules, culprit):
    script = tmp_path / 'labml_fails.py'
    script.write_text(LABML_FAILS.format(modules=modules))
    done = subprocess.run([sys.executable, str(script), 'train', 'transformer', *TINY, f'runs_dir={tmp_path}'],
                          capture_output=True, text=True, env=lazylab_env(), timeout=120)
    run = _only_run(tmp_path)
    assert done.returncode == 2, done.stderr
    labml_run = next(run.glob('labml/transformer/*'))
    assert done.stderr.splitlines() == [f'lazylab: error: cannot write {labml_run / culprit}: Read-only file system']
    assert json.loads((run / 'run.json').read_text())['status'] == 'failed'
