"""Fast Weights Transformer: linear attention as a fast-weight programmer with the delta rule.

Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly Fast Weight Programmers" (ICML 2021).

A linear transformer keeps, per head, a matrix of "fast weights" W that each token writes to and reads from.
The paper (i) replaces the purely additive write W ← W + v ⊗ φ(k) by the delta rule, which first reads the value
v̄ stored under the key and replaces it by a β-mix of old and new, and (ii) introduces the DPFP feature map φ,
normalised by its sum so that no attention denominator is needed:

    kᵢ, vᵢ, qᵢ = W_k xᵢ, W_v xᵢ, W_q xᵢ
    v̄ᵢ = W⁽ⁱ⁻¹⁾ φ'(kᵢ)
    βᵢ = σ(W_β xᵢ)                                    (one scalar per head)
    W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + βᵢ (vᵢ − v̄ᵢ) ⊗ φ'(kᵢ)
    yᵢ = W⁽ⁱ⁾ φ'(qᵢ)                                  (no 1/√d scaling)

The modules here equal labml-nn 0.5.1's `labml_nn.transformers.fast_weights` (names, arguments, state-dict
keys, sequence-first layout), including two of its choices worth knowing:

* the layer adds attention to the *un-normalised* input, x + Attn(x): `norm_self_attn` exists (so state dicts
  match) but is not applied; only the FFN gets a pre-norm;
* `FastWeightsAttention.dropout` exists but is not applied; the layer's dropout on the attention output is the
  only dropout on that path.

What is new:

* the paper's other variants, as arguments: the feature map `phi` (`DPFP`, `LinearElu` = ELU + 1, `Favor` =
  FAVOR+, each with or without sum normalisation; `feature_maps.py`), the update rule (`update_rule='delta'`, or
  `'sum'`: W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + vᵢ ⊗ φ'(kᵢ), linear attention as a fast-weight programmer, `sum_rule.py`) and
  linear attention's normaliser yᵢ / (zᵢ · φ'(qᵢ)) (`attention_normalization=True`, `normalization.py`);
* each rule computed three ways (`kernel=`): `'chunked'` (chunkwise-parallel, the default, fast for training),
  `'loop'` (the token-by-token reference) and `'step'` (the recurrent step that generation uses);
* the fast weights carried between calls with `forward_with_state(x, state) -> (y, state)`, kept in float32 under
  autocast.

State layout: per layer, W of shape [batch_size, heads, d_k, d_dot] (values × features, labml_nn's 'bhvk'
order), with d_dot = 2 · d_k · ν for DPFP, d_k for ELU + 1 and 2 · m for FAVOR+ with m features; with attention
normalisation one more row, z: [batch_size, heads, d_k + 1, d_dot]. The transformer's state is a list with one
such tensor per layer. Under autocast the state is float32 (the kernels keep it there).

The package: this module holds the whole-sequence modules; `feature_maps.py` the feature maps φ'; `delta_rule.py`
and `sum_rule.py` the update rules' kernels (step, loop = the reference, chunked = fast); `normalization.py` the
attention normaliser; `step.py` the generation step functions that `step_function()` returns; `token_wise.py` the
token-wise variants (one step per call, as labml_nn's `token_wise.py`); `retrieval.py` the models of the
associative-retrieval experiment.
"""
from typing import Optional

import torch
from torch import nn

from lazylab.models.fast_weights.delta_rule import delta_rule_chunked, delta_rule_loop, delta_rule_step
from lazylab.models.fast_weights.feature_maps import DPFP, FEATURE_MAPS, Favor, LinearElu, make_feature_map
from lazylab.models.fast_weights.normalization import (
    divide_by_last_column,
    join_state,
    normalise_by_attention,
    split_state,
)
from lazylab.models.fast_weights.step import (
    LayerStepFunction,
    TransformerStepFunction,
    layer_step_function,
    one_token_inference,
    projector,
    transformer_step_function,
)
from lazylab.models.fast_weights.sum_rule import sum_rule_chunked, sum_rule_loop, sum_rule_step
from lazylab.models.feed_forward import FeedForward  # re-exported, as labml_nn does (its experiment imports it here)
from lazylab.models.mha import PrepareForMultiHeadAttention
from lazylab.models.utils import PreNormLayer, check_heads, check_n_layers, clone_module_list

__all__ = ['DPFP', 'LinearElu', 'Favor', 'FEATURE_MAPS', 'make_feature_map', 'FastWeightsAttention',
           'FastWeightsAttentionTransformerLayer', 'FeedForward', 'FastWeightsAttentionTransformer', 'KERNELS',
           'UPDATE_RULES', 'DEFAULT_CHUNK_SIZE', 'run_update_rule']

KERNELS = ('chunked', 'loop', 'step')
UPDATE_RULES = ('delta', 'sum')
DEFAULT_CHUNK_SIZE = 16  # fastest on CPU for d_dot = 64 (small batched matmuls); GPUs prefer 64
#: the sum rule's smallest chunk: it has no within-chunk inverse, and longer chunks mean fewer, larger products
#: (at seq_len 256 on the CPU, chunks of 32-64 run 1.6× faster than 16); results are the same for any chunk size
SUM_RULE_CHUNK_SIZE = 64


def _check_kernel(kernel: str, chunk_size: int):
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}; got kernel={kernel!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got chunk_size={chunk_size}")


def check_update_rule(update_rule: str):
    """Raises ValueError unless update_rule is 'delta' or 'sum'."""
    if update_rule not in UPDATE_RULES:
        raise ValueError(f"update_rule must be one of {', '.join(UPDATE_RULES)}; got update_rule={update_rule!r}")


def run_update_rule(update_rule: str, kernel: str, chunk_size: int, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, beta: Optional[torch.Tensor], state: Optional[torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `update_rule` ('delta' or 'sum'; the sum rule takes no beta) over a sequence with the named kernel
    (shapes as in `delta_rule` / `sum_rule`). The sum rule runs in chunks of at least SUM_RULE_CHUNK_SIZE.

    A single token always takes the recurrent step: it is the same computation, without the chunking set-up.
    """
    if update_rule == 'delta':
        step, loop = delta_rule_step, delta_rule_loop
        chunked = delta_rule_chunked
        args = (beta,)
    else:
        step, loop, chunked, args = sum_rule_step, sum_rule_loop, sum_rule_chunked, ()
        chunk_size = max(chunk_size, SUM_RULE_CHUNK_SIZE)
    if kernel == 'loop' or q.shape[0] == 0:
        return loop(q, k, v, *args, state)
    if q.shape[0] == 1 or kernel == 'step':
        ys = []
        for i in range(q.shape[0]):
            y, state = step(q[i], k[i], v[i], *(a[i] for a in args), state)
            ys.append(y)
        return torch.stack(ys), state
    return chunked(q, k, v, *args, state, chunk_size=chunk_size)


def run_delta_rule(kernel: str, chunk_size: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   beta: torch.Tensor, state: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`run_update_rule('delta', …)` (the name before the sum rule came)."""
    return run_update_rule('delta', kernel, chunk_size, q, k, v, beta, state)


class FastWeightsAttention(nn.Module):
    """Fast-weight attention over a whole sequence (Schlag, Irie & Schmidhuber 2021): the delta rule by default.

    Per head, with φ' the feature map (sum-normalised DPFP in labml_nn):
        delta rule:  v̄ᵢ = W⁽ⁱ⁻¹⁾ φ'(kᵢ),   W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + βᵢ (vᵢ − v̄ᵢ) ⊗ φ'(kᵢ),   βᵢ = σ(W_β xᵢ)
        sum rule:    W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + vᵢ ⊗ φ'(kᵢ)
        read-out:    yᵢ = W⁽ⁱ⁾ φ'(qᵢ),  or with attention normalisation yᵢ / (zᵢ · φ'(qᵢ) + eps), zᵢ = Σ_{j≤i} φ'(kⱼ)
    followed by the output projection W_o [y₁; …; y_h] + b_o.

    Args:
        heads: number of heads h; d_model must be divisible by it (d_k = d_model / h).
        d_model: model width d.
        dropout_prob: kept for labml_nn compatibility; not applied here (the layer drops the attention output).
        phi: the feature map φ', e.g. DPFP(nu=1), LinearElu(), Favor(d_k, m), mapping d_k → d_dot.
        kernel: 'chunked' (default; chunkwise-parallel), 'loop' (reference) or 'step' (recurrent step per token).
        chunk_size: tokens per chunk for 'chunked'; any seq_len works (the sum rule uses at least
            SUM_RULE_CHUNK_SIZE = 64: the result is the same, and faster).
        update_rule: 'delta' (default) or 'sum'.
        attention_normalization: divide the read-out by zᵢ · φ'(qᵢ) + eps (default False, as labml_nn).
        eps: that denominator's eps.

    Parameters (labml_nn's names): query.linear, key.linear, value.linear (no bias), interpolation_weight.0.linear
    (W_β, no bias), output (with bias). The sum rule has no β: `interpolation_weight` is None and its weight is not
    in the state dict (it is still drawn, then dropped, so that from the same seed the other weights equal the
    delta rule's). A delta-rule state dict loads into a sum-rule module with strict=False (β is left out).

    Shapes:
        x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]
        state (forward_with_state, in and out): [batch_size, heads, d_k, d_dot], or [batch_size, heads, d_k + 1,
        d_dot] with attention normalisation (the last row is z); float32 under autocast.

    Raises:
        ValueError: d_model not divisible by heads; unknown kernel or update rule; chunk_size < 1.
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float, phi: nn.Module, *,
                 kernel: str = 'chunked', chunk_size: int = DEFAULT_CHUNK_SIZE, update_rule: str = 'delta',
                 attention_normalization: bool = False, eps: float = 1e-6):
        super().__init__()
        check_heads(d_model, heads, 'FastWeightsAttention')
        _check_kernel(kernel, chunk_size)
        check_update_rule(update_rule)
        self.d_k = d_model // heads
        self.heads = heads
        # Creation order as in labml_nn, so the same seed gives the same initial weights.
        self.query = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
        self.key = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
        self.value = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
        self.interpolation_weight = nn.Sequential(PrepareForMultiHeadAttention(d_model, heads, 1, bias=False),
                                                  nn.Sigmoid())
        self.phi = phi
        self.output = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout_prob)
        self.kernel = kernel
        self.chunk_size = chunk_size
        self.update_rule = update_rule
        self.attention_normalization = attention_normalization
        self.eps = eps
        if update_rule == 'sum':  # no β (see the class docstring); drawn above only to keep the seed's order
            self.interpolation_weight = None

    def set_kernel(self, kernel: str, chunk_size: Optional[int] = None):
        """Switch how the delta rule is computed (the result is the same up to float rounding)."""
        chunk_size = self.chunk_size if chunk_size is None else chunk_size
        _check_kernel(kernel, chunk_size)
        self.kernel, self.chunk_size = kernel, chunk_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model], starting from zero fast weights."""
        return self.forward_with_state(x)[0]

    def forward_with_state(self, x: torch.Tensor, state: Optional[torch.Tensor] = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """Continue from fast weights `state` ([batch_size, heads, d_k, d_dot], or d_k + 1 rows with attention
        normalisation; None = zeros).

        Returns the output [seq_len, batch_size, d_model] and the fast weights after the last token (float32
        under autocast).
        """
        d_model = self.heads * self.d_k
        if x.dim() != 3 or x.shape[-1] != d_model:
            raise ValueError(f"FastWeightsAttention expects x of shape [seq_len, batch_size, d_model={d_model}], "
                             f"got {tuple(x.shape)}")
        seq_len, batch_size, _ = x.shape
        query, key, value, beta = projector(self)(x)  # one matmul for all four with the standard projections
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
                                     weights)
        if self.attention_normalization:
            y, z = normalise_by_attention(y, query, key, z, self.eps)
            weights = join_state(weights, z)
        return self.output(y.reshape(seq_len, batch_size, d_model)), weights  # (no -1: seq_len may be 0)


def per_layer_state(state: Optional[list[Optional[torch.Tensor]]], n_layers: int) -> list[Optional[torch.Tensor]]:
    """The per-layer fast weights a transformer continues from: None → one None (zeros) per layer.

    Raises:
        ValueError: a list whose length is not n_layers.
    """
    if state is None:
        return [None] * n_layers
    if len(state) != n_layers:
        raise ValueError(f"state has {len(state)} entries; expected one per layer (n_layers={n_layers})")
    return list(state)


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
        return self._add_attention_and_ffn(x, self.attn(x))

    def forward_with_state(self, x: torch.Tensor, state: Optional[torch.Tensor] = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` continuing from the fast weights `state`; returns (output, new state). Calls the attention's
        `forward_with_state` directly, so forward hooks of `attn` itself do not run here."""
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
        """Use `kernel` ('chunked', 'loop' or 'step') in every layer's attention."""
        for layer in self.layers:
            layer.attn.set_kernel(kernel, chunk_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def forward_with_state(self, x: torch.Tensor, state: Optional[list[torch.Tensor]] = None
                           ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Continue from the per-layer fast weights `state`; returns (output, new per-layer fast weights).

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
