"""Submitting a run as a Slurm job and following it: what `lazylab train … --slurm` and `lazylab resume RUN --slurm`
do on the machine they are typed on (a login node).

    submit_train('transformer', ['d_model=256'], options=parse_options(['partition=gpu,time=60']))
    submit_resume('runs/transformer/20261203-101500-3fa2', options=parse_options([]), wait=True)

`submit_train` checks the settings as `lazylab train` does before anything is written (the experiment, every key
and value, a --config file: `configure.make_configs`; not the first forward pass, which needs the job's device),
checks the options against the cluster (`sbatch --test-only`), then makes the run directory RUNS_DIR/STEM/RUN_ID,
submits the job (submitit; its files in RUN_DIR/slurm/, its output appended to RUN_DIR/output.log), prints the job
id and the run directory at once, and returns. With `wait` it then prints the job's output as it comes and returns
its exit code once the job has ended for good (through its requeues). RUN_DIR/slurm/job.json lists the jobs
submitted for the run (`job_id`, `submitted`, `how`: train or resume, `options`).

`submit_resume` submits `lazylab resume RUN_DIR` as a job, for a run stopped anywhere (a local Ctrl-C, a cancelled
job, a job that could not requeue itself); a run that has finished is `nothing to do` without submitting, and one
whose job is still queued or running is refused.
"""
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Union

from lazylab import runs, user_files
from lazylab.errors import LazylabError, UsageError
from lazylab.experiments.configure import make_configs
from lazylab.experiments.discovery import find_experiment
from lazylab.slurm import cluster
from lazylab.slurm.executor import SLURM_DIR, check_options
from lazylab.slurm.executor import submit as submit_call
from lazylab.slurm.job import RunJob
from lazylab.slurm.options import SlurmOptions

#: RUN_DIR/slurm/job.json: the jobs submitted for the run
JOB_JSON = 'job.json'
#: seconds between two looks at a followed job (`--wait`)
POLL_S = 1.0
#: run.json statuses → the exit code `--wait` returns when Slurm has forgotten the job
STATUS_CODES = {'completed': 0, 'pruned': 0, 'failed': 1, 'interrupted': 130, 'killed': 143, 'cancelled': 143,
                'preempted': 138}


def submit(run_dir: Path, options: SlurmOptions, call, *, job_name: str, how: str) -> str:
    """Submit `call` as a job whose files are in RUN_DIR/slurm and whose output is RUN_DIR/output.log; record it in
    RUN_DIR/slurm/job.json; returns the job id.

    Raises:
        UsageError: sbatch refused the job (its error line).
    """
    folder = run_dir / SLURM_DIR
    job_id = submit_call(folder, options, call, job_name=job_name, log=run_dir / runs.OUTPUT_LOG)
    record = runs.read_json(folder / JOB_JSON) or {}
    jobs = [*record.get('jobs', []), {'job_id': job_id, 'submitted': runs.timestamp(), 'how': how,
                                      'options': options.given}]
    runs.write_json(folder / JOB_JSON, {'jobs': jobs})
    return job_id


def submitted_jobs(run_dir: Path) -> list[str]:
    """The job ids submitted for a run directory (RUN_DIR/slurm/job.json), oldest first."""
    record = runs.read_json(Path(run_dir) / SLURM_DIR / JOB_JSON) or {}
    return [str(j['job_id']) for j in record.get('jobs', []) if isinstance(j, dict) and 'job_id' in j]


def submit_train(experiment: str, settings: Sequence[str] = (), *, options: SlurmOptions,
                 config: Union[None, str, Sequence[str]] = None, allow_changes: bool = False,
                 wait: bool = False) -> int:
    """`lazylab train EXPERIMENT key=value … --slurm …` (see the module docstring); returns the exit code (0 once
    submitted; with `wait`, the job's).

    Args:
        experiment: EXPERIMENT as written.
        settings: key=value tokens.
        options: the checked --slurm.
        config: the --config files (later wins).
        allow_changes: --allow-changes (a replayed dump's changed computed values accepted).
        wait: --wait (follow the job, see `follow`).

    Raises:
        UsageError, ConfigError: a setting, the options or the cluster, in one line, before anything is written.
    """
    found = find_experiment(experiment)
    conf = make_configs(found, settings, config=config)
    job_name = str(options.parameters.get('job_name') or f'lazylab-{found.name}')
    check_options(options, job_name)
    made: list[Path] = []
    run_dir = runs.make_run_dir(Path(conf.runs_dir).expanduser() / found.name, made,
                                where=f'runs_dir={conf.runs_dir!r}').resolve()
    files = [config] if isinstance(config, str) else list(config or ())
    call = RunJob(run_dir, dataclasses.replace(found, module=None), settings,
                  [str(Path(f).resolve()) for f in files] or None, allow_changes)
    try:
        job_id = submit(run_dir, options, call, job_name=job_name, how='train')
    except BaseException:
        runs.remove_made(made, run_dir)
        raise
    print(f'submitted Slurm job {job_id}: {run_dir} (output: {run_dir / runs.OUTPUT_LOG}; squeue -j {job_id})',
          flush=True)
    return follow(job_id, run_dir) if wait else 0


def submit_resume(run_dir: str, *, options: SlurmOptions, allow_changes: bool = False, wait: bool = False) -> int:
    """`lazylab resume RUN_DIR --slurm …` (see the module docstring); returns the exit code.

    Args:
        run_dir: the stopped run's directory.
        options: the checked --slurm.
        allow_changes: --allow-changes.
        wait: --wait (follow the job, see `follow`).

    Raises:
        UsageError: not a run directory, no checkpoint, a job of the run still queued or running, the options.
    """
    path = Path(run_dir).resolve()
    record = runs.read_record(path)
    if record.get('status') == 'completed':
        print(f'nothing to do: the run in {run_dir} has already finished', flush=True)
        return 0
    if not (path / runs.CHECKPOINT_PT).is_file():
        raise UsageError(f'{run_dir} has no checkpoint to resume from ({runs.CHECKPOINT_PT})')
    live = [s for s in cluster.job_states(submitted_jobs(path)).values() if s.state in ('pending', 'running')]
    if live:
        raise UsageError(f'{run_dir} is still {live[0].state} as Slurm job {live[0].job_id}; wait for it, or '
                         f'scancel {live[0].job_id} first')
    job_name = str(options.parameters.get('job_name') or f'lazylab-{record.get("experiment", "run")}')
    check_options(options, job_name)
    job_id = submit(path, options, RunJob(path, allow_changes=allow_changes), job_name=job_name, how='resume')
    print(f'submitted Slurm job {job_id}: resumes {run_dir} (output: {path / runs.OUTPUT_LOG}; squeue -j {job_id})',
          flush=True)
    return follow(job_id, path) if wait else 0


def follow(job_id: str, run_dir: Path, poll: float = POLL_S) -> int:
    """Print the job's output (RUN_DIR/output.log) as it grows, and a line at each change of its Slurm state (on
    stderr), until it has ended for good; returns its exit code (see `exit_code`). Ctrl-C stops following, not the
    job (130).

    Args:
        job_id: the job.
        run_dir: its run directory (its output.log is printed).
        poll: seconds between two looks.
    """
    log = Path(run_dir) / runs.OUTPUT_LOG
    offset = log.stat().st_size if log.is_file() else 0  # what earlier jobs of the run wrote is not this one's
    shown = None
    try:
        while True:
            state = cluster.job_state(job_id)
            offset = _print_from(log, offset)
            now = (state.state, state.restarts)
            if now != shown:
                again = f', requeued {state.restarts}×' if state.restarts else ''
                why = f' ({state.reason})' if state.reason and state.reason != 'None' else ''
                cluster.say(f'slurm job {job_id}: {state.state}{why}{again}')
                shown = now
            if state.ended or not state.known:
                _print_from(log, offset)
                return exit_code(state, Path(run_dir))
            time.sleep(poll)
    except KeyboardInterrupt:
        cluster.say(f'lazylab: stopped following; Slurm job {job_id} goes on (scancel {job_id} stops it)')
        return 130


def exit_code(state: cluster.JobState, run_dir: Path) -> int:
    """A job's exit code: Slurm's (its batch script's: the run's), else (Slurm has forgotten the job) the one its
    run.json status stands for."""
    if state.exit_code is not None:
        return state.exit_code
    status = (runs.read_json(run_dir / runs.RUN_JSON) or {}).get('status')
    return STATUS_CODES.get(status, 1)


def _print_from(log: Path, offset: int) -> int:
    """Print what `log` holds from `offset` on (whole lines); returns the offset reached."""
    try:
        data = user_files.read_bytes(log, runs.OUTPUT_LOG, None, offset=offset)
    except LazylabError:  # not there yet (the job has not started), or not a regular file
        return offset
    whole = data[:data.rfind(b'\n') + 1]
    if whole:
        sys.stdout.write(whole.decode('utf-8', errors='replace'))
        sys.stdout.flush()
    return offset + len(whole)
