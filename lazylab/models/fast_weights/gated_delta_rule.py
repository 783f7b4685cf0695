"""The gated delta rule (Gated DeltaNet), computed three ways.

Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with Delta Rule" (ICLR 2025), eq. (10):
the delta rule of fast-weight attention (Schlag, Irie & Schmidhuber 2021) with a data-dependent decay αᵢ = exp(gᵢ)
of the whole memory before each write. Per batch element and head, with keys and queries already mapped by the
feature map φ' (size d_dot), values of size d_v, a write strength βᵢ and a log decay gᵢ ≤ 0:

    W ← exp(gᵢ) · W                    (forget: every stored association fades by αᵢ ∈ (0, 1])
    W ← W + βᵢ (vᵢ − W kᵢ) ⊗ kᵢ         (the delta rule's write)
    yᵢ = W qᵢ                          (read with the updated weights; no extra scaling of q)

i.e. Wᵢ = Wᵢ₋₁ αᵢ (I − βᵢ kᵢ kᵢᵀ) + βᵢ vᵢ kᵢᵀ. With g = 0 it is the delta rule (`delta_rule.py`); β ∈ (0, 2)
(`negative_eigenvalues` of the modules: β = 2σ(·), Grazzi et al. 2025) lets I − β k kᵀ have a negative eigenvalue
for unit keys.

* `gated_delta_rule_step`    one token (generation); `gated_delta_rule_step_unchecked` without the shape checks.
* `gated_delta_rule_loop`    the equations above, token by token: the reference (equal to flash-linear-attention's
  `naive_recurrent_gated_delta_rule` with scale = 1, in the tests).
* `gated_delta_rule_chunked` chunkwise-parallel: the delta rule's WY/UT form with the decays inside a chunk as
  cumulative sums Γ of g, applied as masks exp(Γᵢ − Γⱼ) (`GatedChunks`; the derivation is in README.md beside this
  file), with a hand-written backward.

Shapes, sequence-first (as `delta_rule.py`):
    q, k: [seq_len, batch, heads, d_dot];  v: [seq_len, batch, heads, d_v];
    beta, g: [seq_len, batch, heads] (beta may have a trailing 1);  state: [batch, heads, d_v, d_dot] or None
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
from lazylab.models.fast_weights.delta_rule import ChunkedDeltaRule, delta_rule_step_unchecked, unit_lower_inverse

__all__ = ['gated_delta_rule_step', 'gated_delta_rule_step_unchecked', 'gated_delta_rule_loop',
           'gated_delta_rule_chunked', 'chunked_rule', 'decay_state', 'check_gate', 'GatedChunks']


def check_gate(rule: str, name: str, x: torch.Tensor, expected: tuple[int, ...], trailing_one: bool = False
               ) -> torch.Tensor:
    """x of shape `expected` (or with a trailing 1 when `trailing_one`), returned without it.

    Raises:
        ValueError: naming `rule`, `name` and both shapes.
    """
    if trailing_one and x.dim() == len(expected) + 1 and x.shape[-1] == 1:
        x = x.squeeze(-1)
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{rule}: {name} must have shape {tuple(expected)}"
                         f"{' (or with a trailing 1)' if trailing_one else ''}; got {tuple(x.shape)}")
    return x


def _check(q, k, v, beta, g, state, token: bool):
    check_qkv_state('gated delta rule', q, k, v, state, token)
    beta = check_gate('gated delta rule', 'beta', beta, q.shape[:-1], trailing_one=True)
    return beta, check_gate('gated delta rule', 'g', g, q.shape[:-1])


def decay_state(state: Optional[torch.Tensor], g: torch.Tensor) -> Optional[torch.Tensor]:
    """exp(g) · W for W [batch, heads, d_v, d_dot] (None stays None: zeros decay to zeros) and g [batch, heads], in
    the exact dtype. Call it with autocast off."""
    if state is None:
        return None
    exact = exact_dtype(state.dtype)
    return state.to(exact) * g.to(exact).exp()[..., None, None]


def gated_delta_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
                          state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: W ← exp(g) W, then the delta rule's write and read (see the module docstring).

    Args:
        q, k: [batch, heads, d_dot].
        v: [batch, heads, d_v].
        beta: [batch, heads] (or [batch, heads, 1]).
        g: [batch, heads], the log decay (≤ 0).
        state: W [batch, heads, d_v, d_dot]; None means zeros.

    Returns:
        y [batch, heads, d_v] and the new state W (float32, or float64 for float64 inputs).

    Raises:
        ValueError: shapes that do not fit together (the message names them).
    """
    beta, g = _check(q, k, v, beta, g, state, token=True)
    return gated_delta_rule_step_unchecked(q, k, v, beta.unsqueeze(-1), g, state)


def gated_delta_rule_step_unchecked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                                    g: torch.Tensor, state: Optional[torch.Tensor]
                                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """`gated_delta_rule_step` without the shape checks, beta as [batch, heads, 1] (for a generation step
    function)."""
    with no_autocast(q.device.type):
        return delta_rule_step_unchecked(q, k, v, beta, decay_state(state, g))


def gated_delta_rule_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
                          state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token, written as the equations (the reference). O(seq_len) sequential steps.

    Args:
        q, k: [seq_len, batch, heads, d_dot] (after the feature map φ').
        v: [seq_len, batch, heads, d_v].
        beta: [seq_len, batch, heads] (or with a trailing 1), the write strengths.
        g: [seq_len, batch, heads], the log decays (≤ 0).
        state: the fast weights before the first token, [batch, heads, d_v, d_dot]; None means zeros.

    Returns:
        y: [seq_len, batch, heads, d_v] and the final state [batch, heads, d_v, d_dot].

    Raises:
        ValueError: shapes that do not fit together (the message names them).
    """
    beta, g = _check(q, k, v, beta, g, state, token=False)
    seq_len, batch, heads, d_dot = q.shape
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, beta, g = (t.to(exact) for t in (q, k, v, beta, g))
        weights = state.to(exact) if state is not None else q.new_zeros(batch, heads, v.shape[-1], d_dot)
        ys = []
        for i in range(seq_len):
            weights = g[i].exp()[..., None, None] * weights  # W ← exp(gᵢ) W
            k_i, q_i, beta_i = k[i].unsqueeze(-1), q[i].unsqueeze(-1), beta[i, ..., None, None]  # columns
            v_bar = weights @ k_i  # v̄ᵢ = W kᵢ
            weights = weights + beta_i * (v[i].unsqueeze(-1) - v_bar) @ k_i.transpose(-1, -2)  # W + βᵢ (vᵢ − v̄ᵢ) ⊗ kᵢ
            ys.append((weights @ q_i).squeeze(-1))  # yᵢ = W qᵢ
    if seq_len == 0:
        return v.new_zeros(v.shape, dtype=out_dtype), weights
    return torch.stack(ys).to(out_dtype), weights


def _decay_masks(gamma: torch.Tensor):
    """From the cumulative log decays Γ [N, c, 1] of each chunk: D = exp(Γᵢ − Γⱼ) for j ≤ i, 0 above the diagonal
    [N, c, c]; γ = exp(Γ) [N, c, 1] (from the chunk's start to token i); δ = exp(Γ_c − Γ) [N, c, 1] (from token i
    to the chunk's end). Only differences Γᵢ − Γⱼ ≤ 0 are exponentiated (for g ≤ 0), never a large positive number:
    the entries above the diagonal are set to −∞ before exp."""
    diff = gamma - gamma.transpose(1, 2)
    upper = torch.ones(diff.shape[-2:], dtype=torch.bool, device=diff.device).triu_(1)
    decay = diff.masked_fill_(upper, float('-inf')).exp_()
    return decay, gamma.exp(), (gamma[:, -1:] - gamma).exp_()


class GatedChunks(torch.autograd.Function):
    """The chunkwise gated delta rule with a hand-written backward (the equations: README.md, and
    `gated_delta_rule_chunked`).

    Inputs are chunk-major (`Chunking`): q, k [N, c, d_dot], v [N, c, d_v], beta and g [N, c, 1], N = n · bh;
    s_init [bh, d_dot, d_v]. Γ is the cumulative sum of g within each chunk. Returns O [N, c, d_v] and the
    final S [bh, d_dot, d_v]. Not twice differentiable.

    Per chunk, with D, γ, δ the decay masks (`_decay_masks`), P = QKᵀ ⊙ D, A = strictly_lower(diag(β) E),
    E = KKᵀ ⊙ D, T = (I + A)⁻¹, Tβ = T diag(β), and S the state at the chunk's start:
        R = V − γ ⊙ (K S),   U = Tβ R,   O = γ ⊙ (Q S) + P U,   S' = γ_c S + Kᵀ (δ ⊙ U)
    (x ⊙ M scales row i of M by xᵢ; γ ⊙ (K S) is diag(γ) K S: the decayed keys are never formed.)

    Backward for chunk j (dO given, dS' from the later chunks), with dOγ = γ ⊙ dO:
        dU = Pᵀ dO + δ ⊙ (K dS'),   dR = Tβᵀ dU (= dV),   dS = γ_c dS' + Qᵀ dOγ − Kᵀ (γ ⊙ dR)
        dQ ∋ dOγ Sᵀ,   dK ∋ (δ ⊙ U) dS'ᵀ − (γ ⊙ dR) Sᵀ,   dγ_c = ⟨S, dS'⟩
    then for all chunks at once: dP = dO Uᵀ, dQ ∋ (dP ⊙ D) K, dK ∋ (dP ⊙ D)ᵀ Q; T's part as in the delta rule
    (dA = −Tᵀ dT Tᵀ, dE = diag(β) dA, dK ∋ (dE ⊙ D + (dE ⊙ D)ᵀ) K); and g's, with one more c × c product: the mask
    entry exp(Γᵢ − Γⱼ) = exp(g_{j+1} + … + gᵢ) gives H_ij = dP_ij P_ij + dE_ij E_ij to every g_t with j < t ≤ i, so
    dg_t = Σ_{i≥t} Σ_{j<t} H_ij (a block sum: no large terms cancel, as they would in rowsum(H) − colsum(H));
    γᵢ = exp(Γᵢ) gives aᵢ = ⟨dOᵢ, γᵢ (Q S)ᵢ⟩ − ⟨dRᵢ, Vᵢ − Rᵢ⟩ (the rows it scales, read back from O's and R's
    parts) to g_t for t ≤ i; δᵢ = exp(Γ_c − Γᵢ) gives bᵢ = ⟨(δ ⊙ U)ᵢ, (K dS')ᵢ⟩ to g_t for t > i; γ_c gives
    γ_c ⟨S, dS'⟩ to every g_t of the chunk. Only the dS recurrence is sequential.
    """

    @staticmethod
    def forward(ctx, q, k, v, beta, g, s_init, n: int, bh: int):
        decay, gam, delta = _decay_masks(g.cumsum(1))  # Γ, the cumulative log decay within each chunk
        k_t = k.transpose(1, 2).contiguous()  # (bmm is slow on CPU with a transposed right-hand operand)
        e = torch.bmm(k, k_t).mul_(decay)  # E = K Kᵀ ⊙ D
        t = unit_lower_inverse((e * beta).tril_(-1))
        t_beta = t * beta.transpose(1, 2)
        p = torch.bmm(q, k_t).mul_(decay)  # Q Kᵀ ⊙ D: lower, diagonal included (yᵢ reads W⁽ⁱ⁾)
        gam_last = gam[:, -1:]  # [N, 1, 1]: γ_c of each chunk
        states = s_init.new_empty(n + 1, *s_init.shape)
        states[0] = s_init
        r, u, u_d, out = (torch.empty_like(v) for _ in range(4))
        q_s = v.new_empty(bh, *v.shape[1:])
        by_chunk = [x.unflatten(0, (n, bh)) for x in (q, k, k_t, v, gam, delta, gam_last, t_beta, p, r, u, u_d, out)]
        for j, (q_j, k_j, k_t_j, v_j, gam_j, delta_j, gl_j, t_beta_j, p_j, r_j, u_j, u_d_j, out_j) in enumerate(
                zip(*by_chunk)):
            s = states[j]
            torch.bmm(k_j, s, out=r_j)
            torch.addcmul(v_j, r_j, gam_j, value=-1, out=r_j)  # R = V − γ ⊙ (K S)
            torch.bmm(t_beta_j, r_j, out=u_j)  # U = Tβ R
            torch.bmm(q_j, s, out=q_s).mul_(gam_j)  # γ ⊙ (Q S)
            torch.baddbmm(q_s, p_j, u_j, out=out_j)  # O = γ ⊙ (Q S) + P U
            torch.mul(u_j, delta_j, out=u_d_j)
            torch.mul(s, gl_j, out=states[j + 1]).baddbmm_(k_t_j, u_d_j)  # S' = γ_c S + Kᵀ (δ ⊙ U)
        ctx.save_for_backward(q, k, beta, e, decay, gam, delta, t, t_beta, p, r, u, u_d, states)
        ctx.n, ctx.bh, ctx.exact = n, bh, q.dtype
        return out, states[n].clone()

    @staticmethod
    def backward(ctx, d_out, d_s_final):
        # backward() may be called inside an autocast block: its products stay in the forward's float32
        with torch.autocast(d_out.device.type, enabled=False):
            return GatedChunks._backward(ctx, d_out.to(ctx.exact), d_s_final.to(ctx.exact))

    @staticmethod
    def _backward(ctx, d_out, d_s_final):
        q, k, beta, e, decay, gam, delta, t, t_beta, p, r, u, u_d, states = ctx.saved_tensors
        n, bh = ctx.n, ctx.bh
        d_out = d_out.contiguous()
        d_og = d_out * gam  # dOγ = γ ⊙ dO
        d_u = torch.bmm(p.transpose(1, 2), d_out)  # the loop adds δ ⊙ (K dS')
        d_q, d_k, d_r = torch.empty_like(q), torch.empty_like(k), torch.empty_like(d_u)
        k_ds, d_rg = d_u.new_empty(bh, *d_u.shape[1:]), d_u.new_empty(bh, *d_u.shape[1:])
        rs = k.new_empty(bh, *k.shape[1:])
        # per token: aᵢ (what γᵢ scales), bᵢ (what δᵢ scales), and per chunk dγ_c; row-dots taken while in cache
        a, b, d_gl = gam.new_empty(gam.shape[:2]), gam.new_empty(gam.shape[:2]), gam.new_empty(gam.shape[0], 1)
        ds = d_s_final.clone(memory_format=torch.contiguous_format)  # updated in place below
        by_chunk = [x.unflatten(0, (n, bh)) for x in (q, k, gam, delta, t_beta, u_d, d_og, d_u, d_r, d_q, d_k, a, b,
                                                      d_gl)]
        vecdot = torch.linalg.vecdot
        for j in reversed(range(n)):
            q_j, k_j, gam_j, delta_j, t_beta_j, u_d_j, d_og_j, d_u_j, d_r_j, d_q_j, d_k_j, a_j, b_j, d_gl_j = (
                x[j] for x in by_chunk)
            s = states[j]
            s_t = s.transpose(1, 2).contiguous()  # (once per chunk, instead of a copy inside each bmm)
            vecdot(s.flatten(1), ds.flatten(1), out=d_gl_j.view(bh))  # dγ_c = ⟨S, dS'⟩
            torch.bmm(k_j, ds, out=k_ds)
            d_u_j.addcmul_(k_ds, delta_j)  # dU = Pᵀ dO + δ ⊙ (K dS')
            torch.bmm(t_beta_j.transpose(1, 2), d_u_j, out=d_r_j)  # dR = Tβᵀ dU
            torch.mul(d_r_j, gam_j, out=d_rg)
            torch.bmm(u_d_j, ds.transpose(1, 2), out=d_k_j)  # (δ ⊙ U) dS'ᵀ
            vecdot(d_k_j, k_j, out=b_j)  # bᵢ = ⟨(δ ⊙ U)ᵢ, (K dS')ᵢ⟩
            torch.bmm(d_rg, s_t, out=rs)
            d_k_j.sub_(rs)  # − (γ ⊙ dR) Sᵀ
            torch.bmm(d_og_j, s_t, out=d_q_j)  # (γ ⊙ dO) Sᵀ
            vecdot(d_q_j, q_j, out=a_j).sub_(vecdot(rs, k_j))  # aᵢ = ⟨dOᵢ, γᵢ (Q S)ᵢ⟩ − ⟨dRᵢ, γᵢ (K S)ᵢ⟩
            ds.mul_(gam_j[:, -1:]).baddbmm_(q_j.transpose(1, 2), d_og_j).baddbmm_(k_j.transpose(1, 2), d_rg, alpha=-1)
        d_beta, d_g = _parallel_gradients(q, k, beta, e, decay, gam, t, p, r, u, d_out, d_u, a, b, d_gl, d_q, d_k)
        return d_q, d_k, d_r, d_beta, d_g, ds, None, None


def _parallel_gradients(q, k, beta, e, decay, gam, t, p, r, u, d_out, d_u, a, b, d_gl, d_q, d_k):
    """The gradients of everything but the state recurrence (`GatedChunks`), batched over all chunks: adds to dQ
    and dK in place; returns dβ and dg."""
    d_p = torch.bmm(d_out, u.transpose(1, 2))  # dO Uᵀ (what lies above the diagonal meets D's zeros)
    m = d_p * decay  # through P = Q Kᵀ ⊙ D
    d_q.baddbmm_(m, k)
    d_k.baddbmm_(m.transpose(1, 2), q)
    h = d_p.mul_(p)  # H from P: dD ⊙ D = dP ⊙ Q Kᵀ ⊙ D
    # Tβ = T diag(β): dT = dTβ diag(β), dβ ∋ colsum(dTβ ⊙ T)
    d_t_beta = torch.bmm(d_u, r.transpose(1, 2))
    d_beta = (d_t_beta * t).sum(1).unsqueeze(-1)
    t_t = t.transpose(1, 2).contiguous()
    # T = (I + A)⁻¹, A = strictly_lower(diag(β) E):  −dA = strictly_lower(Tᵀ dT Tᵀ)
    d_a_neg = torch.bmm(torch.bmm(t_t, d_t_beta.mul_(beta.transpose(1, 2))), t_t).tril_(-1)
    d_beta -= (d_a_neg * e).sum(-1, keepdim=True)  # dβ ∋ rowsum(dA ⊙ E)
    neg_d_e = d_a_neg.mul_(beta)  # −dE = −diag(β) dA
    h.addcmul_(neg_d_e, e, value=-1)  # H from A: dE ⊙ E
    neg_d_e.mul_(decay)  # −d(K Kᵀ) = −dE ⊙ D
    d_k.baddbmm_(neg_d_e + neg_d_e.transpose(1, 2), k, alpha=-1)
    # dg, not dΓ (Γ = cumsum(g)): ∂ exp(Γᵢ − Γⱼ)/∂g_t = exp(Γᵢ − Γⱼ) for j < t ≤ i, so dg_t sums H over the block
    # of rows i ≥ t and columns j < t (summing dΓ = rowsum(H) − colsum(H) instead would cancel large terms in
    # float32); γᵢ = exp(Γᵢ) depends on g_t for t ≤ i, δᵢ = exp(Γ_c − Γᵢ) for t > i, γ_c on every g_t of the chunk
    c = h.shape[-1]
    before = torch.ones(c, c, dtype=h.dtype, device=h.device).triu_(1)  # [j, t]: j < t
    d_g = torch.matmul(h, before).tril_().sum(1)  # Σ_{i ≥ t} Σ_{j < t} H_ij
    d_g += torch.matmul(b, before)  # Σ_{i < t} bᵢ
    d_g += torch.matmul(a, before.T.add_(torch.eye(c, dtype=h.dtype, device=h.device)))  # Σ_{i ≥ t} aᵢ
    d_g += d_gl * gam[:, -1]
    return d_beta, d_g.unsqueeze(-1)


def gated_delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
                             state: Optional[torch.Tensor] = None, chunk_size: int = 64
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule, chunkwise-parallel (the delta rule's WY/UT form, Yang et al. 2024, with the decays of
    Gated DeltaNet inside each chunk as masks; derivation in README.md beside this file).

    With S = Wᵀ [d_dot, d_v], a chunk of C tokens (rows Q, K [C, d_dot], V [C, d_v]) starting from S₀, and
    Γᵢ = g₁ + … + gᵢ the log decay from the chunk's start to token i:

        S_t = exp(Γ_t) S₀ + Σ_{j≤t} exp(Γ_t − Γⱼ) kⱼ uⱼᵀ,
        (I + A) U = diag(β) (V − diag(exp Γ) K S₀),   A = strictly_lower(diag(β) (K Kᵀ ⊙ D)),   D_ij = exp(Γᵢ − Γⱼ)
        O = diag(exp Γ) Q S₀ + lower(Q Kᵀ ⊙ D) U,   S_C = exp(Γ_C) S₀ + (diag(exp(Γ_C − Γ)) K)ᵀ U

    (I + A)⁻¹ is one batched unit-triangular solve per chunk; only the S recurrence is sequential. Every exponent
    is a difference Γᵢ − Γⱼ with i ≥ j, so ≤ 0 for g ≤ 0: nothing overflows however strong the decay. A sequence
    whose length is not a multiple of C is padded with k = v = β = g = 0, which leave the state unchanged. With g = 0
    this is `delta_rule_chunked`'s computation.

    Args:
        q, k, v, beta, g, state: see the module docstring.
        chunk_size: C, tokens per chunk (≥ 1); clipped to seq_len.

    Returns:
        y [seq_len, batch, heads, d_v] (v's dtype) and the final state [batch, heads, d_v, d_dot] (float32, or
        float64 for float64 inputs).

    Raises:
        ValueError: shapes that do not fit together (named), or chunk_size < 1.
    """
    beta, g = _check(q, k, v, beta, g, state, token=False)
    check_chunk_size('gated_delta_rule_chunked', chunk_size)
    return chunked_rule(q, k, v, beta, g, state, chunk_size)


def chunked_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: Optional[torch.Tensor],
                 state: Optional[torch.Tensor], chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked delta rule (g None: `ChunkedDeltaRule`) or gated delta rule (`GatedChunks`) on checked inputs:
    q, k [seq_len, batch, heads, d_dot], v [seq_len, batch, heads, d_v], beta and g [seq_len, batch, heads]."""
    d_v, d_dot = v.shape[-1], q.shape[-1]
    if q.shape[0] == 0:
        return empty_sequence(v, state, d_v, d_dot)
    layout = Chunking.of(q, chunk_size, exact_dtype(v.dtype))
    with torch.autocast(q.device.type, enabled=False):
        chunks = [layout.chunks(x) for x in (q, k, v, beta.unsqueeze(-1))]
        s_init = layout.initial_state(state, d_v, d_dot)
        if g is None:
            out, s = ChunkedDeltaRule.apply(*chunks, s_init, layout.n, layout.bh)
        else:
            out, s = GatedChunks.apply(*chunks, layout.chunks(g.unsqueeze(-1)), s_init, layout.n, layout.bh)
    return layout.unchunk(out).to(v.dtype), layout.final_state(s)
