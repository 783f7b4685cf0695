"""Attention normalisation of a fast-weight read-out: linear attention's denominator.

Katharopoulos et al. 2020 ("Transformers are RNNs", eq. 6) divide the read-out by the same sum with v = 1:

    zᵢ = z⁽⁰⁾ + Σ_{j≤i} kⱼ,      yᵢ ← yᵢ / (zᵢ · qᵢ + eps)

(keys and queries after the feature map φ'). The fast-weights paper (Schlag et al. 2021, section 4.1) replaces it
by the sum normalisation of φ; `attention_normalization=True` on the modules brings it back, for either update
rule, as the authors' code offers it.

The normaliser z is carried with the fast weights: a module that normalises keeps the state as one tensor
[batch, heads, d_v + 1, d_dot] whose last row is z (`split_state` / `join_state`), so the transformer's per-layer
state stays one tensor per layer. With the sum rule, z is the sum rule itself run with v = 1: the chunked kernel
keeps z beside W and divides in its own forward and backward (`sum_rule_chunked(…, attention_normalization=True)`);
the loop and step kernels are given v with a column of ones appended, so that their state is [W; z] and their
last output column zᵢ · qᵢ (`divide_by_last_column`). With the delta rule, `normalise_by_attention` sums z beside
it.

Precision: z and the denominators are float32 (float64 for float64 inputs), also under autocast.
"""
from typing import Optional

import torch

from lazylab.models.fast_weights._chunks import exact_dtype

__all__ = ['normalise_by_attention', 'divide_by_last_column', 'split_state', 'join_state']


def normalise_by_attention(y: torch.Tensor, q: torch.Tensor, k: torch.Tensor, z: Optional[torch.Tensor],
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """yᵢ / (zᵢ · qᵢ + eps) with zᵢ = z + Σ_{j≤i} kⱼ, for a sequence (a one-token step is a sequence of one).

    Args:
        y: the read-out, [seq_len, batch, heads, d_v].
        q, k: the queries and keys after the feature map, [seq_len, batch, heads, d_dot].
        z: the sum of the keys before the first token, [batch, heads, d_dot]; None means zeros.
        eps: added to the denominator.

    Returns:
        the normalised y (in y's dtype) and z after the last token (float32 or float64).
    """
    exact = exact_dtype(y.dtype)
    with torch.autocast(q.device.type, enabled=False):
        sums = k.to(exact).cumsum(0)
        if z is not None:
            sums = sums + z.to(exact)
        denominator = torch.linalg.vecdot(sums, q.to(exact)).unsqueeze(-1) + eps
        y = (y.to(exact) / denominator).to(y.dtype)
    if k.shape[0] == 0:
        return y, z.to(exact) if z is not None else k.new_zeros(k.shape[1:], dtype=exact)
    return y, sums[-1]


def divide_by_last_column(y: torch.Tensor, eps: float) -> torch.Tensor:
    """[..., d_v + 1] → [..., d_v]: the first d_v columns over (the last one + eps), i.e. yᵢ / (zᵢ · qᵢ + eps) for
    the output of the sum rule run with v extended by a 1."""
    exact = exact_dtype(y.dtype)
    return (y[..., :-1].to(exact) / (y[..., -1:].to(exact) + eps)).to(y.dtype)


def split_state(state: Optional[torch.Tensor]) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """[batch, heads, d_v + 1, d_dot] → (W [batch, heads, d_v, d_dot], z [batch, heads, d_dot]); None → (None, None)."""
    if state is None:
        return None, None
    return state[..., :-1, :], state[..., -1, :]


def join_state(weights: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """(W, z) → [batch, heads, d_v + 1, d_dot], z as the last row."""
    return torch.cat([weights, z.to(weights.dtype).unsqueeze(-2)], dim=-2)
