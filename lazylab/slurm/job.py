"""What a lazylab Slurm job runs, in each of its processes (Lightning's SLURM habit: on the warning signal save,
requeue, exit; on start resume if a checkpoint is there).

    RunJob(run_dir, experiment, settings)()     # the call submitit pickles: train into RUN_DIR, or resume it
    in_job(run_dir, body)                       # any body (a sweep's trial): signals, ranks, requeue, cancel

On start: a run directory with a checkpoint is resumed (`lazylab resume`: bit for bit where it stopped); one with a
run.json but no checkpoint yet (stopped before its first step) is cleared and trained again; an empty one is trained
into (`lazylab train`). Several processes (nodes × ntasks_per_node) are the ranks of one data-parallel run: each
gets torchrun's variables from Slurm's (RANK = SLURM_PROCID, WORLD_SIZE = SLURM_NTASKS, LOCAL_RANK = SLURM_LOCALID,
MASTER_ADDR = the job's first node (its NodeAddr), MASTER_PORT drawn from the job id: submitit's
TorchDistributedEnvironment), which lazylab.experiments.distributed reads as under torchrun. (srun starts them, not
torchrun: torchrun's agent handles TERM, INT, HUP and QUIT only, so the warning signal would end it, and on a signal
it gives its workers 30 s before SIGKILL, where Slurm's KillWait should rule.)

At the warning signal (USR1, or $LAZYLAB_STOP_SIGNAL: `lazylab.errors.stop_signals`) the trainer finishes its step,
writes the checkpoint of that step and raises `Interrupted` with status 'preempted' (lazylab.experiments.lifecycle).
Rank 0 then appends {'job_id', 'time', 'signal', 'step'} to run.json's `requeues`, runs `scontrol requeue
$SLURM_JOB_ID` and the process exits with 128 + the signal; Slurm starts the job again (after its `cred_expire`, 120
s by default), and it resumes. The other ranks exit 0, so that srun's --kill-on-bad-exit does not end rank 0 while
it writes. The same happens at SIGTERM when Slurm says the job reached its time limit (TIMEOUT: the warning came too
late) or was preempted. At SIGTERM from `scancel` (the job CANCELLED) run.json says `cancelled`: the checkpoint is
there, and `lazylab resume RUN [--slurm …]` continues it.

A signal that arrives before the trainer listens for it (while the job starts) raises `Interrupted` at once (the
warning signal: the job requeues from where it was, a checkpoint or nothing yet; SIGTERM: it ends); one that
arrives after the run ended is ignored.
"""
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional, Union

from lazylab import runs
from lazylab.errors import Interrupted, run_cli, stop_signals
from lazylab.experiments.discovery import Experiment
from lazylab.experiments.lifecycle import resume_main, train_main
from lazylab.slurm import cluster
from lazylab.slurm.executor import SLURM_DIR, ready_dir

#: the requeues of a run stopped before its run.json existed, kept in RUN_DIR/slurm until the run starts
PENDING_REQUEUES = 'requeues.json'
#: Slurm's states in which a SIGTERM is Slurm stopping the job for a while, not for good: requeue as at the warning
REQUEUE_STATES = ('TIMEOUT', 'PREEMPTED')


class RunJob:
    """The function a run's Slurm job calls (pickled by submitit): see the module docstring.

    Args:
        run_dir: the run directory (absolute; made by the submitter, it holds slurm/).
        experiment: the experiment to train (None: only resume, `lazylab resume RUN --slurm`).
        settings, config, allow_changes: as `lazylab train` takes them.
    """

    def __init__(self, run_dir: Path, experiment: Optional[Experiment] = None, settings: Sequence[str] = (),
                 config: Union[None, str, Sequence[str]] = None, allow_changes: bool = False):
        self.run_dir, self.experiment = Path(run_dir), experiment
        self.settings, self.config, self.allow_changes = list(settings), config, allow_changes

    def __call__(self) -> None:
        code = in_job(self.run_dir, self.start)
        if code:
            sys.exit(code)

    def start(self) -> None:
        """Resume the run directory's checkpoint, or train into it (see the module docstring)."""
        path = self.run_dir
        if self.experiment is None or ((path / runs.CHECKPOINT_PT).is_file() and (path / runs.RUN_JSON).is_file()):
            resume_main(str(path), allow_changes=self.allow_changes)
            return
        if (path / runs.RUN_JSON).is_file() and _rank() == 0:  # stopped before its first checkpoint: start again
            recorded = (runs.read_json(path / runs.RUN_JSON) or {}).get('requeues')
            if recorded:  # (they include the pending ones its train_main was given)
                runs.write_json(path / SLURM_DIR / PENDING_REQUEUES, {'requeues': recorded})
            clear_run(path)
        pending = pending_requeues(path)
        train_main(self.experiment, self.settings, config=self.config, allow_changes=self.allow_changes,
                   run_dir=path, info={'requeues': pending} if pending else None)


def pending_requeues(path: Path) -> list[dict[str, Any]]:
    """The requeues of a run that had no run.json when they happened (RUN_DIR/slurm/requeues.json)."""
    return (runs.read_json(path / SLURM_DIR / PENDING_REQUEUES) or {}).get('requeues') or []


def keep_requeues(path: Path, more: list[dict[str, Any]]) -> None:
    """Add `more` to the requeues kept until the run has a run.json again (see `pending_requeues`)."""
    if more:
        runs.write_json(path / SLURM_DIR / PENDING_REQUEUES, {'requeues': [*pending_requeues(path), *more]})


def clear_run(path: Path) -> None:
    """Remove what a run wrote in its directory (not slurm/ and output.log), so that it can train there again."""
    for name in (runs.RUN_JSON, runs.CONFIGS_YAML, runs.METRICS_JSONL, runs.SAMPLES_TXT, runs.CHECKPOINT_PT,
                 runs.LABML_DIR):
        p = path / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def _rank() -> int:
    return int(os.environ.get('SLURM_PROCID', os.environ.get('RANK', '0')) or 0)


def in_job(run_dir: Path, body: Callable[[], Any]) -> int:
    """Run `body` (which trains or resumes the run in `run_dir`) as a process of a Slurm job; returns the exit code
    (see the module docstring): 0, 2 for a user's mistake (its line printed), 128 + N after signal N.

    Args:
        run_dir: the run directory `body` trains (its run.json records a requeue or a cancel).
        body: trains or resumes the run (`RunJob.start`, a sweep trial's `run_trial`).

    Raises:
        Exception: a programming error of `body`, with its traceback (submitit records it; the job fails).
    """
    export_ranks()
    numbers = stop_signals()  # until the trainer listens (it puts these back when it ends): raise Interrupted
    for number in numbers:
        signal.signal(number, _raise_interrupted)  # replaces submitit's handlers (its preempt signal; TERM ignored)
    mark_ready()
    stops: list[Interrupted] = []

    def guarded() -> None:
        try:
            body()
        except Interrupted as e:
            stops.append(e)
            raise
        finally:
            for number in numbers:  # the run is over: a late warning or scancel must not cut what follows
                signal.signal(number, signal.SIG_IGN)

    code = run_cli(guarded)
    return after_stop(Path(run_dir), stops[0]) if stops else code


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def export_ranks() -> None:
    """With several processes in the job step: torchrun's variables from Slurm's (see the module docstring)."""
    if int(os.environ.get('SLURM_NTASKS', '1') or 1) <= 1 or 'SLURM_PROCID' not in os.environ:
        return
    from submitit.helpers import TorchDistributedEnvironment  # the `slurm` extra: only inside a submitit job
    env = TorchDistributedEnvironment()
    os.environ.update(RANK=str(env.rank), WORLD_SIZE=str(env.world_size), LOCAL_RANK=str(env.local_rank),
                      LOCAL_WORLD_SIZE=str(env.local_world_size), MASTER_ADDR=cluster.node_address(env.master_addr),
                      MASTER_PORT=str(env.master_port))


def mark_ready() -> None:
    """Tell the job's batch shell that this process notes the warning signal now (lazylab.slurm.executor)."""
    folder, job_id = os.environ.get('SUBMITIT_FOLDER'), os.environ.get('SLURM_JOB_ID')
    if folder and job_id:
        ready = ready_dir(Path(folder), job_id)
        ready.mkdir(parents=True, exist_ok=True)
        (ready / str(_rank())).touch()


def after_stop(run_dir: Path, e: Interrupted) -> int:
    """Rank 0 records the stop and requeues the job when Slurm will give it back (see the module docstring); the
    exit code of this process."""
    status = e.status
    if _rank() != 0:
        return 0
    state = cluster.own_state()
    if status == 'preempted' or (status == 'killed' and state in REQUEUE_STATES):
        return requeue_run(run_dir, e, state)
    if status == 'killed' and state == 'CANCELLED' and (run_dir / runs.RUN_JSON).is_file():
        runs.update_record(run_dir, status='cancelled')
        cluster.say(f'lazylab: Slurm job {os.environ.get("SLURM_JOB_ID")} was cancelled; the run is resumable: '
                    f'lazylab resume {run_dir} [--slurm …]')
    return e.exit_code


def requeue_run(run_dir: Path, e: Interrupted, state: Optional[str]) -> int:
    """Record the requeue in run.json (or, before the run has one, in slurm/requeues.json), `scontrol requeue`."""
    job_id = os.environ.get('SLURM_JOB_ID', '')
    entry = {'job_id': job_id, 'time': runs.timestamp(), 'signal': e.signal_name, 'step': e.step}
    if (run_dir / runs.RUN_JSON).is_file():
        done = runs.read_record(run_dir).get('requeues') or []
        runs.update_record(run_dir, requeues=[*done, entry], status='preempted')
    else:
        keep_requeues(run_dir, [entry])
    if not job_id:
        return e.exit_code
    error = cluster.requeue(job_id)
    why = f' (Slurm: {state})' if state and state != 'RUNNING' else ''
    if error:
        cluster.say(f'lazylab: warning: job {job_id} stopped{why} and cannot requeue itself ({error}); resume it '
                    f'with: lazylab resume {run_dir} --slurm …')
    else:
        saved = getattr(e, 'checkpoint_step', None)
        where = f'the checkpoint of step {saved:,}' if saved is not None else 'the start'
        cluster.say(f'lazylab: requeued Slurm job {job_id}{why}: it continues from {where} when Slurm starts it again')
    return e.exit_code
