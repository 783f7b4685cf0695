"""The training loop, top to bottom: `train(c, run_dir)`.

For each batch of the experiment's task (cut to the current length during a sequence-length warm-up,
`seq_len_start` → `seq_len` over `seq_len_warmup` steps): forward, loss, backward, clip, optimizer and scheduler
step, a running sum of the metrics; every `log_interval` steps a metrics record; every `valid_interval` steps
(default `steps_per_epoch // inner_iterations`) a validation, a sample and a checkpoint; at the end, the final
validation. A stop signal (Ctrl-C, SIGTERM, SIGUSR1: `errors.signals_noted`) ends the run at the end of the step in
progress, with the checkpoint of that step (`Training.stop_or_save`), and `checkpoint_minutes` adds a checkpoint by
the clock (for a SIGKILL or a power cut, which no handler sees). No callbacks; one hook, `on_validation` (below),
for a sweep's pruner. Before a run, `check_trains` (one pass on the first batch) and, for a resume, `check_resume`
let the runner refuse what would fail, before anything is written. The parts with a state of their own are named and
live beside this file:

    task.py        Task: the experiment's batches, loss, validation and samples (nlp_autoregression.TextTask);
                   SeqLenWarmup: each step's sequence length
    budget.py      TimeBudget: the clock, `max_minutes`, and the step count fitted to it
    checkpoint.py  Checkpointer, Position: checkpoint.pt (atomic writes, weights_only reads), resume
    metrics.py     RunningMetrics, RunLog: metrics.jsonl records, the progress line, samples.txt, labml
    flops.py       StepFlops: the FLOPs of the first full-length step; peak_flops: the machine's (MFU)

What `train` reads from the resolved config `c` (any `TrainerConfigs`; the contract is in its docstring): `c.model`
(on `c.device`), `c.optimizer.optimizer` / `c.optimizer.scheduler` (a torch optimizer, an optimizers.ScheduledLR),
`c.task`, `c.total_steps` and the plain items of `TrainerConfigs` below.

Run directory (written by rank 0 only):
    configs.yaml     the replayable config dump (written before training starts, by the caller)
    run.json         experiment name, run id, labml uuid, command line; flops_per_token and peak_flops once counted
    metrics.jsonl    one JSON record per logged step: step, tokens, epoch, loss.train, accuracy.train, lr,
                     tokens_per_s, mfu (once counted), time; plus loss.valid, accuracy.valid on validation records
    samples.txt      a sampled text at every validation
    checkpoint.pt    model, optimizer, scheduler, RNG states, data position, step (temp file + rename)
    labml/           labml's own records of the run (see tracking.py)

Under torchrun (see distributed.py) each process trains on its shard of every batch, the model is wrapped in DDP,
losses and validation are averaged over the processes, and only rank 0 writes files and prints.

Resume (`train(c, run_dir, resume=True)`) restores everything in checkpoint.pt and drops metrics and samples recorded
after it, so a run stopped at any step (or killed at any point) and resumed logs, on the CPU, bitwise the same losses,
samples and final parameters as one that never stopped.

The hook, `train(…, on_validation=hook)`: after every interleaved validation (its record written and the checkpoint
saved; not after the final validation) the trainer calls `hook(step, record)` with the step and that metrics record
(`loss.valid`, `accuracy.valid`, …) with `progress` added: the share of the run done (of `max_minutes` when the
time budget decides the run's length, else of its steps), so that runs of different speeds can be compared at the
same point. A true answer (`'pruned'`, or any truthy value) stops the run there: `train` returns that record, and
the files are complete as at any checkpoint (the run can be resumed). Under torchrun only rank 0 calls the hook,
and every process gets its answer. `lazylab.sweeps` passes a hook that reports the metric to Optuna and answers
whether its pruner stops the trial; nothing else of the loop is exposed.
"""
import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Optional

import torch
from annotated_types import Ge, Lt

from lazylab.configs import BaseConfigs, ConfigError, explain, to_dict
from lazylab.configs.types import (
    NonEmptyStr,
    NonNegativeFloat,
    NonNegativeInt,
    PathStr,
    PositiveInt,
    ThreadCount,
)
from lazylab.errors import (
    CheckpointError,
    Interrupted,
    LazylabError,
    NonFiniteLossError,
    NotedSignals,
    TrainingError,
    signals_noted,
    stop_signals,
)
from lazylab.experiments import distributed
from lazylab.experiments.budget import CALIBRATION_STEPS, TimeBudget
from lazylab.experiments.checkpoint import Checkpointer, Position, load_checkpoint, save_checkpoint
from lazylab.experiments.flops import StepFlops, peak_flops
from lazylab.experiments.metrics import MetricsLog, Progress, RunLog, RunningMetrics, read_metrics
from lazylab.experiments.task import Batch, BatchLoss, SeqLenWarmup, Task, evaluate
from lazylab.models.sampling import NonFiniteLogitsError
from lazylab.runs import CHECKPOINT_PT, mfu

#: the trainer's one hook: (step, validation record) -> a reason to stop now (truthy) or None to go on
ValidationHook = Callable[[int, dict[str, Any]], Any]

# the loop and its configuration, and (re-exported) the names of its parts that callers used to find here
__all__ = ['TrainerConfigs', 'resolve_device', 'autocast_for', 'train', 'check_trains', 'check_resume', 'validate',
           'check_finite', 'sample', 'SeqLenWarmup',
           'TrainingError', 'CheckpointError', 'NonFiniteLossError', 'CALIBRATION_STEPS', 'TimeBudget',
           'Checkpointer', 'Position', 'load_checkpoint', 'save_checkpoint', 'MetricsLog',
           'Progress', 'RunLog', 'RunningMetrics', 'read_metrics', 'Task', 'evaluate', 'ValidationHook']


class TrainerConfigs(BaseConfigs):
    """How to train: length, batch shape, validation, device and precision (labml's TrainValidConfigs idea); the
    base of every experiment's `Configs`.

    The contract: besides the items declared here, the trainer reads four items an experiment's Configs declares
    and makes, each by an `@option` (or a class default, or a value given):

        model        an `nn.Module` on `device_of(c)`, whatever the task's `loss` calls
        task         a `Task` (lazylab.experiments.task): batches, loss, evaluation, optional samples
        optimizer    an `OptimizerConfigs` (lazylab.experiments.optimizers) with `parameters` the model's and
                     `total_steps` the run's: it makes the torch optimizer and its learning-rate schedule
        total_steps  the optimizer steps the run takes (e.g. `max_steps` if given, else `epochs` · batches per epoch)

    `NLPAutoRegressionConfigs` provides task, optimizer and total_steps for text (the experiment adds the model);
    a Task of your own subclasses `Task` and provides all four (lazylab.experiments.retrieval, or `lazylab new
    NAME --task custom`). Its batches may have any shape its `loss` understands. A Configs that declares one of
    the four without a way to make it is refused before a run starts, naming the item
    (`configure.check_trainer_items`).

    Attributes:
        seed, device, threads, …: the items below, each with its meaning beside it (`lazylab options NAME`).
    """
    seed: Annotated[int, Ge(0), Lt(2**32)] = 0         # seeds parameters, dropout and the data order
    device: NonEmptyStr = 'auto'                       # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    threads: ThreadCount = 0                           # CPU threads for torch (0: torch's default)
    dtype: Literal['float32', 'bfloat16'] = 'float32'  # bfloat16: autocast for the forward pass
    compile: bool = False                              # torch.compile the model for training
    epochs: PositiveInt = 1                            # passes over the training split ...
    max_steps: NonNegativeInt = 0                      # ... or stop after this many optimizer steps (0: epochs decide)
    max_minutes: NonNegativeFloat = 0.0                # also stop after this much training time (0: no time limit)
    inner_iterations: PositiveInt = 10                 # validations (and checkpoints) per epoch ...
    valid_interval: NonNegativeInt = 0                 # ... or every this many steps (0: inner_iterations decides)
    batch_size: PositiveInt = 16                       # sequences per step (per process)
    seq_len: PositiveInt = 128                         # characters per sequence
    seq_len_start: NonNegativeInt = 0                  # sequence-length warm-up: the first steps' length (0: none) ...
    seq_len_warmup: NonNegativeInt = 0                 # ... growing linearly to seq_len over this many steps
    grad_norm_clip: NonNegativeFloat = 1.0             # clip the global gradient norm to this (0: no clipping)
    log_interval: PositiveInt = 10                     # steps between metric records
    valid_batches: PositiveInt = 16                    # batches in each interleaved validation
    checkpoint_minutes: NonNegativeFloat = 0.0         # also a checkpoint every this many minutes (0: at validations)
    final_valid_batches: NonNegativeInt = 0            # batches in the final validation (0: the whole validation split)
    peak_tflops: NonNegativeFloat = 0.0                # a device's peak TFLOP/s, for MFU (0: measured once, cached)
    runs_dir: PathStr = 'runs'                         # runs go to RUNS_DIR/NAME/RUN_ID/
    dashboard: str = ''                                # labml app URL ('' → .labml.yaml's app_url, if any)


def resolve_device(name: str) -> torch.device:
    """'auto' → cuda if available, else mps, else cpu; anything else is passed to torch.device.

    Raises:
        ValueError: the device is unknown or not available here.
    """
    if name == 'auto':
        if torch.cuda.is_available():
            return torch.device('cuda')
        if getattr(torch.backends, 'mps', None) is not None and torch.backends.mps.is_available():
            return torch.device('mps')
        return torch.device('cpu')
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type not in ('cpu', 'cuda', 'mps'):
        raise ValueError(f"device {name!r} cannot train here; use auto, cpu, cuda, cuda:N or mps")
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} is not available (no CUDA here); use device=auto or device=cpu")
    if device.type == 'cuda' and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} is not available: this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s) (cuda:0 …)")
    if device.type == 'mps' and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} is not available (no MPS here); use device=auto or device=cpu")
    return device


def autocast_for(device: torch.device, dtype: str) -> Callable[[], Any]:
    """A factory of the context the forward passes run in: autocast to `dtype` ('bfloat16'), or autocast
    disabled ('float32')."""
    torch_dtype = {'float32': None, 'bfloat16': torch.bfloat16}[dtype]
    return lambda: torch.autocast(device.type, dtype=torch_dtype, enabled=torch_dtype is not None)


class Training:
    """What lives across the steps of one `train` call: the parts it trains (model, optimizer, scheduler, task, on
    their device), where training stands (`pos`, a checkpoint.Position), the running metrics and the run's log, the
    time budget, the checkpointer, and why training ends (`stopped`: 'max_steps', 'epochs', 'time', 'target').

    Args:
        c: a resolved experiment config (see the module docstring); run_dir: the run's directory.
        labml_run, resume, checkpoint: as `train`'s.

    Raises:
        CheckpointError: resume=True and the checkpoint is missing or damaged.
    """

    def __init__(self, c, run_dir: Path, *, labml_run=None, resume: bool = False,
                 checkpoint: Optional[dict[str, Any]] = None):
        self.c, self.device, self.world_size = c, resolve_device(c.device), distributed.get_world_size()
        self.model, self.optimizer, self.scheduler, self.task = c.model, c.optimizer.optimizer, \
            c.optimizer.scheduler, c.task
        self.step_model = distributed.wrap(self.model, self.device)  # DDP averages the gradients over processes
        self.step_model = torch.compile(self.step_model) if c.compile else self.step_model
        self.autocast = autocast_for(self.device, c.dtype)
        self.valid_every = c.valid_interval or max(1, self.task.batches_per_epoch // c.inner_iterations)
        self.warmup = SeqLenWarmup(c.seq_len_start, c.seq_len_warmup, c.seq_len)  # each step's sequence length
        self.ckpt = Checkpointer(Path(run_dir) / CHECKPOINT_PT, self.model, self.optimizer, self.scheduler,
                                 self.task.checkpoint_extras())
        self.pos, sums = Position(total_steps=c.total_steps), None
        if resume:  # model, optimizer, scheduler and random states, and where training stands
            self.pos, sums = self.ckpt.restore(checkpoint)
        elif self.world_size > 1:
            # parameters are already equal on every process (same seed, DDP broadcasts); dropout masks must not be
            torch.manual_seed(c.seed * 1_000_003 + distributed.get_rank())
        self.metrics = RunningMetrics(sums)
        self.budget = TimeBudget(c.max_minutes, self.pos, fit_steps=c.max_steps == 0, max_total_steps=c.total_steps,
                                 valid_every=self.valid_every, final_valid_ratio=self.task.final_valid_ratio,
                                 now=time.time, work=self.warmup.work if self.warmup.active else None)
        self.log = RunLog(run_dir, self.pos.total_steps, labml_run, resumed_at=self.pos.step if resume else None,
                          enabled=distributed.is_main_process(), estimated=self.budget.fits)
        self.last: dict[str, Any] = {}
        self.stopped: Optional[str] = None
        self.stop_signals = stop_signals()  # the signals a stop can be for (one more may be named in the environment)
        self.agreed_stop: Optional[int] = None  # under torchrun: the stop signal this step's all-reduce agreed on
        self.agreed_save = False                # ... and whether a checkpoint is due by the clock
        self.saved_at = time.time()             # when the last checkpoint was written (checkpoint_minutes)
        # MFU (flops.py): the FLOPs of this call's first full-length step, over the peak of the run's devices
        # (not under torch.compile: a counting mode would make it run the step eagerly, another step than the run's)
        self.flops = StepFlops(enabled=distributed.is_main_process() and not c.compile)
        peak = peak_flops(self.device, c.dtype, tflops=c.peak_tflops) if self.flops.due else None
        self.peak = peak * self.world_size if peak is not None else None

    def full_length(self) -> bool:
        """This step's sequences are not cut short by a sequence-length warm-up."""
        return not self.warmup.active or self.warmup.length(self.pos.step) >= self.c.seq_len

    def batch(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        """The batch on the device, cut to this step's length during a sequence-length warm-up."""
        if not self.full_length():
            x, y = self.task.shorten(x, y, self.warmup.length(self.pos.step))
        return x.to(self.device), y.to(self.device)

    def mean_loss(self, batch: BatchLoss, x: torch.Tensor, noted: NotedSignals) -> tuple[float, BatchLoss, int, bool]:
        """One all-reduce (nothing in a single process) gives every process the mean loss, the accuracy counts, the
        tokens and whether any of them ran out of time, so that all take the same decisions; under torchrun it also
        carries which stop signals arrived and whether a checkpoint is due by the clock (`agreed_stop`,
        `agreed_save`), so that all processes stop, or save, after the same step. Returns (mean loss, the summed
        counts as a BatchLoss, tokens, late).

        Raises:
            NonFiniteLossError: the loss is not finite (before any update: the model's settings are the cause).
        """
        agree = self.world_size > 1
        arrived = noted.pending() if agree else None
        flags = [float(self.checkpoint_due()), *(float(s == arrived) for s in self.stop_signals)] if agree else []
        loss_sum, correct, count, tokens, late, *agreed = distributed.all_reduce_sum(
            batch.loss.item(), batch.correct, batch.count, x.numel(), float(self.budget.out_of_time()), *flags)
        if agree:
            self.agreed_save = agreed[0] > 0
            self.agreed_stop = next((s for s, n in zip(self.stop_signals, agreed[1:]) if n > 0), None)
        loss = loss_sum / self.world_size
        if self.pos.step == 0 and not math.isfinite(loss):  # before any update: not the learning rate's doing
            raise NonFiniteLossError(f'training loss is {loss} at step 1, before any update ({self.ckpt.kept()}), '
                                     f'{not_finite_cause(self.c)}')
        check_finite(loss, f'training loss is {loss} at step {self.pos.step + 1}', self.ckpt)
        return loss, BatchLoss(batch.loss, int(correct), int(count)), int(tokens), late > 0

    @contextlib.contextmanager
    def counting_flops(self, x: torch.Tensor) -> Iterator[None]:
        """Around the forward and backward passes of a step: the first full-length one of this call is counted
        (flops.StepFlops: bit for bit the same step), and from then on the records and run.json have MFU."""
        if not (self.flops.due and self.full_length()):
            yield
            return
        with self.flops.counting(tokens=x.numel()):
            yield
        if self.flops.per_token is not None and self.peak is not None:
            self.log.utilization(self.flops.per_token, self.peak)

    def step_done(self, loss: float, counts: BatchLoss, tokens: int, seconds: float, lr: float) -> None:
        """After the optimizer step: where training stands, the running metrics, the clock."""
        pos = self.pos
        pos.step, pos.batch, pos.tokens = pos.step + 1, pos.batch + 1, pos.tokens + tokens
        pos.train_seconds += seconds
        self.metrics.add(loss, counts.correct, counts.count, tokens, seconds=seconds, lr=lr)
        self.budget.step_done(pos)

    def validation_due(self, done: bool) -> bool:
        return self.pos.step % self.valid_every == 0 or done or self.budget.calibration_due(self.pos)

    def validate(self, done: bool, late: bool = False) -> bool:
        """A validation (the final one when `done`; `late`: the time budget ran out), its record, a sample, the step
        count fitted to the time budget, a checkpoint (the final one records why the run ended, so that a resume
        finds it finished). Returns whether training ends here (`done`, or the task's target reached).

        Raises:
            NonFiniteLossError: the validation loss, or the sample's logits, are not finite.
        """
        pos, started = self.pos, time.time()
        valid = validate(self.task, self.model, self.autocast, final=done, pos=pos, ckpt=self.ckpt)
        if not done and self.task.converged(valid):  # the task's own stopping rule (e.g. a target loss):
            done, pos.total_steps, self.stopped = True, pos.step, 'target'  # and a resume finds it finished
        self.last = self.log.write(self.metrics.record(pos, self.task.batches_per_epoch, valid), pos,
                                   self.budget.eta(pos))
        self.log.sample(pos, sample(self.task, self.model, self.autocast, pos.step) if self.log.enabled else None)
        if not done and self.budget.validated(pos, seconds=time.time() - started):
            self.scheduler.set_total_steps(pos.total_steps)
        if done:
            pos.finished = self.stopped = self.stopped or self.stop_reason(late)
        self.save()
        return done

    def save(self) -> None:
        """The checkpoint of this step (every process calls it; rank 0 writes)."""
        self.pos.elapsed = self.budget.elapsed()
        self.ckpt.save(self.pos, self.metrics.state())
        self.saved_at = time.time()

    def checkpoint_due(self) -> bool:
        """`checkpoint_minutes` have passed since the last checkpoint (this process's clock)."""
        return self.c.checkpoint_minutes > 0 and time.time() - self.saved_at >= self.c.checkpoint_minutes * 60

    def stop_or_save(self, noted: NotedSignals) -> None:
        """At the end of a step the run goes on from: a stop signal that arrived (in a single process: by now; under
        torchrun: the one this step's all-reduce agreed on) ends the run here, with the checkpoint of this very step,
        so a resume loses nothing; else a checkpoint due by the clock is written.

        Raises:
            Interrupted: for that signal, after the checkpoint is written whole (a second signal meanwhile is noted,
                not lost, and changes nothing).
        """
        single = self.world_size == 1
        signum = noted.pending() if single else self.agreed_stop
        if signum is not None or (self.checkpoint_due() if single else self.agreed_save):
            if self.ckpt.saved_step != self.pos.step:  # a validation at this step wrote it already
                self.save()
        if signum is not None:
            noted.take()
            raise Interrupted(signum)

    def log_train(self) -> None:
        """A record of the training steps since the last one; the step count fitted again to the time budget."""
        self.last = self.log.write(self.metrics.record(self.pos, self.task.batches_per_epoch), self.pos,
                                   self.budget.eta(self.pos))
        if self.budget.refit(self.pos):
            self.scheduler.set_total_steps(self.pos.total_steps)

    def progress(self) -> float:
        """The share of the run done, in [0, 1]: of the time budget when it decides the run's length (elapsed /
        max_minutes), else of the steps (step / total_steps)."""
        if self.budget.fits:
            return min(1.0, self.budget.elapsed() / self.budget.seconds)
        return min(1.0, self.pos.step / max(1, self.pos.total_steps))

    def stop_reason(self, late: bool) -> str:
        """Why a run that ends now ends: 'time' (the budget), 'max_steps' or 'epochs'."""
        c, pos = self.c, self.pos
        fitted = self.budget.fits and pos.total_steps < c.total_steps
        return 'time' if late or fitted else 'max_steps' if c.max_steps > 0 and pos.total_steps >= c.max_steps \
            else 'epochs'

    def end(self, late: bool) -> dict[str, Any]:
        """The last record, with `tokens_per_s_avg` (the run's average over all its steps and resumes, validation
        not counted), `mfu_avg` (its MFU, once the FLOPs are counted) and `stopped`: why training ended."""
        pos = self.pos
        self.stopped = self.stopped or self.stop_reason(late)
        out = dict(self.last, stopped=self.stopped) if self.last else {}
        if out and pos.train_seconds > 0:
            out['tokens_per_s_avg'] = pos.tokens / pos.train_seconds
            if self.log.counted is not None:
                flops_per_token, peak = self.log.counted
                out['mfu_avg'] = mfu(flops_per_token, out['tokens_per_s_avg'], peak)
        return out


def train(c, run_dir: Path, *, resume: bool = False, checkpoint: Optional[dict[str, Any]] = None,
          labml_run=None, on_validation: Optional[ValidationHook] = None) -> dict[str, Any]:
    """Train `c.model` on `c.task`; returns the last metrics record (with the final validation) plus
    `tokens_per_s_avg` (the run's average), `mfu_avg` (its MFU, once counted: flops.py) and `stopped` (why it ended:
    'max_steps', 'epochs', 'time' for the time budget, 'target' for the task's `converged`); {} when a resumed run had
    already finished.

    Args:
        c: a resolved experiment config (see the module docstring for what is read).
        run_dir: the run's directory (exists; configs.yaml already written).
        resume: continue from run_dir/checkpoint.pt (or from `checkpoint`, that file already loaded).
        labml_run: a started tracking.LabmlRun (or anything with `log(step, values)`) to mirror the metrics into.
        on_validation: the hook of the module docstring: asked after each interleaved validation whether to stop.

    Raises:
        CheckpointError: resume=True and the checkpoint is missing or damaged.
        NonFiniteLossError: the training loss became NaN/inf (the checkpoint of the last validation is kept).
        KeyboardInterrupt: a stop signal as `lazylab.errors.Interrupted` (Ctrl-C, SIGTERM, SIGUSR1, …: under
            `errors.signals_interrupt` the step in progress ends and its checkpoint is written first), or a plain
            Ctrl-C where no lazylab handler is set (a notebook); it leaves with `step` (the steps taken) and
            `checkpoint_step` (the step of the checkpoint on disk, or None) set on the exception.
    """
    t = Training(c, run_dir, labml_run=labml_run, resume=resume, checkpoint=checkpoint)
    model, optimizer, scheduler, task, pos = t.model, t.optimizer, t.scheduler, t.task, t.pos
    late = False
    model.train()
    try:
        with signals_noted() as noted:  # a stop signal ends the step in progress, then the run (t.stop_or_save)
            while pos.step < pos.total_steps:
                for x, y in task.batches(pos.epoch, start=pos.batch):
                    step_started = time.time()
                    x, y = t.batch(x, y)
                    with t.counting_flops(x):  # the first full-length step's FLOPs, forward and backward (MFU)
                        with t.autocast():
                            batch = task.loss(t.step_model, x, y)
                        loss, counts, tokens, late = t.mean_loss(batch, x, noted)  # over every process
                        optimizer.zero_grad(set_to_none=True)
                        batch.loss.backward()
                    if c.grad_norm_clip > 0:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_norm_clip)
                    lr = optimizer.param_groups[0]['lr']  # the rate this update uses (logged as `lr`)
                    optimizer.step()
                    scheduler.step()
                    t.step_done(loss, counts, tokens, seconds=time.time() - step_started, lr=lr)

                    done = pos.step >= pos.total_steps or late
                    if t.validation_due(done):
                        done = t.validate(done, late)
                        if on_validation is not None and not done and \
                                stop_asked(on_validation, pos.step, dict(t.last, progress=t.progress())):
                            return t.last
                    elif pos.step % c.log_interval == 0:
                        t.log_train()
                    if done:
                        return t.end(late)
                    t.stop_or_save(noted)  # a stop signal: this step's checkpoint, then Interrupted
                pos.epoch, pos.batch = pos.epoch + 1, 0
            return t.end(late)
    except KeyboardInterrupt as e:  # a stop signal (errors.Interrupted), or Ctrl-C outside lazylab's handler (a
        e.step, e.checkpoint_step = pos.step, t.ckpt.saved_step  # notebook): the runner records where it stopped
        raise


def stop_asked(hook: ValidationHook, step: int, record: dict[str, Any]) -> bool:
    """Rank 0 asks `hook(step, record)`; every process gets whether it said to stop."""
    answer = hook(step, record) if distributed.is_main_process() else None
    return bool(distributed.broadcast_object(answer))


def check_resume(c, path: Path, checkpoint: dict[str, Any]) -> list[str]:
    """Before a resume writes anything: `checkpoint` (read from `path`) fits this run's model and processes
    (`Checkpointer.check`) and was made on this run's data (`Task.check_checkpoint`: for text, the vocabulary,
    then its sha256 and size). Returns the data's changes a resume may accept with `--allow-changes` (one line
    each; the runner refuses them without it).

    Raises:
        CheckpointError: saying what differs.
    """
    changes = c.task.check_checkpoint(checkpoint) or []  # first: another vocabulary also changes the model's shapes
    Checkpointer(path, c.model, c.optimizer.optimizer, c.optimizer.scheduler).check(checkpoint)
    return list(changes)


def check_trains(c) -> None:
    """One forward and backward pass of `c.model` on the task's first batch (`Task.probe_batch`), before a run
    starts, so that what the item declarations cannot check (a size or dtype the model cannot take, a memory that
    is too short for seq_len, a batch that does not fit in memory) is a one-line error before the run directory
    exists. The loss and every gradient must come out finite: a NaN there, before any update, is the model's and
    its settings', not the learning rate's (the message names the settings given, see `not_finite_cause`). The model
    is left as it was: eval mode for the pass (no dropout), the random states restored, the gradients dropped; no
    optimizer step. The loss is asked for with reduction='sum' (as evaluation does).

    Raises:
        TrainingError: the pass fails (the message names the exception; it is chained as __cause__), or the loss
            or a gradient is not finite.
    """
    device, model, task = resolve_device(c.device), c.model, c.task
    x, y = task.probe_batch()
    was_training = model.training
    cuda = [device.index or 0] if device.type == 'cuda' else []
    try:
        with torch.random.fork_rng(devices=cuda):
            model.eval()
            with autocast_for(device, c.dtype)():  # reduction='sum', as evaluation asks: the task's training-loss
                batch = task.loss(model, x.to(device), y.to(device), reduction='sum')  # bookkeeping is not touched
            batch.loss.backward()
        loss = batch.loss.item()
        bad = next(((n, p.grad) for n, p in model.named_parameters()
                    if p.grad is not None and not torch.isfinite(p.grad).all()), None)
    except (LazylabError, ConfigError):
        raise
    except Exception as e:
        what = ' '.join(str(e).split())[:300]
        raise TrainingError(f'the model cannot train with these settings: one batch ({"×".join(map(str, x.shape))})'
                            f' fails with {type(e).__name__}: {what}') from e
    finally:
        model.train(was_training)
        for p in model.parameters():
            p.grad = None
    if not math.isfinite(loss) or bad is not None:
        what = f'loss is {loss}' if not math.isfinite(loss) else \
            f'gradient of {bad[0]} is not finite ({"nan" if torch.isnan(bad[1]).any() else "inf"})'
        raise TrainingError(f'the model\'s {what} on the first batch ({"×".join(map(str, x.shape))}), before any '
                            f'update, {not_finite_cause(c)}')


def not_finite_cause(c) -> str:
    """The end of the message for a loss or gradient that is not finite before any update: the learning rate is
    not the cause, and the settings given that the model is made from likely are (those given by the user or a
    --config file, or the preset's when there are none of those; in declaration order, as `key=value`)."""
    rows, doc = explain(c), to_dict(c)
    needs, todo = set(), ['model']  # the items the model is computed from, transitively
    while todo:
        key = todo.pop()
        if key in rows and key not in needs:
            needs.add(key)
            todo += rows[key]['reads']
    given = {k: label for k, label in (doc.get('given') or {}).items() if k in needs}
    own = [k for k, label in given.items() if not label.startswith('preset ')] or list(given)
    values = {**(doc.get('objects') or {}), **doc['values']}
    shown = ', '.join(f'{k}={_as_given(values.get(k))}' for k in own)
    if not shown:
        return 'so the learning rate is not the cause: the model itself is, with the default settings'
    return f'so the learning rate is not the cause: the likely cause is one of these settings ({shown})'


def _as_given(value: Any) -> str:
    """A value as it is written on the command line (true/false for a flag)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def validate(task: Task, model: torch.nn.Module, autocast, *, final: bool, pos: Position,
             ckpt: Checkpointer) -> dict[str, float]:
    """`task.evaluate` (the final validation at the end), refusing a loss that is not finite.

    Raises:
        NonFiniteLossError: the last update broke the weights; they are not saved.
    """
    with autocast():
        valid = task.evaluate(model, final=final)
    check_finite(valid['loss'], f'validation loss is {valid["loss"]} after step {pos.step}', ckpt)
    return valid


def check_finite(loss: float, what: str, ckpt: Checkpointer) -> None:
    """Raise NonFiniteLossError('<what>; <the checkpoint kept> (<remedy>)') unless `loss` is finite."""
    if not math.isfinite(loss):
        raise NonFiniteLossError(f'{what}; {ckpt.kept()} (try a lower optimizer.learning_rate or grad_norm_clip)')


def sample(task: Task, model: torch.nn.Module, autocast, step: int) -> Optional[str]:
    """`task.sample` under the training's autocast.

    Raises:
        NonFiniteLossError: the model's logits are NaN (the weights are not finite; nothing more is saved).
    """
    try:
        with autocast():
            return task.sample(model, step)
    except NonFiniteLogitsError as e:
        raise NonFiniteLossError(f'sampling after step {step} failed: {e}') from None
