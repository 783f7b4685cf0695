"""checkpoint.pt: what it takes to continue a run exactly where it stopped.

    ckpt = Checkpointer(run_dir / CHECKPOINT_PT, model, optimizer, scheduler, extras={'vocabulary': itos})
    pos, sums = ckpt.restore()     # resume: states loaded into model, optimizer, scheduler, random generators
    ...
    ckpt.save(pos, metrics.state())  # at every validation (every process calls it; rank 0 writes)

The file is one `torch.save` of a dict of tensors and plain values (format 'lazylab-checkpoint-1'):

    model, optimizer, scheduler   their state_dict()s
    rng, rng_per_rank             torch / python (/ cuda) random states of rank 0, and of every rank (or None)
    world_size                    the number of processes that wrote it (resume needs the same number)
    position                      `Position` as a dict: step, epoch, batch, tokens, elapsed, total_steps, calibrated,
                                  train_seconds, finished
    sums                          the running metrics' sums (see metrics.RunningMetrics)
    + the task's extras           e.g. vocabulary (the text task's characters, so generation needs no text)

It is written to a temporary file in the same folder, then renamed, so a reader (or a resume after a kill) never
sees a half-written file; it is read with `weights_only=True`, so loading one runs no code from it.
"""
import os
import random
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from lazylab.errors import CheckpointError, signals_deferred
from lazylab.experiments import distributed

FORMAT = 'lazylab-checkpoint-1'


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
    train_seconds: float = 0.0  # wall-clock seconds of the training steps alone (no validation), over all resumes
    finished: str = ''        # why the run ended ('time', 'max_steps', 'epochs', 'target'); '' while it goes on


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """torch.save to a temporary file in the same folder, then rename: a reader never sees a half-written file,
    and a write that fails leaves the previous checkpoint as it was and no temporary file.

    A failed write is an OSError from the file (the folder is read-only, the disk full at `open`, `close` or a
    buffered write) or torch's RuntimeError (its zip writer's `[enforce fail at inline_container.cc…]`, raised
    while handling the file's OSError); both become one CheckpointError with the operating system's reason.

    Raises:
        CheckpointError: `cannot write the checkpoint PATH (the previous checkpoint is kept | no checkpoint was
            written): REASON`, REASON e.g. `No space left on device`, `Permission denied`.
    """
    tmp = path.with_name(path.name + f'.tmp{os.getpid()}')
    try:
        # a Python file: a failed write is an OSError (errno, strerror) torch passes on; a signal waits for the
        # rename, so that Ctrl-C or SIGTERM is an interrupt after a whole checkpoint, not a failed write
        with signals_deferred():
            with open(tmp, 'wb') as f:
                torch.save(payload, f)
            os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        _remove(tmp)
        reason = write_failure(e)
        if reason is None:  # a RuntimeError that is not the writer's: a bug, with its traceback
            raise
        kept = 'the previous checkpoint is kept' if path.exists() else 'no checkpoint was written'
        raise CheckpointError(f'cannot write the checkpoint {path} ({kept}): {reason}') from e
    except BaseException:
        _remove(tmp)
        raise


def write_failure(e: BaseException) -> Optional[str]:
    """Why writing a file failed, in the operating system's words, or None when `e` is not a write failure: the
    first OSError in `e`'s chain of causes and contexts (torch's writer raises its RuntimeError while handling
    the file's OSError), else the first line of a RuntimeError of torch's zip writer (PytorchStreamWriter,
    inline_container.cc: a write failure torch saw without an OSError, e.g. a short write)."""
    seen: set[int] = set()
    link: Optional[BaseException] = e
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, OSError):
            return link.strerror or str(link) or type(link).__name__
        link = link.__cause__ or link.__context__
    text = str(e)
    if isinstance(e, RuntimeError) and ('inline_container' in text or 'PytorchStreamWriter' in text):
        return text.splitlines()[0] if text else type(e).__name__
    return None


def _remove(tmp: Path) -> None:
    """Remove the temporary file of a failed write (there is none when the folder could not take it)."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint written by `save_checkpoint` with `weights_only=True` (tensors and plain values only).

    Raises:
        CheckpointError: the file is missing, unreadable, truncated, or not a lazylab checkpoint.
    """
    if not path.is_file():
        raise CheckpointError(f'no checkpoint at {path}')
    try:
        with warnings.catch_warnings():
            # a plain pickle (not torch's zip format) draws torch's two-line warning about its pickle protocol
            # before the load fails; the one line below says what is wrong
            warnings.filterwarnings('ignore', message=r'Detected pickle protocol', category=UserWarning)
            payload = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:  # torch raises several types for damaged files (RuntimeError, UnpicklingError, EOFError…)
        raise CheckpointError(f'cannot read checkpoint {path}: it is damaged or not a lazylab checkpoint '
                              f'({type(e).__name__})') from None
    if not isinstance(payload, dict) or payload.get('format') != FORMAT:
        raise CheckpointError(f'{path} is not a lazylab checkpoint')
    return payload


class Checkpointer:
    """Saves and restores one run's checkpoint (the module docstring's contents) for the objects it is given.

    Args:
        path: the checkpoint file (RUN_DIR/checkpoint.pt).
        model, optimizer, scheduler: what is saved and restored (the model itself, not its DDP wrapper).
        extras: plain values added to every checkpoint (the task's, e.g. {'vocabulary': …}).

    Attributes:
        saved_step: the step of the checkpoint on disk, None while there is none.
    """

    def __init__(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                 extras: Optional[dict[str, Any]] = None):
        self.path = Path(path)
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.extras = dict(extras or {})
        self.saved_step: Optional[int] = None

    def kept(self) -> str:
        """What a failing run leaves behind, for its error message."""
        return 'no checkpoint was written' if self.saved_step is None else \
            f'the checkpoint of step {self.saved_step} is kept'

    def save(self, pos: Position, sums: dict[str, Any]) -> None:
        """Write the checkpoint of `pos` (rank 0 writes; every process must call it: the random states of all
        processes are gathered, and their parameters checked to be equal).

        Raises:
            ReplicaMismatchError: the processes' parameters differ (a bug; nothing is written).
        """
        rng = _rng_states()
        world_size = distributed.get_world_size()
        rng_per_rank = distributed.all_gather_object(rng) if world_size > 1 else None
        distributed.check_replicas_in_sync(self.model)
        if distributed.is_main_process():
            save_checkpoint(self.path, {
                'format': FORMAT, 'model': self.model.state_dict(), 'optimizer': self.optimizer.state_dict(),
                'scheduler': self.scheduler.state_dict(), 'rng': rng, 'rng_per_rank': rng_per_rank,
                'world_size': world_size, 'position': asdict(pos), 'sums': dict(sums), **self.extras})
        self.saved_step = pos.step

    def check(self, ck: dict[str, Any]) -> None:
        """That checkpoint `ck` (as `load_checkpoint` returns it) can be restored here, so a resume can refuse it
        before anything is written: the same number of processes, and a model with the same parameter names and
        shapes (configs.yaml edited, or another model, would not load).

        Raises:
            CheckpointError: naming the process counts, or the first parameter that differs.
        """
        saved_world_size, world_size = ck.get('world_size', 1), distributed.get_world_size()
        if saved_world_size != world_size:  # data shards and per-rank RNG states would mean something else
            raise CheckpointError(f'{self.path} was saved by {saved_world_size} process(es); '
                                  f'resume it with {saved_world_size}, not {world_size}')
        saved, ours = ck.get('model'), self.model.state_dict()
        if not isinstance(saved, dict):
            raise CheckpointError(f'{self.path} has no model state')
        for name in sorted(set(saved) | set(ours)):
            if name not in ours or name not in saved:
                where = 'the checkpoint' if name in saved else 'the model of configs.yaml'
                raise CheckpointError(f'{self.path} does not match the model of configs.yaml: only {where} has '
                                      f'{name!r}')
            if tuple(saved[name].shape) != tuple(ours[name].shape):
                raise CheckpointError(f'{self.path} does not match the model of configs.yaml: {name!r} is '
                                      f'{tuple(saved[name].shape)} there, {tuple(ours[name].shape)} here')

    def restore(self, payload: Optional[dict[str, Any]] = None) -> tuple[Position, dict[str, Any]]:
        """Load the checkpoint (or take `payload`, one already read by `load_checkpoint`) into the model,
        optimizer, scheduler and random generators; returns (position, running-metrics sums).

        Raises:
            CheckpointError: the file is missing or damaged, or it was saved by another number of processes.
        """
        ck = load_checkpoint(self.path) if payload is None else payload
        self.check(ck)
        self.model.load_state_dict(ck['model'])
        self.optimizer.load_state_dict(ck['optimizer'])
        self.scheduler.load_state_dict(ck['scheduler'])
        per_rank = ck.get('rng_per_rank') or [ck['rng']]
        world_size = distributed.get_world_size()
        _set_rng_states(per_rank[distributed.get_rank()] if len(per_rank) == world_size else ck['rng'])
        pos = Position(**ck['position'])
        self.saved_step = pos.step
        return pos, ck['sums']


def _rng_states() -> dict[str, Any]:
    states = {'torch': torch.get_rng_state(), 'python': random.getstate()}
    if torch.cuda.is_available():
        states['cuda'] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states['torch'])
    random.setstate(_as_tuple(states['python']))
    if 'cuda' in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states['cuda'])


def _as_tuple(x):
    """random.setstate needs tuples back where torch.save may hand us lists."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
