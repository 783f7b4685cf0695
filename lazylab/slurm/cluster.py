"""Asking Slurm: the state of jobs (`squeue`), a job's own state from inside it (`scontrol`), requeue and cancel;
and `sbatch --test-only`, which checks a job script against the cluster without submitting it (torch-free).

Slurm's commands find the cluster through the environment (`SLURM_CONF`, or its configless DNS record), as they
do on the command line. Slurm keeps an ended job for `MinJobAge` seconds (300 by default); after that `squeue` no
longer knows it, and its state is read from the run's own files (lazylab.slurm.jobs).

States (`JobState.state`), Slurm's names mapped to the words the sweep's table and `--wait` use:

    pending     PENDING, REQUEUE_HOLD, …        waiting for resources (`restarts` > 0: requeued)
    running     RUNNING, COMPLETING, CONFIGURING, SUSPENDED, …
    completed   COMPLETED
    failed      FAILED, NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY, DEADLINE
    cancelled   CANCELLED (scancel; the run checkpointed at SIGTERM and is resumable)
    preempted   PREEMPTED (without a requeue)
    timeout     TIMEOUT (its time limit passed without a requeue)
"""
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from lazylab.errors import UsageError

#: Slurm job states that are over for good (a requeued job goes back to PENDING instead)
ENDED = {'COMPLETED': 'completed', 'FAILED': 'failed', 'NODE_FAIL': 'failed', 'BOOT_FAIL': 'failed',
         'OUT_OF_MEMORY': 'failed', 'DEADLINE': 'failed', 'CANCELLED': 'cancelled', 'PREEMPTED': 'preempted',
         'TIMEOUT': 'timeout', 'REVOKED': 'cancelled', 'SPECIAL_EXIT': 'failed'}
#: states of a job that waits (the rest, but ENDED, are running)
WAITING = ('PENDING', 'REQUEUED', 'REQUEUE_FED', 'REQUEUE_HOLD', 'RESV_DEL_HOLD')
#: seconds a Slurm command may take before lazylab gives up on it
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class JobState:
    """A job as Slurm reports it.

    Args:
        job_id: its id.
        slurm: Slurm's state ('PENDING', 'RUNNING', …; 'UNKNOWN': Slurm no longer knows it).
        reason: why it waits or how it ended (Slurm's Reason: 'Resources', 'BeginTime', 'NonZeroExitCode', …).
        restarts: how many times it was requeued.
        exit_code: once ended, its batch script's exit code, 128 + N for a signal N (a shell's convention).
    """
    job_id: str
    slurm: str
    reason: str = ''
    restarts: int = 0
    exit_code: Optional[int] = None

    @property
    def ended(self) -> bool:
        """Over for good (a requeued job is pending again, not ended)."""
        return self.slurm in ENDED

    @property
    def known(self) -> bool:
        """Slurm still holds the job (for MinJobAge seconds after it ended)."""
        return self.slurm != 'UNKNOWN'

    @property
    def state(self) -> str:
        """lazylab's word for it (see the module docstring); 'unknown' once Slurm has forgotten it."""
        if not self.known:
            return 'unknown'
        if self.slurm in ENDED:
            return ENDED[self.slurm]
        return 'pending' if self.slurm in WAITING else 'running'


def slurm_command(args: Sequence[str], what: str, *, check: bool = True) -> subprocess.CompletedProcess:
    """Run a Slurm client command (`squeue`, `scontrol`, `sbatch`, `scancel`).

    Raises:
        UsageError: the command is not installed, does not answer within TIMEOUT_S, or (`check`) fails; the message
            says `what` was asked and the command's own error line.
    """
    if shutil.which(args[0]) is None:
        raise UsageError(f'{what}: {args[0]} is not installed here (Slurm\'s client commands; Debian: apt-get install '
                         f'slurm-client)')
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UsageError(f'{what}: {args[0]} did not answer within {TIMEOUT_S:g} s (is slurmctld up?)') from None
    if check and done.returncode != 0:
        raise UsageError(f'{what}: {first_error(done.stderr or done.stdout) or f"{args[0]} exit {done.returncode}"}')
    return done


def first_error(text: str) -> str:
    """The line of a Slurm command's output that says what went wrong (its first `error:` line, else its first)."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    errors = [x for x in lines if 'error' in x.lower()]
    return (errors or lines or [''])[0]


def wait_status(raw: int) -> int:
    """A shell's exit code from a wait status as squeue reports it (exit << 8, or the signal): 128 + N for a signal."""
    return 128 + (raw & 0x7F) if raw & 0x7F else raw >> 8


def job_states(job_ids: Iterable[str]) -> dict[str, JobState]:
    """{job id: its state} of the given jobs, in one `squeue` call; a job Slurm has forgotten is 'UNKNOWN'.

    Args:
        job_ids: the jobs (their ids as text or numbers; one squeue for all).

    Raises:
        UsageError: squeue is missing or fails (the cluster does not answer).
    """
    ids = sorted({str(j) for j in job_ids})
    out = {j: JobState(j, 'UNKNOWN') for j in ids}
    if not ids:
        return out
    done = slurm_command(['squeue', '--noheader', '--states=all', '--jobs=' + ','.join(ids),
                          '--Format=JobID:|,State:|,Reason:|,exit_code:|,RestartCnt:|'], 'squeue', check=False)
    if done.returncode != 0 and 'Invalid job id' not in done.stderr:
        raise UsageError(f'squeue: {first_error(done.stderr) or f"exit {done.returncode}"}')
    for line in done.stdout.splitlines():
        fields = line.strip().split('|')
        if len(fields) < 5 or fields[0] not in out:
            continue
        job_id, state, reason, raw, restarts = fields[:5]
        state = state.split()[0] if state.strip() else 'UNKNOWN'  # 'CANCELLED by 0' → CANCELLED
        code = wait_status(int(raw)) if raw.strip().isdigit() and state in ENDED else None
        out[job_id] = JobState(job_id, state, reason.strip(), int(restarts) if restarts.isdigit() else 0, code)
    return out


def job_state(job_id: str) -> JobState:
    """The state of one job (see `job_states`)."""
    return job_states([job_id])[str(job_id)]


def own_state() -> Optional[str]:
    """Inside a Slurm job: why Slurm stops it, or its state: CANCELLED (scancel), TIMEOUT (its time limit),
    PREEMPTED, RUNNING (a signal that did not come from Slurm's stop); None outside a job, or when Slurm does not
    answer. (While it stops the job, Slurm reports COMPLETING: the reason is read from its times then.)"""
    job_id = os.environ.get('SLURM_JOB_ID')
    if not job_id:
        return None
    try:
        done = slurm_command(['scontrol', '--oneliner', 'show', 'job', job_id], 'scontrol')
    except UsageError:
        return None
    fields = dict(w.split('=', 1) for w in done.stdout.split() if '=' in w)
    state = fields.get('JobState')
    if state != 'COMPLETING':
        return state
    if fields.get('PreemptTime', 'None') not in ('None', 'Unknown', ''):
        return 'PREEMPTED'
    run, limit = seconds(fields.get('RunTime', '')), seconds(fields.get('TimeLimit', ''))
    if fields.get('Reason') == 'TimeLimit' or (run is not None and limit is not None and run >= limit):
        return 'TIMEOUT'
    return 'CANCELLED'


def node_address(node: str) -> str:
    """The address Slurm reaches `node` at (its NodeAddr: a node's name need not be a host name); `node` itself when
    Slurm does not say."""
    try:
        done = slurm_command(['scontrol', '--oneliner', 'show', 'node', node], 'scontrol')
    except UsageError:
        return node
    fields = dict(w.split('=', 1) for w in done.stdout.split() if '=' in w)
    return fields.get('NodeAddr') or node


def seconds(text: str) -> Optional[int]:
    """Seconds of a Slurm duration ('1-02:03:04', '02:03:04', '03:04', '5'); None for UNLIMITED or anything else."""
    days, _, clock = text.rpartition('-')
    parts = clock.split(':')
    if not (days.isdigit() or days == '') or not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    value = 0
    for p in parts:
        value = value * 60 + int(p)
    if len(parts) == 1:  # minutes alone (as --time takes them)
        value *= 60
    return value + int(days or 0) * 86400


def requeue(job_id: str) -> Optional[str]:
    """`scontrol requeue JOB_ID`; returns None when Slurm took it, else its error line (the job then ends, its run
    resumable by hand)."""
    try:
        slurm_command(['scontrol', 'requeue', str(job_id)], f'scontrol requeue {job_id}')
    except UsageError as e:
        return str(e)
    return None


def cancel(job_ids: Iterable[str], signal: Optional[str] = None, batch: bool = False) -> None:
    """`scancel [--signal=NAME [--batch]] JOB_ID…` (the jobs' ends are theirs to record).

    Raises:
        UsageError: scancel is missing or fails.
    """
    ids = [str(j) for j in job_ids]
    if ids:
        flags = ([f'--signal={signal}'] if signal else []) + (['--batch'] if batch else [])
        slurm_command(['scancel', *flags, *ids], 'scancel')


def test_only(script: Path) -> None:
    """`sbatch --test-only SCRIPT`: Slurm checks the job's options against the cluster (options sbatch does not
    have, a partition, account or QOS it does not know, more nodes or memory than it has) without submitting.

    Raises:
        UsageError: sbatch's error line, after `--slurm` (nothing was submitted).
    """
    done = slurm_command(['sbatch', '--test-only', str(script)], 'sbatch --test-only', check=False)
    if done.returncode != 0:
        line = first_error(done.stderr or done.stdout).replace('sbatch: error: ', '')
        raise UsageError(f'--slurm: Slurm refuses the job: {line}')


def missing_commands() -> Optional[str]:
    """What is missing for --slurm on this machine (Slurm's client commands), or None."""
    gone = [c for c in ('sbatch', 'squeue', 'scontrol', 'scancel') if shutil.which(c) is None]
    if gone:
        return f'{", ".join(gone)} not found: --slurm submits with Slurm\'s client commands (Debian: apt-get ' \
               f'install slurm-client)'
    return None


def say(line: str) -> None:
    """A line on stderr, at once (the job's log interleaves stdout and stderr)."""
    print(line, file=sys.stderr, flush=True)
