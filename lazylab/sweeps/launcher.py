"""Starting a sweep's trials: one small interface, Hydra's launcher habit (the sweep asks, launches and tells).

    class Launcher(Protocol):
        def launch(self, trial: TrialSpec) -> TrialProcess     start one trial; the sweep polls it, then collects
        def cores_per_trial(self, workers: int) -> int         the CPU cores each of `workers` trials at once gets

The sweep (lazylab.sweeps.workers) decides what each trial runs — a `TrialSpec`: its number and folder, the
arguments of its process (`python -m lazylab.sweeps.trial ARGS`), its torch threads, the environment it needs and
which worker runs it — and the launcher decides where and how it runs. The sweep polls the `TrialProcess` it gets
back until it ends (stopping it with SIGINT, then kill, when the sweep is stopped), and reads what the trial wrote
in its folder (`lazylab.sweeps.workers.outcome`): the launcher returns nothing else.

`LocalLauncher` starts each trial as a subprocess of this machine: `python -m lazylab.sweeps.trial …`, or, with
`lazylab sweep --launcher COMMAND`, COMMAND's words in front of `-m lazylab.sweeps.trial …` (e.g.
`torchrun --standalone --nproc_per_node=2`: then each trial is that many processes, and the cores are divided
among them too). Worker i gets GPU i mod n_gpus (CUDA_VISIBLE_DEVICES) when asked to assign GPUs, each trial its
threads (OMP_NUM_THREADS, MKL_NUM_THREADS), and a trial dies with the sweep process (Linux), so that a killed sweep
leaves no orphan behind (the next sweep on the directory resumes the trial). A cluster launcher (Slurm, Ray) is one
more class with these two methods.
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol

from lazylab import runs
from lazylab.errors import plural

#: the module a trial's process runs (`python -m lazylab.sweeps.trial ARGS`)
TRIAL_MODULE = 'lazylab.sweeps.trial'


@dataclass
class TrialSpec:
    """One trial to start.

    Args:
        number: the Optuna trial number.
        folder: its run directory, SWEEP_DIR/trial-NNNN (made already; its process writes there).
        args: the arguments of its process after `python -m lazylab.sweeps.trial`.
        threads: the torch threads it uses (its settings say so too).
        worker: which of the sweep's workers runs it (0 … workers − 1).
        env: environment variables it needs, on top of the launcher's (the study of a pruned sweep: never on the
            command line, where `ps` would show a password).
        resume: whether it continues a trial whose process was stopped (for its log).
    """
    number: int
    folder: Path
    args: list[str]
    threads: int
    worker: int = 0
    env: dict[str, str] = field(default_factory=dict)
    resume: bool = False

    @property
    def log(self) -> Path:
        """Where what the trial prints goes (appended): FOLDER/output.log."""
        return self.folder / runs.OUTPUT_LOG


class TrialProcess(Protocol):
    """A started trial as the sweep polls it (a `subprocess.Popen` has all of it)."""
    returncode: Optional[int]

    def poll(self) -> Optional[int]:
        """Its exit code once it has ended, else None (never blocks)."""

    def send_signal(self, sig: int) -> None:
        """Pass a signal on (SIGINT when the sweep is stopped: the trial stops at its next step, to be resumed).

        Args:
            sig: the signal's number, e.g. `signal.SIGINT`.
        """

    def wait(self, timeout: Optional[float] = None) -> int:
        """Its exit code, once it has ended.

        Args:
            timeout: the most seconds to wait; None: until it ends.

        Raises:
            subprocess.TimeoutExpired: it did not end within `timeout` seconds.
        """

    def kill(self) -> None:
        """End it now."""


class Launcher(Protocol):
    """Starts a sweep's trials (see the module docstring)."""

    def launch(self, trial: TrialSpec) -> TrialProcess:
        """Start `trial`; returns at once, with the process the sweep polls."""

    def cores_per_trial(self, workers: int) -> int:
        """The CPU cores each trial gets when `workers` trials run at once (at least 1)."""


def cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)


def workers_line(plan, workers: int) -> Optional[str]:
    """The warning when more trials would run at once than there are cores (None otherwise); `plan.workers` is
    what --workers asked for."""
    n = cores()
    if workers <= n:
        return None
    asked = f' (--workers {plan.workers}, at most one per trial left)' if workers != plan.workers else ''
    return (f'lazylab: warning: {plural(workers, "worker")}{asked} on {plural(n, "CPU core")}: the trials share '
            f'them and each runs slower')


def visible_gpus() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES's list, else torch's count of CUDA devices."""
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    if visible is not None:
        return [g for g in visible.split(',') if g.strip()]
    try:
        import torch  # start-up time: only a sweep that starts trials asks (after planning has loaded torch)
        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no usable CUDA: no GPU to assign
        return []


class LocalLauncher:
    """Each trial a subprocess of this machine (see the module docstring).

    Args:
        prefix: what runs `-m lazylab.sweeps.trial …`: the Python interpreter, or `--launcher COMMAND`'s words.
        assign_gpus: give worker i GPU i mod n_gpus (False when the command sets the device itself).
        shown: how the command appears in the trial's log (a storage URL's credentials hidden).
    """

    def __init__(self, prefix: Sequence[str] = (sys.executable,), *, assign_gpus: bool = True,
                 shown: Callable[[str], str] = str):
        self.prefix, self.assign_gpus, self.shown = list(prefix), assign_gpus, shown
        self._gpus: Optional[list[str]] = None

    @property
    def processes_per_trial(self) -> int:
        """The processes of one trial: a torchrun prefix's --nproc_per_node, else 1."""
        m = re.search(r'--nproc[_-]per[_-]node[= ](\d+)', ' '.join(self.prefix))
        return int(m.group(1)) if m else 1

    def cores_per_trial(self, workers: int) -> int:
        """This machine's cores divided among `workers` trials and each trial's processes (at least 1)."""
        return max(1, cores() // (workers * self.processes_per_trial))

    def gpus(self) -> list[str]:
        """The GPUs the workers share (found once); none when not assigning."""
        if self._gpus is None:
            self._gpus = visible_gpus() if self.assign_gpus else []
        return self._gpus

    def launch(self, trial: TrialSpec) -> subprocess.Popen:
        """Start `trial`'s process, its output appended to its log (after a line naming the command)."""
        cmd = [*self.prefix, '-m', TRIAL_MODULE, *trial.args]
        env = {**os.environ, **trial.env, 'OMP_NUM_THREADS': str(trial.threads),
               'MKL_NUM_THREADS': str(trial.threads), 'PYTHONUNBUFFERED': '1'}
        if self.gpus():
            env['CUDA_VISIBLE_DEVICES'] = self.gpus()[trial.worker % len(self.gpus())]
        with open(trial.log, 'a', encoding='utf-8') as log:
            log.write(f'--- {runs.timestamp()} {"resumed" if trial.resume else "started"}: '
                      f'{self.shown(shlex.join(cmd))}\n')
            log.flush()
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    preexec_fn=_die_with_parent if sys.platform == 'linux' else None)


def _die_with_parent():
    """In a trial process (Linux): be killed when the sweep process dies (see the module docstring)."""
    try:
        import ctypes  # only in the forked child, just before it runs the trial
        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def stop_all(processes: Sequence[TrialProcess], grace: float = 30.0) -> None:
    """Pass Ctrl-C on to the running `processes` and wait for them (at most `grace` seconds in all; then kill)."""
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace
    for p in processes:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
