"""Model FLOPs utilization (MFU): how close a run's training comes to what its machine can compute.

    MFU = flops_per_token · tokens_per_s / peak_flops          (PaLM, Chowdhery et al. 2022, appendix B)

    flops = StepFlops(enabled=is_main_process())
    with flops.counting(tokens=x.numel()):      # the first full-length training step: forward and backward
        ...                                      # as the trainer runs them; then flops.per_token (None: not counted)
    peak = peak_flops(device, 'float32', tflops=c.peak_tflops)   # FLOP/s of one device: given, cached or measured

**The FLOPs of a step** are counted once a `train` call (at its first full-length step, a resume's included: the
machine may be another one), by torch's `FlopCounterMode` around the step itself, so any model is counted, a user's
own too, and nothing runs twice. It counts the ops torch has a formula for: the matrix products (mm, addmm, bmm,
baddbmm, convolutions) and the fused attention kernels, each product 2·m·n·k, their backward as torch computes it
(input and weight gradients: 2× the forward; a fused attention's backward recomputes the scores: 2.5×); any other
op counts 0 (elementwise ops, norms, softmax are small beside the products), and a causal mask saves nothing in the
count (as in FlopCounterMode). The CPU's fused attention kernel, which torch has no formula for, gets its CUDA
twin's. Counting changes nothing in the step, bit for bit: FlopCounterMode's module tracking is switched off (its
hooks change the order in which a shared weight's gradients are summed), and an op whose formula fails counts 0
and marks the count failed, instead of failing the step. A count that fails, or finds no FLOPs, is no count: MFU is
then absent from the run, never an error. Nor is a `compile=true` run counted: under a dispatch mode torch.compile
runs the step eagerly, which would be another step than the run's.

**The peak** is the `peak_tflops` setting (the data-sheet figure of a GPU, TFLOP/s per device) or else measured
once per machine: the best rate of a square matrix product (512 on a CPU, 4096 on a GPU) in the run's dtype, on its
device and with torch's thread count, timed for about `MEASURE_SECONDS` (on a CPU with several threads, at least
one thread's rate, timed half as long: `measure_peak_flops`). It is cached in a JSON file,

    $LAZYLAB_PEAK_FLOPS_CACHE, else $XDG_CACHE_HOME/lazylab/peak_flops.json (~/.cache/lazylab/peak_flops.json)

under a key naming the device (a GPU's name, the CPU's model), the dtype, the threads (CPU), the float32 matmul
precision (GPU) and torch's version; written atomically; a damaged file is ignored and written anew. Measured on a
busy machine the peak is low (and MFU high) until the file is deleted. A measurement that fails gives no peak.
"""
import contextlib
import math
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch.utils import flop_counter

from lazylab.runs import read_json, timestamp, write_json

#: the environment variable naming the peak cache file (a test points it at a folder of its own)
CACHE_ENV = 'LAZYLAB_PEAK_FLOPS_CACHE'
#: the cache file's format
CACHE_FORMAT = 1
#: seconds the peak measurement times matrix products for (about; once per machine, dtype and thread count)
MEASURE_SECONDS = 0.2
#: the side of the square matrices the peak is measured with, per device type
MATRIX = {'cpu': 512, 'cuda': 4096, 'mps': 4096}


# --- the FLOPs of a training step ------------------------------------------------------------------------------

class StepFlops:
    """The FLOPs per token of a training step, counted around the first step `counting` is asked for.

    Args:
        enabled: count (False: `counting` does nothing; under torchrun only rank 0 counts).

    Attributes:
        per_token: FLOPs per token of the counted step (forward and backward); None before the count and when it
            failed or found nothing.
    """

    def __init__(self, enabled: bool = True):
        self.due, self.per_token = enabled, None

    @contextlib.contextmanager
    def counting(self, tokens: int) -> Iterator[None]:
        """Count the FLOPs of the block (this time only; later calls do nothing) and set `per_token` from them and
        `tokens`, the tokens of the step. An exception of the block passes through, uncounted."""
        if not self.due:
            yield
            return
        self.due = False
        counter = FlopCount()
        with counter:
            yield
        if counter.flops and tokens > 0:
            self.per_token = counter.flops / tokens


class FlopCount:
    """FlopCounterMode without its module tracking, whose failures are a missing count, never an error.

    `with count:` counts the FLOPs of the block's ops; then `count.flops` is their sum, or None when counting could
    not start, an op's formula failed or torch's counter failed. (Re-entering is not supported.)
    """

    def __init__(self):
        self.flops: Optional[int] = None
        self.failed = False
        self.mode: Any = None

    def __enter__(self) -> 'FlopCount':
        try:
            mode = flop_counter.FlopCounterMode(display=False, custom_mapping=self._formulas())
            if hasattr(mode, 'mod_tracker'):  # its module hooks reorder gradient sums: results would differ
                mode.mod_tracker = _NoModuleTracking()
            mode.__enter__()
            self.mode = mode
        except Exception:  # an older or newer torch that cannot count here: no count, the step goes on
            self.mode, self.failed = None, True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.mode is None:
            return
        try:
            self.mode.__exit__(*exc)
            total = int(self.mode.get_total_flops())
        except Exception:
            self.failed, total = True, 0
        self.mode = None
        self.flops = None if self.failed or total <= 0 else total

    def _formulas(self) -> dict[Any, Callable[..., int]]:
        """torch's flop formulas, each made safe (a formula that raises counts 0 and marks the count failed), and
        the CPU's fused attention forward and backward, with the formulas of CUDA's flash attention."""
        formulas = {op: self._safe(formula) for op, formula in flop_counter.flop_registry.items()}
        aten = torch.ops.aten
        cpu_attention = [(getattr(aten, '_scaled_dot_product_flash_attention_for_cpu', None), _attention_forward),
                         (getattr(aten, '_scaled_dot_product_flash_attention_for_cpu_backward', None),
                          _attention_backward)]
        shapes = getattr(flop_counter, 'shape_wrapper', None)  # (torch ≥ 2.2: formulas of tensor shapes)
        for op, formula in cpu_attention:
            if op is not None and shapes is not None and op not in formulas:
                formulas[op] = self._safe(shapes(formula))
        return formulas

    def _safe(self, formula: Callable[..., int]) -> Callable[..., int]:
        def counted(*args: Any, **kwargs: Any) -> int:
            try:
                return int(formula(*args, **kwargs))
            except Exception:
                self.failed = True
                return 0
        counted._get_raw = True  # type: ignore[attr-defined]  # (FlopCounterMode passes the arguments as given)
        return counted


class _NoModuleTracking:
    """Stands in for FlopCounterMode's ModuleTracker: every op counts for 'Global' (the total) only."""
    parents = frozenset({'Global'})

    def __enter__(self) -> '_NoModuleTracking':
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _attention_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Fused attention [batch, heads, seq, d_k]: Q Kᵀ and the weights times V (torch's `sdpa_flop_count`)."""
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Its backward: the scores again, then the gradients of both products (torch's `sdpa_backward_flop_count`)."""
    return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# --- the machine's peak ----------------------------------------------------------------------------------------

def peak_flops(device: torch.device, dtype: str, *, tflops: float = 0.0) -> Optional[float]:
    """The peak FLOP/s of one `device` in `dtype` ('float32' or 'bfloat16'): `tflops` · 10¹² when given (> 0),
    else the cached measurement for this machine (see the module docstring), else a measurement, cached. None when
    it cannot be measured (the reason is not an error of the run)."""
    if tflops > 0:
        return tflops * 1e12
    key, path = machine_key(device, dtype), cache_file()
    cached = _cached_peaks(path)
    value = cached.get(key, {}).get('flops') if isinstance(cached.get(key), dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    try:
        measured = measure_peak_flops(device, dtype)
    except Exception:  # out of memory on a full GPU, an unsupported dtype: no peak, the run goes on
        return None
    cached[key] = {'flops': measured, 'measured': timestamp()}
    with contextlib.suppress(OSError):  # a read-only cache folder: measured again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {'format': CACHE_FORMAT, 'peaks': cached})
    return measured


def measure_peak_flops(device: torch.device, dtype: str, seconds: float = MEASURE_SECONDS,
                       clock: Callable[[], float] = time.perf_counter) -> float:
    """The best rate, in FLOP/s, of an n×n by n×n matrix product (2n³ FLOPs; n from MATRIX) in `dtype` on `device`
    with torch's current thread count, over about `seconds` of repeats (each timing at least 1 ms of work, by
    `clock`, in seconds). The matrices are constants: no random generator is drawn from. On a CPU with several
    threads it is at least the rate of one thread, measured too (half as long): on a busy machine a product that
    waits for all its threads can come out at a fraction of one thread's rate (2 threads, load average 7: 20.6
    GFLOP/s against 169.1 for one thread).

    Raises:
        RuntimeError: torch cannot make or multiply the matrices there (e.g. out of memory).
    """
    threads = torch.get_num_threads()
    best = _best_rate(device, dtype, seconds, clock)
    if device.type == 'cpu' and threads > 1:
        try:
            torch.set_num_threads(1)
            best = max(best, _best_rate(device, dtype, seconds / 2, clock))
        finally:
            torch.set_num_threads(threads)
    return best


def _best_rate(device: torch.device, dtype: str, seconds: float, clock: Callable[[], float]) -> float:
    torch_dtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[dtype]
    n = MATRIX.get(device.type, 1024)
    a = torch.full((n, n), 0.5, dtype=torch_dtype, device=device)
    b = torch.full((n, n), 0.25, dtype=torch_dtype, device=device)
    out = torch.empty((n, n), dtype=torch_dtype, device=device)
    sync = _synchronizer(device)
    torch.mm(a, b, out=out)  # the first product sets up the library's buffers: not timed
    sync()
    best, repeats, started = 0.0, 1, clock()
    while True:
        t0 = clock()
        for _ in range(repeats):
            torch.mm(a, b, out=out)
        sync()
        took = clock() - t0
        best = max(best, repeats * 2 * n ** 3 / max(took, 1e-9))
        if took < 1e-3:
            repeats *= 2
        if clock() - started >= seconds:
            return best


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == 'cuda':
        return lambda: torch.cuda.synchronize(device)
    if device.type == 'mps':
        return torch.mps.synchronize
    return lambda: None


def machine_key(device: torch.device, dtype: str) -> str:
    """What a peak is cached under: 'cpu | Intel(R) Xeon(R) … | float32 | 2 threads | torch 2.13.0'; a GPU's name,
    and its float32 matmul precision (TF32 or not), instead of the CPU's model and threads."""
    if device.type == 'cuda':
        parts = ['cuda', torch.cuda.get_device_name(device), dtype]
    else:
        parts = [device.type, cpu_model(), dtype]
    if device.type == 'cpu':
        parts.append(f'{torch.get_num_threads()} threads')
    elif dtype == 'float32':
        parts.append(f'float32 matmul precision {torch.get_float32_matmul_precision()}')
    return ' | '.join([*parts, f'torch {torch.__version__}'])


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's on Linux; else what the platform module says)."""
    with contextlib.suppress(OSError):
        with open('/proc/cpuinfo', encoding='utf-8', errors='replace') as f:
            for line in f:
                if line.lower().startswith('model name'):
                    return line.split(':', 1)[1].strip()
    return platform.processor() or platform.machine() or 'unknown CPU'


def cache_file() -> Path:
    """The peak cache: $LAZYLAB_PEAK_FLOPS_CACHE, else $XDG_CACHE_HOME/lazylab/peak_flops.json, else
    ~/.cache/lazylab/peak_flops.json."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return Path(base) / 'lazylab' / 'peak_flops.json'


def _cached_peaks(path: Path) -> dict[str, Any]:
    """The cache's peaks ({} when the file is missing, damaged or of another format)."""
    doc = read_json(path) or {}
    peaks = doc.get('peaks') if doc.get('format') == CACHE_FORMAT else None
    return dict(peaks) if isinstance(peaks, dict) else {}
