"""Kimi Delta Attention (KDA): the gated delta rule with a decay per key channel, computed three ways.

Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention Architecture" (arXiv 2510.26692), the recurrence of
its Kimi Delta Attention: Gated DeltaNet's rule (`gated_delta_rule.py`) with the scalar decay exp(gᵢ) made diagonal,
Diag(exp(gᵢ)), one log decay per key channel (as in GLA). In the paper's layout S [d_k, d_v] it reads
Sᵢ = (I − βᵢ kᵢ kᵢᵀ) Diag(exp(gᵢ)) Sᵢ₋₁ + βᵢ kᵢ vᵢᵀ, oᵢ = Sᵢᵀ qᵢ; in ours, W = Sᵀ [d_v, d_k], per batch element
and head:

    W ← W Diag(exp(gᵢ))                (forget: key channel c of every stored association fades by exp(gᵢ,c))
    W ← W + βᵢ (vᵢ − W kᵢ) ⊗ kᵢ         (the delta rule's write)
    yᵢ = W qᵢ                          (read with the updated weights; no scaling of q)

With gᵢ,c the same for every channel c it is the gated delta rule; with g = 0 the delta rule. Keys and queries come
as the caller made them: nothing here normalises them (Kimi Linear L2-normalises q and k before the rule).

* `kda_step`    one token (generation).
* `kda_loop`    the equations above, token by token: the reference (equal to flash-linear-attention's
  `naive_recurrent_kda` with scale = 1, in the tests).
* `kda_chunked` chunkwise-parallel: the gated delta rule's WY/UT form (`GatedChunks`) with the decays between
  tokens taken per channel (`intra_chunk`, without a positive exponent), and a hand-written backward (`KdaChunks`).

Shapes, sequence-first (as `delta_rule.py`):
    q, k: [seq_len, batch, heads, d_k];  v: [seq_len, batch, heads, d_v];  beta: [seq_len, batch, heads] (or with a
    trailing 1);  g: [seq_len, batch, heads, d_k];  state: [batch, heads, d_v, d_k] or None
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
from lazylab.models.fast_weights.delta_rule import delta_rule_step_unchecked, unit_lower_inverse
from lazylab.models.fast_weights.gated_delta_rule import check_gate

__all__ = ['kda_step', 'kda_loop', 'kda_chunked', 'intra_chunk', 'intra_chunk_backward', 'DecaySums', 'KdaChunks']


def _check(q, k, v, beta, g, state, token: bool):
    check_qkv_state('KDA', q, k, v, state, token)
    beta = check_gate('KDA', 'beta', beta, q.shape[:-1], trailing_one=True)
    return beta, check_gate('KDA', 'g', g, q.shape)


def kda_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
             state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: W ← W Diag(exp(g)), then the delta rule's write and read (see the module docstring).

    Args:
        q, k: [batch, heads, d_k].
        v: [batch, heads, d_v].
        beta: [batch, heads] (or [batch, heads, 1]).
        g: [batch, heads, d_k], the log decay of each key channel (≤ 0).
        state: W [batch, heads, d_v, d_k]; None means zeros.

    Returns:
        y [batch, heads, d_v] and the new state W (float32, or float64 for float64 inputs).

    Raises:
        ValueError: shapes that do not fit together (the message names them).
    """
    beta, g = _check(q, k, v, beta, g, state, token=True)
    with no_autocast(q.device.type):
        if state is not None:
            exact = exact_dtype(state.dtype)
            state = state.to(exact) * g.to(exact).exp().unsqueeze(-2)  # column c of W times exp(g_c)
        return delta_rule_step_unchecked(q, k, v, beta.unsqueeze(-1), state)


def kda_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
             state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA token by token, written as the equations (the reference). O(seq_len) sequential steps.

    Args:
        q, k: [seq_len, batch, heads, d_k].
        v: [seq_len, batch, heads, d_v].
        beta: [seq_len, batch, heads] (or with a trailing 1), the write strengths.
        g: [seq_len, batch, heads, d_k], the log decays of the key channels (≤ 0).
        state: the fast weights before the first token, [batch, heads, d_v, d_k]; None means zeros.

    Returns:
        y: [seq_len, batch, heads, d_v] and the final state [batch, heads, d_v, d_k].

    Raises:
        ValueError: shapes that do not fit together (the message names them).
    """
    beta, g = _check(q, k, v, beta, g, state, token=False)
    seq_len, batch, heads, d_k = q.shape
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, beta, g = (t.to(exact) for t in (q, k, v, beta, g))
        weights = state.to(exact) if state is not None else q.new_zeros(batch, heads, v.shape[-1], d_k)
        ys = []
        for i in range(seq_len):
            weights = weights * g[i].exp().unsqueeze(-2)  # W ← W Diag(exp(gᵢ))
            k_i, q_i, beta_i = k[i].unsqueeze(-1), q[i].unsqueeze(-1), beta[i, ..., None, None]  # columns
            v_bar = weights @ k_i  # v̄ᵢ = W kᵢ
            weights = weights + beta_i * (v[i].unsqueeze(-1) - v_bar) @ k_i.transpose(-1, -2)  # W + βᵢ (vᵢ − v̄ᵢ) ⊗ kᵢ
            ys.append((weights @ q_i).squeeze(-1))  # yᵢ = W qᵢ
    if seq_len == 0:
        return v.new_zeros(v.shape, dtype=out_dtype), weights
    return torch.stack(ys).to(out_dtype), weights


def _pairs(x: torch.Tensor, b: int) -> torch.Tensor:
    """[N, c, …] → [N, c / 2b, 2, b, …]: the chunk as pairs of neighbouring blocks of b tokens (a view)."""
    return x.view(x.shape[0], x.shape[1] // (2 * b), 2, b, *x.shape[2:])


def _block(x: torch.Tensor, b: int) -> torch.Tensor:
    """The entries of x [N, c, c] in the rows of the second block and the columns of the first block of every pair
    (`_pairs`), as a view [N, b, b, c / 2b] (the pair axis last)."""
    n_pairs = x.shape[1] // (2 * b)
    return x.view(x.shape[0], n_pairs, 2 * b, n_pairs, 2 * b).diagonal(dim1=1, dim2=3)[:, b:, :b]


def _matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y for x [..., m, n], y [..., n, p]; as n broadcast products when m · n ≤ 8, where CPU's batched matmul
    takes several times longer for many such small matrices."""
    m, n = x.shape[-2:]
    if m * n > 8:
        return torch.matmul(x, y)
    out = x[..., :1] * y[..., :1, :]
    for i in range(1, n):
        out.addcmul_(x[..., i:i + 1], y[..., i:i + 1, :])
    return out


def _power_of_two(x: torch.Tensor, gam: bool = False) -> torch.Tensor:
    """x [N, c, d] padded along c to the next power of two: with zeros, or for Γ with its last value (zero log
    decays, so that no exponent of `intra_chunk` is positive)."""
    c = x.shape[1]
    pad = (1 << (c - 1).bit_length()) - c
    if not pad:
        return x
    tail = x[:, -1:].expand(-1, pad, -1) if gam else x.new_zeros(x.shape[0], pad, x.shape[2])
    return torch.cat((x, tail), 1)


def intra_chunk(q: torch.Tensor, k: torch.Tensor, gam: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """P_ij = Σ_d Q_id K_jd exp(Γᵢ,d − Γⱼ,d) for j ≤ i and E_ij = Σ_d K_id K_jd exp(Γᵢ,d − Γⱼ,d) for j < i (zeros
    elsewhere), [N, c, c], from q, k [N, c, d_k] and the cumulative log decays Γ [N, c, d_k] of each chunk; and what
    `intra_chunk_backward` needs (a list of tensors).

    Without an [N, c, c, d_k] tensor of decays, and without a positive exponent: the chunk (padded to a power of two)
    is halved recursively. At the level of blocks of b tokens, for each pair of neighbouring blocks with r the last
    token of the first, the entries (i in the second block, j in the first) are one product through r,
        exp(Γᵢ − Γⱼ) = exp(Γᵢ − Γ_r) exp(Γ_r − Γⱼ),  i.e.  (Qγ; Kγ) Kδᵀ,  Qγ = Q ⊙ exp(Γ − Γ_r),  Kδ = K ⊙ exp(Γ_r − Γ),
    with both exponents ≤ 0 for g ≤ 0 (j ≤ r < i); the diagonal is Q_i · K_i. That is about 4 d_k elementwise
    operations per token and level, log₂ c levels, where a decay mask taken whole would cost c · d_k per token, and
    the factorisation (Q ⊙ exp Γ)(K ⊙ exp(−Γ))ᵀ through the chunk's start would overflow for strong decays.
    """
    c = q.shape[1]
    q, k, gam = _power_of_two(q), _power_of_two(k), _power_of_two(gam, gam=True)
    n_rows, c2, d_k = q.shape
    p, e = q.new_zeros(n_rows, c2, c2), q.new_zeros(n_rows, c2, c2)
    p.diagonal(dim1=1, dim2=2).copy_(torch.linalg.vecdot(q, k))
    saved = []
    b = c2 // 2
    while b:
        q_p, k_p, g_p = _pairs(q, b), _pairs(k, b), _pairs(gam, b)
        ref = g_p[:, :, 0, -1:]  # Γ_r
        grow = torch.sub(g_p[:, :, 1], ref).exp_()  # from r to the second block's tokens
        shrink = torch.sub(ref, g_p[:, :, 0]).exp_()  # from the first block's tokens to r
        rows = q.new_empty(n_rows, c2 // (2 * b), 2, b, d_k)  # (Qγ; Kγ)
        torch.mul(q_p[:, :, 1], grow, out=rows[:, :, 0])
        torch.mul(k_p[:, :, 1], grow, out=rows[:, :, 1])
        rows = rows.flatten(2, 3)
        cols = k_p[:, :, 0] * shrink  # Kδ
        blocks = torch.matmul(rows, cols.transpose(-1, -2)).permute(0, 2, 3, 1)  # [N, 2b, b, pairs]
        _block(p, b).copy_(blocks[:, :b])
        _block(e, b).copy_(blocks[:, b:])
        saved += [rows, cols, grow, shrink]
        b //= 2
    if c2 != c:
        p, e = p[:, :c, :c].contiguous(), e[:, :c, :c].contiguous()
    return p, e, saved


class DecaySums:
    """What the log decays g of a chunk receive, gathered as terms and added up with one matrix product.

    A term is a tensor x [N, c, d_k] of contributions placed at token positions, with a rule saying which g_t each
    position passes its contribution to; all rules here are "the g_t of a segment of tokens after (or from) that
    position", so dg = Σ_terms W_term x with fixed 0/1 matrices W [c, c]. The terms are written into one buffer Y
    [n_terms, c, N · d_k] (token-major, so that the sum is one GEMM, W [c, n_terms · c] @ Y, and not a cumulative sum
    per term, or a batched product over N small matrices), and no two contributions are subtracted: nothing
    cancels, as it would in dΓ's row sums minus its column sums.
    """

    def __init__(self, like: torch.Tensor, c: int, n_terms: int):
        self.c, self.rows, self.d = c, like.shape[0], like.shape[-1]
        self.buffer = like.new_empty(n_terms, c, self.rows, self.d)
        self.weights = like.new_zeros(c, n_terms, c)
        self.n = 0

    def term(self, weights: torch.Tensor) -> torch.Tensor:
        """A new term passing position x's contribution to g_u with weight weights[u, x]: its slot in the buffer as
        a view [N, c, d_k] to write into (uninitialised: every position must be written)."""
        self.weights[:, self.n] = weights.to(self.weights)
        self.n += 1
        return self.buffer[self.n - 1].transpose(0, 1)

    def level(self, b: int) -> torch.Tensor:
        """The term of a level of `intra_chunk` with blocks of b tokens: a second block's position i passes to its
        block's g_t with t ≤ i (the exponent Γᵢ − Γ_r = g_{r+1} + … + gᵢ), a first block's position j to its
        block's g_t with t > j (Γ_r − Γⱼ = g_{j+1} + … + g_r)."""
        u, x = torch.arange(self.c).unsqueeze(1), torch.arange(self.c)
        same, second = u // b == x // b, (u // b) % 2 == 1
        return self.term(same & torch.where(second, x >= u, x < u))

    def add_to(self, d_g: torch.Tensor):
        """d_g [N, c', d_k] (c' ≤ c) += the sum of the terms."""
        total = torch.mm(self.weights.view(self.c, -1), self.buffer.view(-1, self.rows * self.d))
        d_g += total.view(self.c, self.rows, self.d)[:d_g.shape[1]].transpose(0, 1)


def intra_chunk_backward(d_p: torch.Tensor, d_e: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         saved: list[torch.Tensor], sums: DecaySums) -> tuple[torch.Tensor, torch.Tensor]:
    """dQ and dK [N, c, d_k] of `intra_chunk` from dP and dE [N, c, c] (their entries outside P's and E's triangles
    are not read) and what it saved; g's share goes into `sums` (one term per level, `DecaySums.level`)."""
    c = q.shape[1]
    q, k = _power_of_two(q), _power_of_two(k)
    c2 = q.shape[1]
    if c2 != c:
        d_p, d_e = (torch.nn.functional.pad(x, (0, c2 - c, 0, c2 - c)) for x in (d_p, d_e))
    diagonal = d_p.diagonal(dim1=1, dim2=2).unsqueeze(-1)
    d_q, d_k = diagonal * k, diagonal * q
    b = c2 // 2
    for level in range(len(saved) // 4):
        rows, cols, grow, shrink = saved[4 * level:4 * level + 4]
        d_blocks = torch.cat((_block(d_p, b), _block(d_e, b)), 1).permute(0, 3, 1, 2)  # [N, pairs, 2b, b]
        d_rows = _matmul(d_blocks, cols).unflatten(2, (2, b))  # d(Qγ; Kγ) [N, pairs, 2, b, d_k]
        d_cols = _matmul(d_blocks.transpose(-1, -2), rows)  # dKδ
        rows = rows.view(d_rows.shape)
        term = _pairs(sums.level(b), b)
        torch.mul(d_rows[:, :, 0], rows[:, :, 0], out=term[:, :, 1]).addcmul_(d_rows[:, :, 1], rows[:, :, 1])
        torch.mul(d_cols, cols, out=term[:, :, 0])
        _pairs(d_q, b)[:, :, 1].addcmul_(d_rows[:, :, 0], grow)
        _pairs(d_k, b)[:, :, 1].addcmul_(d_rows[:, :, 1], grow)
        _pairs(d_k, b)[:, :, 0].addcmul_(d_cols, shrink)
        b //= 2
    return d_q[:, :c], d_k[:, :c]


class KdaChunks(torch.autograd.Function):
    """The chunkwise KDA with a hand-written backward (the equations: `kda_chunked`).

    Inputs are chunk-major (`Chunking`): q, k [N, c, d_k], v [N, c, d_v], beta [N, c, 1] and g [N, c, d_k],
    N = n · bh; s_init [bh, d_k, d_v]. Returns O [N, c, d_v] and the final S [bh, d_k, d_v]. Not twice
    differentiable.

    Per chunk, with Γ the cumulative sum of g, P and E from `intra_chunk`, A = strictly_lower(diag(β) E),
    T = (I + A)⁻¹, Tβ = T diag(β), the decayed rows Qγ = Q ⊙ exp(Γ), Kγ = K ⊙ exp(Γ), Kδ = K ⊙ exp(Γ_c − Γ),
    γ_c = exp(Γ_c) and S the state at the chunk's start:
        R = V − Kγ S,   U = Tβ R,   O = Qγ S + P U,   S' = Diag(γ_c) S + Kδᵀ U
    (Qγ and Kγ stacked, [Qγ; Kγ] S is one product.)

    Backward for chunk j (dO given, dS' from the later chunks):
        dU = Pᵀ dO + Kδ dS',   dR = Tβᵀ dU (= dV),   dS = Diag(γ_c) dS' + [Qγ; Kγ]ᵀ [dO; −dR]
        [dQγ; dKγ] = [dO; −dR] Sᵀ,   dKδ = U dS'ᵀ,   dγ_c = rowsum(S ⊙ dS')
    then for all chunks at once: dP = dO Uᵀ and T's part as in the delta rule (dA = −Tᵀ dT Tᵀ, dE = diag(β) dA),
    which `intra_chunk_backward` takes to dQ, dK and g; and g's other parts, taken directly rather than through Γ
    (`DecaySums`): γᵢ = exp(Γᵢ) passes aᵢ = dQγᵢ ⊙ Qγᵢ + dKγᵢ ⊙ Kγᵢ to g_t for t ≤ i, δᵢ = exp(Γ_c − Γᵢ) passes
    bᵢ = dKδᵢ ⊙ Kδᵢ to g_t for t > i, and γ_c passes γ_c ⊙ dγ_c to every g_t of the chunk. Only the dS recurrence
    is sequential.
    """

    @staticmethod
    def forward(ctx, q, k, v, beta, g, s_init, n: int, bh: int):
        c = q.shape[1]
        gam = g.cumsum(1)  # Γ, the cumulative log decay within each chunk, per channel
        p, e, levels = intra_chunk(q, k, gam)
        t = unit_lower_inverse((e * beta).tril_(-1))
        t_beta = t * beta.transpose(1, 2)
        grow = gam.exp()  # γ (from the chunk's start to token i; ≤ 1)
        shrink = (gam[:, -1:] - gam).exp_()  # δ (from token i to the chunk's end; ≤ 1)
        qk_g = q.new_empty(q.shape[0], 2 * c, q.shape[2])  # [Qγ; Kγ]
        torch.mul(q, grow, out=qk_g[:, :c])
        torch.mul(k, grow, out=qk_g[:, c:])
        k_d = k * shrink
        k_d_t = k_d.transpose(1, 2).contiguous()  # (bmm is slow on CPU with a transposed operand)
        gam_last = grow[:, -1:].transpose(1, 2).contiguous()  # [N, d_k, 1]: γ_c scales the rows of S
        states = s_init.new_empty(n + 1, *s_init.shape)
        states[0] = s_init
        r, u, out = (torch.empty_like(v) for _ in range(3))
        qk_s = v.new_empty(bh, 2 * c, v.shape[2])
        q_s, k_s = qk_s[:, :c], qk_s[:, c:]
        by_chunk = [x.unflatten(0, (n, bh)) for x in (qk_g, k_d_t, v, gam_last, t_beta, p, r, u, out)]
        for j, (qk_g_j, k_d_t_j, v_j, gl_j, t_beta_j, p_j, r_j, u_j, out_j) in enumerate(zip(*by_chunk)):
            s = states[j]
            torch.bmm(qk_g_j, s, out=qk_s)  # [Qγ; Kγ] S
            torch.sub(v_j, k_s, out=r_j)  # R = V − Kγ S
            torch.bmm(t_beta_j, r_j, out=u_j)  # U = Tβ R
            torch.baddbmm(q_s, p_j, u_j, out=out_j)  # O = Qγ S + P U
            torch.mul(s, gl_j, out=states[j + 1]).baddbmm_(k_d_t_j, u_j)  # S' = Diag(γ_c) S + Kδᵀ U
        ctx.save_for_backward(q, k, beta, e, grow, shrink, qk_g, k_d, t, t_beta, p, r, u, states, *levels)
        ctx.n, ctx.bh, ctx.exact = n, bh, q.dtype
        return out, states[n].clone()

    @staticmethod
    def backward(ctx, d_out, d_s_final):
        # backward() may be called inside an autocast block: its products stay in the forward's float32
        with torch.autocast(d_out.device.type, enabled=False):
            return KdaChunks._backward(ctx, d_out.to(ctx.exact), d_s_final.to(ctx.exact))

    @staticmethod
    def _backward(ctx, d_out, d_s_final):
        q, k, beta, e, grow, shrink, qk_g, k_d, t, t_beta, p, r, u, states, *levels = ctx.saved_tensors
        n, bh = ctx.n, ctx.bh
        n_rows, c = q.shape[:2]
        d_or = d_out.new_empty(n_rows, 2 * c, d_out.shape[2])  # [dO; −dR]
        d_or[:, :c] = d_out
        d_u = torch.bmm(p.transpose(1, 2), d_or[:, :c])  # the loop adds Kδ dS'
        neg_t_beta_t = t_beta.transpose(1, 2).neg()  # −Tβᵀ
        d_qk_g, d_k_d = torch.empty_like(qk_g), torch.empty_like(k)
        d_gl = grow.new_empty(n_rows, grow.shape[2])  # dγ_c, [N, d_k]
        ds = d_s_final.clone(memory_format=torch.contiguous_format)  # updated in place below
        by_chunk = [x.unflatten(0, (n, bh)) for x in (qk_g, k_d, neg_t_beta_t, u, d_or, d_u, d_qk_g, d_k_d, d_gl,
                                                      grow)]
        for j in reversed(range(n)):
            qk_g_j, k_d_j, neg_t_beta_t_j, u_j, d_or_j, d_u_j, d_qk_g_j, d_k_d_j, d_gl_j, grow_j = (
                x[j] for x in by_chunk)
            s = states[j]
            s_t = s.transpose(1, 2).contiguous()  # (once per chunk, instead of a copy inside each bmm)
            torch.linalg.vecdot(s, ds, out=d_gl_j)  # dγ_c = rowsum(S ⊙ dS')
            d_u_j.baddbmm_(k_d_j, ds)  # dU = Pᵀ dO + Kδ dS'
            torch.bmm(neg_t_beta_t_j, d_u_j, out=d_or_j[:, c:])  # −dR = −Tβᵀ dU
            torch.bmm(d_or_j, s_t, out=d_qk_g_j)  # [dQγ; dKγ] = [dO; −dR] Sᵀ
            torch.bmm(u_j, ds.transpose(1, 2), out=d_k_d_j)  # dKδ = U dS'ᵀ
            ds.mul_(grow_j[:, -1:].transpose(1, 2)).baddbmm_(qk_g_j.transpose(1, 2), d_or_j)  # dS
        d_r = d_or[:, c:].neg()  # dV
        d_beta, d_p, neg_d_e = _triangular_gradients(beta, e, t, r, d_out, d_u, u)
        sums = DecaySums(q, 1 << (c - 1).bit_length(), 2 + len(levels) // 4)
        d_q, d_k = intra_chunk_backward(d_p, neg_d_e.neg_(), q, k, levels, sums)
        # the rows scaled by γ and δ, and the state by γ_c
        d_q_g, d_k_g = d_qk_g[:, :c], d_qk_g[:, c:]
        d_q.addcmul_(d_q_g, grow)
        d_k.addcmul_(d_k_g, grow).addcmul_(d_k_d, shrink)
        after = torch.arange(sums.c).unsqueeze(0) >= torch.arange(sums.c).unsqueeze(1)  # [t, i]: i ≥ t
        a = sums.term(after)  # γᵢ = exp(Γᵢ) holds g_t for t ≤ i
        torch.mul(d_q_g, qk_g[:, :c], out=a[:, :c]).addcmul_(d_k_g, qk_g[:, c:])
        b = sums.term(~after)  # δᵢ = exp(Γ_c − Γᵢ) holds g_t for t > i
        torch.mul(d_k_d, k_d, out=b[:, :c])
        if sums.c != c:  # (the positions `intra_chunk` padded)
            a[:, c:] = b[:, c:] = 0
        d_g = (d_gl * grow[:, -1]).unsqueeze(1).expand(-1, c, -1).clone()  # γ_c ⊙ dγ_c, to every token of the chunk
        sums.add_to(d_g)
        return d_q, d_k, d_r, d_beta, d_g, ds, None, None


def _triangular_gradients(beta, e, t, r, d_out, d_u, u):
    """dβ, dP and −dE of the UT transform U = T diag(β) R, T = (I + A)⁻¹, A = strictly_lower(diag(β) E), and of
    O ∋ P U (as in the delta rule's backward)."""
    d_p = torch.bmm(d_out, u.transpose(1, 2))  # dO Uᵀ (what lies above the diagonal meets M's zeros)
    d_t_beta = torch.bmm(d_u, r.transpose(1, 2))
    d_beta = (d_t_beta * t).sum(1).unsqueeze(-1)  # dβ ∋ colsum(dTβ ⊙ T)
    t_t = t.transpose(1, 2).contiguous()
    d_a_neg = torch.bmm(torch.bmm(t_t, d_t_beta.mul_(beta.transpose(1, 2))), t_t).tril_(-1)  # −dA
    d_beta -= (d_a_neg * e).sum(-1, keepdim=True)  # dβ ∋ rowsum(dA ⊙ E)
    return d_beta, d_p, d_a_neg.mul_(beta)  # −dE = −diag(β) dA


def kda_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
                state: Optional[torch.Tensor] = None, chunk_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA, chunkwise-parallel: the WY/UT form of the delta rule (Yang et al. 2024) with per-channel decays.

    With S = Wᵀ [d_k, d_v], a chunk of C tokens (rows Q, K [C, d_k], V [C, d_v]) starting from S₀, and
    Γᵢ = g₁ + … + gᵢ [d_k] the log decay of each channel from the chunk's start to token i, the pseudo-values
    uᵢ = βᵢ (vᵢ − (Diag(exp gᵢ) Sᵢ₋₁)ᵀ kᵢ) give Sₜ = Diag(exp Γₜ) S₀ + Σ_{j≤t} Diag(exp(Γₜ − Γⱼ)) kⱼ uⱼᵀ, so

        (I + A) U = diag(β) (V − (K ⊙ exp Γ) S₀),   A = strictly_lower(diag(β) E),   E_ij = Σ_c K_ic K_jc M_ijc
        O = (Q ⊙ exp Γ) S₀ + P U,   P_ij = Σ_c Q_ic K_jc M_ijc (j ≤ i)
        S_C = Diag(exp Γ_C) S₀ + (K ⊙ exp(Γ_C − Γ))ᵀ U,      M_ijc = exp(Γᵢ,c − Γⱼ,c)

    (I + A)⁻¹ is one batched unit-triangular solve per chunk; only the S recurrence is sequential. P and E come from
    `intra_chunk`, which takes every decay M_ijc through an intermediate token, as a product of two factors ≤ 1 for
    g ≤ 0, so that nothing overflows however strong the decay (the usual factorisation (Q ⊙ exp Γ)(K ⊙ exp(−Γ))ᵀ
    overflows within a few tokens of strong decay), and never forms the [C, C, d_k] tensor M. A sequence whose
    length is not a multiple of C is padded with k = v = β = g = 0, which leave the state unchanged. With g the same
    on every channel this is `gated_delta_rule_chunked`'s computation.

    Args:
        q, k, v, beta, g, state: see the module docstring.
        chunk_size: C, tokens per chunk (≥ 1); clipped to seq_len. A power of two spares `intra_chunk` its padding;
            on a CPU (d_k 32, one thread) 8 and 16 are about equally fast.

    Returns:
        y [seq_len, batch, heads, d_v] (v's dtype) and the final state [batch, heads, d_v, d_k] (float32, or
        float64 for float64 inputs).

    Raises:
        ValueError: shapes that do not fit together (named), or chunk_size < 1.
    """
    beta, g = _check(q, k, v, beta, g, state, token=False)
    check_chunk_size('kda_chunked', chunk_size)
    d_v, d_k = v.shape[-1], q.shape[-1]
    if q.shape[0] == 0:
        return empty_sequence(v, state, d_v, d_k)
    layout = Chunking.of(q, chunk_size, exact_dtype(v.dtype))
    with torch.autocast(q.device.type, enabled=False):
        chunks = [layout.chunks(x) for x in (q, k, v, beta.unsqueeze(-1), g)]
        out, s = KdaChunks.apply(*chunks, layout.initial_state(state, d_v, d_k), layout.n, layout.bh)
    return layout.unchunk(out).to(v.dtype), layout.final_state(s)
