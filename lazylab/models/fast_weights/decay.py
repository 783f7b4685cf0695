"""The decay gate of Gated DeltaNet: how much of the fast weights each token keeps.

Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with Delta Rule" (ICLR 2025), section 3,
with the parametrisation of Mamba2 (Dao & Gu 2024) that flash-linear-attention's `GatedDeltaNet` layer uses:

    gᵢ = −exp(A_log) · softplus(W_a xᵢ + dt_bias) ≤ 0          (one per head; αᵢ = exp(gᵢ) ∈ (0, 1])

Initialisation as there: A ~ U(0, 16) and A_log = log A; dt = exp(u), u ~ U(log 0.001, log 0.1), at least 1e-4,
and dt_bias = softplus⁻¹(dt) = dt + log(1 − exp(−dt)), so that at W_a x = 0 a head keeps exp(−A · dt) of its
memory per token (between about 0.2 and 1); W_a is PyTorch's default Linear initialisation, without a bias.
"""
import math

import torch
from torch import nn

__all__ = ['DecayGate']


class DecayGate(nn.Module):
    """g = −exp(A_log) · softplus(W_a x + dt_bias): the log decay of the gated delta rule (see the module docstring).

    Args:
        d_in: the size of x.
        heads: one decay per head.

    Parameters: projection.weight (W_a [heads, d_in]), A_log [heads], dt_bias [heads].

    Shapes:
        x: [..., d_in] → g: [..., heads] (float32 or wider: the kernels keep the state in float32, and exp(g) of a
        bfloat16 g would lose the small decays).
    """

    def __init__(self, d_in: int, heads: int):
        super().__init__()
        self.projection = nn.Linear(d_in, heads, bias=False)
        a = torch.empty(heads).uniform_(0, 16)
        self.A_log = nn.Parameter(torch.log(a))
        dt = torch.exp(torch.rand(heads) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp_min(1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_decay(self.projection(x))

    def log_decay(self, a: torch.Tensor) -> torch.Tensor:
        """g from a = W_a x [..., heads] (for a caller that computed W_a x in a stacked projection)."""
        exact = torch.promote_types(a.dtype, torch.float32)
        a, a_log, dt_bias = a.to(exact), self.A_log.to(exact), self.dt_bias.to(exact)
        return -a_log.exp() * nn.functional.softplus(a + dt_bias)
