"""Token-wise Fast Weights Transformer: one step per call, carrying the fast weights explicitly.

The same model as `lazylab.models.fast_weights` (Schlag, Irie & Schmidhuber 2021), in the form of labml-nn
0.5.1's `labml_nn.transformers.fast_weights.token_wise`: the attention and the layer take one token
`[batch_size, d_model]` and the fast weights W⁽ⁱ⁻¹⁾, and return the output and W⁽ⁱ⁾. The transformer runs all
layers for a token before moving to the next token.

Names, arguments and state-dict keys are labml_nn's token-wise ones; note that W_β lives in `gate` here (it
is `interpolation_weight` in the whole-sequence module).

State layout: W is [batch_size, heads, d_k, d_dot] per layer, the same as the whole-sequence module's.
"""
from typing import Optional

import torch
from torch import nn

from lazylab.models.fast_weights.delta_rule import delta_rule_step
from lazylab.models.fast_weights.feature_maps import DPFP  # re-exported, as labml_nn does
from lazylab.models.fast_weights.normalization import join_state, normalise_by_attention, split_state
from lazylab.models.fast_weights.rules import check_update_rule
from lazylab.models.fast_weights.step import per_layer_state
from lazylab.models.fast_weights.sum_rule import sum_rule_step
from lazylab.models.feed_forward import FeedForward  # re-exported, as labml_nn does
from lazylab.models.mha import PrepareForMultiHeadAttention
from lazylab.models.utils import PreNormLayer, check_heads, check_n_layers, clone_module_list

__all__ = ['DPFP', 'FeedForward', 'FastWeightsAttention', 'FastWeightsAttentionTransformerLayer',
           'FastWeightsAttentionTransformer']


class FastWeightsAttention(nn.Module):
    """One step of delta-rule fast-weight attention (see `lazylab.models.fast_weights.FastWeightsAttention`).

        v̄ = W⁽ⁱ⁻¹⁾ φ'(k),   W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + β (v − v̄) ⊗ φ'(k),   y = W_o [W⁽ⁱ⁾ φ'(q)] + b_o,   β = σ(W_β x)

    Args:
        heads, d_model, dropout_prob, phi: as in the whole-sequence module (dropout_prob is kept, not applied).
        update_rule, attention_normalization, eps: as there ('sum': no β, `gate` is None).

    Shapes:
        x: [batch_size, d_model] → [batch_size, d_model]
        weights (in and out): [batch_size, heads, d_k, d_dot] (d_k + 1 rows with attention normalisation); None
        means zeros.

    Raises:
        ValueError: d_model not divisible by heads; an update rule other than 'delta' and 'sum' (the gated delta
            rule and DeltaProduct are in the whole-sequence module, whose step function generates token by token).
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float, phi: nn.Module, *,
                 update_rule: str = 'delta', attention_normalization: bool = False, eps: float = 1e-6):
        super().__init__()
        check_heads(d_model, heads, 'FastWeightsAttention')
        check_update_rule(update_rule, ('delta', 'sum'), "token-wise FastWeightsAttention (labml_nn's form)")
        self.d_k = d_model // heads
        self.heads = heads
        self.query = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
        self.key = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
        self.value = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
        self.gate = nn.Sequential(PrepareForMultiHeadAttention(d_model, heads, 1, bias=False), nn.Sigmoid())
        self.phi = phi
        self.output = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout_prob)
        self.update_rule, self.attention_normalization, self.eps = update_rule, attention_normalization, eps
        if update_rule == 'sum':  # no β, as in the whole-sequence module
            self.gate = None

    def forward(self, x: torch.Tensor, weights: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() != 2:
            raise ValueError(f"token-wise FastWeightsAttention expects one step [batch_size, d_model], "
                             f"got {tuple(x.shape)}")
        query = self.phi(self.query(x))  # [batch_size, heads, d_dot]
        key = self.phi(self.key(x))
        value = self.value(x)  # [batch_size, heads, d_k]
        weights, z = split_state(weights) if self.attention_normalization else (weights, None)
        if self.update_rule == 'delta':
            y, weights = delta_rule_step(query, key, value, self.gate(x), weights)
        else:
            y, weights = sum_rule_step(query, key, value, weights)
        if self.attention_normalization:
            y, z = normalise_by_attention(y.unsqueeze(0), query.unsqueeze(0), key.unsqueeze(0), z, self.eps)
            y, weights = y[0], join_state(weights, z)
        return self.output(y.reshape(x.shape[0], -1)), weights


class FastWeightsAttentionTransformerLayer(PreNormLayer):
    """x + Dropout(Attn(x, W)), then x + Dropout(FFN(LayerNorm(x))), for one token (labml_nn's layer;
    `norm_self_attn` exists but, as there, is not applied).

    Shapes:
        x: [batch_size, d_model] → [batch_size, d_model]; weights [batch_size, heads, d_k, d_dot] in and out.
    """

    def forward(self, x: torch.Tensor, weights: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        attn, weights = self.attn(x, weights)
        x = x + self.dropout(attn)
        x = x + self.dropout(self.feed_forward(self.norm_ff(x)))
        return x, weights


class FastWeightsAttentionTransformer(nn.Module):
    """`n_layers` copies of the token-wise layer and a final LayerNorm, run token by token.

    Args:
        layer: the `FastWeightsAttentionTransformerLayer` to copy.
        n_layers: the number of copies (≥ 1).

    Shapes:
        x_seq: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]
        state (forward_with_state): list of n_layers tensors [batch_size, heads, d_k, d_dot], or None.

    Raises:
        ValueError: n_layers < 1; a state list of the wrong length.
    """

    def __init__(self, layer: FastWeightsAttentionTransformerLayer, n_layers: int):
        super().__init__()
        check_n_layers(n_layers, 'FastWeightsAttentionTransformer')
        self.layers = clone_module_list(layer, n_layers)
        self.norm = nn.LayerNorm([layer.size])

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        return self.forward_with_state(x_seq)[0]

    def forward_with_state(self, x_seq: torch.Tensor, state: Optional[list[Optional[torch.Tensor]]] = None
                           ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run the tokens of x_seq in order, continuing from per-layer fast weights `state`."""
        weights = per_layer_state(state, len(self.layers))
        outputs = []
        for x in x_seq.unbind(0):
            for i, layer in enumerate(self.layers):
                x, weights[i] = layer(x, weights[i])
            outputs.append(x)
        if not outputs:
            return self.norm(x_seq), weights
        return self.norm(torch.stack(outputs)), weights
