"""The delta rule of fast-weight attention, computed three ways.

Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly Fast Weight Programmers" (the delta-rule update).
Per batch element and head, with keys and queries already mapped by the feature map φ' (size d_dot),
values of size d_v and a write strength βᵢ ∈ (0, 1):

    v̄ᵢ = W⁽ⁱ⁻¹⁾ kᵢ                         (the value currently stored under kᵢ)
    W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + βᵢ (vᵢ − v̄ᵢ) ⊗ kᵢ       (replace it by a β-mix of old and new)
    yᵢ = W⁽ⁱ⁾ qᵢ                            (read with the updated weights; no extra scaling)

The fast weights W have shape [d_v, d_dot] per head, i.e. `[batch, heads, d_v, d_dot]` for a batch; this is
labml_nn's layout ('bhvk') and the state layout used throughout `lazylab.models.fast_weights`.

* `delta_rule_step`    one token; what generation uses (O(1) work per token); `delta_rule_step_unchecked` is
  the same without the shape checks.
* `delta_rule_loop`    the equations above, token by token: the slow, obviously-correct reference.
* `delta_rule_chunked` the chunkwise-parallel form (Yang, Wang, Zhang, Shen & Kim 2024, "Parallelizing Linear
  Transformers with the Delta Rule over Sequence Length"): within a chunk the product of the
  Householder-like updates is written in WY/UT form, (I + A)⁻¹ found by a batched triangular solve; only the
  [d_dot, d_v] state is carried from chunk to chunk.

All three take sequence-first tensors (the project's layout):
    q, k: [seq_len, batch, heads, d_dot];  v: [seq_len, batch, heads, d_v];  beta: [seq_len, batch, heads]
    (a trailing singleton, [seq_len, batch, heads, 1], is accepted too);  state: [batch, heads, d_v, d_dot] or None.
They return `(y, state)` with y: [seq_len, batch, heads, d_v] and the fast weights after the last token.

Precision: the state and every product that accumulates into it are float32 whatever the inputs' dtype (float64
for float64 inputs), also under autocast and in a backward pass started inside an autocast block; y comes back in
v's dtype, the state stays float32 (so carrying it from segment to segment loses nothing).
"""
from typing import Optional

import torch

from lazylab.models.fast_weights._chunks import (  # (exact_dtype, no_autocast, to_chunks, from_chunks: re-exported)
    Chunking,
    check_chunk_size,
    check_qkv_state,
    empty_sequence,
    exact_dtype,
    from_chunks,
    no_autocast,
    to_chunks,
)

__all__ = ['delta_rule_step', 'delta_rule_step_unchecked', 'delta_update_unchecked', 'delta_rule_loop',
           'delta_rule_chunked', 'unit_lower_inverse', 'exact_dtype', 'no_autocast', 'to_chunks', 'from_chunks']


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, state: Optional[torch.Tensor],
           token: bool):
    """Validate shapes; return beta without a trailing singleton axis."""
    check_qkv_state('delta rule', q, k, v, state, token)
    if beta.dim() == q.dim() and beta.shape[-1] == 1:
        beta = beta.squeeze(-1)
    if beta.shape != q.shape[:-1]:
        raise ValueError(f"delta rule: beta must have shape {tuple(q.shape[:-1])} (or with a trailing 1); "
                         f"got {tuple(beta.shape)}")
    return beta


def delta_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                    state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the delta rule, in the "Householder" form W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ (I − βᵢ kᵢ kᵢᵀ) + βᵢ vᵢ kᵢᵀ.

    Args:
        q, k: [batch, heads, d_dot] (after the feature map φ').
        v: [batch, heads, d_v].
        beta: [batch, heads] or [batch, heads, 1], the write strength βᵢ.
        state: fast weights W⁽ⁱ⁻¹⁾, [batch, heads, d_v, d_dot]; None means zeros.

    Returns:
        y: [batch, heads, d_v] = W⁽ⁱ⁾ qᵢ, and the new state W⁽ⁱ⁾ [batch, heads, d_v, d_dot].

    Raises:
        ValueError: if the shapes do not fit together.
    """
    return delta_rule_step_unchecked(q, k, v, _check(q, k, v, beta, state, token=True).unsqueeze(-1), state)


def delta_rule_step_unchecked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                              state: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`delta_rule_step` without its shape checks, with beta as [batch, heads, 1]: for a generation step function,
    which checks the state once per layer and token and needs nothing else checked (its q, k, v, β come from
    its own projection). Mismatched shapes broadcast or fail inside PyTorch here."""
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    with no_autocast(q.device.type):  # (vecdot may decompose into a matmul, which autocast would take to bf16)
        new_state = delta_update_unchecked(k, v, beta, state)
        return torch.linalg.vecdot(new_state, q.to(exact).unsqueeze(-2)).to(out_dtype), new_state


def delta_update_unchecked(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, state: Optional[torch.Tensor]
                           ) -> torch.Tensor:
    """One delta-rule write without the read: W + β (v − W k) ⊗ k, for k [batch, heads, d_dot], v [batch, heads,
    d_v], β [batch, heads, 1] and W [batch, heads, d_v, d_dot] or None (zeros); the new W in the exact dtype
    (float32, or float64 for float64 inputs). No shape checks; call it with autocast off."""
    # The state and its products in float32 (float64 for float64 inputs) whatever the inputs' dtype (bf16 under
    # autocast): `.to` is free for inputs already there.
    exact = exact_dtype(v.dtype)
    k, v, beta = k.to(exact), v.to(exact), beta.to(exact)
    # Matrix-vector products as vecdot: for one token, fewer operations than matmul's reshapes around a bmm.
    k_row = k.unsqueeze(-2)
    if state is None:
        # W⁽⁰⁾ = 0, so v̄ = 0 and the update is a plain outer product
        return (beta * v).unsqueeze(-1) * k_row
    state = state.to(exact)
    retrieved = torch.linalg.vecdot(state, k_row)  # v̄ᵢ = W kᵢ
    return torch.addcmul(state, (v - retrieved).mul_(beta).unsqueeze(-1), k_row)


def delta_rule_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                    state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule token by token, written as the paper's equations (the reference the fast form is tested
    against). O(seq_len) sequential steps.

    Args:
        q, k: [seq_len, batch, heads, d_dot] (after the feature map φ').
        v: [seq_len, batch, heads, d_v].
        beta: [seq_len, batch, heads] (or with a trailing 1), the write strengths βᵢ.
        state: the fast weights before the first token, [batch, heads, d_v, d_dot]; None means zeros.

    Returns:
        y: [seq_len, batch, heads, d_v] and the final state [batch, heads, d_v, d_dot].

    Raises:
        ValueError: if the shapes do not fit together.
    """
    beta = _check(q, k, v, beta, state, token=False)
    seq_len, batch, heads, d_dot = q.shape
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    with torch.autocast(q.device.type, enabled=False):  # the state and its products in float32 (see above)
        q, k, v, beta = q.to(exact), k.to(exact), v.to(exact), beta.to(exact)
        weights = state.to(exact) if state is not None else q.new_zeros(batch, heads, v.shape[-1], d_dot)
        ys = []
        for i in range(seq_len):
            k_i, q_i, beta_i = k[i].unsqueeze(-1), q[i].unsqueeze(-1), beta[i, ..., None, None]  # columns
            v_bar = weights @ k_i  # v̄ᵢ = W⁽ⁱ⁻¹⁾ kᵢ
            v_new = beta_i * v[i].unsqueeze(-1) + (1 - beta_i) * v_bar  # βᵢ vᵢ + (1 − βᵢ) v̄ᵢ
            weights = weights + (v_new - v_bar) @ k_i.transpose(-1, -2)  # W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + (v_new − v̄) ⊗ kᵢ
            ys.append((weights @ q_i).squeeze(-1))  # yᵢ = W⁽ⁱ⁾ qᵢ
    if seq_len == 0:
        return v.new_zeros(v.shape, dtype=out_dtype), weights
    return torch.stack(ys).to(out_dtype), weights


def unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    """(I + A)⁻¹ for strictly lower-triangular A [..., c, c] (the UT transform's T).

    A batched triangular solve against the identity with a unit diagonal assumed, so the zeros on A's diagonal are
    never read and I + A is never formed. On CPU (PyTorch 2.13) it is the fastest of the ways measured, for every
    chunk size from 8 to 64: at c = 16 a fifth of the time of the product series (I − A)(I + A²)(I + A⁴)…,
    at c = 64 a thirteenth. Exact up to rounding; with the sum-normalised keys of DPFP the entries of A are at
    most β kᵢ·kⱼ ≤ 1.

    Args:
        a: strictly lower-triangular [..., c, c] (its diagonal and upper part are not read).

    Returns:
        (I + A)⁻¹, [..., c, c], unit lower-triangular.
    """
    c = a.shape[-1]
    eye = torch.eye(c, dtype=a.dtype, device=a.device).expand(a.shape)
    return torch.linalg.solve_triangular(a, eye, upper=False, unitriangular=True)


class ChunkedDeltaRule(torch.autograd.Function):
    """The chunkwise delta rule with a hand-written backward (see `delta_rule_chunked` for the forward equations).

    Inputs are chunk-major: q, k: [N, c, d_dot], v: [N, c, d_v], beta: [N, c, 1] with N = n · bh (chunk j is
    rows j·bh … (j+1)·bh − 1); s_init: [bh, d_dot, d_v]. Returns O [N, c, d_v] and the final S [bh, d_dot, d_v].
    Not twice differentiable.

    Per chunk, with Tβ = T diag(β) and S the state at the chunk's start:
        R = V − K S,   U = Tβ R,   O = Q S + P U,   S' = S + Kᵀ U          (P = lower(Q Kᵀ))
    (U = Uc − Wc S of `delta_rule_chunked`, factored so that Wc and diag(β) K, V are never formed.)

    Layout of the work: everything inside a chunk (Q Kᵀ, K Kᵀ, T) is one batched product over all N chunks;
    everything that touches a state (d_dot × d_v per chunk, the largest operand) happens in the loop over chunks,
    batched over the bh heads, while that state is in cache. A batched product over all chunks' states streams
    n·bh·d_dot·d_v floats through memory for a handful of flops each: on CPU it runs at half speed.

    Backward, for chunk j (dO given, dS' flowing back from the later chunks):
        dU = Pᵀ dO + K dS',   dR = Tβᵀ dU  (= dV),   dS = dS' + Qᵀ dO − Kᵀ dR
        dQ = dO Sᵀ + dP K,    dK ∋ dPᵀ Q + U dS'ᵀ − dR Sᵀ,   dP = lower(dO Uᵀ)
        dTβ = dU Rᵀ  →  dT = dTβ diag(β),  dβ ∋ colsum(dTβ ⊙ T)
        dA = strictly_lower(−Tᵀ dT Tᵀ)    (T = (I + A)⁻¹, A = strictly_lower(diag(β) K Kᵀ))
        dK ∋ (β dA + (β dA)ᵀ) K,   dβ ∋ rowsum(dA ⊙ K Kᵀ)
    dA is carried with the opposite sign (saves negations); only the dS recurrence is sequential.
    """

    @staticmethod
    def forward(ctx, q, k, v, beta, s_init, n: int, bh: int):
        # bmm runs at a third of its speed on CPU with a transposed right-hand operand: Kᵀ is made once
        k_t = k.transpose(1, 2).contiguous()
        kkt = torch.bmm(k, k_t)
        t = unit_lower_inverse((beta * kkt).tril_(-1))
        t_beta = t * beta.transpose(1, 2)  # T diag(β): column j scaled by β_j
        p = torch.bmm(q, k_t).tril_()  # lower(Q Kᵀ), diagonal included: yᵢ reads W⁽ⁱ⁾
        states = s_init.new_empty(n + 1, *s_init.shape)  # states[j]: S at the start of chunk j
        states[0] = s_init
        r, u, out = torch.empty_like(v), torch.empty_like(v), torch.empty_like(v)
        q_s = v.new_empty(bh, *v.shape[1:])
        by_chunk = [x.unflatten(0, (n, bh)) for x in (q, k, k_t, v, t_beta, p, r, u, out)]
        for j, (q_j, k_j, k_t_j, v_j, t_beta_j, p_j, r_j, u_j, out_j) in enumerate(zip(*by_chunk)):
            s = states[j]
            torch.bmm(k_j, s, out=r_j)
            torch.sub(v_j, r_j, out=r_j)  # R = V − K S
            torch.bmm(t_beta_j, r_j, out=u_j)  # U = T diag(β) R
            torch.bmm(q_j, s, out=q_s)
            torch.baddbmm(q_s, p_j, u_j, out=out_j)  # O = Q S + P U
            torch.baddbmm(s, k_t_j, u_j, out=states[j + 1])  # S' = S + Kᵀ U
        ctx.save_for_backward(q, k, beta, kkt, t, t_beta, p, r, u, states)
        ctx.n, ctx.bh, ctx.exact = n, bh, q.dtype
        return out, states[n].clone()

    @staticmethod
    def backward(ctx, d_out, d_s_final):
        # backward() may be called inside an autocast block: its products stay in the forward's float32
        with torch.autocast(d_out.device.type, enabled=False):
            return ChunkedDeltaRule._backward(ctx, d_out.to(ctx.exact), d_s_final.to(ctx.exact))

    @staticmethod
    def _backward(ctx, d_out, d_s_final):
        q, k, beta, kkt, t, t_beta, p, r, u, states = ctx.saved_tensors
        n, bh = ctx.n, ctx.bh
        d_out = d_out.contiguous()
        d_p = torch.bmm(d_out, u.transpose(1, 2)).tril_()
        d_u = torch.bmm(p.transpose(1, 2), d_out)  # the loop adds K dS'
        d_q, d_k, d_r = torch.empty_like(q), torch.empty_like(k), torch.empty_like(d_u)
        ds = d_s_final.clone(memory_format=torch.contiguous_format)  # updated in place below
        by_chunk = [x.unflatten(0, (n, bh)) for x in (q, k, t_beta, u, d_out, d_p, d_u, d_r, d_q, d_k)]
        for j in reversed(range(n)):
            q_j, k_j, t_beta_j, u_j, d_out_j, d_p_j, d_u_j, d_r_j, d_q_j, d_k_j = (x[j] for x in by_chunk)
            # bmm copies a transposed right-hand operand itself; once per chunk here instead of twice
            s_t = states[j].transpose(1, 2).contiguous()
            # the [c, d_dot] products are done here too, while q_j, k_j, dQ_j, dK_j are in cache
            torch.bmm(d_p_j.transpose(1, 2), q_j, out=d_k_j).baddbmm_(u_j, ds.transpose(1, 2))
            d_u_j.baddbmm_(k_j, ds)
            torch.bmm(t_beta_j.transpose(1, 2), d_u_j, out=d_r_j)
            torch.bmm(d_p_j, k_j, out=d_q_j).baddbmm_(d_out_j, s_t)
            d_k_j.baddbmm_(d_r_j, s_t, alpha=-1)
            ds.baddbmm_(q_j.transpose(1, 2), d_out_j).baddbmm_(k_j.transpose(1, 2), d_r_j, alpha=-1)
        # U = T diag(β) R
        d_t_beta = torch.bmm(d_u, r.transpose(1, 2))
        d_beta = (d_t_beta * t).sum(1).unsqueeze(-1)  # column sums → [N, c, 1]
        t_t = t.transpose(1, 2).contiguous()  # (as a right-hand operand below: see forward)
        # T = (I + A)⁻¹, A = strictly_lower(diag(β) K Kᵀ):  −dA = strictly_lower(Tᵀ dT Tᵀ)
        d_a_neg = torch.bmm(torch.bmm(t_t, d_t_beta.mul_(beta.transpose(1, 2))), t_t).tril_(-1)
        d_beta -= (d_a_neg * kkt).sum(-1, keepdim=True)
        sym = d_a_neg.mul_(beta)
        d_k.baddbmm_(sym + sym.transpose(1, 2), k, alpha=-1)
        return d_q, d_k, d_r, d_beta, ds, None, None


def delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                       state: Optional[torch.Tensor] = None, chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule, chunkwise-parallel (Yang et al. 2024; WY/UT representation).

    Work with the transposed state S = Wᵀ ([d_dot, d_v]); one token is S ← (I − β k kᵀ) S + β k vᵀ. For a chunk of
    C tokens (rows of K, Q: [C, d_dot], V: [C, d_v], starting from state S₀), the state after token t is
    S_t = S₀ + Σ_{j≤t} k_j u_jᵀ, where the "pseudo-values" u_j obey

        u_j = β_j (v_j − S₀ᵀ k_j − Σ_{m<j} (k_mᵀ k_j) u_m),   i.e.   (I + A) U = diag(β) (V − K S₀),
        A = strictly_lower(diag(β) K Kᵀ).

    With the UT transform T = (I + A)⁻¹ (a unit-lower-triangular inverse per chunk), Wc = T diag(β) K and
    Uc = T diag(β) V, so

        U   = Uc − Wc S₀,   S_C = S₀ + Kᵀ U                  (the only sequential step: two matmuls per chunk)
        O   = Q S₀ + lower(Q Kᵀ) U                         (lower includes the diagonal: yᵢ reads W⁽ⁱ⁾)

    Everything except the S recurrence runs in parallel over all chunks. A sequence whose length is not a
    multiple of C is padded with k = v = β = 0 tokens, which leave the state unchanged.

    T is one batched unit-triangular solve (`unit_lower_inverse`). The backward is hand-written
    (`ChunkedDeltaRule`). Everything runs in float32 (float64 for float64 inputs), also under autocast and in a
    backward pass started inside autocast; y is cast back to v's dtype, the state stays float32.

    Args:
        q, k, v, beta, state: see the module docstring.
        chunk_size: C, tokens per chunk (≥ 1); clipped to seq_len.

    Returns:
        y: [seq_len, batch, heads, d_v] and the final state [batch, heads, d_v, d_dot].

    Raises:
        ValueError: bad shapes or chunk_size < 1.
    """
    beta = _check(q, k, v, beta, state, token=False)
    check_chunk_size('delta_rule_chunked', chunk_size)
    d_v, d_dot = v.shape[-1], q.shape[-1]
    if q.shape[0] == 0:
        return empty_sequence(v, state, d_v, d_dot)
    layout = Chunking.of(q, chunk_size, exact_dtype(v.dtype))  # float32, or float64 for float64 inputs
    with torch.autocast(q.device.type, enabled=False):
        out, s = ChunkedDeltaRule.apply(layout.chunks(q), layout.chunks(k), layout.chunks(v),
                                         layout.chunks(beta.unsqueeze(-1)), layout.initial_state(state, d_v, d_dot),
                                         layout.n, layout.bh)
    return layout.unchunk(out).to(v.dtype), layout.final_state(s)  # the state stays float32: the carried state
