"""Shared test set-up, and the fixtures several test folders use.

labml-nn 0.5.1 (the reference we compare against) calls `labml.tracker.debug`, which labml 0.5.3 lacks;
we give it a no-op so the reference modules run unchanged.

Fixtures (test files cannot import a conftest under --import-mode=importlib, so shared helpers come as fixtures):
    short_run   a finished 3-step `lazylab train transformer` run directory, made once per session: copy it
                before damaging it
    ports       loopback ports for the servers tests start: ports.free(), ports.is_open(port),
                ports.wait(port, proc, what) (until `proc` accepts connections on `port`)
    cli_error   cli_error(argv): run `lazylab ARGV` in-process, assert it is one error line with exit code 2,
                and return the message after 'lazylab: error: '

Every test leaves torch's thread count as it found it (a run's `threads=1` would otherwise stay for the rest of
the session), and starts with no secret hidden from messages (lazylab.redaction.conceal).
"""
import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, settings

# Under pytest-xdist (make test: 2 workers on 2 cores) each worker and every process a test starts computes on one
# thread: torch's default (one thread per core) in every worker oversubscribes the cores, and the suite took 31
# minutes on 2 workers against 26 on one; with one thread a worker it takes 11. Set before torch is imported.
if os.environ.get('PYTEST_XDIST_WORKER'):
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    os.environ.setdefault('MKL_NUM_THREADS', '1')

from lazylab.testing import TINY, keep_threads  # noqa: E402  (after the thread settings above)

# Every run measures the machine's peak FLOP/s once (MFU: lazylab.experiments.flops) and caches it: the tests' runs,
# and the processes they start, use a cache file of this session's, never the user's (set before any test module
# copies os.environ for its processes).
_PEAK_CACHE = tempfile.mkdtemp(prefix='lazylab-test-peak-')
os.environ['LAZYLAB_PEAK_FLOPS_CACHE'] = os.path.join(_PEAK_CACHE, 'peak_flops.json')
atexit.register(shutil.rmtree, _PEAK_CACHE, True)

os.environ.setdefault('LABML_DISABLE_GIT', '1')

# Timing never decides a test: hypothesis's deadline and its too-slow health check measure the machine's load (the
# suite must pass on two busy cores: a property test of the storage URL failed once only on its data's generation
# time), so neither applies to any test; a test's own @settings still sets the rest.
settings.register_profile('lazylab', deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile('lazylab')


def _patch_labml_tracker():
    try:
        from labml import tracker
    except ImportError:  # labml is a hard dependency; the import error will surface in the tests that need it
        return
    if not hasattr(tracker, 'debug'):
        tracker.debug = lambda *args, **kwargs: None


_patch_labml_tracker()



@pytest.fixture(autouse=True)
def _keep_threads():
    with keep_threads():
        yield


@pytest.fixture(autouse=True)
def _forget_concealed_secrets(monkeypatch):
    """The secrets a test's configuration read from the environment are hidden from messages for the rest of the
    process (lazylab.redaction.conceal): each test starts with none, so no test's message is masked by another's."""
    monkeypatch.setattr('lazylab.redaction._CONCEALED', {})


@pytest.fixture
def cli_error(capsys):
    """cli_error(argv) -> the message of the one `lazylab: error: …` line that `lazylab ARGV` ends with (exit 2)."""
    from lazylab import cli

    def run(argv) -> str:
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith('lazylab: error: '), err
        return lines[0][len('lazylab: error: '):]
    return run


@pytest.fixture(scope='session')
def short_run(tmp_path_factory):
    """A finished 3-step transformer run (TINY): its folder, shared by the session's tests; copy it before
    changing anything in it."""
    import torch

    from lazylab import cli
    runs = tmp_path_factory.mktemp('short-run')
    threads = torch.get_num_threads()
    try:
        assert cli.main(['train', 'transformer', *TINY, f'runs_dir={runs}']) == 0
    finally:
        torch.set_num_threads(threads)  # the run's threads=1 would stay for the rest of the session
    run, = (runs / 'transformer').iterdir()
    return run


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    try:
        with socket.create_connection(('127.0.0.1', port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_port(port: int, proc: subprocess.Popen, what: str = 'the server', timeout: float = 60) -> None:
    """Wait until `proc` accepts connections on `port`.

    Raises:
        AssertionError: `proc` ended, or `timeout` seconds passed (it is then killed); the message has the end of
            what it printed (when its stdout is a pipe).
    """
    deadline = time.monotonic() + timeout
    while not port_open(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            output = proc.stdout.read() if proc.stdout is not None else ''
            raise AssertionError(f'{what} did not start on port {port} (exit code {proc.returncode}): '
                                 f'{output[-2000:]}')
        time.sleep(0.2)


@pytest.fixture(scope='session')
def ports():
    """free_port, port_open and wait_for_port above, for the test modules."""
    return SimpleNamespace(free=free_port, is_open=port_open, wait=wait_for_port)
