"""Gated linear attention (GLA): the sum rule with a decay per key channel, computed three ways.

Yang, Wang, Shen, Panda & Kim 2024, "Gated Linear Attention Transformers with Hardware-Efficient Training" (ICML
2024), section 4: linear attention whose memory fades by a data-dependent gate αᵢ ∈ (0, 1]^d_dot, one factor per key
channel. Per batch element and head, with keys and queries already mapped by the feature map φ' (size d_dot), values
of size d_v and log decays gᵢ = log αᵢ ≤ 0 (a vector of d_dot):

    W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ Diag(exp gᵢ) + vᵢ ⊗ kᵢ      (column c of W, what key channel c addresses, fades by exp(gᵢ,c))
    yᵢ = W⁽ⁱ⁾ qᵢ                              (read with the updated weights; no extra scaling of q)

(the paper's Sₜ = Diag(αₜ) Sₜ₋₁ + kₜ vₜᵀ, written for S = Wᵀ), so yᵢ = Σ_{j≤i} (Σ_c qᵢ,c kⱼ,c exp(Γᵢ,c − Γⱼ,c)) vⱼ
with Γ the cumulative sums of g. With g the same for every channel it is the gated sum rule (`gated_sum.py`); with
g = 0 the sum rule.

* `gla_step`    one token (generation); `gla_step_unchecked` without the shape checks.
* `gla_loop`    the equations above, token by token: the reference (equal to flash-linear-attention's
  `naive_recurrent_gla`, whose q is scaled by d_dot^-1/2, in the tests).
* `gla_chunked` chunkwise, with every decay taken relative to a point between the two tokens it connects, so that
  no exponent is positive (`gla_chunked` and `_GLAChunks` derive it), with a hand-written backward.

Shapes, sequence-first (as `sum_rule.py`):
    q, k, g: [seq_len, batch, heads, d_dot];  v: [seq_len, batch, heads, d_v];  state: [batch, heads, d_v, d_dot]
    or None
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
from lazylab.models.fast_weights.gated_delta_rule import check_gate

__all__ = ['gla_step', 'gla_step_unchecked', 'gla_loop', 'gla_chunked']


def _check(q, k, v, g, state, token: bool) -> torch.Tensor:
    check_qkv_state('GLA', q, k, v, state, token)
    return check_gate('GLA', 'g', g, q.shape)


def gla_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: W ← W Diag(exp g) + v ⊗ k, y = W q.

    Args:
        q, k: [batch, heads, d_dot] (after the feature map φ').
        v: [batch, heads, d_v].
        g: [batch, heads, d_dot], the log decay of each key channel (≤ 0).
        state: W [batch, heads, d_v, d_dot]; None means zeros.

    Returns:
        y [batch, heads, d_v] and the new state W (float32, or float64 for float64 inputs).

    Raises:
        ValueError: shapes that do not fit together (the message names them).
    """
    g = _check(q, k, v, g, state, token=True)
    return gla_step_unchecked(q, k, v, g, state)


def gla_step_unchecked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                       state: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`gla_step` without the shape checks (for a generation step function)."""
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    with no_autocast(q.device.type):
        q, k, v, g = q.to(exact), k.to(exact), v.to(exact), g.to(exact)
        update = v.unsqueeze(-1) * k.unsqueeze(-2)  # vᵢ ⊗ kᵢ
        new_state = update if state is None else state.to(exact) * g.exp().unsqueeze(-2) + update
        return torch.linalg.vecdot(new_state, q.unsqueeze(-2)).to(out_dtype), new_state


def gla_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GLA token by token, written as the equations (the reference). O(seq_len) sequential steps.

    Args:
        q, k: [seq_len, batch, heads, d_dot] (after the feature map φ').
        v: [seq_len, batch, heads, d_v].
        g: [seq_len, batch, heads, d_dot], the log decays of the key channels (≤ 0).
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
            weights = weights * g[i].exp().unsqueeze(-2) + v[i].unsqueeze(-1) @ k[i].unsqueeze(-2)  # W Diag(αᵢ) + vᵢ⊗kᵢ
            ys.append((weights @ q[i].unsqueeze(-1)).squeeze(-1))  # yᵢ = W qᵢ
    if seq_len == 0:
        return v.new_zeros(v.shape, dtype=out_dtype), weights
    return torch.stack(ys).to(out_dtype), weights


# ---- the chunked form ----

def _block_sizes(c: int) -> list[int]:
    """c, c/2, …, 2 for a power of two c: the blocks whose halves `_intra_scores` connects."""
    return [c >> level for level in range(c.bit_length() - 1)]


def _halves(q: torch.Tensor, k: torch.Tensor, gamma: torch.Tensor, b: int):
    """For the blocks of b tokens of every chunk (q, k, Γ [N, c, d]), with r the last token of a block's first half:
    the second half's queries scaled by e_q = exp(Γᵢ − Γ_r) and the first half's keys by e_k = exp(Γ_r − Γⱼ), each
    [N, c/b, b/2, d], and the two factors. Both exponents are sums of g over the tokens between (≤ 0 for g ≤ 0)."""
    n_rows, c, d = q.shape
    h = b // 2
    q, k, gamma = (x.view(n_rows, c // b, 2, h, d) for x in (q, k, gamma))
    ref = gamma[:, :, 0, -1:]  # Γ_r [N, c/b, 1, d]
    e_q, e_k = (gamma[:, :, 1] - ref).exp_(), (ref - gamma[:, :, 0]).exp_()
    return q[:, :, 1] * e_q, k[:, :, 0] * e_k, e_q, e_k


def _block_view(x: torch.Tensor, b: int) -> torch.Tensor:
    """The entries of x [N, c, c] whose row lies in the second half and column in the first half of one block of b
    tokens: a view [N, c/b, b/2, b/2] (block, row, column)."""
    n_rows, c, h = x.shape[0], x.shape[1], b // 2
    return x.view(n_rows, c // b, b, c // b, b).diagonal(dim1=1, dim2=3)[:, h:, :h].permute(0, 3, 1, 2)


def _sums_from(x: torch.Tensor) -> torch.Tensor:
    """Σ_{i ≥ t} xᵢ along the token axis (−2) of x [..., h, d]: as one product with a triangle of ones (einsum makes
    it a single [h, h] × [h, …] product; a batched matmul of many tiny blocks is several times slower on CPU)."""
    ones = torch.ones(x.shape[-2], x.shape[-2], dtype=x.dtype, device=x.device)
    return torch.einsum('ti,...id->...td', ones.triu_(), x)


def _sums_before(x: torch.Tensor) -> torch.Tensor:
    """Σ_{j < t} xⱼ along the token axis (−2) of x [..., h, d] (see `_sums_from`)."""
    ones = torch.ones(x.shape[-2], x.shape[-2], dtype=x.dtype, device=x.device)
    return torch.einsum('tj,...jd->...td', ones.tril_(-1), x)


def _times(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a b for a [..., h, h], b [..., h, d]: a batched matmul, or for h ≤ 2 its h terms written out (a batched
    matmul of many 1 × 1 or 2 × 2 blocks is several times slower on CPU)."""
    if a.shape[-1] > 2:
        return torch.matmul(a, b)
    out = a[..., :1] * b[..., :1, :]
    for j in range(1, a.shape[-1]):
        out.addcmul_(a[..., j:j + 1], b[..., j:j + 1, :])
    return out


def _intra_scores(q: torch.Tensor, k: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """A [N, c, c] with A_ij = Σ_d q_id k_jd exp(Γ_id − Γ_jd) for j ≤ i, 0 above the diagonal (c a power of two).

    Every pair i > j has one smallest block of the halving c, c/2, …, 2 in which i lies in the second half and j in
    the first; with r that block's middle (its first half's last token), exp(Γᵢ − Γⱼ) = exp(Γᵢ − Γ_r) exp(Γ_r − Γⱼ),
    two factors ≤ 1, so that block's entries are one product (Q ⊙ e_q)(K ⊙ e_k)ᵀ (`_halves`). The diagonal has no
    decay: A_ii = qᵢ · kᵢ. log₂ c products and 2 log₂ c exponentials of [N, c/2, d] in all, never an exponential
    of a positive number, nor an [N, c, c, d] tensor.
    """
    a = q.new_zeros(q.shape[0], q.shape[1], q.shape[1])
    a.diagonal(dim1=1, dim2=2).copy_(torch.linalg.vecdot(q, k))
    for b in _block_sizes(q.shape[1]):
        q2, k1, _, _ = _halves(q, k, gamma, b)
        _block_view(a, b).copy_(torch.matmul(q2, k1.transpose(-1, -2)))
    return a


def _intra_backward(d_a: torch.Tensor, q: torch.Tensor, k: torch.Tensor, gamma: torch.Tensor, d_q: torch.Tensor,
                    d_k: torch.Tensor, d_g: torch.Tensor):
    """Adds the gradients through `_intra_scores` (d_a [N, c, c]; its upper part is not read) to d_q, d_k and d_g
    [N, c, d], in place. g's directly, not Γ's: in a block with middle r, e_q of row i is exp(g_{r+1} + … + gᵢ) and
    e_k of column j is exp(g_{j+1} + … + g_r), so g_t gets the suffix sums Σ_{i≥t} of (dQ₂ ⊙ Q₂) in the second half
    and the sums Σ_{j<t} of (dK₁ ⊙ K₁) in the first."""
    diag = d_a.diagonal(dim1=1, dim2=2).unsqueeze(-1)
    d_q.addcmul_(diag, k)
    d_k.addcmul_(diag, q)
    n_rows, c, d = q.shape
    for b in _block_sizes(c):
        q2, k1, e_q, e_k = _halves(q, k, gamma, b)
        d_block = _block_view(d_a, b)
        d_q2, d_k1 = _times(d_block, k1), _times(d_block.transpose(-1, -2), q2)
        halves = [x.view(n_rows, c // b, 2, b // 2, d) for x in (d_q, d_k, d_g)]
        halves[0][:, :, 1].addcmul_(d_q2, e_q)
        halves[1][:, :, 0].addcmul_(d_k1, e_k)
        halves[2][:, :, 1] += _sums_from(d_q2.mul_(q2))  # Σ_{i ≥ t} (dQ₂ ⊙ Q₂)ᵢ
        halves[2][:, :, 0] += _sums_before(d_k1.mul_(k1))  # Σ_{j < t} (dK₁ ⊙ K₁)ⱼ


class _GLAChunks(torch.autograd.Function):
    """Chunkwise GLA with a hand-written backward (the forward equations: `gla_chunked`).

    Inputs are chunk-major (`Chunking`), with c a power of two: q, k, g [N, c, d_dot], v [N, c, d_v], N = n · bh;
    s_init [bh, d_dot, d_v]. Returns O [N, c, d_v] and the final S [bh, d_dot, d_v]. Not twice differentiable.

    Per chunk, with Γ the cumulative sums of g, γ = exp(Γ), δ = exp(Γ_c − Γ) (both ≤ 1), A the intra-chunk scores
    (`_intra_scores`) and S the state at the chunk's start:
        O = (Q ⊙ γ) S + A V,   S' = Diag(γ_c) S + (K ⊙ δ)ᵀ V
    Backward for chunk j (dO given, dS' from the later chunks):
        d(Q ⊙ γ) = dO Sᵀ,   d(K ⊙ δ) = V dS'ᵀ,   dV ∋ (K ⊙ δ) dS',   dγ_c = rowsum(S ⊙ dS'),
        dS = Diag(γ_c) dS' + (Q ⊙ γ)ᵀ dO
    then for all chunks at once: dV ∋ Aᵀ dO, dA = dO Vᵀ (`_intra_backward`), and g's without going through Γ
    (no large terms cancel): γᵢ depends on g_t for t ≤ i, δⱼ on g_t for t > j, γ_c on all g_t of the chunk:
        dg_t = Σ_{i≥t} (d(Q ⊙ γ) ⊙ Q ⊙ γ)ᵢ + Σ_{j<t} (d(K ⊙ δ) ⊙ K ⊙ δ)ⱼ + dγ_c ⊙ γ_c + (A's part)
    Only the dS recurrence is sequential.
    """

    @staticmethod
    def forward(ctx, q, k, v, g, s_init, n: int, bh: int):
        gamma = g.cumsum(1)  # Γ: the log decay of each channel from the chunk's start
        gam, delta = gamma.exp(), (gamma[:, -1:] - gamma).exp_()
        k_d_t = (k * delta).transpose(1, 2).contiguous()  # (K ⊙ δ)ᵀ (bmm is slow with a transposed right operand)
        q_g = q * gam
        gam_last = gam[:, -1:].transpose(1, 2)  # γ_c [N, d_dot, 1]: scales the rows of S
        a = _intra_scores(q, k, gamma)
        states = s_init.new_empty(n + 1, *s_init.shape)
        states[0] = s_init
        out = torch.empty_like(v)
        by_chunk = [x.unflatten(0, (n, bh)) for x in (q_g, k_d_t, gam_last, a, v, out)]
        for j, (q_g_j, k_d_t_j, gl_j, a_j, v_j, out_j) in enumerate(zip(*by_chunk)):
            s = states[j]
            torch.bmm(q_g_j, s, out=out_j).baddbmm_(a_j, v_j)  # O = (Q ⊙ γ) S + A V
            torch.mul(s, gl_j, out=states[j + 1]).baddbmm_(k_d_t_j, v_j)  # S' = Diag(γ_c) S + (K ⊙ δ)ᵀ V
        ctx.save_for_backward(q, k, v, gamma, gam, delta, a, states)
        ctx.n, ctx.bh, ctx.exact = n, bh, q.dtype
        return out, states[n].clone()

    @staticmethod
    def backward(ctx, d_out, d_s_final):
        # backward() may be called inside an autocast block: its products stay in the forward's float32
        with torch.autocast(d_out.device.type, enabled=False):
            return _GLAChunks._backward(ctx, d_out.to(ctx.exact), d_s_final.to(ctx.exact))

    @staticmethod
    def _backward(ctx, d_out, d_s_final):
        q, k, v, gamma, gam, delta, a, states = ctx.saved_tensors
        n, bh = ctx.n, ctx.bh
        d_out = d_out.contiguous()
        q_g, k_d = q * gam, k * delta
        gam_last = gam[:, -1:].transpose(1, 2)
        d_v = torch.bmm(a.transpose(1, 2), d_out)  # Aᵀ dO; the loop adds (K ⊙ δ) dS'
        d_q_g, d_k_d = torch.empty_like(q), torch.empty_like(k)
        d_gl = gam.new_empty(gam.shape[0], gam.shape[-1])  # dγ_c [N, d_dot]
        ds = d_s_final.clone(memory_format=torch.contiguous_format)  # updated in place below
        by_chunk = [x.unflatten(0, (n, bh)) for x in (q_g, k_d, gam_last, v, d_out, d_v, d_q_g, d_k_d, d_gl)]
        for j in reversed(range(n)):
            q_g_j, k_d_j, gl_j, v_j, d_out_j, d_v_j, d_q_g_j, d_k_d_j, d_gl_j = (x[j] for x in by_chunk)
            s = states[j]
            torch.linalg.vecdot(s, ds, out=d_gl_j)  # dγ_c = rowsum(S ⊙ dS')
            d_v_j.baddbmm_(k_d_j, ds)  # dV ∋ (K ⊙ δ) dS'
            torch.bmm(v_j, ds.transpose(1, 2), out=d_k_d_j)  # d(K ⊙ δ) = V dS'ᵀ
            torch.bmm(d_out_j, s.transpose(1, 2).contiguous(), out=d_q_g_j)  # d(Q ⊙ γ) = dO Sᵀ
            ds.mul_(gl_j).baddbmm_(q_g_j.transpose(1, 2), d_out_j)  # dS = Diag(γ_c) dS' + (Q ⊙ γ)ᵀ dO
        d_q, d_k = d_q_g * gam, d_k_d * delta
        d_g = _sums_from(d_q_g.mul_(q_g))  # Σ_{i ≥ t}: γᵢ = exp(g₁ + … + gᵢ)
        d_g += _sums_before(d_k_d.mul_(k_d))  # Σ_{j < t}: δⱼ = exp(gⱼ₊₁ + … + g_c)
        d_g += (d_gl * gam[:, -1]).unsqueeze(1)  # γ_c = exp(g₁ + … + g_c)
        _intra_backward(torch.bmm(d_out, v.transpose(1, 2)), q, k, gamma, d_q, d_k, d_g)
        return d_q, d_k, d_v, d_g, ds, None, None


def gla_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                state: Optional[torch.Tensor] = None, chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """GLA by chunks of C tokens (the chunkwise form of Yang et al. 2024, section 4, with their secondary chunking
    carried down to single tokens).

    With S = Wᵀ [d_dot, d_v], a chunk's rows Q, K [C, d_dot], V [C, d_v], its state S₀ at the start, and
    Γᵢ = g₁ + … + gᵢ [d_dot] the log decays from the chunk's start to token i:

        O = (Q ⊙ exp Γ) S₀ + A V,        A_ij = Σ_d Q_id K_jd exp(Γ_id − Γ_jd) for j ≤ i, 0 above the diagonal
        S_C = Diag(exp Γ_C) S₀ + (K ⊙ exp(Γ_C − Γ))ᵀ V

    A is not a product Q Kᵀ ⊙ D, the decay depending on the channel; writing it (Q ⊙ exp Γ)(K ⊙ exp(−Γ))ᵀ would
    overflow exp(−Γ) within a few tokens of strong decay. Instead every pair i > j is computed relative to the
    middle r of the smallest of the blocks C, C/2, …, 2 that separates them, exp(Γᵢ − Γⱼ) = exp(Γᵢ − Γ_r)
    exp(Γ_r − Γⱼ), one product per block size (`_intra_scores`): every exponent is a sum of g over consecutive
    tokens, ≤ 0 for g ≤ 0, so a decay of any strength underflows to zero at worst and no inf · 0 arises.
    Everything but the S recurrence (two products per chunk) is batched over all chunks; the backward is
    hand-written (`_GLAChunks`). A chunk is padded to a power of two, and the sequence to a multiple of C, with
    k = v = g = 0 tokens, which leave the state unchanged.

    Args:
        q, k, v, g, state: see the module docstring.
        chunk_size: C, tokens per chunk (≥ 1); clipped to seq_len. A power of two wastes nothing.

    Returns:
        y [seq_len, batch, heads, d_v] (v's dtype) and the final state [batch, heads, d_v, d_dot] (float32, or
        float64 for float64 inputs).

    Raises:
        ValueError: shapes that do not fit together (named), or chunk_size < 1.
    """
    g = _check(q, k, v, g, state, token=False)
    check_chunk_size('gla_chunked', chunk_size)
    d_v, d_dot = v.shape[-1], q.shape[-1]
    if q.shape[0] == 0:
        return empty_sequence(v, state, d_v, d_dot)
    layout = Chunking.of(q, chunk_size, exact_dtype(v.dtype))
    pad = (1 << (layout.c - 1).bit_length()) - layout.c  # to the next power of two
    with torch.autocast(q.device.type, enabled=False):
        chunks = [layout.chunks(x) for x in (q, k, v, g)]
        if pad:
            chunks = [torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in chunks]
        out, s = _GLAChunks.apply(*chunks, layout.initial_state(state, d_v, d_dot), layout.n, layout.bh)
    return layout.unchunk(out[:, :layout.c]).to(v.dtype), layout.final_state(s)
