"""DeltaProduct: n_h delta-rule steps per token (a product of n_h generalised Householder matrices), three ways.

Siems, Carstensen, Zela, Hutter, Pontil & Grazzi 2025, "DeltaProduct: Improving State-Tracking in Linear RNNs via
Householder Products": each token writes n_h keys and values in order, so that the state transition is a product
of n_h matrices I − βᵢ,ⱼ kᵢ,ⱼ kᵢ,ⱼᵀ instead of one (the delta rule is n_h = 1), optionally after the decay of the
gated delta rule (`gated_delta_rule.py`). Per batch element and head, token i:

    W ← exp(gᵢ) · W                                  (optional: g None means no decay)
    W ← W + βᵢ,ⱼ (vᵢ,ⱼ − W kᵢ,ⱼ) ⊗ kᵢ,ⱼ     for j = 1 … n_h, in order
    yᵢ = W qᵢ                                        (one read per token, after its n_h writes; no scaling of q)

With β ∈ (0, 2) (Grazzi et al. 2025, "Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues") the
factors may have a negative eigenvalue, which the paper needs for state tracking.

* `delta_product_step`    one token (generation); `delta_product_step_unchecked` without the shape checks.
* `delta_product_loop`    the equations above, token by token and step by step: the reference (equal to
  flash-linear-attention's `naive_recurrent_gated_delta_product` with scale = 1, in the tests).
* `delta_product_chunked` chunkwise-parallel: the n_h writes of a token are n_h consecutive delta-rule steps, so the
  product is the (gated) delta rule over a sequence of seq_len · n_h steps, with token i's decay on its first step
  and its query read after its last (the other steps read nothing); that sequence goes through the chunked kernels
  of `delta_rule.py` / `gated_delta_rule.py` in chunks of chunk_size steps (writes; a chunk's edges need not fall
  between tokens).

Shapes, sequence-first, n_h = householder steps ≥ 1:
    q: [seq_len, batch, heads, d_dot];  k: [seq_len, n_h, batch, heads, d_dot];  v: [seq_len, n_h, batch, heads, d_v]
    beta: [seq_len, n_h, batch, heads];  g: [seq_len, batch, heads] or None;  state: [batch, heads, d_v, d_dot] or None
and each returns `(y, state)` with y: [seq_len, batch, heads, d_v] (a step: every seq_len axis dropped).

Precision: as the other rules (float32 state and accumulations, float64 for float64 inputs; y in v's dtype).
"""
from typing import Optional

import torch

from lazylab.models.fast_weights._chunks import check_chunk_size, check_state, exact_dtype, no_autocast
from lazylab.models.fast_weights.delta_rule import delta_update_unchecked
from lazylab.models.fast_weights.gated_delta_rule import check_gate, chunked_rule, decay_state

__all__ = ['delta_product_step', 'delta_product_step_unchecked', 'delta_product_loop', 'delta_product_chunked',
           'check_householder_steps']


def check_householder_steps(householder_steps: int):
    """Raises ValueError unless householder_steps (n_h) ≥ 1."""
    if householder_steps < 1:
        raise ValueError(f"DeltaProduct needs householder_steps >= 1, got householder_steps={householder_steps}")


def _check(q, k, v, beta, g, state, token: bool):
    """Validate the shapes (see the module docstring; a step drops the seq_len axis); return beta."""
    lead = 3 if token else 4
    if q.dim() != lead or k.dim() != lead + 1:
        lead_dims = '' if token else 'seq_len, '
        raise ValueError(f"delta product: q must be [{lead_dims}batch, heads, d_dot] and k [{lead_dims}n_h, batch, "
                         f"heads, d_dot]; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    n_h_axis = 0 if token else 1
    check_householder_steps(k.shape[n_h_axis])
    steps = (*q.shape[:n_h_axis], k.shape[n_h_axis], *q.shape[n_h_axis:])  # q's shape with n_h inserted
    if k.shape != steps or v.shape[:-1] != steps[:-1]:
        raise ValueError(f"delta product: k must be q's shape with n_h inserted, {steps}, and v the same but its last "
                         f"dim; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    beta = check_gate('delta product', 'beta', beta, steps[:-1], trailing_one=True)
    if g is not None:
        check_gate('delta product', 'g', g, q.shape[:-1])
    check_state('delta product', state, (*q.shape[-3:-1], v.shape[-1], q.shape[-1]))
    return beta


def delta_product_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                       g: Optional[torch.Tensor] = None, state: Optional[torch.Tensor] = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: the optional decay, n_h delta-rule writes in order, one read (see the module docstring).

    Args:
        q: [batch, heads, d_dot].
        k: [n_h, batch, heads, d_dot].
        v: [n_h, batch, heads, d_v].
        beta: [n_h, batch, heads] (or with a trailing 1).
        g: [batch, heads], the log decay (≤ 0), or None.
        state: W [batch, heads, d_v, d_dot]; None means zeros.

    Returns:
        y [batch, heads, d_v] and the new state W.

    Raises:
        ValueError: shapes that do not fit together (named), or n_h < 1.
    """
    beta = _check(q, k, v, beta, g, state, token=True)
    return delta_product_step_unchecked(q, k, v, beta, g, state)


def delta_product_step_unchecked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                                 g: Optional[torch.Tensor], state: Optional[torch.Tensor]
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """`delta_product_step` without the shape checks, beta as [n_h, batch, heads] (for a generation step
    function)."""
    out_dtype = v.dtype
    with no_autocast(q.device.type):
        if g is not None:
            state = decay_state(state, g)
        for k_j, v_j, beta_j in zip(k, v, beta.unsqueeze(-1)):
            state = delta_update_unchecked(k_j, v_j, beta_j, state)
        return torch.linalg.vecdot(state, q.to(state.dtype).unsqueeze(-2)).to(out_dtype), state


def delta_product_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                       g: Optional[torch.Tensor] = None, state: Optional[torch.Tensor] = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """DeltaProduct token by token and step by step, written as the equations (the reference).

    Args:
        q: [seq_len, batch, heads, d_dot].
        k: [seq_len, n_h, batch, heads, d_dot].
        v: [seq_len, n_h, batch, heads, d_v].
        beta: [seq_len, n_h, batch, heads].
        g: [seq_len, batch, heads], the log decays (≤ 0), or None for no decay.
        state: the fast weights before the first token, [batch, heads, d_v, d_dot]; None means zeros.

    Returns:
        y: [seq_len, batch, heads, d_v] and the final state [batch, heads, d_v, d_dot].

    Raises:
        ValueError: shapes that do not fit together (named), or n_h < 1.
    """
    beta = _check(q, k, v, beta, g, state, token=False)
    seq_len, batch, heads, d_dot = q.shape
    exact, out_dtype = exact_dtype(v.dtype), v.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, beta = (t.to(exact) for t in (q, k, v, beta))
        weights = state.to(exact) if state is not None else q.new_zeros(batch, heads, v.shape[-1], d_dot)
        ys = []
        for i in range(seq_len):
            if g is not None:
                weights = g[i].to(exact).exp()[..., None, None] * weights  # W ← exp(gᵢ) W
            for j in range(k.shape[1]):
                k_ij, beta_ij = k[i, j].unsqueeze(-1), beta[i, j, ..., None, None]
                v_bar = weights @ k_ij  # W kᵢ,ⱼ
                weights = weights + beta_ij * (v[i, j].unsqueeze(-1) - v_bar) @ k_ij.transpose(-1, -2)
            ys.append((weights @ q[i].unsqueeze(-1)).squeeze(-1))  # yᵢ = W qᵢ
    if seq_len == 0:
        return v.new_zeros(q.shape[:-1] + v.shape[-1:], dtype=out_dtype), weights
    return torch.stack(ys).to(out_dtype), weights


def delta_product_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                          g: Optional[torch.Tensor] = None, state: Optional[torch.Tensor] = None,
                          chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """DeltaProduct, chunkwise-parallel: the (gated) delta rule over the seq_len · n_h writes (see the module
    docstring), in chunks of chunk_size writes.

    Step i · n_h + j writes kᵢ,ⱼ, vᵢ,ⱼ with βᵢ,ⱼ; its log decay is gᵢ for j = 0 and 0 otherwise; its query is qᵢ for
    j = n_h − 1 and 0 otherwise (a zero query reads zero, and its output is dropped). The result is the loop's.

    Args:
        q, k, v, beta, g, state: see the module docstring.
        chunk_size: writes (steps) per chunk, ≥ 1: chunk_size / n_h tokens. The CPU's best size is about the same
            number of steps as for the delta rule (16 at d_dot 32-64), so the same chunk_size serves both.

    Returns:
        y [seq_len, batch, heads, d_v] and the final state [batch, heads, d_v, d_dot].

    Raises:
        ValueError: shapes that do not fit together (named), n_h < 1, or chunk_size < 1.
    """
    beta = _check(q, k, v, beta, g, state, token=False)
    check_chunk_size('delta_product_chunked', chunk_size)
    seq_len, n_h = k.shape[:2]
    steps = seq_len * n_h
    # token i's query on its last step, its decay on its first: zeros padded in front of / behind the step axis
    q_steps = torch.nn.functional.pad(q.unsqueeze(1), (0, 0) * 3 + (n_h - 1, 0)).flatten(0, 1)
    g_steps = None if g is None else torch.nn.functional.pad(g.unsqueeze(1), (0, 0) * 2 + (0, n_h - 1)).flatten(0, 1)
    y, state = chunked_rule(q_steps, k.reshape(steps, *k.shape[2:]), v.reshape(steps, *v.shape[2:]),
                            beta.reshape(steps, *beta.shape[2:]), g_steps, state, chunk_size)
    return y.view(seq_len, n_h, *y.shape[1:])[:, -1], state
