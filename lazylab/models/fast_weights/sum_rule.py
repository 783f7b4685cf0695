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
  S₀ + the sum of the earlier chunks' Kᵀ V (one cumulative sum, so no step is sequential); optionally with the
  attention normaliser folded in.

Shapes, as the delta rule's (`delta_rule.py`), sequence-first:
    q, k: [seq_len, batch, heads, d_dot];  v: [seq_len, batch, heads, d_v];  state: [batch, heads, d_v, d_dot] or None
and each returns `(y, state)` with y: [seq_len, batch, heads, d_v] (for a step: no seq_len axis).

Precision: the state and its accumulations are float32 (float64 for float64 inputs) under autocast too; y comes
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
from lazylab.models.fast_weights.normalization import join_state

__all__ = ['sum_rule_step', 'sum_rule_step_unchecked', 'sum_rule_loop', 'sum_rule_chunked']


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor], token: bool,
           extra_rows: int = 0):
    check_qkv_state('sum rule', q, k, v, state, token, extra_rows)


def sum_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + vᵢ ⊗ kᵢ, yᵢ = W⁽ⁱ⁾ qᵢ.

    Args:
        q, k: [batch, heads, d_dot] (after the feature map φ').
        v: [batch, heads, d_v].
        state: W⁽ⁱ⁻¹⁾ [batch, heads, d_v, d_dot], or None (zeros).

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
    """The sum rule token by token, as the equations (the reference).

    Args:
        q, k: [seq_len, batch, heads, d_dot] (after the feature map φ').
        v: [seq_len, batch, heads, d_v].
        state: the fast weights before the first token, [batch, heads, d_v, d_dot]; None means zeros.

    Returns:
        y: [seq_len, batch, heads, d_v] and the final state [batch, heads, d_v, d_dot].

    Raises:
        ValueError: shapes that do not fit together.
    """
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


class _ChunkedSumRule(torch.autograd.Function):
    """The chunkwise sum rule with a hand-written backward (the forward equations: `sum_rule_chunked`).

    Inputs are chunk-major as the delta rule's (`to_chunks`): q, k: [N, c, d_dot], v: [N, c, d_v] with
    N = n · bh; s_init: [bh, d_dot, d_v]; z_init: [bh, d_dot] when normalising, else None. Returns y [N, c, d_v]
    (normalised or not), the final state [bh, d_dot, d_v] and the final z [bh, d_dot] (None without normalising).
    Not twice differentiable.

    With S_j, z_j the state and normaliser at chunk j's start and P = lower(Q Kᵀ):
        O = Q S_j + P V,   S_{j+1} = S_j + Kᵀ V
        den = Q z_j + rowsum(P) + eps,   z_{j+1} = z_j + colsum(K),   y = O / den     (when normalising)
    Backward, with G_j, g_j the gradients of S_{j+1}, z_{j+1} (the final state's, plus what every later chunk m
    reads: Q_mᵀ dO_m and Q_mᵀ dden_m):
        dO = dy / den,   dden = −(dy · y) / den,   dP = lower(dO Vᵀ + dden 1ᵀ)
        dQ = dP K + dO S_jᵀ + dden z_jᵀ,   dK = dPᵀ Q + V G_jᵀ + 1 g_jᵀ,   dV = Pᵀ dO + K G_j
    Everything but the suffix sums of G and g (n − 1 additions of a state) is one batched product over all
    chunks. The normaliser is kept beside V rather than as a column of ones appended to it: a 33rd column
    would make every product's inner size odd, at half the speed.
    """

    @staticmethod
    def forward(ctx, q, k, v, s_init, z_init, n: int, eps: float):
        normalise = z_init is not None
        chunk_states = (v.shape[0], *s_init.shape[1:])  # the states of all chunks as one batch of matrices
        p = torch.bmm(q, k.transpose(1, 2)).tril_()  # diagonal included: yᵢ reads W⁽ⁱ⁾
        states = s_init.new_empty(n + 1, *s_init.shape)  # states[j]: S at the start of chunk j; states[n]: final
        states[0] = s_init
        torch.bmm(k.transpose(1, 2), v, out=states[1:].view(chunk_states))  # each chunk's write Kᵀ V
        states.cumsum_(0)
        out = torch.bmm(q, states[:n].view(chunk_states)).baddbmm_(p, v)
        if not normalise:
            ctx.save_for_backward(q, k, v, p, states)
            ctx.n, ctx.exact = n, q.dtype
            return out, states[n].clone(), None
        zs = z_init.new_empty(n + 1, *z_init.shape)  # the same for z, with colsum(K) as each chunk's write
        zs[0] = z_init
        torch.sum(k, 1, out=zs[1:].view(v.shape[0], -1))
        zs.cumsum_(0)
        z_start = zs[:n].view(v.shape[0], 1, -1)
        r_den = torch.linalg.vecdot(q, z_start).add_(p.sum(-1)).add_(eps).reciprocal_().unsqueeze(-1)
        y = out.mul_(r_den)
        ctx.save_for_backward(q, k, v, p, states, zs, y, r_den)
        ctx.n, ctx.exact = n, q.dtype
        return y, states[n].clone(), zs[n].clone()

    @staticmethod
    def backward(ctx, d_y, d_s_final, d_z_final):
        with torch.autocast(d_y.device.type, enabled=False):  # backward() may be called inside autocast
            exact = ctx.exact
            return _ChunkedSumRule._backward(ctx, d_y.to(exact), d_s_final.to(exact),
                                             None if d_z_final is None else d_z_final.to(exact))

    @staticmethod
    def _backward(ctx, d_y, d_s_final, d_z_final):
        n = ctx.n
        q, k, v, p, states, *normaliser = ctx.saved_tensors
        chunk_states = (q.shape[0], *states.shape[2:])
        if normaliser:
            zs, y, r_den = normaliser
            d_den = torch.linalg.vecdot(d_y, y).unsqueeze(-1).mul_(r_den).neg_()  # y = O / den: −(dy · y) / den
            d_out = d_y * r_den
            d_p = torch.bmm(d_out, v.transpose(1, 2)).add_(d_den).tril_()
        else:
            d_out = d_y.contiguous()
            d_p = torch.bmm(d_out, v.transpose(1, 2)).tril_()
        d_q = torch.bmm(d_p, k).baddbmm_(d_out, states[:n].view(chunk_states).transpose(1, 2))
        d_states = torch.empty_like(states)  # [j < n]: Q_jᵀ dO_j, then the suffix sums G
        d_states[n] = d_s_final
        torch.bmm(q.transpose(1, 2), d_out, out=d_states[:n].view(chunk_states))
        for j in reversed(range(n)):
            d_states[j] += d_states[j + 1]
        g = d_states[1:].view(chunk_states)  # G_j: the gradient of chunk j's write
        d_k = torch.bmm(d_p.transpose(1, 2), q).baddbmm_(v, g.transpose(1, 2))
        d_v = torch.bmm(p.transpose(1, 2), d_out).baddbmm_(k, g)
        if not normaliser:
            return d_q, d_k, d_v, d_states[0], None, None, None
        z_start = zs[:n].view(q.shape[0], 1, -1)
        d_q.addcmul_(d_den, z_start)
        d_zs = torch.empty_like(zs)  # the same suffix sums for z
        d_zs[n] = 0 if d_z_final is None else d_z_final
        torch.bmm(d_den.transpose(1, 2), q, out=d_zs[:n].view(q.shape[0], 1, -1))  # Qᵀ dden, as rows
        for j in reversed(range(n)):
            d_zs[j] += d_zs[j + 1]
        d_k += d_zs[1:].view(q.shape[0], 1, -1)
        return d_q, d_k, d_v, d_states[0], d_zs[0], None, None


def sum_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor] = None,
                     chunk_size: int = 64, *, attention_normalization: bool = False, eps: float = 1e-6
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum rule by chunks of C tokens (see the module docstring). With S = Wᵀ [d_dot, d_v] and a chunk's
    rows Q, K [C, d_dot], V [C, d_v]:

        O = Q S_start + lower(Q Kᵀ) V          (lower keeps the diagonal: yᵢ reads W⁽ⁱ⁾)
        S_start of chunk j = S₀ + Σ_{m<j} K_mᵀ V_m,   final S = S₀ + Σ_m K_mᵀ V_m

    Everything is batched over all chunks, with a hand-written backward (`_ChunkedSumRule`). A sequence whose
    length is not a multiple of C is padded with zeros (k = v = 0 adds nothing).

    With `attention_normalization`, the read-out is divided by zᵢ · qᵢ + eps, zᵢ = z₀ + Σ_{j≤i} kⱼ (Katharopoulos
    et al. 2020, eq. 6; `normalization.py`), and the state carries z as its last row: [batch, heads, d_v + 1, d_dot]
    in and out.

    Args:
        q, k, v, state: see the module docstring (state with one more row when normalising).
        chunk_size: C ≥ 1, clipped to seq_len.
        attention_normalization: divide by the attention normaliser (see above).
        eps: that denominator's eps.

    Returns:
        y [seq_len, batch, heads, d_v] and the final state [batch, heads, d_v (+ 1), d_dot] (float32 or float64).

    Raises:
        ValueError: bad shapes or chunk_size < 1.
    """
    d_v = v.shape[-1]
    rows = d_v + attention_normalization  # the state's rows: W, and z below it when normalising
    _check(q, k, v, state, token=False, extra_rows=int(attention_normalization))
    check_chunk_size('sum_rule_chunked', chunk_size)
    d_dot = q.shape[-1]
    if q.shape[0] == 0:
        return empty_sequence(v, state, rows, d_dot)
    layout = Chunking.of(q, chunk_size, exact_dtype(v.dtype))
    with torch.autocast(q.device.type, enabled=False):
        if state is not None:
            state = state.to(layout.dtype)
        s_init = layout.initial_state(None if state is None else state[..., :d_v, :], d_v, d_dot)
        z_init = None
        if attention_normalization:
            z_init = (state[..., d_v, :].reshape(layout.bh, d_dot) if state is not None else
                      s_init.new_zeros(layout.bh, d_dot))
        out, s, z = _ChunkedSumRule.apply(layout.chunks(q), layout.chunks(k), layout.chunks(v), s_init, z_init,
                                          layout.n, eps)
    final_state = layout.final_state(s)
    if attention_normalization:
        final_state = join_state(final_state, z.view(layout.batch, layout.heads, d_dot))
    return layout.unchunk(out).to(v.dtype), final_state
