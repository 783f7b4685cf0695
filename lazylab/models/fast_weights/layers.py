"""The fast-weight layers over a whole sequence: attention, transformer layer, transformer (labml_nn's classes).

See the package docstring (`lazylab.models.fast_weights`) for the model and what differs from labml-nn 0.5.1; the
update rules' kernels are in their own modules, chosen through `rules.run_update_rule`; the generation step
functions that `step_function()` returns are in `step.py`.
"""
from typing import Optional

import torch
from torch import nn

from lazylab.models.fast_weights.decay import DecayGate
from lazylab.models.fast_weights.delta_product import check_householder_steps
from lazylab.models.fast_weights.normalization import (
    divide_by_last_column,
    join_state,
    normalise_by_attention,
    split_state,
)
from lazylab.models.fast_weights.rules import (
    DEFAULT_CHUNK_SIZE,
    GATED_RULES,
    SUM_RULE_CHUNK_SIZE,
    check_kernel,
    check_update_rule,
    run_update_rule,
)
from lazylab.models.fast_weights.step import (
    LayerStepFunction,
    TransformerStepFunction,
    layer_step_function,
    one_token_inference,
    per_layer_state,
    projector,
    transformer_step_function,
)
from lazylab.models.fast_weights.sum_rule import sum_rule_chunked
from lazylab.models.mha import PrepareForMultiHeadAttention
from lazylab.models.utils import PreNormLayer, check_heads, check_n_layers, clone_module_list

__all__ = ['FastWeightsAttention', 'FastWeightsAttentionTransformerLayer', 'FastWeightsAttentionTransformer',
           'check_rule_options']


class FastWeightsAttention(nn.Module):
    """Fast-weight attention over a whole sequence (Schlag, Irie & Schmidhuber 2021): the delta rule by default.

    Per head, with φ' the feature map (sum-normalised DPFP in labml_nn) and βᵢ = σ(W_β xᵢ) (2σ(W_β xᵢ) with
    `negative_eigenvalues`):
        delta rule:     W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + βᵢ (vᵢ − W⁽ⁱ⁻¹⁾ φ'(kᵢ)) ⊗ φ'(kᵢ)
        sum rule:       W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + vᵢ ⊗ φ'(kᵢ)
        gated delta:    the delta rule's write after W ← exp(gᵢ) W, gᵢ = −exp(A_log) softplus(W_a xᵢ + dt_bias)
                        (Yang, Kautz & Hatamizadeh 2025; `decay.py`)
        delta product:  the optional decay (`gated`), then n_h = householder_steps delta-rule writes with their own
                        keys, values and βs (Siems et al. 2025; `delta_product.py`)
        read-out:       yᵢ = W⁽ⁱ⁾ φ'(qᵢ),  or with attention normalisation yᵢ / (zᵢ · φ'(qᵢ) + eps), zᵢ = Σ_{j≤i} φ'(kⱼ)
    followed by the output projection W_o [y₁; …; y_h] + b_o.

    Args:
        heads: number of heads h; d_model must be divisible by it (d_k = d_model / h).
        d_model: model width d.
        dropout_prob: kept for labml_nn compatibility; not applied here (the layer drops the attention output).
        phi: the feature map φ', e.g. DPFP(nu=1), LinearElu(), Favor(d_k, m), L2NormSiLU(), mapping d_k → d_dot.
        kernel: 'chunked' (default; chunkwise-parallel), 'loop' (reference) or 'step' (recurrent step per token).
        chunk_size: tokens per chunk for 'chunked' (for DeltaProduct: writes, n_h per token); any seq_len works
            (the sum rule uses at least SUM_RULE_CHUNK_SIZE = 64: the result is the same, and faster).
        update_rule: 'delta' (default), 'sum', 'gated_delta' or 'delta_product'.
        attention_normalization: divide the read-out by zᵢ · φ'(qᵢ) + eps (default False, as labml_nn); for the
            delta and sum rules.
        eps: that denominator's eps.
        householder_steps: n_h ≥ 1 of 'delta_product' (default 2).
        gated: 'delta_product' with the decay gate of the gated delta rule (default False).
        negative_eigenvalues: β ∈ (0, 2) instead of (0, 1) (Grazzi et al. 2025), for every rule with a β.

    Parameters (labml_nn's names): query.linear, key.linear, value.linear (no bias), interpolation_weight.0.linear
    (W_β, no bias), output (with bias); with the gate also decay.projection (W_a), decay.A_log and decay.dt_bias,
    drawn after the others. The sum rule has no β: `interpolation_weight` is None and its weight is not in the
    state dict (it is still drawn, then dropped, so that from the same seed the other weights equal the delta
    rule's). A delta-rule state dict loads into a sum-rule module with strict=False (β is left out), and into a
    gated-delta one with strict=False (the gate keeps its initialisation). DeltaProduct's key, value and
    interpolation_weight are n_h times wider (the n_h keys, values and βs of a token, step-major).

    Shapes:
        x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]
        state (forward_with_state, in and out): [batch_size, heads, d_k, d_dot], or [batch_size, heads, d_k + 1,
        d_dot] with attention normalisation (the last row is z); float32 under autocast.

    Raises:
        ValueError: d_model not divisible by heads; unknown kernel or update rule; chunk_size < 1;
            householder_steps < 1; an option the rule does not have (gated without delta_product,
            negative_eigenvalues with the sum rule, attention_normalization with a gated rule or DeltaProduct).
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float, phi: nn.Module, *,
                 kernel: str = 'chunked', chunk_size: int = DEFAULT_CHUNK_SIZE, update_rule: str = 'delta',
                 attention_normalization: bool = False, eps: float = 1e-6, householder_steps: int = 2,
                 gated: bool = False, negative_eigenvalues: bool = False):
        super().__init__()
        check_heads(d_model, heads, 'FastWeightsAttention')
        check_kernel(kernel, chunk_size)
        check_rule_options(update_rule, householder_steps, gated, negative_eigenvalues, attention_normalization)
        self.d_k = d_model // heads
        self.heads = heads
        n_h = self.householder_steps = householder_steps if update_rule == 'delta_product' else 1
        # Creation order as in labml_nn, so the same seed gives the same initial weights.
        self.query = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
        self.key = PrepareForMultiHeadAttention(d_model, n_h * heads, self.d_k, bias=False)
        self.value = PrepareForMultiHeadAttention(d_model, n_h * heads, self.d_k, bias=False)
        self.interpolation_weight = nn.Sequential(PrepareForMultiHeadAttention(d_model, n_h * heads, 1, bias=False),
                                                  nn.Sigmoid())
        self.phi = phi
        self.output = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout_prob)
        self.kernel = kernel
        self.chunk_size = chunk_size
        self.update_rule = update_rule
        self.attention_normalization = attention_normalization
        self.eps = eps
        self.negative_eigenvalues = negative_eigenvalues
        gate = update_rule == 'gated_delta' or (update_rule == 'delta_product' and gated)
        self.decay = DecayGate(d_model, heads) if gate else None  # g = −exp(A_log) softplus(W_a x + dt_bias)
        if update_rule == 'sum':  # no β (see the class docstring); drawn above only to keep the seed's order
            self.interpolation_weight = None

    def set_kernel(self, kernel: str, chunk_size: Optional[int] = None):
        """Switch how the update rule is computed (the result is the same up to float rounding).

        Args:
            kernel: 'chunked' (training), 'loop' (the token-by-token reference) or 'step' (generation).
            chunk_size: tokens per chunk of the chunked kernel (None: keep the current one).

        Raises:
            ValueError: an unknown kernel, or a chunk size below 1.
        """
        chunk_size = self.chunk_size if chunk_size is None else chunk_size
        check_kernel(kernel, chunk_size)
        self.kernel, self.chunk_size = kernel, chunk_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The attention's output, starting from zero fast weights.

        Args:
            x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model].
        """
        return self.forward_with_state(x)[0]

    def forward_with_state(self, x: torch.Tensor, state: Optional[torch.Tensor] = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """Continue from fast weights `state`.

        Args:
            x: [seq_len, batch_size, d_model].
            state: [batch_size, heads, d_k, d_dot] (d_k + 1 rows with attention normalisation); None = zeros.

        Returns the output [seq_len, batch_size, d_model] and the fast weights after the last token (float32
        under autocast).
        """
        d_model = self.heads * self.d_k
        if x.dim() != 3 or x.shape[-1] != d_model:
            raise ValueError(f"FastWeightsAttention expects x of shape [seq_len, batch_size, d_model={d_model}], "
                             f"got {tuple(x.shape)}")
        seq_len, batch_size, _ = x.shape
        # one matmul for q, k, v, β (and the gate's W_a x) with the standard projections
        query, key, value, beta, g = projector(self)(x)
        if self.attention_normalization and self.update_rule == 'sum' and self.kernel == 'chunked' and seq_len > 1:
            y, state = sum_rule_chunked(query, key, value, state, max(self.chunk_size, SUM_RULE_CHUNK_SIZE),
                                        attention_normalization=True, eps=self.eps)
            return self.output(y.reshape(seq_len, batch_size, d_model)), state
        if self.attention_normalization and self.update_rule == 'sum':
            # the normaliser is the sum rule with v = 1: one more value column, whose row of the state is z
            y, state = run_update_rule('sum', self.kernel, self.chunk_size, query, key,
                                       torch.cat([value, value.new_ones(*value.shape[:-1], 1)], dim=-1), None, state)
            y = divide_by_last_column(y, self.eps)
            return self.output(y.reshape(seq_len, batch_size, d_model)), state
        weights, z = split_state(state) if self.attention_normalization else (state, None)
        y, weights = run_update_rule(self.update_rule, self.kernel, self.chunk_size, query, key, value, beta,
                                     weights, g)
        if self.attention_normalization:
            y, z = normalise_by_attention(y, query, key, z, self.eps)
            weights = join_state(weights, z)
        return self.output(y.reshape(seq_len, batch_size, d_model)), weights  # (no -1: seq_len may be 0)


def check_rule_options(update_rule: str, householder_steps: int, gated: bool, negative_eigenvalues: bool,
                       attention_normalization: bool):
    """The options a fast-weight module takes beside its update rule, checked against it.

    Raises:
        ValueError: an unknown rule, householder_steps < 1 (DeltaProduct), or an option the rule does not have;
            the message names the option and the rule.
    """
    check_update_rule(update_rule)
    if update_rule == 'delta_product':
        check_householder_steps(householder_steps)
    if gated and update_rule != 'delta_product':
        raise ValueError(f"gated=True is DeltaProduct's decay gate (update_rule='delta_product'); the gated delta rule "
                         f"is update_rule='gated_delta'; got update_rule={update_rule!r}")
    if negative_eigenvalues and update_rule == 'sum':
        raise ValueError("negative_eigenvalues=True scales β, which the sum rule does not have (update_rule='sum')")
    if attention_normalization and update_rule in GATED_RULES:
        raise ValueError(f"attention_normalization=True is linear attention's normaliser, for the delta and sum rules "
                         f"only; got update_rule={update_rule!r}")


class FastWeightsAttentionTransformerLayer(PreNormLayer):
    """One layer: x + Dropout(Attn(x)), then the pre-norm FFN block x + Dropout(FFN(LayerNorm(x))).

    As in labml_nn, the attention sees x itself; `norm_self_attn` is created (state-dict compatibility) but unused.

    Args:
        d_model: model width.
        attn: a FastWeightsAttention.
        feed_forward: the FFN (e.g. lazylab.models.feed_forward.FeedForward).
        dropout_prob: dropout on the outputs of attention and FFN before each residual add.

    Shapes:
        x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]; state as in FastWeightsAttention.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's output from zero fast weights.

        Args:
            x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model].
        """
        return self._add_attention_and_ffn(x, self.attn(x))

    def forward_with_state(self, x: torch.Tensor, state: Optional[torch.Tensor] = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` continuing from the fast weights `state`; returns (output, new state). Calls the attention's
        `forward_with_state` directly, so forward hooks of `attn` itself do not run here.

        Args:
            x: [seq_len, batch_size, d_model].
            state: the attention's fast weights (see `FastWeightsAttention.forward_with_state`); None = zeros.
        """
        if one_token_inference(x):
            step = self.step_function()
            if step is not None:
                y, state = step(x[0], state)
                return y.unsqueeze(0), state
        attn, state = self.attn.forward_with_state(x, state)
        return self._add_attention_and_ffn(x, attn), state

    def _add_attention_and_ffn(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(attn)
        return x + self.dropout(self.feed_forward(self.norm_ff(x)))

    def step_function(self) -> Optional[LayerStepFunction]:
        """This layer's `forward_with_state` for one token in eval mode, as a function
        (x [batch_size, d_model], state) → (x', state') that runs the same operations in the same order (so the
        same result, bit for bit) without the module calls, shape checks and identity dropouts that otherwise
        cost more than a one-token step's arithmetic. The checks are made here, once: use the function while the
        layer's parts and weights stay as they are. None unless the layer is built from the standard parts
        (FastWeightsAttention with the standard projections and the 'chunked' or 'step' kernel, LayerNorm,
        FeedForward with ReLU, not gated), every submodule is in eval mode and none has forward hooks.
        """
        if type(self.attn) is not FastWeightsAttention:  # (checked here: step.py does not import this module)
            return None
        return layer_step_function(self)


class FastWeightsAttentionTransformer(nn.Module):
    """`n_layers` copies of `layer` followed by a final LayerNorm.

    Args:
        layer: the FastWeightsAttentionTransformerLayer to copy (deep copies: layers do not share weights).
        n_layers: number of layers.

    Shapes:
        x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]
        state (forward_with_state): list of n_layers tensors [batch_size, heads, d_k, d_dot], or None for zeros.

    Raises:
        ValueError: n_layers < 1; a state list of the wrong length.
    """

    def __init__(self, layer: FastWeightsAttentionTransformerLayer, n_layers: int):
        super().__init__()
        check_n_layers(n_layers, 'FastWeightsAttentionTransformer')
        self.layers = clone_module_list(layer, n_layers)
        self.norm = nn.LayerNorm([layer.size])

    def set_kernel(self, kernel: str, chunk_size: Optional[int] = None):
        """Use `kernel` in every layer's attention.

        Args:
            kernel: 'chunked', 'loop' or 'step' (see `FastWeightsAttention.set_kernel`).
            chunk_size: tokens per chunk (None: keep each layer's).

        Raises:
            ValueError: an unknown kernel, or a chunk size below 1.
        """
        for layer in self.layers:
            layer.attn.set_kernel(kernel, chunk_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layers, then the final LayerNorm, from zero fast weights.

        Args:
            x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model].
        """
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def forward_with_state(self, x: torch.Tensor, state: Optional[list[torch.Tensor]] = None
                           ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Continue from the per-layer fast weights `state`; returns (output, new per-layer fast weights).

        Args:
            x: [seq_len, batch_size, d_model].
            state: one fast-weight tensor per layer (see `FastWeightsAttention.forward_with_state`); None = zeros.

        Calling this on consecutive chunks of a sequence, carrying the state, gives the outputs of one call on
        the whole sequence (the incremental-state protocol of `lazylab.models.autoregressive`). When training on
        consecutive segments, detach the state between them (`[w.detach() for w in state]`) to truncate
        backpropagation at the segment boundary. The layers' `forward_with_state` are called directly, so their
        own forward hooks do not run here (those of their parts do).
        """
        if one_token_inference(x):
            step = self.step_function()
            if step is not None:
                return step(x, state)
        state = per_layer_state(state, len(self.layers))
        new_state = []
        for layer, layer_state in zip(self.layers, state):
            x, layer_state = layer.forward_with_state(x, layer_state)
            new_state.append(layer_state)
        return self.norm(x), new_state

    def step_function(self) -> Optional[TransformerStepFunction]:
        """For generation: `forward_with_state` on one token in eval mode without autograd, as a function
        (x [1, batch_size, d_model], state) → (y, new_state) with every check and set-up done here, once
        (each layer's `step_function`). Bit for bit the module path's result. Use it while the modules and
        weights stay as they are: `AutoregressiveModel.generate` makes one per call. None when a layer has none
        (see `FastWeightsAttentionTransformerLayer.step_function`), or the final norm is not a LayerNorm in eval
        mode without forward hooks.

        The function raises ValueError for x that is not one token [1, batch_size, d_model], or a state list of
        the wrong length or shapes.
        """
        return transformer_step_function(self)
