"""A one-node Slurm cluster for the tests of this folder, started from Debian's `slurm-wlm` and `munge` in a temporary
folder, as root, and stopped after them.

`slurm` (session-scoped, so once per pytest-xdist worker: each worker's cluster has its own folder, name, node name
and loopback ports, so two never meet) makes, in /tmp/lazylab-slurm-XXXX/:

    munge/munge.key, munge/sock   a fresh key and munged on a private socket (AuthInfo=socket=…)
    slurm.conf                    ClusterName, SlurmctldHost=localhost, the node (its CPUs from nproc, RealMemory),
                                  ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, SelectType=select/cons_tres,
                                  state, spool and logs in this folder, free ports on 127.0.0.1; cred_expire=5, so a
                                  requeued job may start again after 6 s rather than Slurm's default 121
    slurmctld, slurmd             started (-i: no saved state) and waited for: `sinfo` shows the node idle

The client commands (sbatch, squeue, scancel, scontrol) find it through SLURM_CONF, set in this process's
environment for the session, so lazylab's subprocesses and the jobs (sbatch exports the environment) see it too.
At the end every job is cancelled and waited for, then slurmd, slurmctld and munged are stopped (by the pids they
wrote) and the folder removed.

Without root or without the programs the tests skip, with one line saying what to install; with
LAZYLAB_REQUIRE_SLURM=1 (set by .ci/run) or CI set, they fail instead: a skip there would hide a broken install.
"""
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from lazylab.slurm.options import split_options
from lazylab.testing import wait_until

ROOT = Path(__file__).resolve().parents[2]
#: what a lazylab subprocess gets: this checkout first (the jobs inherit it through sbatch)
ENV_EXTRA = {'PYTHONPATH': str(ROOT), 'PYTHONUNBUFFERED': '1'}
PROGRAMS = ('munged', 'slurmctld', 'slurmd', 'sinfo', 'sbatch', 'squeue', 'scontrol', 'scancel', 'srun')
#: a run of 1,500 steps of the TINY sizes: about 6 s of training on a loaded core, long enough to signal mid-run
RUN = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'sample_tokens=5',
       'valid_batches=1', 'final_valid_batches=1', 'device=cpu', 'threads=1', 'max_steps=1500', 'valid_interval=500',
       'log_interval=50', 'max_minutes=0']


#: the guide whose commands these tests run (docs/guide/slurm.md; tests/docs/test_docs_code.py names the tests)
GUIDE = ROOT / 'docs' / 'guide' / 'slurm.md'
#: --slurm options the one-node test cluster has no use for (no such partition, no GPUs), and those it changes
DROPPED_OPTIONS = ('partition', 'gpus_per_node', 'gpus', 'account', 'qos', 'constraint')
CHANGED_OPTIONS = {'time': 'time=10', 'nodes': 'nodes=1', 'ntasks_per_node': 'ntasks_per_node=2'}
#: a swept key's values on the test cluster
TINY_SWEEPS = {'d_model': 'd_model=16,24'}


def guide_commands() -> list[str]:
    """The commands of the guide's bash blocks (continuation lines joined, comments dropped)."""
    text = GUIDE.read_text(encoding='utf-8')
    commands = []
    for block in re.findall(r'```bash\n(.*?)```', text, re.S):
        for line in block.replace('\\\n', ' ').splitlines():
            line = re.sub(r'\s+#\s.*$', '', line).strip()
            if line:
                commands.append(' '.join(line.split()))
    return commands


def guide_command(start: str) -> str:
    """The one command of the guide that starts with `start`."""
    [command] = [c for c in guide_commands() if c.startswith(start)]
    return command


def on_cluster(command: str, runs_dir: Path, **paths: str) -> list[str]:
    """A `lazylab …` command of the guide as arguments after `lazylab` on the test cluster: RUN's tiny sizes for
    the sizes it sets (a swept key's values from TINY_SWEEPS), runs_dir=RUNS_DIR, the --slurm options the cluster can
    take (DROPPED_OPTIONS, CHANGED_OPTIONS); `paths` replace the guide's placeholders (run_dir for
    runs/transformer/RUN_ID, sweep_dir for runs/transformer/sweep-ID)."""
    command = command.replace('runs/transformer/RUN_ID', paths.get('run_dir', 'RUN_ID'))
    command = command.replace('runs/transformer/sweep-ID', paths.get('sweep_dir', 'sweep-ID'))
    words, out, settings = shlex.split(command)[1:], [], False
    sizes = {t.split('=', 1)[0] for t in RUN} | {'batch_size'}
    i = 0
    while i < len(words):
        w = words[i]
        if w == '--slurm':
            kept = [CHANGED_OPTIONS.get(o.split('=', 1)[0], o) for o in split_options(words[i + 1])
                    if o.split('=', 1)[0] not in DROPPED_OPTIONS]
            out += ['--slurm', ','.join(kept)]
            i += 2
            continue
        key = w.split('=', 1)[0]
        if '=' in w and not w.startswith('-'):
            settings = True
            if ',' in w:
                out.append(TINY_SWEEPS.get(key, w))
            elif key not in sizes:
                out.append(w)
        else:
            out.append(w)
        i += 1
    if out[0] in ('train', 'sweep') and not out[1].startswith('-'):
        swept = {w.split('=', 1)[0] for w in out if '=' in w and ',' in w}
        out[2:2] = [t for t in RUN if t.split('=', 1)[0] not in swept] + [f'runs_dir={runs_dir}']
    assert settings or out[0] != 'train', command
    return out


def missing() -> str:
    """Why a Slurm cluster cannot be started here ('' when it can)."""
    gone = [p for p in PROGRAMS if shutil.which(p) is None and not Path('/usr/sbin', p).exists()]
    if gone:
        return f'{", ".join(gone)} not installed (Debian: apt-get install slurm-wlm munge)'
    if os.geteuid() != 0:
        return 'slurmd runs jobs as their user and needs root here'
    try:
        import submitit  # noqa: F401
    except ImportError:
        return "submitit is not installed (pip install 'lazylab[slurm]')"
    return ''


def _program(name: str) -> str:
    return shutil.which(name) or str(Path('/usr/sbin', name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """A running test cluster (see the module docstring)."""
    home: Path
    conf: Path
    node: str
    cpus: int

    @property
    def env(self) -> dict[str, str]:
        """The environment of a lazylab subprocess on this cluster."""
        return {**os.environ, **ENV_EXTRA, 'SLURM_CONF': str(self.conf)}

    def command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=60, env=self.env)
        if check:
            assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def jobs(self) -> dict[str, str]:
        """{job id: Slurm state} of the jobs squeue shows (pending, running, completing)."""
        out = self.command('squeue', '--noheader', '--format=%i %T').stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def state(self, job_id: str) -> str:
        """One job's Slurm state (COMPLETED, PENDING, …), also after it ended."""
        out = self.command('squeue', '--noheader', '--states=all', f'--jobs={job_id}', '--format=%T',
                           check=False).stdout.split()
        return out[0] if out else 'UNKNOWN'

    def lazylab(self, *args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
        """`python -m lazylab.cli ARGS` on this cluster."""
        return subprocess.run([sys.executable, '-m', 'lazylab.cli', *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env, **kwargs)

    def start_lazylab(self, *args: str, **kwargs) -> subprocess.Popen:
        """`python -m lazylab.cli ARGS` started (stdout and stderr in pipes)."""
        return subprocess.Popen([sys.executable, '-m', 'lazylab.cli', *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env, **kwargs)


def _conf(home: Path, name: str, node: str, cpus: int, memory_mb: int) -> str:
    return f"""\
ClusterName={name}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={home}/munge/sock,cred_expire=5
StateSaveLocation={home}/state
SlurmdSpoolDir={home}/spool
SlurmctldPidFile={home}/slurmctld.pid
SlurmdPidFile={home}/slurmd.pid
SlurmctldLogFile={home}/log/slurmctld.log
SlurmdLogFile={home}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
InactiveLimit=0
KillWait=10
MinJobAge=300
Waittime=0
NodeName={node} NodeHostname={socket.gethostname().split('.')[0]} NodeAddr=127.0.0.1 CPUs={cpus} \
RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _memory_mb() -> int:
    for line in Path('/proc/meminfo').read_text().splitlines():
        if line.startswith('MemTotal:'):
            return int(line.split()[1]) // 1024 * 9 // 10  # below what slurmd finds, or it drains the node
    return 1024


def _stop(pid_file: Path, timeout: float = 30) -> None:
    """SIGTERM to the daemon whose pid is in `pid_file`, then SIGKILL if it is still there after `timeout` s."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def start_cluster(home: Path, worker: str) -> Cluster:
    """munged, slurmctld and slurmd in `home`, waited for (see the module docstring)."""
    for d in ('munge', 'state', 'spool', 'log'):
        (home / d).mkdir()
    key = home / 'munge' / 'munge.key'
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (home / 'munge').chmod(0o700)
    cpus = len(os.sched_getaffinity(0))
    node = f'lazylab{worker}'
    conf = home / 'slurm.conf'
    conf.write_text(_conf(home, f'lazylab{worker}', node, cpus, _memory_mb()), encoding='utf-8')
    cluster = Cluster(home, conf, node, cpus)
    subprocess.run([_program('munged'), '-f', '-S', str(home / 'munge' / 'sock'), f'--key-file={key}',
                    f'--log-file={home}/log/munged.log', f'--pid-file={home}/munged.pid',
                    f'--seed-file={home}/munge/seed'], check=True, capture_output=True, timeout=60)
    env = cluster.env
    subprocess.run([_program('slurmctld'), '-i'], check=True, capture_output=True, timeout=60, env=env)
    subprocess.run([_program('slurmd'), '-N', node], check=True, capture_output=True, timeout=60, env=env)

    def idle() -> bool:
        out = cluster.command('sinfo', '--noheader', f'--nodes={node}', '--format=%T', check=False).stdout
        return out.strip() == 'idle'
    deadline = time.monotonic() + 60
    while not idle():
        if time.monotonic() > deadline:
            logs = ''.join((home / 'log' / f).read_text(errors='replace')[-1500:]
                           for f in ('slurmctld.log', 'slurmd.log') if (home / 'log' / f).exists())
            raise RuntimeError(f'the Slurm test cluster did not come up within 60 s:\n{logs}')
        time.sleep(0.2)
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    """Cancel every job and wait for them (each writes its end), then stop the daemons and remove the folder."""
    home = cluster.home
    try:
        cluster.command('scancel', '--user=root', check=False)
        deadline = time.monotonic() + 60
        while cluster.jobs() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for pid_file in ('slurmd.pid', 'slurmctld.pid', 'munged.pid'):
            _stop(home / pid_file)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope='session')
def slurm():
    """The running one-node cluster of this worker (a `Cluster`); SLURM_CONF points at it for the session."""
    why = missing()
    if why:
        if os.environ.get('LAZYLAB_REQUIRE_SLURM') or os.environ.get('CI'):
            pytest.fail(f'Slurm test cluster: {why}')
        pytest.skip(f'Slurm test cluster: {why}')
    home = Path(tempfile.mkdtemp(prefix='lazylab-slurm-'))
    worker = os.environ.get('PYTEST_XDIST_WORKER', 'gw0').replace('gw', '')
    before: Optional[str] = os.environ.get('SLURM_CONF')
    try:
        cluster = start_cluster(home, worker)
    except (subprocess.SubprocessError, OSError, RuntimeError) as e:
        for pid_file in ('slurmd.pid', 'slurmctld.pid', 'munged.pid'):
            _stop(home / pid_file)
        shutil.rmtree(home, ignore_errors=True)
        pytest.fail(f'Slurm test cluster did not start: {e}')
    os.environ['SLURM_CONF'] = str(cluster.conf)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)
        if before is None:
            os.environ.pop('SLURM_CONF', None)
        else:
            os.environ['SLURM_CONF'] = before


@pytest.fixture(scope='session')
def slurm_tools():
    """The module's helpers for the test files (they cannot import a conftest under --import-mode=importlib)."""
    from types import SimpleNamespace
    return SimpleNamespace(RUN=RUN, ROOT=ROOT, wait_until=wait_until, guide_command=guide_command,
                           guide_commands=guide_commands, on_cluster=on_cluster)
