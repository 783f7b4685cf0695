"""The memory a run needs at least, checked before anything is built, so that an absurd size (`nu=1000000`,
`d_model=10000000`) is one error line instead of a process the kernel kills for want of memory.

    needs = module.memory_needs(c)          # each experiment: [Need(what, bytes, keys), …] from its plain items
    check_memory(needs, device)             # UsageError when their sum exceeds the memory available

Every `Need` is a lower bound of what the run allocates (float32, 4 bytes a number): the parameters with their
gradients, what the forward pass must keep for the backward pass, the feature maps and states of fast weights,
the evaluation batches. Optimizer state, workspace and the allocator's slack come on top, so a run refused here
could not have run; one that passes may still be too big, and then fails on its first batch (`check_trains`).
The memory available is that of the device: for CUDA what `torch.cuda.mem_get_info` says is free, otherwise
/proc/meminfo's MemAvailable (within a cgroup's limit, where there is one), or the physical memory.
"""
import os
from pathlib import Path
from typing import Any, NamedTuple, Optional

from lazylab.configs import inspect
from lazylab.errors import UsageError

# late imports: torch only when the memory of a CUDA device is asked: `lazylab options` lists keys without it

FLOAT = 4   # bytes of a float32
LONG = 8    # bytes of an int64 (token and key ids)


class Need(NamedTuple):
    """Memory a run allocates at least, and what decides it.

    what: the tensors, in words ('parameters and their gradients').
    bytes: how many bytes they take at least.
    keys: (key, value) pairs of the items that size them, in the order a user would change them.
    """
    what: str
    bytes: int
    keys: tuple[tuple[str, Any], ...]


def check_memory(needs: list[Need], device, available: Optional[int] = None) -> None:
    """Refuse a run whose needs add up to more than the memory available on `device` (`available_bytes`, unless
    given).

    Raises:
        UsageError: `the run needs at least 1.2 TB of memory, more than the 23.0 GB available (cpu): fast-weight
            features φ(k), φ(q) alone take 1.1 TB (nu=1000000, hidden_size=64, …); make one of them smaller`.
    """
    total = sum(n.bytes for n in needs)
    available = available_bytes(device) if available is None else available
    if available is None or total <= available:
        return
    biggest = max(needs, key=lambda n: n.bytes)
    keys = ', '.join(f'{k}={v}' for k, v in biggest.keys)
    raise UsageError(f'the run needs at least {size_text(total)} of memory, more than the {size_text(available)} '
                     f'available ({device}): {biggest.what} alone take {size_text(biggest.bytes)} ({keys}); '
                     f'make one of them smaller')


def size_text(n: int) -> str:
    """Bytes in decimal units: '512 B', '3.4 kB', '12.0 GB', '1.2 TB', '4.0e+03 PB'."""
    for unit in ('B', 'kB', 'MB', 'GB', 'TB'):
        if n < 1000:
            return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.1f} {unit}'
        n /= 1000
    return f'{n:.1f} PB' if n < 1000 else f'{n:.1e} PB'


def available_bytes(device) -> Optional[int]:
    """Bytes a new run can have on `device` (a torch.device): free CUDA memory, or the host's available memory
    (see the module docstring); None when the system does not say."""
    if getattr(device, 'type', 'cpu') == 'cuda':
        import torch
        return int(torch.cuda.mem_get_info(device)[0])
    sizes = [s for s in (_meminfo_available(), _cgroup_available()) if s is not None]
    if sizes:
        return min(sizes)
    try:
        return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
    except (ValueError, OSError, AttributeError):
        return None


def _meminfo_available() -> Optional[int]:
    try:
        for line in Path('/proc/meminfo').read_text().splitlines():
            if line.startswith('MemAvailable:'):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> Optional[int]:
    """The limit of this process's cgroup less what it uses (cgroup v2, then v1); None without a limit."""
    for limit_file, usage_file in (('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory.current'),
                                   ('/sys/fs/cgroup/memory/memory.limit_in_bytes',
                                    '/sys/fs/cgroup/memory/memory.usage_in_bytes')):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**62:  # v1 writes a huge number for "no limit", v2 writes 'max'
            return max(0, int(limit) - usage)
    return None


def named(c, key: str, path: str, value: int) -> tuple[str, int]:
    """(the key to name in a message, `value`): the experiment's own `key` when its sub-config's item at `path`
    follows it (has its value), else `path`."""
    return (key, value) if getattr(c, key) == value else (path, value)


def selected_option(conf, key: str) -> Optional[str]:
    """The option name item `key` of `conf` will be computed with (given, default or first option), without
    computing it; None when its value is not an option name (`lazylab.configs.inspect.selected_option`)."""
    return inspect.selected_option(conf, key)


def feature_size(phi: Optional[str], d_key: int, nu: int, favor_features: int) -> Optional[int]:
    """d_dot, the size of the feature map φ' called `phi` for keys of size d_key (see
    lazylab.models.fast_weights.feature_maps): DPFP 2 · d_key · ν, ELU + 1 d_key, FAVOR+ 2m; None for another."""
    return {'dpfp': 2 * d_key * nu, 'linear': d_key, 'favor': 2 * favor_features}.get(phi)


def language_model_needs(c, sizes: dict[str, tuple[str, int]],
                         features: Optional[tuple[int, tuple[tuple[str, Any], ...]]] = None) -> list[Need]:
    """The needs of a character-level language model of n_layers blocks (attention, FFN) on `c`'s batches.

    Args:
        c: the experiment's config (batch_size, seq_len, n_tokens are read).
        sizes: 'd_model', 'd_ff', 'n_layers', 'heads' → (the key a user sets, its value).
        features: for fast weights, (d_dot, the keys that size heads · d_dot: (('nu', ν), ('d_model', d)) for
            DPFP, (('favor_features', m), ('heads', h)) for FAVOR+).

    Lower bounds: per block two d_model² projections and the FFN's two d_model × d_ff matrices, plus the token
    embedding, each parameter with its gradient (2 · 4 bytes); the activations the backward pass keeps, each
    block's input and FFN hidden layer [batch_size, seq_len, d_model + d_ff] and the logits [batch_size, seq_len,
    n_tokens]; with fast weights, φ(k) and φ(q) of every block [batch_size, seq_len, heads · d_dot] and one state
    [batch_size, heads, d_model / heads, d_dot].
    """
    (d_key, d), (f_key, f), (l_key, n_layers), (_, heads) = (sizes[k] for k in ('d_model', 'd_ff', 'n_layers',
                                                                                'heads'))
    batch, seq_len, n_tokens = c.batch_size, c.seq_len, c.n_tokens
    parameters = n_tokens * d + n_layers * (2 * d * d + 2 * d * f)
    activations = batch * seq_len * (n_layers * (d + f) + n_tokens)
    needs = [Need('parameters and their gradients', 2 * FLOAT * parameters,
                  ((d_key, d), (f_key, f), (l_key, n_layers))),
             Need('activations kept for the backward pass', FLOAT * activations,
                  (('batch_size', batch), ('seq_len', seq_len), (d_key, d), (f_key, f), (l_key, n_layers)))]
    if features is not None:
        d_dot, phi_keys = features
        needs += [Need('fast-weight features φ(k), φ(q)', FLOAT * 2 * n_layers * batch * seq_len * heads * d_dot,
                       (*phi_keys, ('batch_size', batch), ('seq_len', seq_len), (l_key, n_layers))),
                  Need('a fast-weight state', FLOAT * batch * d * d_dot, (*phi_keys, ('batch_size', batch)))]
    return needs
