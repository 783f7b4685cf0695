"""What the run commands do alongside other processes, in real child processes: a resume while another process
still trains the run is refused before it prints or writes anything; generate reads a checkpoint while it is being
written; a finished run's resume says only that there is nothing to do."""
import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

from lazylab.testing import run_lazylab, start_lazylab, tiny

#: long enough (600 steps) to be still training while the other command runs; a checkpoint every 5 steps
SIZES = tiny('sample_tokens=4', 'max_steps=600', 'valid_interval=5', 'log_interval=5')


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)


def _labml_pid(run: Path) -> Optional[int]:
    uuid = json.loads((run / 'run.json').read_text())['uuid']
    files = list((run / 'labml').glob(f'*/{uuid}/run.pid'))
    try:
        return int(files[0].read_text()) if files else None
    except ValueError:  # being written
        return None


def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob('*') if p.is_file()}


def test_resume_while_train_still_trains_the_run_is_refused_and_generate_reads_its_checkpoint(tmp_path):
    # a run far too long to end by itself, writing a checkpoint every 5 steps while the other commands read
    train = start_lazylab('train', 'transformer', *tiny('sample_tokens=4', 'max_steps=1000000', 'valid_interval=5',
                                                        'log_interval=5'), f'runs_dir={tmp_path}')
    _wait_for(lambda: list(tmp_path.glob('transformer/*/checkpoint.pt')), train)
    run, = (tmp_path / 'transformer').iterdir()
    _wait_for(lambda: _labml_pid(run) == train.pid, train)
    run_json = (run / 'run.json').read_bytes()

    resumed = run_lazylab('resume', str(run))
    generated = run_lazylab('generate', str(run), '--prompt', 'a', '--tokens', '30', '--seed', '3')
    training = train.poll() is None
    after = (run / 'run.json').read_bytes()
    train.terminate()
    out, err = train.communicate(timeout=300)

    assert resumed.returncode == 2 and resumed.stdout == ''
    assert resumed.stderr == (f'lazylab: error: {run} is still being trained by process {train.pid}; wait for it '
                              f'to finish or stop it first\n')
    assert generated.returncode == 0, generated.stderr
    assert len(generated.stdout) == 1 + 30 + 1 and generated.stdout.startswith('a')
    assert training and after == run_json and json.loads(after)['status'] == 'running'  # untouched by either
    assert train.returncode == 143, err  # the training went on until it was stopped, and recorded the stop
    info = json.loads((run / 'run.json').read_text())
    assert info['status'] == 'killed' and 'error' not in info and info['checkpoint_step'] == info['steps']


def test_a_second_resume_while_a_resume_trains_is_refused_and_writes_nothing(tmp_path):
    train = start_lazylab('train', 'transformer', *SIZES, f'runs_dir={tmp_path}')
    _wait_for(lambda: list(tmp_path.glob('transformer/*/checkpoint.pt')), train)
    train.terminate()
    assert train.wait(timeout=60) == 143
    run, = (tmp_path / 'transformer').iterdir()

    first = start_lazylab('resume', str(run))
    _wait_for(lambda: _labml_pid(run) == first.pid, first)
    first.send_signal(signal.SIGSTOP)  # nothing of the run changes while the second resume looks at it
    try:
        before = _files(run)
        second = run_lazylab('resume', str(run))
        after = _files(run)
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=300)

    assert second.returncode == 2 and second.stdout == ''
    assert second.stderr == (f'lazylab: error: {run} is still being trained by process {first.pid}; wait for it '
                             f'to finish or stop it first\n')
    assert after == before
    assert first.returncode == 0, err
    info = json.loads((run / 'run.json').read_text())
    assert info['status'] == 'completed' and info['steps'] == 600 and 'error' not in info


def test_resume_of_a_finished_run_prints_only_that_there_is_nothing_to_do(short_run, tmp_path):
    run = tmp_path / 'run'
    shutil.copytree(short_run, run)
    before = _files(run)
    done = run_lazylab('resume', str(run))
    assert (done.returncode, done.stdout, done.stderr) == (
        0, f'nothing to do: the run in {run} has already finished\n', '')
    assert _files(run) == before


def test_train_whose_stdout_reader_goes_away_trains_to_the_end_without_its_output(tmp_path):
    # `lazylab train … | head -1`: the reader takes the start line and closes the pipe; every later progress
    # line and sample would meet a closed pipe
    train = start_lazylab('train', 'transformer', *tiny('sample_tokens=4', 'max_steps=60', 'valid_interval=5',
                                                        'log_interval=5'), f'runs_dir={tmp_path}', text=False)
    first = train.stdout.readline()
    train.stdout.close()
    err = train.stderr.read()
    assert train.wait(timeout=300) == 0, err
    run, = (tmp_path / 'transformer').iterdir()
    assert first.decode().startswith('transformer: 4,657 parameters, 60 steps') and first.decode().endswith(
        f'→ {run}\n')
    assert err == b''  # no BrokenPipeError, not even Python's 'Exception ignored' at exit
    info = json.loads((run / 'run.json').read_text())
    assert info['status'] == 'completed' and info['steps'] == 60 and 'error' not in info
    import torch
    assert torch.load(run / 'checkpoint.pt', weights_only=True)['position']['step'] == 60
    assert (run / 'samples.txt').read_text().count('--- step ') == 60 // 5  # the samples still go to the file


def test_generate_streams_the_same_bytes_as_the_text_it_returns(short_run):
    from lazylab.experiments.generation import generate
    text = generate(str(short_run), 'Th', 200, seed=11)
    pieces: list[str] = []
    assert generate(str(short_run), 'Th', 200, seed=11, on_text=pieces.append) == text
    assert pieces[0] == 'Th' and len(pieces) == 201 and ''.join(pieces) == text
    done = run_lazylab('generate', str(short_run), '--prompt', 'Th', '--tokens', '200', '--seed', '11', text=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (text + '\n').encode()


def test_ctrl_c_during_generate_leaves_the_text_so_far_on_stdout(short_run):
    from lazylab.experiments.generation import generate
    proc = start_lazylab('generate', str(short_run), '--prompt', 'Th', '--tokens', '1000000', '--seed', '11',
                         text=False)
    seen, deadline = b'', time.monotonic() + 120
    while len(seen) < 2 + 64:  # the prompt and some tokens have come, long before the millionth
        assert select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0], 'nothing streamed'
        chunk = os.read(proc.stdout.fileno(), 4096)
        assert chunk, proc.communicate()
        seen += chunk
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    out = (seen + out).decode()
    assert proc.returncode == 130, err
    assert err.decode().strip().splitlines() == ['lazylab: interrupted']
    assert len(out) < 2 + 1_000_000
    assert out == generate(str(short_run), 'Th', len(out) - 2, seed=11)  # what was sampled so far, nothing lost
