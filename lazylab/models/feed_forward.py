"""Position-wise feed-forward network (FFN) of the transformer, with the gated variants.

Vaswani et al. 2017, "Attention Is All You Need", eq. (2):

    FFN(x) = act(x W₁ + b₁) W₂ + b₂

and the gated linear unit family of Shazeer 2020, "GLU Variants Improve Transformer":

    FFN_gated(x) = (act(x W₁ + b₁) ⊗ (x V + c)) W₂ + b₂

where act = σ gives GLU, identity gives Bilinear, ReLU gives ReGLU, GELU gives GEGLU and SiLU (Swish₁) gives
SwiGLU. The paper drops all biases in the gated variants; here each bias is a separate switch.

State-dict keys match labml-nn 0.5.1's `FeedForward`: `layer1` (W₁, b₁), `layer2` (W₂, b₂), `linear_v` (V, c).
"""
from typing import Optional

import torch
from torch import nn


class FeedForward(nn.Module):
    """Position-wise FFN, optionally gated (see the module docstring for the equations).

    Args:
        d_model: width of a token vector (input and output features).
        d_ff: width of the hidden layer (usually about 4 × d_model).
        dropout: dropout probability on the hidden layer, after the activation (and the gate).
        activation: the module applied to x W₁ + b₁; None (the default) is `nn.ReLU()`.
        is_gated: multiply the activated hidden layer by a linear gate x V + c.
        bias1: learn b₁.
        bias2: learn b₂.
        bias_gate: learn c (only used when `is_gated`).

    Shapes:
        x: [..., d_model] → [..., d_model] (any leading dimensions, usually [seq_len, batch_size, d_model]).

    Raises:
        ValueError: d_model or d_ff is not positive; the input's last dimension is not d_model (on forward).
    """

    def __init__(self, d_model: int, d_ff: int,
                 dropout: float = 0.1,
                 activation: Optional[nn.Module] = None,
                 is_gated: bool = False,
                 bias1: bool = True,
                 bias2: bool = True,
                 bias_gate: bool = True):
        super().__init__()
        if d_model <= 0 or d_ff <= 0:
            raise ValueError(f"FeedForward needs positive sizes, got d_model={d_model}, d_ff={d_ff}")
        # Creation order (layer1, layer2, linear_v) follows labml-nn, so the same seed gives the same weights.
        self.layer1 = nn.Linear(d_model, d_ff, bias=bias1)
        self.layer2 = nn.Linear(d_ff, d_model, bias=bias2)
        self.dropout = nn.Dropout(dropout)
        self.activation = nn.ReLU() if activation is None else activation
        self.is_gated = is_gated
        if is_gated:
            self.linear_v = nn.Linear(d_model, d_ff, bias=bias_gate)
        self.d_model = d_model
        self.d_ff = d_ff

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., d_model] → [..., d_model]."""
        if x.dim() == 0 or x.shape[-1] != self.d_model:
            raise ValueError(f"FeedForward expects inputs of shape [..., d_model={self.d_model}], "
                             f"got {tuple(x.shape)}")
        hidden = self.activation(self.layer1(x))
        if self.is_gated:
            hidden = hidden * self.linear_v(x)
        return self.layer2(self.dropout(hidden))
