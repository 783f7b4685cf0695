"""The generalised delta rule of RWKV-7: a diagonal-plus-rank-one transition (DPLR), computed three ways.

Peng et al. 2025, "RWKV-7 "Goose" with Expressive Dynamic State Evolution" (arXiv 2503.14456): the state evolves
by a diagonal decay plus a rank-one correction, wkvₜ = wkvₜ₋₁ (diag(wₜ) + aₜᵀ bₜ) + vₜᵀ kₜ with row vectors, in the
[d_v, d_k] layout of our state; RWKV-7 takes a = −κ̂ and b = κ̂ ⊙ (its in-context learning rate), κ̂ a unit key, so
that the rank-one term is a delta-rule removal. flash-linear-attention computes it as `generalized_delta_rule`
(`dplr`): in its layout S [d_k, d_v], Sₜ = (Diag(exp(gₜ)) + bₜ aₜᵀ) Sₜ₋₁ + kₜ vₜᵀ. In ours, W = Sᵀ [d_v, d_k], per
batch element and head, with column vectors:

    W ← W (Diag(exp(gᵢ)) + aᵢ bᵢᵀ) + vᵢ ⊗ kᵢ       i.e.   W ← W Diag(exp(gᵢ)) + (W aᵢ) ⊗ bᵢ + vᵢ ⊗ kᵢ
    yᵢ = W qᵢ                                      (read with the updated weights; no scaling of q)

The rank-one term reads the weights before this token's decay (the decay and the correction are added, not
applied one after the other), and the write vᵢ ⊗ kᵢ has no strength β of its own (fold it into k). KDA
(`kda.py`) is the special case a = exp(g) ⊙ k, b = −β k with the written key β k.

* `dplr_step`    one token (generation).
* `dplr_loop`    the equations above, token by token: the reference (equal to flash-linear-attention's
  `dplr_recurrence`, in the tests).
* `dplr_chunked` chunkwise-parallel, in flash-linear-attention's WY form (`chunk_dplr`): per chunk, the rank-one
  reads wᵢ = W aᵢ of its tokens solve one unit-lower-triangular system, and only the state is carried from chunk
  to chunk (see `dplr_chunked`). Differentiated by autograd (no hand-written backward: no speed target here).

Shapes, sequence-first (as `delta_rule.py`):
    q, k, a, b, g: [seq_len, batch, heads, d_k];  v: [seq_len, batch, heads, d_v];  state: [batch, heads, d_v, d_k]
    or None
and each returns `(y, state)` with y: [seq_len, batch, heads, d_v] (a step: no seq_len axis). g is the log decay of
each key channel (≤ 0).

Stability: like any linear recurrence, the state stays bounded only when the transitions do (RWKV-7's a, b give
eigenvalues of Diag(exp g) + a bᵀ within [−1, 1]); for such inputs the chunked form is as stable as the loop: its
triangular system is the loop's own recurrence for the reads w within a chunk, and every decay it takes is an
exp(Γᵢ − Γⱼ) with i ≥ j (Γ the cumulative log decays), ≤ 1 for g ≤ 0 and masked before exp.

Precision: the state and its accumulations are float32 (float64 for float64 inputs), also under autocast; y comes
back in v's dtype, the state stays float32.
"""
from typing import Optional

import torch

from lazylab.models.fast_weights._chunks import (
    Chunking,
    check_chunk_size,
    check_qkv_state,
    empty_sequence,
    exact_dtype,
    no_autocast,
)
from lazylab.models.fast_weights.delta_rule import unit_lower_inverse
from lazylab.models.fast_weights.gated_delta_rule import check_gate

__all__ = ['dplr_step', 'dplr_loop', 'dplr_chunked', 'channel_decay_mask']


def _check(q, k, v, a, b, g, state, token: bool):
    check_qkv_state('DPLR', q, k, v, state, token)
    for name, x in (('a', a), ('b', b), ('g', g)):
        check_gate('DPLR', name, x, q.shape)


def dplr_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, g: torch.Tensor,
              state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: W ← W Diag(exp(g)) + (W a) ⊗ b + v ⊗ k, then y = W q (see the module docstring).

    Args:
        q, k, a, b: [batch, heads, d_k].
        v: [batch, heads, d_v].
        g: [batch, heads, d_k], the log decay of each key channel (≤ 0).
        state: W [batch, heads, d_v, d_k]; None means zeros.

    Returns:
        y [batch, heads, d_v] and the new state W (float32, or float64 for float64 inputs).

    Raises:
        ValueError: shapes that do not fit together (the message names them).
    """
    _check(q, k, v, a, b, g, state, token=True)
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    with no_autocast(q.device.type):
        q, k, v, a, b, g = (t.to(exact) for t in (q, k, v, a, b, g))
        weights = v.unsqueeze(-1) * k.unsqueeze(-2)  # v ⊗ k
        if state is not None:
            state = state.to(exact)
            read = torch.linalg.vecdot(state, a.unsqueeze(-2))  # W a
            weights += state * g.exp().unsqueeze(-2) + read.unsqueeze(-1) * b.unsqueeze(-2)
        return torch.linalg.vecdot(weights, q.unsqueeze(-2)).to(out_dtype), weights


def dplr_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, g: torch.Tensor,
              state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The DPLR rule token by token, written as the equations (the reference). O(seq_len) sequential steps.

    Args:
        q, k: [seq_len, batch, heads, d_k].
        v: [seq_len, batch, heads, d_v].
        a, b: [seq_len, batch, heads, d_k], the rank-one term a bᵀ of each transition (W a is read, along b).
        g: [seq_len, batch, heads, d_k], the log decays of the key channels (≤ 0).
        state: the fast weights before the first token, [batch, heads, d_v, d_k]; None means zeros.

    Returns:
        y: [seq_len, batch, heads, d_v] and the final state [batch, heads, d_v, d_k].

    Raises:
        ValueError: shapes that do not fit together (the message names them).
    """
    _check(q, k, v, a, b, g, state, token=False)
    seq_len, batch, heads, d_k = q.shape
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, a, b, g = (t.to(exact) for t in (q, k, v, a, b, g))
        weights = state.to(exact) if state is not None else q.new_zeros(batch, heads, v.shape[-1], d_k)
        ys = []
        for i in range(seq_len):
            read = weights @ a[i].unsqueeze(-1)  # W aᵢ, before the decay
            weights = (weights * g[i].exp().unsqueeze(-2)  # W Diag(exp(gᵢ))
                       + read @ b[i].unsqueeze(-2)  # + (W aᵢ) ⊗ bᵢ
                       + v[i].unsqueeze(-1) @ k[i].unsqueeze(-2))  # + vᵢ ⊗ kᵢ
            ys.append((weights @ q[i].unsqueeze(-1)).squeeze(-1))  # yᵢ = W qᵢ
    if seq_len == 0:
        return v.new_zeros(v.shape, dtype=out_dtype), weights
    return torch.stack(ys).to(out_dtype), weights


def channel_decay_mask(gamma: torch.Tensor) -> torch.Tensor:
    """M_ijc = exp(Γᵢ,c − Γⱼ,c) for j ≤ i, 0 for j > i: [N, c, c, d] from the cumulative log decays Γ [N, c, d] of
    each chunk (the decay of key channel c from after token j to token i). The entries above the diagonal are set
    to −∞ before exp: for g ≤ 0 every exponent taken is ≤ 0, so a decay of any strength underflows to zero at
    worst, and no overflow meets a zero (exp(Γᵢ) and exp(−Γⱼ) taken apart would overflow within a few tokens of
    strong decay). Differentiable (the gradient of a masked entry is zero)."""
    c = gamma.shape[1]
    upper = torch.ones(c, c, dtype=torch.bool, device=gamma.device).triu_(1).unsqueeze_(-1)
    return (gamma.unsqueeze(2) - gamma.unsqueeze(1)).masked_fill(upper, float('-inf')).exp()


def _chunk_forward(q, k, v, a, b, g, s_init, n: int, bh: int):
    """`dplr_chunked` on chunk-major inputs (`Chunking`: q, k, a, b, g [N, c, d_k], v [N, c, d_v], N = n · bh,
    s_init [bh, d_k, d_v]), in differentiable operations: O [N, c, d_v] and the final S [bh, d_k, d_v]."""
    gam = g.cumsum(1)  # Γ, per channel
    decay = channel_decay_mask(gam)  # M_ij = exp(Γᵢ − Γⱼ), j ≤ i
    # row i of M pairs q_i with the decay to token i; a_{i+1} reads the weights after token i: the rows a shifted up
    a_next = torch.nn.functional.pad(a[:, 1:], (0, 0, 0, 1))
    rows = torch.stack((q, a_next), -1)  # [N, c, d_k, 2]
    by_k = torch.matmul(decay * k.unsqueeze(1), rows)  # Σ (q_i; a_{i+1}) M_ij k_j
    by_b = torch.matmul(decay * b.unsqueeze(1), rows)  # Σ (q_i; a_{i+1}) M_ij b_j
    down = lambda x: torch.nn.functional.pad(x[:, :-1], (0, 0, 1, 0))  # noqa: E731  (row i ← row i − 1, row 0 ← 0)
    a_qk, a_ak, a_qb, a_ab = by_k[..., 0], down(by_k[..., 1]), by_b[..., 0], down(by_b[..., 1])
    # (I − A_ab) W = A_ak V + (a ⊙ exp Γ⁻) S: the reads of a chunk, Γ⁻ = Γ − g (the decay to before token i)
    t = unit_lower_inverse(-a_ab)
    u = t @ (a_ak @ v)
    w = t @ (a * down(gam).exp())
    grow = gam.exp()
    q_g = q * grow
    shrink = (gam[:, -1:] - gam).exp()
    k_d, b_d = k * shrink, b * shrink
    gam_last = grow[:, -1].unsqueeze(-1)  # [N, d_k, 1]: scales the rows of S
    s = s_init
    outs = []
    chunks = zip(*(x.unflatten(0, (n, bh)).unbind(0) for x in (q_g, v, u, w, a_qk, a_qb, k_d, b_d, gam_last)))
    for q_g_j, v_j, u_j, w_j, a_qk_j, a_qb_j, k_d_j, b_d_j, gl_j in chunks:
        reads = u_j + w_j @ s  # W = T A_ak V + T (a ⊙ exp Γ⁻) S
        outs.append(q_g_j @ s + a_qk_j @ v_j + a_qb_j @ reads)
        s = gl_j * s + k_d_j.transpose(1, 2) @ v_j + b_d_j.transpose(1, 2) @ reads
    return torch.cat(outs), s


def dplr_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                 g: torch.Tensor, state: Optional[torch.Tensor] = None, chunk_size: int = 16
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The DPLR rule, chunkwise-parallel (the WY form of flash-linear-attention's `chunk_dplr`).

    With S = Wᵀ [d_k, d_v], a chunk of C tokens starting from S₀, Γᵢ = g₁ + … + gᵢ the per-channel log decay from
    the chunk's start to token i, Γ⁻ᵢ = Γᵢ − gᵢ, and the rank-one reads wᵢ = Sᵢ₋₁ᵀ aᵢ (rows W [C, d_v]):

        Sₜ = Diag(exp Γₜ) S₀ + Σ_{j≤t} Diag(exp(Γₜ − Γⱼ)) (kⱼ vⱼᵀ + bⱼ wⱼᵀ)
        (I − A_ab) W = A_ak V + (A ⊙ exp Γ⁻) S₀,    A_ab,ij = Σ_c a_ic b_jc exp(Γ⁻ᵢ,c − Γⱼ,c),  A_ak likewise (j < i)
        O = (Q ⊙ exp Γ) S₀ + A_qk V + A_qb W,       A_qk,ij = Σ_c q_ic k_jc exp(Γᵢ,c − Γⱼ,c),   A_qb likewise (j ≤ i)
        S_C = Diag(exp Γ_C) S₀ + (K ⊙ exp(Γ_C − Γ))ᵀ V + (B ⊙ exp(Γ_C − Γ))ᵀ W

    (I − A_ab)⁻¹ is one batched unit-triangular solve per chunk, so W = T A_ak V + T (A ⊙ exp Γ⁻) S₀ splits into a
    part computed for all chunks at once and one product with the state; only the S recurrence is sequential. The
    decays are the [C, C, d_k] masks of `channel_decay_mask` (Γ⁻ᵢ − Γⱼ is row i − 1 of the same mask), so no
    exponent is positive however strong the decay. A sequence whose length is not a multiple of C is padded with
    zeros (k = v = a = b = g = 0 leave the state as it is).

    Args:
        q, k, v, a, b, g, state: see the module docstring.
        chunk_size: C, tokens per chunk (≥ 1); clipped to seq_len.

    Returns:
        y [seq_len, batch, heads, d_v] (v's dtype) and the final state [batch, heads, d_v, d_k] (float32, or
        float64 for float64 inputs).

    Raises:
        ValueError: shapes that do not fit together (named), or chunk_size < 1.
    """
    _check(q, k, v, a, b, g, state, token=False)
    check_chunk_size('dplr_chunked', chunk_size)
    d_v, d_k = v.shape[-1], q.shape[-1]
    if q.shape[0] == 0:
        return empty_sequence(v, state, d_v, d_k)
    layout = Chunking.of(q, chunk_size, exact_dtype(v.dtype))
    with torch.autocast(q.device.type, enabled=False):
        chunks = [layout.chunks(x) for x in (q, k, v, a, b, g)]
        out, s = _chunk_forward(*chunks, layout.initial_state(state, d_v, d_k), layout.n, layout.bh)
    return layout.unchunk(out).to(v.dtype), layout.final_state(s)
