"""The submitit executor of a lazylab job, and its job script: the warning signal passed on to the run's processes.

    executor = make_executor(RUN_DIR / 'slurm', options, job_name='lazylab-transformer', log=RUN_DIR / 'output.log')
    job = executor.submit(RunJob(...))          # submitit: sbatch the script; the job calls the pickled function

submitit's `SlurmExecutor` writes the sbatch script (every sbatch option: submitit's parameters and its
`slurm_additional_parameters`), submits it, and in the job runs `python -u -m submitit.core._submit FOLDER`, which
unpickles the function and calls it. Its script runs that line through srun in the foreground; lazylab's differs
in how the warning signal reaches the run:

- `#SBATCH --signal=B:USR1@90` sends it to the batch shell, as `scancel --signal=USR1 --batch JOB` does. (Without
  `B:` Slurm signals the job steps and not the shell; `--batch` signals only the shell.) A shell runs a trap only
  between commands, so srun runs in the background while the shell waits on it, and the trap passes the signal on to
  srun, which forwards it to every process of the step: one per rank, so every rank notes it (lazylab.slurm.job).
- A signal that arrives before every process has installed its handler would end it (SIGUSR1's default action), so
  each process, once ready, writes a file in FOLDER/ready-JOB_ID/, and the trap holds the signal until all are
  there (then passes it on).
- srun gets `--kill-on-bad-exit=1` (one process failing ends the others, at once rather than at the collectives'
  timeout) and the job's `--cpus-per-task` (srun does not take it from sbatch since Slurm 22.05).
- A warning signal other than USR1 is exported as `LAZYLAB_STOP_SIGNAL` (the trainer then stops at it as at
  USR1) and as `SUBMITIT_PREEMPT_SIGNAL` (so that submitit's own handler, which lazylab's replaces, is on it too).

submitit's defaults that would surprise a lazylab user are dropped: no `--time` unless given (submitit's is 5 minutes;
the partition's default applies), no `--wckey=submitit`. The job's stdout and stderr go, appended (a requeued job
adds to it), to the log file given (RUN_DIR/output.log).
"""
import os
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from lazylab.errors import UsageError
from lazylab.slurm import cluster
from lazylab.slurm.options import SlurmOptions, submitit_parameters

# late imports: submitit (the `slurm` extra) is imported when an executor is made, so that the options and the
# job states load without it

#: the folder of a job's submitit files (its script, pickled call and result) inside its run directory
SLURM_DIR = 'slurm'
#: the ready files of each job (see the module docstring), inside SLURM_DIR
READY_PREFIX = 'ready-'


def ready_dir(folder: Path, job_id: str) -> Path:
    """FOLDER/ready-JOB_ID: where the job's processes say they are ready for the warning signal."""
    return Path(folder) / f'{READY_PREFIX}{job_id}'


def setup_lines(options: SlurmOptions, folder: Path) -> list[str]:
    """The shell lines before the run's command: the environment and the trap (see the module docstring)."""
    sig = options.signal
    lines = ['# lazylab: the warning signal reaches this shell (--signal=B:…, scancel --signal=… --batch); the trap',
             '# passes it on to srun once every process is ready for it (a file each in the ready folder)',
             f'export SUBMITIT_PREEMPT_SIGNAL={sig}']
    if sig != 'USR1':
        lines.append(f'export LAZYLAB_STOP_SIGNAL={sig}')
    lines += [f'lazylab_ready={shlex.quote(str(Path(folder) / READY_PREFIX))}"$SLURM_JOB_ID"',
              'rm -rf "$lazylab_ready" && mkdir -p "$lazylab_ready"',
              'lazylab_step=', 'lazylab_pending=',
              'lazylab_forward() {',
              '    lazylab_pending=1',
              f'    if [ -n "$lazylab_step" ] && [ "$(ls "$lazylab_ready" | wc -l)" -ge {options.tasks} ]; then',
              f'        kill -{sig} "$lazylab_step" && lazylab_pending=',
              '    fi',
              '}',
              f'trap lazylab_forward {sig}']
    return lines


def command_lines(command: str) -> list[str]:
    """srun in the background and the shell waiting on it, passing on a held signal (see the module docstring);
    the script's exit code is srun's."""
    return ['srun --kill-on-bad-exit=1 ${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK} '
            f'{command} &',
            'lazylab_step=$!',
            'while kill -0 "$lazylab_step" 2>/dev/null; do',
            '    if [ -n "$lazylab_pending" ]; then',
            '        sleep 0.2 & wait $!',
            '        lazylab_forward',
            '    else',
            '        wait "$lazylab_step"',
            '    fi',
            'done',
            'wait "$lazylab_step"',
            'lazylab_rc=$?',
            'rm -rf "$lazylab_ready"',
            'exit $lazylab_rc']


def make_executor(folder: Path, options: SlurmOptions, *, job_name: str, log: Path):
    """A submitit SlurmExecutor whose jobs keep their files in `folder`, with `options` and lazylab's job script.

    Args:
        folder: RUN_DIR/slurm (made when a job is submitted).
        options: the checked --slurm.
        job_name: the job's name unless the options give one.
        log: the job's output file (appended to).

    Raises:
        UsageError: submitit is not installed.
    """
    submitit_parameters()  # the one-line error when submitit is missing
    from submitit import SlurmExecutor  # the `slurm` extra (checked just above)

    class Executor(SlurmExecutor):
        """submitit's executor with lazylab's script around the command (see the module docstring)."""

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            text = super()._make_submission_file_text(command, uid)
            lines = text.splitlines()
            at = lines.index(command)  # use_srun=False: the command is a line of its own
            return '\n'.join(lines[:at] + command_lines(command) + lines[at + 1:]) + '\n'

    executor = Executor(folder=Path(folder))
    parameters: dict[str, Any] = {'job_name': job_name, 'time': None, 'wckey': None, **options.parameters}
    parameters.update(use_srun=False, stderr_to_stdout=True, setup=setup_lines(options, Path(folder)),
                      additional_parameters={**options.additional, 'output': str(log),
                                             'signal': options.sbatch_signal})
    executor.update_parameters(**parameters)
    return executor


def script_text(executor) -> str:
    """The sbatch script `executor` submits (for `sbatch --test-only`, and for the docs)."""
    return executor._make_submission_file_text(executor._submitit_command_str, 'check')


def check_options(options: SlurmOptions, job_name: str) -> None:
    """`sbatch --test-only` of the job script these options make (in a scratch folder; nothing is submitted).

    Args:
        options: the checked --slurm.
        job_name: the job's name (its length and characters are Slurm's to check too).

    Raises:
        UsageError: Slurm's client commands are missing, or Slurm refuses the options (its error line).
    """
    missing = cluster.missing_commands()
    if missing:
        raise UsageError(missing)
    with tempfile.TemporaryDirectory(prefix='lazylab-slurm-') as scratch:
        executor = make_executor(Path(scratch), options, job_name=job_name, log=Path(scratch) / 'output.log')
        script = Path(scratch) / 'check.sh'
        script.write_text(script_text(executor), encoding='utf-8')
        cluster.test_only(script)


def submit(folder: Path, options: SlurmOptions, call, *, job_name: str, log: Path,
           env: Optional[Mapping[str, str]] = None) -> str:
    """Submit `call` (a picklable callable) as a job whose submitit files are in `folder` and whose output is
    appended to `log`; returns the job id.

    Args:
        folder: the job's submitit folder (RUN_DIR/slurm, TRIAL_DIR/slurm).
        options: the checked --slurm.
        call: what the job calls (`lazylab.slurm.job.RunJob`, a sweep's `TrialJob`).
        job_name: the job's name unless the options give one.
        log: the job's output file (appended to).
        env: variables the job gets besides this process's own: sbatch exports the submitter's environment, so
            they travel there (never on a command line or in a file of the run directory: a database password).

    Raises:
        UsageError: submitit is missing, or sbatch refused the job (its error line).
    """
    executor = make_executor(folder, options, job_name=job_name, log=log)
    from submitit.core.utils import FailedJobError  # the `slurm` extra (make_executor has checked it is there)
    env = dict(env or {})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return executor.submit(call).job_id
    except FailedJobError as e:
        raise UsageError(f'sbatch: {cluster.first_error(str(e))}') from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
