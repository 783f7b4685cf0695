"""What the update rules' kernels share: their precision, their shape checks and the chunked kernels' set-up.

Every kernel (`delta_rule.py`, `sum_rule.py`, `gated_delta_rule.py`, `delta_product.py`) takes sequence-first
tensors, q, k: [seq_len, batch, heads, d_dot], v: [seq_len, batch, heads, d_v], and a state W [batch, heads, d_v,
d_dot]. A chunked kernel works chunk-major instead: `Chunking` cuts the sequence into n chunks of c tokens and
lays each input out as [n · batch · heads, c, d] (so that every product is a plain 3-d bmm and chunk j is the
block of rows [j · bh, (j + 1) · bh), bh = batch · heads), and carries the transposed state S = Wᵀ [bh, d_dot,
d_v]; `unchunk` and `final_state` go back.

Precision: the state and every product that accumulates into it are float32 whatever the inputs' dtype (float64
for float64 inputs: `exact_dtype`), also under autocast (`no_autocast`); the kernels cast y back to v's dtype.
"""
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ['no_autocast', 'exact_dtype', 'check_qkv_state', 'check_chunk_size', 'Chunking', 'to_chunks',
           'from_chunks', 'empty_sequence']


def no_autocast(device_type: str):
    """A context with autocast off on `device_type`: `torch.autocast(…, enabled=False)` where autocast is on,
    else a no-op (cheaper, for a one-token step)."""
    return torch.autocast(device_type, enabled=False) if torch.is_autocast_enabled(device_type) else nullcontext()


def exact_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the fast weights and their accumulations are kept in: float32 for float32 and lower (bfloat16,
    float16: what autocast gives), float64 for float64 (as flash-linear-attention keeps its states)."""
    return torch.promote_types(dtype, torch.float32)


def check_qkv_state(rule: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor],
                    token: bool, extra_rows: int = 0):
    """The shapes every update rule takes: q, k [batch, heads, d] for one token or [seq_len, batch, heads, d] for
    a sequence, v with the same leading dims, state [batch, heads, d_v + extra_rows, d_dot] (one extra row for
    the attention normaliser z that a kernel carries in its state).

    Raises:
        ValueError: naming `rule` ('delta rule', 'sum rule', …) and the shapes.
    """
    lead = 3 if token else 4
    if q.dim() != lead or k.shape != q.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"{rule}: q and k must have equal shapes and v the same leading dims, "
                         f"{'[batch, heads, d]' if token else '[seq_len, batch, heads, d]'}; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    check_state(rule, state, (q.shape[-3], q.shape[-2], v.shape[-1] + extra_rows, q.shape[-1]), extra_rows)


def check_state(rule: str, state: Optional[torch.Tensor], expected: tuple[int, ...], extra_rows: int = 0):
    """Raises ValueError (naming `rule` and both shapes) unless state is None or of shape `expected`."""
    if state is not None and tuple(state.shape) != expected:
        raise ValueError(f"{rule}: state must be [batch, heads, d_v{' + 1' if extra_rows else ''}, d_dot] = "
                         f"{expected}; got {tuple(state.shape)}")


def check_chunk_size(kernel: str, chunk_size: int):
    """Raises ValueError naming `kernel` unless chunk_size ≥ 1."""
    if chunk_size < 1:
        raise ValueError(f"{kernel}: chunk_size must be >= 1, got {chunk_size}")


def empty_sequence(v: torch.Tensor, state: Optional[torch.Tensor], rows: int, d_dot: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """What a kernel returns for seq_len 0: no output [0, batch, heads, d_v] and the state as it was (zeros for
    None), in the exact dtype."""
    exact = exact_dtype(v.dtype)
    batch, heads = v.shape[1], v.shape[2]
    weights = state.to(exact) if state is not None else v.new_zeros(batch, heads, rows, d_dot, dtype=exact)
    return v.new_zeros(v.shape), weights


def to_chunks(x: torch.Tensor, n: int, c: int, dtype: torch.dtype) -> torch.Tensor:
    """[seq_len, batch, heads, d] → [n · batch · heads, c, d] in `dtype`: chunk-major and contiguous, so that every
    product of a chunked kernel is a plain 3-d bmm and chunk j's rows are the block [j · bh, (j + 1) · bh). A
    sequence shorter than n · c is padded with zeros (for every rule, a zero key, value and β, and a zero log decay,
    leave the state as it is). One copy: splitting the sequence axis is a view even for q, k, v split off one
    projection."""
    pad = n * c - x.shape[0]
    if pad:
        x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 1) + (0, pad))
    return x.unflatten(0, (n, c)).permute(0, 2, 3, 1, 4).reshape(n * x.shape[1] * x.shape[2], c, x.shape[-1]).to(dtype)


def from_chunks(x: torch.Tensor, seq_len: int, batch: int, heads: int) -> torch.Tensor:
    """The inverse of `to_chunks`: [n · batch · heads, c, d] → [seq_len, batch, heads, d] (padding dropped)."""
    c, d = x.shape[-2:]
    n = x.shape[0] // (batch * heads)
    x = x.view(n, batch, heads, c, d).permute(0, 3, 1, 2, 4).reshape(n * c, batch, heads, d)
    return x[:seq_len] if n * c > seq_len else x  # (a slice costs a zero-filled copy in the backward pass)


@dataclass(frozen=True)
class Chunking:
    """How a chunked kernel cuts a sequence of seq_len tokens: n chunks of c = min(chunk_size, seq_len) tokens
    (the last one padded), over bh = batch · heads independent heads, computed in `dtype` (the exact dtype) on
    `device`."""
    seq_len: int
    batch: int
    heads: int
    c: int
    n: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, q: torch.Tensor, chunk_size: int, dtype: torch.dtype) -> 'Chunking':
        """The chunking of q [seq_len ≥ 1, batch, heads, d] into chunks of at most `chunk_size` tokens."""
        seq_len, batch, heads = q.shape[:3]
        c = min(chunk_size, seq_len)
        return cls(seq_len, batch, heads, c, -(-seq_len // c), dtype, q.device)

    @property
    def bh(self) -> int:
        return self.batch * self.heads

    def chunks(self, x: torch.Tensor) -> torch.Tensor:
        """[seq_len, batch, heads, d] → [n · bh, c, d] (`to_chunks`)."""
        return to_chunks(x, self.n, self.c, self.dtype)

    def unchunk(self, x: torch.Tensor) -> torch.Tensor:
        """[n · bh, c, d] → [seq_len, batch, heads, d] (`from_chunks`)."""
        return from_chunks(x, self.seq_len, self.batch, self.heads)

    def initial_state(self, state: Optional[torch.Tensor], d_v: int, d_dot: int) -> torch.Tensor:
        """W [batch, heads, d_v, d_dot] (None: zeros) → S = Wᵀ [bh, d_dot, d_v] in the exact dtype."""
        if state is None:
            return torch.zeros(self.bh, d_dot, d_v, dtype=self.dtype, device=self.device)
        return state.transpose(-1, -2).to(self.dtype).reshape(self.bh, d_dot, d_v)

    def final_state(self, s: torch.Tensor) -> torch.Tensor:
        """S [bh, d_dot, d_v] → W [batch, heads, d_v, d_dot] (a view; the exact dtype: the carried state)."""
        return s.view(self.batch, self.heads, *s.shape[1:]).transpose(-1, -2)
