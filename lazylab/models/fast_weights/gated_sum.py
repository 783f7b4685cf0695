"""The gated sum rule (a scalar decay per head and token), computed three ways.

The sum rule (`sum_rule.py`) with a data-dependent decay αᵢ = exp(gᵢ) of the whole memory before each write: the
recurrence of Mamba-2's SSD layer (Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient
Algorithms Through Structured State Space Duality": a state space model whose transition is a scalar times the
identity), of RetNet's retention with a learned, data-dependent decay in place of its fixed γ (Sun et al. 2023,
"Retentive Network") and of "simple GLA" (flash-linear-attention's `simple_gla`). Per batch element and head, with
keys and queries already mapped by the feature map φ' (size d_dot), values of size d_v and a log decay gᵢ ≤ 0:

    W⁽ⁱ⁾ = exp(gᵢ) W⁽ⁱ⁻¹⁾ + vᵢ ⊗ kᵢ       (forget: every stored association fades by αᵢ ∈ (0, 1]; then write)
    yᵢ = W⁽ⁱ⁾ qᵢ                         (read with the updated weights; no extra scaling of q)

so yᵢ = Σ_{j≤i} exp(gⱼ₊₁ + … + gᵢ) (kⱼ · qᵢ) vⱼ: causal linear attention with a decay mask. With g = 0 it is the sum
rule.

* `gated_sum_step`    one token (generation); `gated_sum_step_unchecked` without the shape checks.
* `gated_sum_loop`    the equations above, token by token: the reference (equal to flash-linear-attention's
  `naive_recurrent_simple_gla` with scale = 1, in the tests).
* `gated_sum_chunked` chunkwise: within a chunk the decays are masks exp(Γᵢ − Γⱼ) of the cumulative log decays Γ
  (as in the gated delta rule's chunks, without its triangular inverse), with a hand-written backward.

Shapes, sequence-first (as `sum_rule.py`):
    q, k: [seq_len, batch, heads, d_dot];  v: [seq_len, batch, heads, d_v];  g: [seq_len, batch, heads];
    state: [batch, heads, d_v, d_dot] or None
and each returns `(y, state)` with y: [seq_len, batch, heads, d_v] (a step: no seq_len axis).

Precision: the state and its accumulations are float32 (float64 for float64 inputs), also under autocast and in a
backward pass started inside autocast; y comes back in v's dtype, the state stays float32.
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
from lazylab.models.fast_weights.gated_delta_rule import _decay_masks, check_gate, decay_state

__all__ = ['gated_sum_step', 'gated_sum_step_unchecked', 'gated_sum_loop', 'gated_sum_chunked']


def _check(q, k, v, g, state, token: bool) -> torch.Tensor:
    check_qkv_state('gated sum rule', q, k, v, state, token)
    return check_gate('gated sum rule', 'g', g, q.shape[:-1])


def gated_sum_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                   state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: W ← exp(g) W + v ⊗ k, y = W q.

    Args:
        q, k: [batch, heads, d_dot] (after the feature map φ').
        v: [batch, heads, d_v].
        g: [batch, heads], the log decay (≤ 0).
        state: W [batch, heads, d_v, d_dot]; None means zeros.

    Returns:
        y [batch, heads, d_v] and the new state W (float32, or float64 for float64 inputs).

    Raises:
        ValueError: shapes that do not fit together (the message names them).
    """
    g = _check(q, k, v, g, state, token=True)
    return gated_sum_step_unchecked(q, k, v, g, state)


def gated_sum_step_unchecked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             state: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`gated_sum_step` without the shape checks (for a generation step function)."""
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    with no_autocast(q.device.type):
        q, k, v = q.to(exact), k.to(exact), v.to(exact)
        update = v.unsqueeze(-1) * k.unsqueeze(-2)  # vᵢ ⊗ kᵢ
        new_state = update if state is None else decay_state(state, g) + update
        return torch.linalg.vecdot(new_state, q.unsqueeze(-2)).to(out_dtype), new_state


def gated_sum_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                   state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated sum rule token by token, written as the equations (the reference). O(seq_len) sequential steps.

    Args:
        q, k: [seq_len, batch, heads, d_dot] (after the feature map φ').
        v: [seq_len, batch, heads, d_v].
        g: [seq_len, batch, heads], the log decays (≤ 0).
        state: the fast weights before the first token, [batch, heads, d_v, d_dot]; None means zeros.

    Returns:
        y: [seq_len, batch, heads, d_v] and the final state [batch, heads, d_v, d_dot].

    Raises:
        ValueError: shapes that do not fit together (the message names them).
    """
    g = _check(q, k, v, g, state, token=False)
    seq_len, batch, heads, d_dot = q.shape
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, g = (t.to(exact) for t in (q, k, v, g))
        weights = state.to(exact) if state is not None else q.new_zeros(batch, heads, v.shape[-1], d_dot)
        ys = []
        for i in range(seq_len):
            weights = g[i].exp()[..., None, None] * weights + v[i].unsqueeze(-1) @ k[i].unsqueeze(-2)  # αᵢ W + vᵢ ⊗ kᵢ
            ys.append((weights @ q[i].unsqueeze(-1)).squeeze(-1))  # yᵢ = W qᵢ
    if seq_len == 0:
        return v.new_zeros(v.shape, dtype=out_dtype), weights
    return torch.stack(ys).to(out_dtype), weights


class _GatedSumChunks(torch.autograd.Function):
    """The chunkwise gated sum rule with a hand-written backward (the forward equations: `gated_sum_chunked`).

    Inputs are chunk-major (`Chunking`): q, k [N, c, d_dot], v [N, c, d_v], g [N, c, 1], N = n · bh;
    s_init [bh, d_dot, d_v]. Returns O [N, c, d_v] and the final S [bh, d_dot, d_v]. Not twice differentiable.

    Per chunk, with Γ the cumulative sum of g, the masks D = exp(Γᵢ − Γⱼ) (j ≤ i), γ = exp(Γ), δ = exp(Γ_c − Γ)
    (`_decay_masks`: only differences Γᵢ − Γⱼ ≤ 0 are exponentiated), P = Q Kᵀ ⊙ D, and S the state at the chunk's
    start:
        O = γ ⊙ (Q S) + P V,   S' = γ_c S + Kᵀ (δ ⊙ V)
    Backward for chunk j (dO given, dS' from the later chunks), with dOγ = γ ⊙ dO:
        dV ∋ δ ⊙ (K dS'),   dK ∋ (δ ⊙ V) dS'ᵀ,   dQ ∋ dOγ Sᵀ,   dS = γ_c dS' + Qᵀ dOγ,   dγ_c = ⟨S, dS'⟩
    then for all chunks at once: dP = dO Vᵀ, dQ ∋ (dP ⊙ D) K, dK ∋ (dP ⊙ D)ᵀ Q, dV ∋ Pᵀ dO, and g's, as the gated
    delta rule's (`GatedChunks`): H = dP ⊙ P gives dg_t = Σ_{i≥t} Σ_{j<t} H_ij (a block sum, no cancellation);
    aᵢ = ⟨dOᵢ, γᵢ (Q S)ᵢ⟩ goes to g_t for t ≤ i, bᵢ = ⟨(δ ⊙ V)ᵢ, (K dS')ᵢ⟩ to g_t for t > i, γ_c ⟨S, dS'⟩ to every
    g_t of the chunk.
    """

    @staticmethod
    def forward(ctx, q, k, v, g, s_init, n: int, bh: int):
        decay, gam, delta = _decay_masks(g.cumsum(1))
        k_t = k.transpose(1, 2).contiguous()  # (bmm is slow on CPU with a transposed right-hand operand)
        p = torch.bmm(q, k_t).mul_(decay)  # Q Kᵀ ⊙ D: lower, diagonal included (yᵢ reads W⁽ⁱ⁾)
        v_d = v * delta  # δ ⊙ V: each value decayed to the chunk's end
        gam_last = gam[:, -1:]  # [N, 1, 1]: γ_c of each chunk
        states = s_init.new_empty(n + 1, *s_init.shape)
        states[0] = s_init
        out = torch.empty_like(v)
        by_chunk = [x.unflatten(0, (n, bh)) for x in (q, k_t, v_d, gam, gam_last, p, v, out)]
        for j, (q_j, k_t_j, v_d_j, gam_j, gl_j, p_j, v_j, out_j) in enumerate(zip(*by_chunk)):
            s = states[j]
            torch.bmm(q_j, s, out=out_j).mul_(gam_j).baddbmm_(p_j, v_j)  # O = γ ⊙ (Q S) + P V
            torch.mul(s, gl_j, out=states[j + 1]).baddbmm_(k_t_j, v_d_j)  # S' = γ_c S + Kᵀ (δ ⊙ V)
        ctx.save_for_backward(q, k, v, v_d, decay, gam, delta, p, states)
        ctx.n, ctx.bh, ctx.exact = n, bh, q.dtype
        return out, states[n].clone()

    @staticmethod
    def backward(ctx, d_out, d_s_final):
        # backward() may be called inside an autocast block: its products stay in the forward's float32
        with torch.autocast(d_out.device.type, enabled=False):
            return _GatedSumChunks._backward(ctx, d_out.to(ctx.exact), d_s_final.to(ctx.exact))

    @staticmethod
    def _backward(ctx, d_out, d_s_final):
        q, k, v, v_d, decay, gam, delta, p, states = ctx.saved_tensors
        n, bh = ctx.n, ctx.bh
        d_out = d_out.contiguous()
        d_og = d_out * gam  # dOγ = γ ⊙ dO
        d_v = torch.bmm(p.transpose(1, 2), d_out)  # Pᵀ dO; the loop adds δ ⊙ (K dS')
        d_q, d_k = torch.empty_like(q), torch.empty_like(k)
        k_ds = v.new_empty(bh, *v.shape[1:])
        # per token: aᵢ (what γᵢ scales), bᵢ (what δᵢ scales), and per chunk dγ_c; row-dots taken while in cache
        a, b, d_gl = gam.new_empty(gam.shape[:2]), gam.new_empty(gam.shape[:2]), gam.new_empty(gam.shape[0], 1)
        ds = d_s_final.clone(memory_format=torch.contiguous_format)  # updated in place below
        by_chunk = [x.unflatten(0, (n, bh)) for x in (q, k, v_d, delta, gam, d_og, d_v, d_q, d_k, a, b, d_gl)]
        vecdot = torch.linalg.vecdot
        for j in reversed(range(n)):
            q_j, k_j, v_d_j, delta_j, gam_j, d_og_j, d_v_j, d_q_j, d_k_j, a_j, b_j, d_gl_j = (x[j] for x in by_chunk)
            s = states[j]
            vecdot(s.flatten(1), ds.flatten(1), out=d_gl_j.view(bh))  # dγ_c = ⟨S, dS'⟩
            torch.bmm(k_j, ds, out=k_ds)
            vecdot(k_ds, v_d_j, out=b_j)  # bᵢ = ⟨(δ ⊙ V)ᵢ, (K dS')ᵢ⟩
            d_v_j.addcmul_(k_ds, delta_j)  # dV ∋ δ ⊙ (K dS')
            torch.bmm(v_d_j, ds.transpose(1, 2), out=d_k_j)  # (δ ⊙ V) dS'ᵀ
            torch.bmm(d_og_j, s.transpose(1, 2).contiguous(), out=d_q_j)  # (γ ⊙ dO) Sᵀ
            vecdot(d_q_j, q_j, out=a_j)  # aᵢ = ⟨dOᵢ, γᵢ (Q S)ᵢ⟩
            ds.mul_(gam_j[:, -1:]).baddbmm_(q_j.transpose(1, 2), d_og_j)  # dS = γ_c dS' + Qᵀ dOγ
        d_p = torch.bmm(d_out, v.transpose(1, 2))  # dO Vᵀ (what lies above the diagonal meets D's zeros)
        m = d_p * decay  # through P = Q Kᵀ ⊙ D
        d_q.baddbmm_(m, k)
        d_k.baddbmm_(m.transpose(1, 2), q)
        h = d_p.mul_(p)  # H: dD ⊙ D = dP ⊙ Q Kᵀ ⊙ D
        # dg, not dΓ (see the class docstring): block sums of H, and suffix and prefix sums of a and b
        c = h.shape[-1]
        before = torch.ones(c, c, dtype=h.dtype, device=h.device).triu_(1)  # [j, t]: j < t
        d_g = torch.matmul(h, before).tril_().sum(1)  # Σ_{i ≥ t} Σ_{j < t} H_ij
        d_g += torch.matmul(b, before)  # Σ_{i < t} bᵢ
        d_g += torch.matmul(a, before.T.add_(torch.eye(c, dtype=h.dtype, device=h.device)))  # Σ_{i ≥ t} aᵢ
        d_g += d_gl * gam[:, -1]
        return d_q, d_k, d_v, d_g.unsqueeze(-1), ds, None, None


def gated_sum_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                      state: Optional[torch.Tensor] = None, chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated sum rule by chunks of C tokens (the chunkwise algorithm of Mamba-2's SSD, Dao & Gu 2024: quadratic
    attention with a decay mask within a chunk, the recurrence between chunks).

    With S = Wᵀ [d_dot, d_v], a chunk's rows Q, K [C, d_dot], V [C, d_v], its state S₀ at the start, and
    Γᵢ = g₁ + … + gᵢ the log decay from the chunk's start to token i:

        O = diag(exp Γ) Q S₀ + (Q Kᵀ ⊙ D) V,        D_ij = exp(Γᵢ − Γⱼ) for j ≤ i, 0 above the diagonal
        S_C = exp(Γ_C) S₀ + Kᵀ diag(exp(Γ_C − Γ)) V

    Everything but the S recurrence (two products per chunk) is batched over all chunks; the backward is
    hand-written (`_GatedSumChunks`). Every exponent is a difference Γᵢ − Γⱼ with i ≥ j, so ≤ 0 for g ≤ 0: nothing
    overflows however strong the decay. A sequence whose length is not a multiple of C is padded with k = v = g = 0,
    which leave the state unchanged.

    Args:
        q, k, v, g, state: see the module docstring.
        chunk_size: C, tokens per chunk (≥ 1); clipped to seq_len.

    Returns:
        y [seq_len, batch, heads, d_v] (v's dtype) and the final state [batch, heads, d_v, d_dot] (float32, or
        float64 for float64 inputs).

    Raises:
        ValueError: shapes that do not fit together (named), or chunk_size < 1.
    """
    g = _check(q, k, v, g, state, token=False)
    check_chunk_size('gated_sum_chunked', chunk_size)
    d_v, d_dot = v.shape[-1], q.shape[-1]
    if q.shape[0] == 0:
        return empty_sequence(v, state, d_v, d_dot)
    layout = Chunking.of(q, chunk_size, exact_dtype(v.dtype))
    with torch.autocast(q.device.type, enabled=False):
        out, s = _GatedSumChunks.apply(layout.chunks(q), layout.chunks(k), layout.chunks(v),
                                       layout.chunks(g.unsqueeze(-1)), layout.initial_state(state, d_v, d_dot),
                                       layout.n, layout.bh)
    return layout.unchunk(out).to(v.dtype), layout.final_state(s)
