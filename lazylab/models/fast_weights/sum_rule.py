"""The sum rule of fast-weight attention (linear attention read as a fast-weight programmer), computed three ways.

Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly Fast Weight Programmers", section 3: a linear
transformer (Katharopoulos et al. 2020) without its normaliser is a fast-weight memory written by a plain sum of
outer products. Per batch element and head, with keys and queries already mapped by the feature map φ':

    W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + vᵢ ⊗ kᵢ          (no β: every write adds, nothing is replaced)
    yᵢ = W⁽ⁱ⁾ qᵢ

so yᵢ = Σ_{j≤i} vⱼ (kⱼ · qᵢ), causal linear attention. (The attention normaliser 1 / (zᵢ · qᵢ) with
zᵢ = Σ_{j≤i} kⱼ is a separate, optional step: `lazylab.models.fast_weights.normalization`.)

* `sum_rule_step`    one token (generation); `sum_rule_step_unchecked` without the shape checks.
* `sum_rule_loop`    the equations above, token by token: the reference.
* `sum_rule_chunked` chunkwise (Katharopoulos et al.'s causal product, by chunks as in flash-linear-attention's
  `chunk` kernels): within a chunk of C tokens, O = Q S + lower(Q Kᵀ) V; the state at each chunk's start is
  S₀ + the sum of the earlier chunks' Kᵀ V (one cumulative sum, so no step is sequential).

Shapes, as the delta rule's (`delta_rule.py`), sequence-first:
    q, k: [seq_len, batch, heads, d_dot];  v: [seq_len, batch, heads, d_v];  state: [batch, heads, d_v, d_dot] or None
and each returns `(y, state)` with y: [seq_len, batch, heads, d_v] (for a step: no seq_len axis).

Precision: the state and its accumulations are float32 (float64 for float64 inputs) under autocast too; y comes
back in v's dtype, the state stays float32.
"""
from typing import Optional

import torch

from lazylab.models.fast_weights.delta_rule import check_qkv_state, exact_dtype, no_autocast

__all__ = ['sum_rule_step', 'sum_rule_step_unchecked', 'sum_rule_loop', 'sum_rule_chunked']


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor], token: bool):
    check_qkv_state('sum rule', q, k, v, state, token)


def sum_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + vᵢ ⊗ kᵢ, yᵢ = W⁽ⁱ⁾ qᵢ.

    Args:
        q, k: [batch, heads, d_dot]; v: [batch, heads, d_v]; state: W⁽ⁱ⁻¹⁾ [batch, heads, d_v, d_dot] or None (zeros).

    Returns:
        y [batch, heads, d_v] and W⁽ⁱ⁾.

    Raises:
        ValueError: shapes that do not fit together.
    """
    _check(q, k, v, state, token=True)
    return sum_rule_step_unchecked(q, k, v, state)


def sum_rule_step_unchecked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor]
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """`sum_rule_step` without the shape checks (for a generation step function)."""
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    q, k, v = q.to(exact), k.to(exact), v.to(exact)
    with no_autocast(q.device.type):
        update = v.unsqueeze(-1) * k.unsqueeze(-2)  # vᵢ ⊗ kᵢ
        new_state = update if state is None else state.to(exact) + update
        return torch.linalg.vecdot(new_state, q.unsqueeze(-2)).to(out_dtype), new_state


def sum_rule_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum rule token by token, as the equations (the reference). Shapes: the module docstring's."""
    _check(q, k, v, state, token=False)
    seq_len, batch, heads, d_dot = q.shape
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = q.to(exact), k.to(exact), v.to(exact)
        weights = state.to(exact) if state is not None else q.new_zeros(batch, heads, v.shape[-1], d_dot)
        ys = []
        for i in range(seq_len):
            weights = weights + v[i].unsqueeze(-1) @ k[i].unsqueeze(-2)  # W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + vᵢ ⊗ kᵢ
            ys.append((weights @ q[i].unsqueeze(-1)).squeeze(-1))  # yᵢ = W⁽ⁱ⁾ qᵢ
    if seq_len == 0:
        return v.new_zeros(v.shape, dtype=out_dtype), weights
    return torch.stack(ys).to(out_dtype), weights


def sum_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor] = None,
                     chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum rule by chunks of C tokens (see the module docstring). With S = Wᵀ [d_dot, d_v] and a chunk's
    rows Q, K [C, d_dot], V [C, d_v]:

        O = Q S_start + lower(Q Kᵀ) V          (lower keeps the diagonal: yᵢ reads W⁽ⁱ⁾)
        S_start of chunk j = S₀ + Σ_{m<j} K_mᵀ V_m,   final S = S₀ + Σ_m K_mᵀ V_m

    Everything is batched over all chunks; autograd differentiates it. A sequence whose length is not a multiple
    of C is padded with zeros (k = v = 0 adds nothing).

    Args:
        q, k, v, state: see the module docstring.
        chunk_size: C ≥ 1, clipped to seq_len.

    Returns:
        y [seq_len, batch, heads, d_v] and the final state [batch, heads, d_v, d_dot] (float32 or float64).

    Raises:
        ValueError: bad shapes or chunk_size < 1.
    """
    _check(q, k, v, state, token=False)
    if chunk_size < 1:
        raise ValueError(f"sum_rule_chunked: chunk_size must be >= 1, got {chunk_size}")
    seq_len, batch, heads, d_dot = q.shape
    d_v = v.shape[-1]
    exact = exact_dtype(v.dtype)
    if seq_len == 0:
        weights = state.to(exact) if state is not None else q.new_zeros(batch, heads, d_v, d_dot, dtype=exact)
        return v.new_zeros(v.shape), weights
    c = min(chunk_size, seq_len)
    n = -(-seq_len // c)
    pad = n * c - seq_len

    def chunks(x):  # [seq_len, batch, heads, d] -> [batch · heads, n, c, d]
        if pad:
            x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 1) + (0, pad))
        return x.to(exact).unflatten(0, (n, c)).permute(2, 3, 0, 1, 4).reshape(batch * heads, n, c, x.shape[-1])

    with torch.autocast(q.device.type, enabled=False):
        q_c, k_c, v_c = chunks(q), chunks(k), chunks(v)
        writes = k_c.transpose(-1, -2) @ v_c  # K_mᵀ V_m: [bh, n, d_dot, d_v]
        s0 = (q.new_zeros(batch * heads, 1, d_dot, d_v, dtype=exact) if state is None
              else state.to(exact).transpose(-1, -2).reshape(batch * heads, 1, d_dot, d_v))
        ends = s0 + writes.cumsum(1)  # the state after each chunk
        starts = torch.cat([s0, ends[:, :-1]], dim=1)
        out = q_c @ starts + (q_c @ k_c.transpose(-1, -2)).tril_() @ v_c  # [bh, n, c, d_v]
    final_state = ends[:, -1].view(batch, heads, d_dot, d_v).transpose(-1, -2)
    out = out.view(batch, heads, n * c, d_v).permute(2, 0, 1, 3)[:seq_len]
    return out.to(v.dtype), final_state
