"""Data-parallel training on several processes, GPUs and machines, launched by PyTorch's own `torchrun`.

    torchrun --standalone --nproc_per_node=N -m lazylab.experiments.feedback key=value …     (one machine)
    torchrun --nnodes=M --node_rank=I --nproc_per_node=N --rdzv-backend=c10d \\
             --rdzv-endpoint=HOST:PORT -m lazylab.experiments.feedback key=value …           (each machine)

There is no process management here: torchrun starts the processes and sets RANK, WORLD_SIZE and LOCAL_RANK;
this module reads them, joins the process group (NCCL on CUDA, gloo on the CPU) and supplies the few pieces the
trainer needs. Without those variables (or with WORLD_SIZE=1) every function is a no-op and the trainer runs
exactly as a plain single process.

Data parallelism (`torch.nn.parallel.DistributedDataParallel`, Li et al. 2020, "PyTorch Distributed: Experiences
on Accelerating Data Parallel Training"): every process holds the same model and takes its own `batch_size`
sequences; after `backward()` the gradients are averaged over the N processes,

    g = (1/N) Σ_r ∇ L_r,   L_r = mean cross-entropy over the B·T tokens of process r,

which is the gradient of the mean loss over the combined N·B sequences, so N processes with `batch_size=B` take
the same steps (up to float rounding) as one process with `batch_size=N·B` that sees the union of their batches.
`lazylab.data.ShuffledLoader(rank=r, world_size=N)` gives that union: batch b of rank r holds slots
r, r+N, r+2N, … of positions [b·N·B, (b+1)·N·B) of the epoch's permutation (seeded by (seed, epoch)), which is
exactly batch b of a single process with batch N·B.

Failures: if a process raises, `process_group` prints one line naming the rank and the process exits non-zero;
torchrun's agent then stops the others (SIGTERM) and prints its summary. Every collective has a timeout
(`LAZYLAB_DIST_TIMEOUT` seconds, default 600), so a process whose peer vanished without the agent noticing (a
lost machine) fails with an error instead of hanging forever.
"""
import contextlib
import datetime
import gc
import hashlib
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from lazylab.errors import DistributedError

# late imports: DistributedDataParallel only under torchrun: it pulls in torch.distributed's heavier modules

__all__ = ['DistEnv', 'DistributedError', 'ReplicaMismatchError', 'environment', 'setup', 'teardown',
           'process_group', 'is_distributed', 'get_rank', 'get_world_size', 'is_main_process', 'wrap',
           'all_reduce_sum', 'broadcast_object', 'all_gather_object', 'batch_share',
           'parameter_digest', 'check_replicas_in_sync', 'DEFAULT_TIMEOUT_S']

#: seconds a collective waits for the other processes before failing (env LAZYLAB_DIST_TIMEOUT overrides)
DEFAULT_TIMEOUT_S = 600.0
#: the longest LAZYLAB_DIST_TIMEOUT taken (a year: longer is no timeout at all, and 1e18 overflows a timedelta)
MAX_TIMEOUT_S = 365 * 24 * 3600.0

T = TypeVar('T')


class ReplicaMismatchError(RuntimeError):
    """The processes' model parameters differ (they must stay identical under data parallelism): a bug."""


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in a torchrun job (rank 0 of 1 when not launched by torchrun).

    Attributes:
        rank: global rank in [0, world_size).
        world_size: number of processes in the job.
        local_rank: rank on this machine; picks the GPU (cuda:local_rank).
    """
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run directory, metrics, samples, checkpoints and labml records."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """More than one process: gradients, metrics and validation are combined across processes."""
        return self.world_size > 1


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == '':
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f'environment variable {name}={value!r} is not an integer') from None


def environment() -> DistEnv:
    """Read torchrun's RANK, WORLD_SIZE and LOCAL_RANK (all absent → a single process).

    Raises:
        DistributedError: a variable is not an integer, only some of RANK/WORLD_SIZE are set, or
            RANK/LOCAL_RANK are out of range.
    """
    rank, world, local = _env_int('RANK'), _env_int('WORLD_SIZE'), _env_int('LOCAL_RANK')
    if rank is None and world is None:
        return DistEnv()
    if rank is None or world is None:
        raise DistributedError('RANK and WORLD_SIZE must be set together (launch with torchrun)')
    local = rank if local is None else local
    if world < 1 or not 0 <= rank < world or not 0 <= local <= rank:
        raise DistributedError(f'bad torchrun environment: RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local}')
    return DistEnv(rank, world, local)


def timeout() -> datetime.timedelta:
    """How long a collective waits for the other processes: LAZYLAB_DIST_TIMEOUT seconds (default 600), a finite
    number in (0, MAX_TIMEOUT_S]. `setup` reads it in every process, under torchrun or not, so a bad value is
    refused before a run starts wherever it is set.

    Raises:
        DistributedError: `LAZYLAB_DIST_TIMEOUT='abc' is not a number of seconds`, or not finite, ≤ 0 or too large
            (the message names the variable and the value).
    """
    value = os.environ.get('LAZYLAB_DIST_TIMEOUT', '')
    try:
        seconds = float(value) if value.strip() else DEFAULT_TIMEOUT_S
    except ValueError:
        raise DistributedError(f'LAZYLAB_DIST_TIMEOUT={value!r} is not a number of seconds') from None
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_TIMEOUT_S:
        raise DistributedError(f'LAZYLAB_DIST_TIMEOUT must be a finite number of seconds in (0, {MAX_TIMEOUT_S:g}], '
                               f'got {value!r}')
    return datetime.timedelta(seconds=seconds)


def setup(device: torch.device, env: Optional[DistEnv] = None) -> DistEnv:
    """Join the job's process group: NCCL when `device` is CUDA (this process takes cuda:LOCAL_RANK), else gloo.

    A single process (no torchrun variables, or WORLD_SIZE=1) creates no process group. Call once, before the
    model is built, so that `torch.device('cuda')` already means this process's GPU.

    Args:
        device: the training device the configuration resolved to (cpu, cuda, cuda:N, mps).
        env: the torchrun environment (default: read it with `environment()`).

    Raises:
        DistributedError: several processes and device mps (not supported by torch.distributed), or a CUDA
            device given with an explicit index other than LOCAL_RANK, or fewer GPUs than LOCAL_RANK needs; a bad
            LAZYLAB_DIST_TIMEOUT (see `timeout`), also in a single process.
    """
    env = environment() if env is None else env
    wait = timeout()  # also without torchrun: a bad LAZYLAB_DIST_TIMEOUT is refused wherever it is set
    if not env.enabled or dist.is_initialized():
        return env
    if device.type == 'mps':
        raise DistributedError('several processes cannot train on mps (torch.distributed has no MPS backend); '
                               'use device=cpu')
    if device.type == 'cuda':
        if device.index is not None and device.index != env.local_rank:
            raise DistributedError(f'device={device} under torchrun: each process uses cuda:LOCAL_RANK '
                                   f'(this one cuda:{env.local_rank}); use device=auto or device=cuda')
        if env.local_rank >= torch.cuda.device_count():
            raise DistributedError(f'LOCAL_RANK {env.local_rank} needs GPU {env.local_rank} but this machine has '
                                   f'{torch.cuda.device_count()}; use --nproc_per_node ≤ the number of GPUs')
        torch.cuda.set_device(env.local_rank)
        dist.init_process_group('nccl', timeout=wait, device_id=torch.device('cuda', env.local_rank))
    else:
        dist.init_process_group('gloo', timeout=wait)
    return env


def teardown() -> None:
    """Leave the process group (if any), after every process has reached this point."""
    if dist.is_initialized():
        # DistributedDataParallel wrappers that only reference cycles keep alive must go before the process
        # group: one collected at exit, after the group is destroyed, aborts the process ("terminate called
        # without an active exception": 3 of 27 jobs of the DDP models test before this, 0 of 16 after)
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[DistEnv]:
    """`setup` … `teardown` around a block; on an exception, name the rank on stderr and re-raise at once.

    The failing process does not wait for the others (no barrier, no destroy that could block on a peer): it
    exits non-zero right away, and torchrun's agent (srun's --kill-on-bad-exit under Slurm) stops the rest of the
    job. A stop signal the processes agreed on in the training loop (its checkpoint written) ends each of them
    alike, without that line.
    """
    env = setup(device)
    try:
        yield env
    except BaseException as e:
        agreed = isinstance(e, KeyboardInterrupt) and getattr(e, 'checkpoint_step', None) is not None
        if env.enabled and not agreed:  # (a stop all processes agreed on in the loop ends each of them alike)
            what = 'interrupted' if isinstance(e, KeyboardInterrupt) else f'{type(e).__name__}: {e}'.splitlines()[0]
            print(f'lazylab: process rank {env.rank} of {env.world_size} stopped ({what}); '
                  f'its launcher (torchrun, or srun under Slurm) stops the other processes', file=sys.stderr,
                  flush=True)
            if isinstance(e, Exception):
                # torchrun's summary then shows this traceback as the root cause (what its @record does)
                from torch.distributed.elastic.multiprocessing.errors import get_error_handler
                handler = get_error_handler()
                handler.initialize()
                handler.record_exception(e)
        raise
    teardown()


def is_distributed() -> bool:
    """A process group with more than one process is active."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main_process() -> bool:
    """True on rank 0 (and in a single process): the process that writes files and prints progress."""
    return get_rank() == 0


def _comm_device() -> torch.device:
    """NCCL reduces CUDA tensors only; gloo CPU tensors."""
    return torch.device('cuda', torch.cuda.current_device()) if dist.get_backend() == 'nccl' else torch.device('cpu')


def wrap(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` in DistributedDataParallel when distributed, else `model` itself.

    `static_graph=True`: our models use the same parameters at every step, but not necessarily all of them in
    one forward pass — the feedback transformer's first step has no memory, so with seq_len=1 its attention is
    never used. A static graph lets DDP learn the set of used parameters in the first iteration (so unused ones
    are handled) without `find_unused_parameters`' graph walk after every forward, which would be costly for the
    feedback model's token-by-token graph.

    Call `forward` through the returned module for training; keep using `model` itself for evaluation,
    generation and `state_dict()` (its keys have no 'module.' prefix).
    """
    if not is_distributed():
        return model
    from torch.nn.parallel import DistributedDataParallel
    device_ids = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == 'cuda' else None
    return DistributedDataParallel(model, device_ids=device_ids, static_graph=True)


def all_reduce_sum(*values: float) -> tuple[float, ...]:
    """Sum each number over all processes (float64; identity in a single process)."""
    if not is_distributed():
        return tuple(values)
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return tuple(t.tolist())


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank `src`'s `obj` (any picklable value) on every process."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, …] on every process ([obj] in a single process)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * get_world_size()
    dist.all_gather_object(out, obj)
    return out


def batch_share(batch: torch.Tensor) -> torch.Tensor:
    """This process's columns of a sequence-first batch [seq_len, batch_size]: rank, rank+N, … (all of them in a
    single process). Used for validation: the N processes evaluate disjoint parts of the same batches, and
    `all_reduce_sum` of their loss sums gives the loss of the whole batch. A process may get no column.

    Shapes:
        batch: [seq_len, b] → [seq_len, ⌈(b − rank) / N⌉]
    """
    world_size = get_world_size()
    return batch if world_size == 1 else batch[:, get_rank()::world_size]


def parameter_digest(model: nn.Module) -> str:
    """sha256 of every parameter's bytes, in `named_parameters()` order (equal digests ⇔ bitwise-equal weights)."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_replicas_in_sync(model: nn.Module) -> None:
    """Raise unless every process holds bitwise the same parameters (a no-op in a single process).

    DDP keeps replicas equal by construction (same start, same averaged gradients, same optimizer); a difference
    means a bug such as a parameter updated outside the DDP-wrapped forward, and a checkpoint written by rank 0
    would then not describe the other ranks.

    Raises:
        ReplicaMismatchError: names the ranks whose parameters differ from rank 0's.
    """
    digests = all_gather_object(parameter_digest(model))
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise ReplicaMismatchError(f'model parameters of rank(s) {", ".join(map(str, differ))} differ from rank 0 '
                                   f'after the same training steps; the processes are out of sync')
