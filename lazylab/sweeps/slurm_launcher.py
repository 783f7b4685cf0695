"""Each trial of a sweep a Slurm job: `lazylab sweep … --launcher slurm --slurm KEY=VALUE,… --workers N`.

    SlurmLauncher(parse_options(['partition=gpu,time=60']), name='lazylab-glu')    # a `Launcher` (launcher.py)

The sweep asks, launches and tells as with local processes (lazylab.sweeps.workers); this launcher submits each trial
as a job (lazylab.slurm: submitit, the job script that passes the warning signal on) whose call is the trial
process's own (`lazylab.sweeps.trial.run_trial`) inside `lazylab.slurm.job.in_job`: the trial checkpoints at the
warning signal and requeues itself, and a requeued trial resumes from its checkpoint. At most `--workers` jobs are in
the queue at once (pending or running: the sweep submits the next when one has ended). A trial's job keeps its files
in TRIAL_DIR/slurm/, and its output is appended to TRIAL_DIR/output.log, as a local trial's.

While it runs, the trial's state in trial.json follows Slurm's (`pending`, `running`, `preempted` while a requeued job
waits; `slurm`: the job id, its Slurm state and requeues, and every job the trial had); when the job has ended the
sweep records the outcome as for a local trial (completed, failed, pruned), and a job cancelled (scancel), preempted
or timed out for good is `cancelled`, `preempted` or `timeout`: left to `lazylab sweep --resume`, which submits it
again (it resumes from its checkpoint).

The jobs outlive the sweep process: Ctrl-C, SIGTERM or SIGKILL of `lazylab sweep` leaves them queued or running
(`scancel` stops them), and `lazylab sweep --resume` reattaches to those still queued or running, and to those that
completed or failed meanwhile (their outcome is in their folders), instead of submitting them twice (trial.json's
job id, checked with squeue).
"""
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from lazylab import runs
from lazylab.slurm import SLURM_DIR, SlurmOptions, job_states
from lazylab.slurm.cluster import JobState
from lazylab.slurm.executor import submit
from lazylab.sweeps.launcher import TRIAL_MODULE, TrialSpec

#: seconds between two squeue calls of a sweep (for all its jobs at once)
POLL_S = 1.0
#: the exit codes the sweep reads a job that ended without one as (Slurm forgot it; its run.json's status)
STATUS_CODES = {'completed': 0, 'pruned': 0, 'failed': 1, 'cancelled': 143, 'killed': 143, 'preempted': 138,
                'interrupted': 130}


class TrialJob:
    """The call a trial's job makes (pickled by submitit): the trial's process, `python -m lazylab.sweeps.trial
    ARGS`, in `lazylab.slurm.job.in_job` (the warning signal, the ranks, the requeue). A requeued job finds the
    trial's run.json and resumes (`--resume`: from its checkpoint, or from the start).

    Args:
        args: the trial process's arguments (TrialSpec.args; the first is the trial's folder).
    """

    def __init__(self, args: list[str]):
        self.args = list(args)

    def __call__(self) -> None:
        from lazylab.slurm.job import in_job  # torch: only in the job's process
        from lazylab.sweeps.trial import run_trial  # torch: only in the job's process
        folder = Path(self.args[0])
        args = self.args
        if (folder / runs.RUN_JSON).is_file() and '--resume' not in args[:args.index('--')]:
            args = [args[0], args[1], '--resume', *args[2:]]
        code = in_job(folder, lambda: run_trial(args))
        if code:
            sys.exit(code)


class SlurmTrial:
    """A trial's job as the sweep polls it (a `TrialProcess`).

    Args:
        launcher: the launcher that follows it (one squeue for all its jobs).
        job_id: the Slurm job.
        folder: the trial's folder (its trial.json follows the job's state).

    Attributes:
        returncode: the job's exit code once it has ended for good (None before).
        ended_as: how it ended when the sweep should resume it: 'cancelled', 'preempted', 'timeout' (else None).
    """

    def __init__(self, launcher: 'SlurmLauncher', job_id: str, folder: Path):
        self.launcher, self.job_id, self.folder = launcher, job_id, folder
        self.returncode: Optional[int] = None
        self.ended_as: Optional[str] = None
        self.shown: Optional[tuple[str, int]] = None

    def poll(self) -> Optional[int]:
        """Its exit code once the job has ended for good, else None; trial.json follows its Slurm state."""
        if self.returncode is not None:
            return self.returncode
        state = self.launcher.state(self.job_id)
        if (state.state, state.restarts) != self.shown:
            self.shown = (state.state, state.restarts)
            self.record(state)
        if state.ended or not state.known:
            self.returncode = state.exit_code if state.exit_code is not None else self._code_from_run()
            self.ended_as = state.state if state.state in ('cancelled', 'preempted', 'timeout') else None
            if self.returncode == 0 and state.state != 'completed':
                self.returncode = 1  # (a job that ended otherwise with exit code 0: not a completed trial)
        return self.returncode

    def _code_from_run(self) -> int:
        status = (runs.read_json(self.folder / runs.RUN_JSON) or {}).get('status')
        return STATUS_CODES.get(status, 1)

    def record(self, state: JobState) -> None:
        """trial.json's `state` and `slurm` as Slurm reports the job now."""
        path = self.folder / runs.TRIAL_JSON
        record = runs.read_json(path) or {}
        word = 'preempted' if state.state == 'pending' and state.restarts else state.state
        if state.known and not state.ended:
            record['state'] = word
        record['slurm'] = {**(record.get('slurm') or {}), 'job_id': self.job_id, 'state': state.slurm,
                           'requeues': state.restarts}
        runs.write_json(path, record)

    def send_signal(self, sig: int) -> None:
        """The sweep stops: leave the job to Slurm (it goes on; `lazylab sweep --resume` reattaches to it).

        Args:
            sig: the signal the sweep passes on (not to the job: the job is Slurm's).
        """
        self.detach()

    def kill(self) -> None:
        """As `send_signal`: the job is Slurm's, and `scancel` is the user's to type."""
        self.detach()

    def detach(self) -> None:
        """Stop following the job (it goes on), saying so and how to stop it; the trial is left to --resume."""
        if self.returncode is None:
            print(f'lazylab: trial {self.folder.name}: Slurm job {self.job_id} goes on (scancel {self.job_id} stops '
                  f'it; lazylab sweep --resume reattaches to it)', file=sys.stderr, flush=True)
            self.returncode = 130

    def wait(self, timeout: Optional[float] = None) -> int:
        """Its exit code once the job has ended (polling Slurm), or a detached trial's at once.

        Args:
            timeout: the most seconds to wait; None: until it ends.

        Raises:
            subprocess.TimeoutExpired: not ended within `timeout` seconds.
        """
        import subprocess  # only for its TimeoutExpired, what a Popen's wait raises
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f'slurm job {self.job_id}', timeout)
            time.sleep(POLL_S)
        return self.returncode


class SlurmLauncher:
    """Starts each trial as a Slurm job (see the module docstring).

    Args:
        options: the checked --slurm.
        name: the jobs' name prefix (each job: NAME-NNNN, unless the options name it).
        shown: how the command appears in the trial's log (a storage URL's credentials hidden).
    """
    local = False  # its trials run elsewhere: no warning about this machine's cores

    def __init__(self, options: SlurmOptions, name: str = 'lazylab', shown: Callable[[str], str] = str):
        self.options, self.name, self.shown = options, name, shown
        self._states: dict[str, JobState] = {}
        self._asked = 0.0

    def cores_per_trial(self, workers: int) -> int:
        """The cores each trial's job asks for: cpus_per_task (1 unless given).

        Args:
            workers: the trials at once (each job has its own cores: they do not divide them).
        """
        return self.options.cpus_per_task

    def state(self, job_id: str) -> JobState:
        """A job's state; one squeue for all the jobs this launcher follows, at most every POLL_S seconds.

        Args:
            job_id: the job.
        """
        if job_id not in self._states or time.monotonic() - self._asked > POLL_S:
            self._states = job_states([*self._states, job_id])
            self._states = {j: s for j, s in self._states.items() if not s.ended or j == job_id}
            self._asked = time.monotonic()
        return self._states[job_id]

    def previous_job(self, folder: Path) -> Optional[JobState]:
        """The state of the last job a trial had (trial.json), or None when it had none.

        Args:
            folder: the trial's folder.
        """
        record = runs.read_json(Path(folder) / runs.TRIAL_JSON) or {}
        job_id = (record.get('slurm') or {}).get('job_id')
        return job_states([job_id])[str(job_id)] if job_id else None

    def still_running(self, folder: Path) -> Optional[str]:
        """The job id of a trial's job that is still queued or running (to reattach to), else None.

        Args:
            folder: the trial's folder.
        """
        state = self.previous_job(folder)
        return state.job_id if state is not None and state.state in ('pending', 'running') else None

    def _to_collect(self, folder: Path) -> Optional[JobState]:
        """A --resume's trial whose job is still queued or running, or ended while no sweep watched it (completed or
        failed: its outcome is in its folder): the sweep follows that job instead of submitting another."""
        state = self.previous_job(folder)
        if state is None:
            return None
        if state.state in ('pending', 'running', 'completed', 'failed'):
            return state
        status = (runs.read_json(Path(folder) / runs.RUN_JSON) or {}).get('status')
        return state if not state.known and status in ('completed', 'pruned', 'failed') else None

    def launch(self, trial: TrialSpec) -> SlurmTrial:
        """Submit `trial` as a job, or (a --resume) follow the job it has already (see `_to_collect`)."""
        path = trial.folder / runs.TRIAL_JSON
        earlier = self._to_collect(trial.folder) if trial.resume else None
        if earlier is not None:
            self._log(trial, f'reattached to Slurm job {earlier.job_id} ({earlier.state})')
            return SlurmTrial(self, earlier.job_id, trial.folder)
        env = {**trial.env, 'OMP_NUM_THREADS': str(trial.threads), 'MKL_NUM_THREADS': str(trial.threads),
               'PYTHONUNBUFFERED': '1'}
        job_name = str(self.options.parameters.get('job_name') or f'{self.name}-{trial.number:04d}')
        job_id = submit(trial.folder / SLURM_DIR, self.options, TrialJob(trial.args), job_name=job_name,
                        log=trial.log, env=env)
        command = ' '.join([sys.executable, '-m', TRIAL_MODULE, *trial.args])
        self._log(trial, f'{"resumed" if trial.resume else "started"} as Slurm job {job_id}: {self.shown(command)}')
        record = runs.read_json(path) or {}
        jobs = (record.get('slurm') or {}).get('jobs') or []
        record['slurm'] = {'job_id': job_id, 'state': 'PENDING', 'requeues': 0, 'jobs': [*jobs, job_id]}
        runs.write_json(path, record)
        return SlurmTrial(self, job_id, trial.folder)

    @staticmethod
    def _log(trial: TrialSpec, line: str) -> None:
        with open(trial.log, 'a', encoding='utf-8') as log:
            log.write(f'--- {runs.timestamp()} {line}\n')

