"""The life of a run: made, locked, trained, finished (or failed, interrupted, killed), resumed.

    train_main('feedback', ['d_model=64'])     # `lazylab train feedback d_model=64`
    resume_main('runs/feedback/20261201-143005-9f3a')

`train_main` checks everything first (`configure.make_configs`, `configure.prepare`, `replay.check_replay`), so a
mistake is one error line before anything is written; only then is RUNS_DIR/STEM/RUN_ID/ made (`start_run`:
configs.yaml and run.json), the training lock taken (`training_lock`) and the trainer run (`execute`).

run.json (`lazylab.runs.RunRecord`): experiment, source (where the experiment came from, for resume), run_id, uuid,
argv, created; the lazylab, torch and Python versions, the device, the git commit of the lazylab source when it is a
git checkout, the parameter count, `loss_label` (the task's loss and its unit, for plots); `flops_per_token` and
`peak_flops` once the trainer counted them (MFU: lazylab.experiments.flops); `status` (running, then completed,
pruned — stopped by a sweep's pruner —, failed with its one-line `error`, interrupted by Ctrl-C or killed by SIGTERM
— with `signal` and `checkpoint_step`, the step `lazylab resume` continues from), and at the end `steps` (optimizer
steps taken), `mfu` (the run's average, when counted) and `finished`. At the end configs.yaml is written again with
`total_steps` / `optimizer.total_steps` as the run took them (the time budget fits them as it goes; the
configuration's own values move to its `computed_before_run` section).

The first line of a run says what it is (parameters, length, batch, device, folder); the last says how it ended
and why it stopped (max_steps, the epochs, the time budget, the task's target, a sweep's pruner): `summary`.
"""
import contextlib
import errno
import sys
import uuid as uuid_lib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import torch

from lazylab.configs import dump, explain, label_given, to_dict
from lazylab.errors import (
    Interrupted,
    LazylabError,
    TrainingError,
    UsageError,
    WrapsUserError,
    error_line,
    plural,
    signals_interrupt,
    user_error_message,
)
from lazylab.experiments import distributed
from lazylab.experiments.checkpoint import load_checkpoint, write_failure
from lazylab.experiments.configure import device, make_configs, prepare
from lazylab.experiments.discovery import Experiment, find_experiment
from lazylab.experiments.metrics import stdout_may_close
from lazylab.experiments.replay import check_data_changes, check_replay, reopen
from lazylab.experiments.summary import first_line, last_line, parameter_count
from lazylab.experiments.tracking import LabmlRun
from lazylab.experiments.trainer import ValidationHook, check_resume, train
from lazylab.locks import exclusive_lock
from lazylab.runs import (
    CHECKPOINT_PT,
    CONFIGS_YAML,
    END_FIELDS,
    RUN_JSON,
    environment,
    make_run_dir,
    read_record,
    remove_leftovers,
    remove_made,
    timestamp,
    training_pid,
    update_record,
    write_record,
)


def train_main(experiment: Union[str, Experiment], settings: Sequence[str] = (), *,
               config: Union[None, str, Sequence[str]] = None,
               allow_changes: bool = False, run_dir: Optional[Path] = None,
               on_validation: Optional[ValidationHook] = None, labels: Optional[dict[str, Sequence[str]]] = None,
               info: Optional[dict[str, Any]] = None) -> Path:
    """`lazylab train EXPERIMENT key=value … [--config FILE] [--allow-changes]`: check, make the run directory,
    train; returns the run directory.

    Args:
        experiment: EXPERIMENT as written (built-in name, .py file, module, plugin) or an `Experiment`.
        settings: key=value tokens.
        config: the --config file, or files in order (flat settings, or a run's configs.yaml; later wins).
        allow_changes: accept a replayed dump's changed computed values (--allow-changes).
        run_dir: for a caller that runs the run (a sweep's trial): the folder to use (created if needed; it must
            not hold a run yet).
        on_validation: the trainer's hook (see trainer.train).
        labels: {label: keys} relabels given keys in the dump (e.g. {'sweep': ['d_model']}).
        info: more for run.json.

    Ctrl-C and SIGTERM raise `lazylab.errors.Interrupted` while it runs (`signals_interrupt`): before the run
    directory exists nothing is written; after, run.json records the stop (see `record_interrupt`).

    Raises:
        UsageError, ConfigError, DataError, TrainingError, CheckpointError: one line, before anything is written
            when the mistake is in the settings.
    """
    found = experiment if isinstance(experiment, Experiment) else find_experiment(experiment)
    with their_bugs(found):
        conf = make_configs(found, settings, config=config)
    for label, keys in (labels or {}).items():
        label_given(conf, keys, label)
    with signals_interrupt(), distributed.process_group(device(conf)):  # under torchrun: join the job
        with their_bugs(found):
            prepare(conf)
        changes = check_replay(conf, allow_changes)
        made = None
        if distributed.is_main_process():  # rank 0 creates the run directory; the others learn its name
            files = [config] if isinstance(config, str) else list(config or ())
            argv = [*settings, *(arg for path in files for arg in ('--config', path))]
            made = start_run(conf, found, argv, run_dir=run_dir, changes=changes, info=info)
        run_dir = Path(distributed.broadcast_object(str(made) if made else None))
        with training_lock(run_dir, distributed.is_main_process()), stdout_may_close():  # see those two
            execute(found.name, conf, run_dir, resume=False, on_validation=on_validation)
    return run_dir


def resume_main(run_dir: str, *, allow_changes: bool = False, on_validation: Optional[ValidationHook] = None
                ) -> Path:
    """`lazylab resume RUN_DIR`: re-import the run's experiment from run.json's `source`, rebuild its configs
    (checked as any replay, see `replay.check_replay`) and continue from its checkpoint. A run that was
    interrupted or killed goes on from the checkpoint it kept (Ctrl-C and SIGTERM are handled as in `train_main`).

    Args:
        run_dir: the run directory; allow_changes: accept a changed computed value or text.
        on_validation: the trainer's hook (a sweep's trial passes its pruner).

    Raises:
        UsageError, CheckpointError, ConfigError: one line, before the run is touched.
    """
    rank0 = distributed.environment().rank == 0  # torchrun's RANK: the process group is not up yet
    run = reopen(run_dir, warn=_printer(rank0))
    conf, path = run.conf, run.path
    with contextlib.ExitStack() as stack:
        # rank 0 refuses a run another process still trains, before it reads the checkpoint that process may not
        # have written yet
        stack.enter_context(training_lock(path, rank0))
        if rank0:  # what a writer killed mid-write left (we hold the lock: no live writer owns it)
            remove_leftovers(path)
        checkpoint = load_checkpoint(path / CHECKPOINT_PT)  # CheckpointError before anything else happens
        if has_finished(checkpoint, read_record(path)):  # whatever phase it ended in: the run is not touched
            if rank0:
                print(f'nothing to do: the run in {path} has already finished', flush=True)
            return path
        stack.enter_context(signals_interrupt())
        stack.enter_context(distributed.process_group(device(conf)))
        with their_bugs(run.experiment):
            prepare(conf)
        # first the checkpoint (another text says which characters differ), then the replay's computed values
        data_changes = check_resume(conf, path / CHECKPOINT_PT, checkpoint)  # vocabulary, text, shapes, processes
        changes = check_data_changes(data_changes, allow_changes) + check_replay(conf, allow_changes)
        if distributed.is_main_process():
            record = {k: v for k, v in read_record(path).items() if k not in END_FIELDS}  # no longer true
            write_record(path, {**record, 'status': 'running', **({'replay_changes': changes} if changes else {})})
        stack.enter_context(stdout_may_close())  # `| head`: the run goes on without its output
        execute(run.experiment.name, conf, path, resume=True, checkpoint=checkpoint, on_validation=on_validation)
    return path


def has_finished(checkpoint: dict[str, Any], record: dict[str, Any]) -> bool:
    """Whether a run ended for good: its checkpoint says why it ended (the time budget, its steps, its epochs, the
    task's target: `Position.finished`), or its steps are all taken, or run.json says `completed` (a checkpoint
    from before `finished` was recorded). A run a sweep's pruner stopped, or a signal, is not finished."""
    position = checkpoint.get('position') or {}
    return bool(position.get('finished')) or position.get('step', 0) >= position.get('total_steps', 0) \
        or record.get('status') == 'completed'


@contextlib.contextmanager
def their_bugs(experiment: Experiment) -> Iterator[None]:
    """While the block computes the experiment's items, an exception the experiment's own code raised (its model's
    constructor, its task: `Experiment.raised_in_its_code`), which lazylab words as one error line (a
    `CalculatorError` naming the option, a `TrainingError` of the first batch), is the user's bug: that line, saying
    so, then the exception itself with its traceback (exit code 1). lazylab's own errors stay one line.

    Raises:
        The exception the experiment's code raised (its traceback kept), instead of lazylab's one-line error.
    """
    try:
        yield
    except LazylabError as e:
        cause = e.__cause__
        if cause is None or isinstance(cause, LazylabError) or not experiment.raised_in_its_code(cause):
            raise
        if distributed.environment().rank == 0:
            where = experiment.path.name if experiment.path is not None else experiment.module_name
            print(f"lazylab: error: {user_error_message(e)} (a bug in {where}'s code: its traceback follows)",
                  file=sys.stderr, flush=True)
        raise cause from None


def _printer(enabled: bool):
    """A warning printer for one process of a torchrun job: rank 0 prints, the others keep quiet."""
    return (lambda line: print(line, file=sys.stderr, flush=True)) if enabled else (lambda line: None)


def start_run(conf, experiment: Union[str, Experiment], argv: Sequence[str], *, run_dir: Optional[Path] = None,
              changes: Optional[list] = None, info: Optional[dict[str, Any]] = None) -> Path:
    """Make a new run's directory (RUNS_DIR/STEM/RUN_ID, or `run_dir`) with its configs.yaml and run.json, as
    `lazylab train` does, for a prepared `conf` (see `configure.prepare`); returns the directory. A notebook that
    runs `trainer.train` itself starts its run with this.

    Args:
        conf: the prepared Configs; experiment: its experiment (as written, or found: run.json records its source).
        argv: the settings the configuration was made from (recorded); run_dir: a folder chosen by the caller.
        changes: the replay's accepted changes; info: more for run.json.

    Raises:
        UsageError: the folder cannot be made or written (what this call made is removed again).
    """
    found = experiment if isinstance(experiment, Experiment) else find_experiment(experiment)
    made: list[Path] = []
    if run_dir is None:
        run_dir = make_run_dir(Path(conf.runs_dir).expanduser() / found.name, made, where=f'runs_dir={conf.runs_dir!r}')
    else:
        run_dir = _use_run_dir(Path(run_dir))
    try:
        dump(conf, run_dir / CONFIGS_YAML)
        record = {'experiment': found.name, 'source': found.source, 'run_id': run_dir.name,
                  'uuid': uuid_lib.uuid4().hex, 'argv': list(argv), 'created': timestamp(), **run_environment(conf),
                  'parameters': parameter_count(conf.model), 'loss_label': conf.task.loss_label, 'status': 'running'}
        if changes:
            record['replay_changes'] = changes
        record.update(info or {})
        write_record(run_dir, record)
    except OSError as e:  # e.g. a full disk: no half-written run directory stays
        remove_made(made, run_dir)
        raise UsageError(f'cannot write the run directory {run_dir}: {e.strerror or e}') from None
    return run_dir


def _use_run_dir(path: Path) -> Path:
    """A run directory chosen by the caller: created if needed, and not holding a run already."""
    if (path / RUN_JSON).exists():
        raise UsageError(f'{path} already holds a run ({RUN_JSON}); resume it with: lazylab resume {path}')
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_environment(conf) -> dict[str, Any]:
    """What run.json records about the software and machine: `lazylab.runs.environment()` and the device."""
    where = device(conf)
    info = {**environment(), 'device': str(where)}
    if where.type == 'cuda':
        info['device_name'] = torch.cuda.get_device_name(where)
    return info


@contextlib.contextmanager
def training_lock(run_dir: Path, take: bool = True) -> Iterator[None]:
    """While the block runs, this process holds the run's training lock (`lazylab.locks.exclusive_lock` on the
    folder: nothing is written into it, and the kernel drops it when the process ends, even by SIGKILL). A second
    process (`lazylab resume` while `lazylab train` or another resume still trains the run) is refused before it
    prints or writes anything. `take=False` (a torchrun rank other than 0): no lock. Where there is no flock
    (Windows), no lock either; labml's run.pid still stops a second process, later.

    Raises:
        UsageError: `RUN is still being trained by process PID; wait for it to finish or stop it first`.
    """
    if not take:
        yield
        return
    pid = training_pid(run_dir)
    by = f'process {pid}' if pid is not None else 'another process'
    with exclusive_lock(run_dir, f'{run_dir} is still being trained by {by}; wait for it to finish or stop it '
                                 f'first'):
        yield


class _StopRequest:
    """Wraps the trainer's `on_validation` hook and remembers the reason it gave for stopping (→ run.json status)."""

    def __init__(self, hook: ValidationHook):
        self.hook, self.reason = hook, None

    def __call__(self, step: int, record: dict[str, Any]) -> Optional[str]:
        answer = self.hook(step, record)
        if answer:
            self.reason = answer if isinstance(answer, str) else 'stopped'
        return answer


def execute(name: str, conf, run_dir: Path, *, resume: bool, checkpoint: Optional[dict[str, Any]] = None,
            on_validation: Optional[ValidationHook] = None) -> dict[str, Any]:
    """Train inside a labml experiment and print the first and last lines; returns the last metrics record.

    Args:
        name: the experiment's name; conf: its prepared Configs; run_dir: the run directory (made).
        resume: continue from the checkpoint (`checkpoint`: already loaded, so that it is read once).
        on_validation: the trainer's hook (see trainer.train); the reason it gives for stopping becomes run.json's
            status (a sweep's pruner says 'pruned'). run.json and configs.yaml record the end (see `finish_run`).

    Raises:
        Whatever training raises (run.json records it first: failed, interrupted or killed).
    """
    is_main = distributed.is_main_process()
    labml_run = contextlib.nullcontext()
    if is_main:  # only rank 0 prints, and records the run in labml
        print(first_line(name, conf, run_dir), flush=True)
        flat = dict(to_dict(conf)['values'])
        explicit = [k for k, row in explain(conf).items() if row['source'] == 'override']
        labml_run = LabmlRun(run_dir, name, read_record(run_dir)['uuid'], flat, conf.dashboard, explicit)
    stop = _StopRequest(on_validation) if on_validation is not None else None
    try:
        with labml_run as tracker:
            last = train(conf, run_dir, resume=resume, checkpoint=checkpoint, labml_run=tracker, on_validation=stop)
        if is_main and last:
            finish_run(conf, run_dir, (stop.reason if stop is not None else None) or 'completed', last)
    except KeyboardInterrupt as e:  # a stop signal (see train_main's signals_interrupt)
        if getattr(e, 'checkpoint_step', None) is None and checkpoint is not None:
            # it came before the training loop took its first step: the resumed checkpoint is where it stands
            e.step = e.checkpoint_step = (checkpoint.get('position') or {}).get('step')
        if is_main:
            record_interrupt(conf, run_dir, e)
        raise
    except BaseException as e:
        failure = write_failed(e)  # a file of the run could not be written: one line naming it, not a traceback
        if is_main:
            record_failure(conf, run_dir, failure or e)
        if failure is not None:
            raise failure from None
        raise
    if is_main and last:
        print(last_line(conf, run_dir, last, stop.reason if stop is not None else None), flush=True)
    elif is_main:
        print(f'nothing to do: the run in {run_dir} has already finished', flush=True)
    return last


def finish_run(conf, run_dir: Path, status: str, last: dict[str, Any], error: Optional[str] = None,
               **more: Any) -> None:
    """Record the end of a run: run.json's status, steps and finish time (and `more`); configs.yaml with the steps
    taken (only when `last`, the final record, is given: a run stopped midway keeps its configs.yaml, which its
    resume replays).

    Args:
        conf: the run's Configs; run_dir: its folder; status: one of `lazylab.runs.STATUSES`.
        last: the final metrics record ({} for none); error: the one line of a failure; more: more run.json.
    """
    extra: dict[str, Any] = {'status': status, 'finished': timestamp(), **more}
    if last.get('step') is not None:
        extra['steps'] = int(last['step'])
        dump(conf, run_dir / CONFIGS_YAML, run_values=_run_values(conf, last))
    if last.get('mfu_avg') is not None:  # the run's average (its flops_per_token and peak_flops are there already)
        extra['mfu'] = last['mfu_avg']
    if error is not None:
        extra['error'] = error
    update_record(run_dir, **extra)


def _run_values(conf, last: dict[str, Any]) -> dict[str, Any]:
    """total_steps and optimizer.total_steps as the run took them: steps taken, and the length the learning-rate
    schedule spanned at the end (the time budget fits both as the run goes)."""
    values = {'total_steps': int(last['step'])}
    schedules = getattr(conf.optimizer.scheduler, 'lr_lambdas', None) or [None]
    length = getattr(schedules[0], 'total_steps', None)
    if isinstance(length, int):
        values['optimizer.total_steps'] = length
    return values


def record_failure(conf, run_dir: Path, e: BaseException) -> None:
    """run.json of a run that `e` ended: status `failed`, `error` the one line `run_cli` prints for a user's error
    (else the exception's type and first line). When run.json itself cannot be written (a disk still full, a
    read-only folder) a user's error `e` says so at the end of its one line (else a warning line does), and `e` is
    what the caller goes on raising."""
    message = error_line(e)
    why = _unrecorded('failure', conf, run_dir, 'failed', message)
    if why is not None and isinstance(e, LazylabError) and not isinstance(e, WrapsUserError):
        e.args = (f'{message} ({why})',)
    elif why is not None:
        print(f'lazylab: warning: {why}', file=sys.stderr, flush=True)


def _unrecorded(what: str, conf, run_dir: Path, status: str, error: Optional[str] = None,
                **more: Any) -> Optional[str]:
    """`finish_run` of a run that did not complete; None when run.json recorded it, else why it could not (a disk
    still full, a folder gone read-only): `RUN/run.json could not record the WHAT: REASON`."""
    try:
        finish_run(conf, run_dir, status, {}, error, **more)
    except (OSError, LazylabError) as written:
        return f'{run_dir / RUN_JSON} could not record the {what}: {write_failure(written) or written}'
    return None


#: what an OSError of a write says when the disk, not lazylab, is at fault (read-only, full, over quota, gone)
WRITE_ERRNOS = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EIO,
                          errno.EFBIG, errno.ENOENT, errno.ESTALE})


def write_failed(e: BaseException) -> Optional[TrainingError]:
    """The one-line error for a run whose file could not be written (`cannot write FILE: Read-only file system`)
    when `e` is the OSError of such a write (from any writer: labml's files, configs.yaml, …); None otherwise."""
    if not isinstance(e, OSError) or e.errno not in WRITE_ERRNOS:
        return None
    where = e.filename if e.filename is not None else 'a file of the run'
    return TrainingError(f'cannot write {where}: {e.strerror or e}')


def record_interrupt(conf, run_dir: Path, e: KeyboardInterrupt) -> None:
    """run.json of a run that a stop signal ended (see `trainer.train`, which sets `e.step` and
    `e.checkpoint_step`): status `interrupted` (SIGINT), `killed` (SIGTERM) or `preempted` (SIGUSR1, …: see
    `errors.stop_status`), `signal`, `steps` (the steps it took) and `checkpoint_step` (where `lazylab resume`
    continues; None: no checkpoint yet). The checkpoint is left as it is. An `Interrupted`'s message (what `run_cli`
    prints) then names the step, the step the resume starts from, and the resume command."""
    name = getattr(e, 'signal_name', 'SIGINT')
    step, saved = getattr(e, 'step', None), getattr(e, 'checkpoint_step', None)
    status = getattr(e, 'status', 'interrupted')
    more: dict[str, Any] = {'signal': name, 'checkpoint_step': saved}
    if step is not None:
        more['steps'] = step
    why = _unrecorded('stop', conf, run_dir, status, **more)
    if isinstance(e, Interrupted):
        e.message = f'{status} ({name}){f" at step {step:,}" if step is not None else ""}; ' + \
            resume_advice(run_dir, step, saved) + (f' ({why})' if why else '')


def resume_advice(run_dir: Path, step: Optional[int], saved: Optional[int]) -> str:
    """How a stopped run goes on, for its last line: from which step, and what that costs."""
    if saved is None:
        return f'no checkpoint was written yet (lazylab resume {run_dir} cannot continue it)'
    lost = '' if step is None or step == saved else f' ({plural(step - saved, "step")} after it are lost)'
    return f'lazylab resume {run_dir} continues from step {saved:,}, its checkpoint{lost}'
