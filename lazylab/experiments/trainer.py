"""The training loop, its configuration, checkpoints and metrics.

`train(c, run_dir)` is the whole training path, top to bottom: build the loaders, (maybe) restore a checkpoint,
then for each batch: forward, cross-entropy, backward, clip, optimizer and scheduler step, log; every
`valid_interval` steps (default `steps_per_epoch // inner_iterations`): validate, sample, checkpoint. No callbacks, no hooks.

What `train` reads from the resolved config `c` (an `NLPAutoRegressionConfigs`): `c.model` (an
`AutoregressiveModel` already on `c.device`), `c.optimizer.optimizer` / `c.optimizer.scheduler` (torch optimizer
and LR scheduler), `c.dataset` (a `lazylab.data.TextDataset`) and the plain items of `TrainerConfigs` below.

Run directory (written by rank 0 only):
    configs.yaml     the replayable config dump (written before training starts, by the caller)
    run.json         experiment name, run id, labml uuid, command line
    metrics.jsonl    one JSON record per logged step: step, tokens, epoch, loss.train, accuracy.train, lr,
                     tokens_per_s, time; plus loss.valid, accuracy.valid on validation records
    samples.txt      a sampled text at every validation
    checkpoint.pt    model, optimizer, scheduler, RNG states, data position, step (temp file + rename)
    labml/           labml's own records of the run (see tracking.py)

Resume (`train(c, run_dir, resume=True)`) restores everything in checkpoint.pt and drops metrics recorded after it,
so a run killed at any point and resumed logs, on the CPU, bitwise the same losses as one that never stopped.
"""
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

from lazylab.configs import BaseConfigs

from lazylab.data import SequentialLoader, ShuffledLoader
from lazylab.experiments import distributed

CHECKPOINT = 'checkpoint.pt'
METRICS = 'metrics.jsonl'
SAMPLES = 'samples.txt'


class TrainingError(RuntimeError):
    """A run cannot go on for a reason the user can act on (bad checkpoint, diverged loss); one-line message."""


class CheckpointError(TrainingError):
    """A checkpoint file is missing, truncated or not a lazylab checkpoint."""


class NonFiniteLossError(TrainingError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""


class TrainerConfigs(BaseConfigs):
    """How to train: length, batch shape, validation, device and precision (labml's TrainValidConfigs idea)."""
    seed: int = 0                 # seeds parameters, dropout and the data order
    device: str = 'auto'          # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    threads: int = 0              # CPU threads for torch (0: torch's default); 1 is fastest on a busy machine
    dtype: str = 'float32'        # float32, or bfloat16 (autocast for the forward pass)
    compile: bool = False         # torch.compile the model for training
    epochs: int = 1               # passes over the training split ...
    max_steps: int = 0            # ... or stop after this many optimizer steps (0: epochs decide)
    max_minutes: float = 0.0      # also stop after this much training time (0: no time limit)
    inner_iterations: int = 10    # validations (and checkpoints) per epoch ...
    valid_interval: int = 0       # ... or every this many steps (0: inner_iterations decides)
    batch_size: int = 16          # sequences per step (per process)
    seq_len: int = 128            # characters per sequence
    grad_norm_clip: float = 1.0   # clip the global gradient norm to this (0: no clipping)
    log_interval: int = 10        # steps between metric records
    valid_batches: int = 16       # batches in each interleaved validation
    final_valid_batches: int = 0  # batches in the final validation (0: the whole validation split)
    runs_dir: str = 'runs'        # runs go to RUNS_DIR/NAME/RUN_ID/
    dashboard: str = ''           # labml app URL for the live dashboard ('' → .labml.yaml's app_url, if any)


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
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} is not available (no CUDA here); use device=auto or device=cpu")
    if device.type == 'mps' and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} is not available (no MPS here); use device=auto or device=cpu")
    return device


@dataclass
class Position:
    """Where training stands; saved in every checkpoint."""
    step: int = 0             # optimizer steps taken
    epoch: int = 0            # current epoch
    batch: int = 0            # next batch index within the epoch
    tokens: int = 0           # training tokens seen (all processes)
    elapsed: float = 0.0      # wall-clock seconds of training and validation, summed over resumes
    total_steps: int = 0      # steps this run takes (fitted to max_minutes when the time budget decides)
    calibrated: bool = False  # the step count has been fitted to the time budget


#: steps timed before fitting the step count to `max_minutes` (when max_steps=0)
CALIBRATION_STEPS = 30


def save_checkpoint(path: Path, payload: Dict[str, Any]) -> None:
    """torch.save to a temporary file in the same folder, then rename: a reader never sees a half-written file."""
    tmp = path.with_name(path.name + f'.tmp{os.getpid()}')
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> Dict[str, Any]:
    """Load a checkpoint written by `save_checkpoint` with `weights_only=True` (tensors and plain values only).

    Raises:
        CheckpointError: the file is missing, unreadable, truncated, or not a lazylab checkpoint.
    """
    if not path.is_file():
        raise CheckpointError(f'no checkpoint at {path}')
    try:
        payload = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:  # torch raises several types for damaged files (RuntimeError, UnpicklingError, EOFError…)
        raise CheckpointError(f'cannot read checkpoint {path}: it is damaged or not a lazylab checkpoint '
                              f'({type(e).__name__})') from None
    if not isinstance(payload, dict) or payload.get('format') != 'lazylab-checkpoint-1':
        raise CheckpointError(f'{path} is not a lazylab checkpoint')
    return payload


def _rng_states() -> Dict[str, Any]:
    states = {'torch': torch.get_rng_state(), 'python': random.getstate()}
    if torch.cuda.is_available():
        states['cuda'] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: Dict[str, Any]) -> None:
    torch.set_rng_state(states['torch'])
    random.setstate(_as_tuple(states['python']))
    if 'cuda' in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states['cuda'])


def _as_tuple(x):
    """random.setstate needs tuples back where torch.save may hand us lists."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


class MetricsLog:
    """metrics.jsonl: one JSON object per line, flushed per record."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, record: Dict[str, Any]) -> None:
        with open(self.path, 'a', encoding='utf-8') as f:
            f.write(json.dumps(record) + '\n')

    def drop_after(self, step: int) -> None:
        """Keep only records up to `step` (a resumed run re-logs the steps after its checkpoint)."""
        if self.path.exists():
            kept = [r for r in read_metrics(self.path) if r['step'] <= step]
            tmp = self.path.with_name(self.path.name + '.tmp')
            tmp.write_text(''.join(json.dumps(r) + '\n' for r in kept), encoding='utf-8')
            os.replace(tmp, self.path)


def read_metrics(path: Path) -> List[Dict[str, Any]]:
    """All records of a metrics.jsonl file (a torn last line from a killed process is skipped)."""
    records = []
    for line in Path(path).read_text(encoding='utf-8').splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


class Progress:
    """The live progress line: redrawn in place on a terminal, one line per validation otherwise."""

    def __init__(self, total_steps: int, stream=None):
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()

    def show(self, pos: Position, record: Dict[str, Any], eta: float, newline: bool) -> None:
        if not (self.tty or newline):
            return
        parts = [f'epoch {pos.epoch + (pos.batch > 0)} step {pos.step:,}/{self.total_steps:,}',
                 f'{record.get("tokens_per_s", 0):,.0f} tok/s', f'ETA {_minutes(eta)}']
        if 'loss.train' in record:
            parts.append(f'train loss {record["loss.train"]:.3f} acc {record["accuracy.train"]:.3f}')
        if 'loss.valid' in record:
            parts.append(f'valid loss {record["loss.valid"]:.3f} acc {record["accuracy.valid"]:.3f}')
        line = ' | '.join(parts)
        if self.tty:
            self.stream.write('\r\033[K' + line + ('\n' if newline else ''))
        else:
            self.stream.write(line + '\n')
        self.stream.flush()

    def text(self, line: str) -> None:
        self.stream.write(('\r\033[K' if self.tty else '') + line + '\n')
        self.stream.flush()


def _minutes(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f'{seconds // 60}:{seconds % 60:02d}'


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, device: torch.device, autocast) -> Dict[str, float]:
    """Mean cross-entropy (nats/token) and accuracy of next-token prediction over all batches of `loader`.

    Under torchrun each process takes its share of every batch's columns and the sums are added up, so the
    result is that of the whole batches.
    """
    was_training = model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for x, y in loader:
        x, y = distributed.batch_share(x).to(device), distributed.batch_share(y).to(device)
        if y.numel():
            with autocast():
                logits, _ = model(x)
            loss_sum += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction='sum').item()
            correct += (logits.argmax(-1) == y).sum().item()
            count += y.numel()
    model.train(was_training)
    loss_sum, correct, count = distributed.all_reduce_sum(loss_sum, correct, count)
    return {'loss': loss_sum / count, 'accuracy': correct / count}


def train(c, run_dir: Path, *, resume: bool = False, labml_run=None) -> Dict[str, Any]:
    """Train `c.model` on `c.dataset`; returns the last metrics record (with the final, whole-split validation).

    Args:
        c: a resolved NLPAutoRegressionConfigs (see the module docstring for what is read).
        run_dir: the run's directory (exists; configs.yaml already written).
        resume: continue from run_dir/checkpoint.pt.
        labml_run: a started tracking.LabmlRun to mirror the metrics into, or None.

    Under torchrun (see distributed.py) each process trains on its shard of every batch, the model is wrapped in
    DDP, losses and validation are averaged over the processes, and only rank 0 writes files and prints.

    Raises:
        CheckpointError: resume=True and the checkpoint is missing or damaged.
        NonFiniteLossError: the training loss became NaN/inf (the checkpoint of the last validation is kept).
    """
    run_dir = Path(run_dir)
    device = resolve_device(c.device)
    model, optimizer, scheduler = c.model, c.optimizer.optimizer, c.optimizer.scheduler
    data = c.dataset
    rank, world_size = distributed.get_rank(), distributed.get_world_size()
    is_main = rank == 0
    step_model = distributed.wrap(model, device)  # DDP averages the gradients over processes (if several)
    step_model = torch.compile(step_model) if c.compile else step_model
    dtype = {'float32': None, 'bfloat16': torch.bfloat16}[c.dtype]

    def autocast():
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    data.check_seq_len(c.seq_len, processes=world_size)
    train_loader = ShuffledLoader(data.train, seq_len=c.seq_len, batch_size=c.batch_size, seed=c.seed,
                                  rank=rank, world_size=world_size)
    # validation batches span all processes (evaluate takes this process's columns)
    valid_quick = SequentialLoader(data.valid, seq_len=c.seq_len, batch_size=c.batch_size * world_size,
                                   max_batches=c.valid_batches)
    valid_full = SequentialLoader(data.valid, seq_len=c.seq_len, batch_size=c.batch_size * world_size,
                                  max_batches=c.final_valid_batches or None)
    valid_every = c.valid_interval or max(1, len(train_loader) // c.inner_iterations)
    budget = c.max_minutes * 60  # seconds; 0: no time limit
    fit_to_budget = budget > 0 and c.max_steps == 0

    metrics = MetricsLog(run_dir / METRICS)
    pos = Position(total_steps=c.total_steps)
    sums = {'loss': 0.0, 'correct': 0, 'count': 0, 'steps': 0, 'tokens': 0, 'seconds': 0.0}
    if resume:
        ck = load_checkpoint(run_dir / CHECKPOINT)
        saved_world_size = ck.get('world_size', 1)
        if saved_world_size != world_size:  # data shards and per-rank RNG states would mean something else
            raise CheckpointError(f'{run_dir / CHECKPOINT} was saved by {saved_world_size} process(es); '
                                  f'resume it with {saved_world_size}, not {world_size}')
        model.load_state_dict(ck['model'])
        optimizer.load_state_dict(ck['optimizer'])
        scheduler.load_state_dict(ck['scheduler'])
        per_rank = ck.get('rng_per_rank') or [ck['rng']]
        _set_rng_states(per_rank[rank] if len(per_rank) == world_size else ck['rng'])
        pos = Position(**ck['position'])
        sums = ck['sums']
        if is_main:
            metrics.drop_after(pos.step)
    elif world_size > 1:
        # parameters are already equal on every process (same seed, DDP broadcasts); dropout masks must not be
        torch.manual_seed(c.seed * 1_000_003 + rank)
    progress = Progress(pos.total_steps)
    started, step_started_at, elapsed_before = time.time(), pos.step, pos.elapsed
    last_record: Dict[str, Any] = {}

    def clock() -> float:
        """Wall-clock seconds of this run so far, over all resumes."""
        return elapsed_before + time.time() - started

    def save(path: Path = run_dir / CHECKPOINT):
        pos.elapsed = clock()
        rng = _rng_states()
        rng_per_rank = distributed.all_gather_object(rng) if world_size > 1 else None
        distributed.check_replicas_in_sync(model)
        if is_main:
            save_checkpoint(path, {'format': 'lazylab-checkpoint-1', 'model': model.state_dict(),
                                   'optimizer': optimizer.state_dict(), 'scheduler': scheduler.state_dict(),
                                   'rng': rng, 'rng_per_rank': rng_per_rank, 'world_size': world_size,
                                   'position': asdict(pos), 'sums': dict(sums), 'vocabulary': data.tokenizer.itos})
        saved_step[0] = pos.step

    def record(valid: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
        """Turn the sums since the last record into a metrics record; write and show it."""
        r = {'step': pos.step, 'tokens': pos.tokens, 'epoch': round(pos.epoch + pos.batch / len(train_loader), 4),
             'lr': step_lr, 'time': round(pos.elapsed, 3)}
        if sums['count']:
            r['loss.train'] = sums['loss'] / sums['steps']
            r['accuracy.train'] = sums['correct'] / sums['count']
            r['tokens_per_s'] = sums['tokens'] / max(sums['seconds'], 1e-9)
        if valid is not None:
            r['loss.valid'], r['accuracy.valid'] = valid['loss'], valid['accuracy']
        sums.update(loss=0.0, correct=0, count=0, steps=0, tokens=0, seconds=0.0)
        if is_main:
            metrics.write(r)
            if labml_run is not None:
                labml_run.log(pos.step, {k: v for k, v in r.items() if '.' in k or k in ('lr', 'tokens_per_s')})
        eta = (time.time() - started) / max(1, pos.step - step_started_at) * (pos.total_steps - pos.step)
        if budget > 0:
            eta = min(eta, budget - clock())
        progress.total_steps = pos.total_steps
        if is_main:
            progress.show(pos, r, eta=eta, newline=valid is not None)
        return r

    def sample() -> None:
        """Sample from the model with a generator of its own, so training's random state is untouched."""
        if not is_main:
            return
        g = torch.Generator(device=device).manual_seed(c.seed + pos.step)
        prompt = data.tokenizer.encode(c.prompt).to(device)
        with autocast():
            ids = model.generate(prompt, c.sample_tokens, temperature=c.sample_temperature, generator=g)
        text = data.tokenizer.decode(ids.cpu())
        progress.text('sample: ' + text.replace('\n', ' ⏎ '))
        with open(run_dir / SAMPLES, 'a', encoding='utf-8') as f:
            f.write(f'--- step {pos.step}, {pos.tokens:,} tokens\n{text}\n')

    saved_step = [load_checkpoint(run_dir / CHECKPOINT)['position']['step'] if resume else None]

    def kept() -> str:
        return 'no checkpoint was written' if saved_step[0] is None else \
            f'the checkpoint of step {saved_step[0]} is kept'

    def out_of_time() -> bool:
        return budget > 0 and clock() >= budget

    def validate(final: bool) -> Dict[str, Any]:
        """Validation loss (the whole split, or `final_valid_batches`, at the end), a sample, a checkpoint."""
        started_at = time.time()
        valid = evaluate(model, valid_full if final else valid_quick, device, autocast)
        if not math.isfinite(valid['loss']):  # the last update broke the weights: do not save them
            raise NonFiniteLossError(f'validation loss is {valid["loss"]} after step {pos.step}; '
                                     f'{kept()} (try a lower optimizer.learning_rate or grad_norm_clip)')
        r = record(valid)
        sample()
        if fit_to_budget and not final:
            timing.update(valid_seconds=time.time() - started_at)
            if not pos.calibrated:  # the first steps are slow (allocations, caches): time from warm_step on
                timing.update(since_clock=warm_clock or elapsed_before, since_step=warm_step if warm_clock
                              else step_started_at)
                pos.calibrated = True
            fit_steps_to_budget(just_validated=True)
            timing.update(since_clock=clock(), since_step=pos.step)
        save()
        return r

    def fit_steps_to_budget(just_validated: bool) -> None:
        """Choose the step count that ends the run, final validation included, at `max_minutes`, and stretch the
        LR schedule over it. Time per step = training time per step over the current validation interval plus
        the last validation's time shared over its interval. Done after the first CALIBRATION_STEPS steps and
        then every `log_interval` steps, so a machine that speeds up or slows down mid-run still ends on time."""
        steps = pos.step - timing['since_step']
        if steps <= 0:
            return
        valid_seconds = timing['valid_seconds']
        training_seconds = clock() - timing['since_clock'] - (valid_seconds if just_validated else 0.0)
        step_seconds = training_seconds / steps + valid_seconds / valid_every
        final_seconds = valid_seconds * len(valid_full) / len(valid_quick)
        steps_left = (budget - clock() - final_seconds) / step_seconds
        # every process must stop at the same step: rank 0's clock decides
        pos.total_steps = distributed.broadcast_object(min(c.total_steps, pos.step + max(1, int(steps_left))))
        for schedule in scheduler.lr_lambdas:
            schedule.total_steps = pos.total_steps

    warm_step, warm_clock = CALIBRATION_STEPS // 3, None
    # timing for fit_steps_to_budget: training since (since_clock, since_step); the last validation's seconds
    timing = {'since_clock': clock(), 'since_step': pos.step, 'valid_seconds': 0.0}
    step_lr = optimizer.param_groups[0]['lr']
    model.train()
    done = False
    while pos.step < pos.total_steps and not done:
        for x, y in train_loader.epoch(pos.epoch, start=pos.batch):
            t0 = time.time()
            x, y = x.to(device), y.to(device)
            with autocast():
                logits, _ = step_model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            # one all-reduce (nothing in a single process) gives every process the mean loss, the accuracy counts
            # and whether any of them ran out of time, so that all take the same decisions below
            correct = (logits.detach().argmax(-1) == y).sum().item()
            loss_sum, correct, count, late = distributed.all_reduce_sum(loss.item(), correct, y.numel(),
                                                                        float(out_of_time()))
            mean_loss = loss_sum / world_size
            if not math.isfinite(mean_loss):
                raise NonFiniteLossError(f'training loss is {mean_loss} at step {pos.step + 1}; {kept()} '
                                         f'(try a lower optimizer.learning_rate or grad_norm_clip)')
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if c.grad_norm_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_norm_clip)
            step_lr = optimizer.param_groups[0]['lr']  # the rate this update used (logged as `lr`)
            optimizer.step()
            scheduler.step()

            pos.step, pos.batch, pos.tokens = pos.step + 1, pos.batch + 1, pos.tokens + int(count)
            seconds = time.time() - t0
            pos.elapsed = clock()
            sums['loss'] += mean_loss
            sums['correct'] += int(correct)
            sums['count'] += int(count)
            sums['steps'] += 1
            sums['tokens'] += int(count)
            sums['seconds'] += seconds

            done = pos.step >= pos.total_steps or late > 0
            if pos.step == warm_step:
                warm_clock = clock()
            first_fit = fit_to_budget and not pos.calibrated and pos.step == CALIBRATION_STEPS
            if pos.step % valid_every == 0 or done or first_fit:
                last_record = validate(final=done)
            elif pos.step % c.log_interval == 0:
                last_record = record()
                if fit_to_budget and pos.calibrated:
                    fit_steps_to_budget(just_validated=False)
            if done:
                break
        else:
            pos.epoch, pos.batch = pos.epoch + 1, 0
            continue
        break
    return last_record
