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
* the delta rule's successors, as arguments too: `update_rule='gated_delta'` (Gated DeltaNet, Yang, Kautz &
  Hatamizadeh 2025: a decay exp(gᵢ) of W before each write, `gated_delta_rule.py`, its gate in `decay.py`),
  `update_rule='delta_product'` (DeltaProduct, Siems et al. 2025: `householder_steps` writes per token, with the
  gate if `gated`; `delta_product.py`), `negative_eigenvalues=True` (β = 2σ(·) ∈ (0, 2), Grazzi et al. 2025) and
  the feature map `L2NormSiLU` (SiLU, then L2 normalisation);
* each rule computed three ways (`kernel=`): `'chunked'` (chunkwise-parallel, the default, fast for training),
  `'loop'` (the token-by-token reference) and `'step'` (the recurrent step that generation uses);
* the fast weights carried between calls with `forward_with_state(x, state) -> (y, state)`, kept in float32 under
  autocast.

State layout: per layer, W of shape [batch_size, heads, d_k, d_dot] (values × features, labml_nn's 'bhvk'
order), with d_dot = 2 · d_k · ν for DPFP, d_k for ELU + 1 and 2 · m for FAVOR+ with m features; with attention
normalisation one more row, z: [batch_size, heads, d_k + 1, d_dot]. The transformer's state is a list with one
such tensor per layer. Under autocast the state is float32 (the kernels keep it there).

The package (this module only re-exports): `layers.py` the whole-sequence modules; `feature_maps.py` the feature
maps φ'; `delta_rule.py`, `sum_rule.py`, `gated_delta_rule.py` and `delta_product.py` the update rules' kernels
(step, loop = the reference, chunked = fast; README.md beside them derives the chunked forms), `gated_sum.py` and
`gla.py` the diagonal-gate rules' kernels (the gated sum rule of Mamba-2 and RetNet, and GLA; not yet a module
option), `_chunks.py` what they share,
`rules.py` the rules by name; `decay.py` the gate; `normalization.py` the attention normaliser;
`step.py` the generation step functions that `step_function()` returns; `token_wise.py` the token-wise variants
(one step per call, as labml_nn's `token_wise.py`); `retrieval.py` the models of the associative-retrieval
experiment; `fla_reference.py` loads flash-linear-attention's plain-PyTorch references for the tests.

Two more rules' kernels (step, loop, chunked), which the modules do not offer yet: `kda.py`, Kimi Delta Attention
(the gated delta rule with a decay per key channel), and `dplr.py`, RWKV-7's diagonal-plus-rank-one rule.
"""
from lazylab.models.fast_weights.decay import DecayGate
from lazylab.models.fast_weights.delta_product import delta_product_chunked, delta_product_loop, delta_product_step
from lazylab.models.fast_weights.delta_rule import delta_rule_chunked, delta_rule_loop, delta_rule_step
from lazylab.models.fast_weights.dplr import dplr_chunked, dplr_loop, dplr_step
from lazylab.models.fast_weights.feature_maps import (
    DPFP,
    FEATURE_MAPS,
    Favor,
    L2NormSiLU,
    LinearElu,
    make_feature_map,
)
from lazylab.models.fast_weights.gated_delta_rule import (
    gated_delta_rule_chunked,
    gated_delta_rule_loop,
    gated_delta_rule_step,
)
from lazylab.models.fast_weights.gated_sum import gated_sum_chunked, gated_sum_loop, gated_sum_step
from lazylab.models.fast_weights.gla import gla_chunked, gla_loop, gla_step
from lazylab.models.fast_weights.kda import kda_chunked, kda_loop, kda_step
from lazylab.models.fast_weights.layers import (
    FastWeightsAttention,
    FastWeightsAttentionTransformer,
    FastWeightsAttentionTransformerLayer,
    check_rule_options,
)
from lazylab.models.fast_weights.normalization import (
    divide_by_last_column,
    join_state,
    normalise_by_attention,
    split_state,
)
from lazylab.models.fast_weights.rules import (
    DEFAULT_CHUNK_SIZE,
    GATED_RULES,
    KERNELS,
    SUM_RULE_CHUNK_SIZE,
    UPDATE_RULES,
    check_kernel,
    check_update_rule,
    run_delta_rule,
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
from lazylab.models.fast_weights.sum_rule import sum_rule_chunked, sum_rule_loop, sum_rule_step
from lazylab.models.feed_forward import FeedForward  # re-exported, as labml_nn does (its experiment imports it here)
from lazylab.models.mha import PrepareForMultiHeadAttention  # (re-exported: importable here before the split)
from lazylab.models.utils import PreNormLayer, check_heads, check_n_layers, clone_module_list  # (the same)

__all__ = ['DPFP', 'LinearElu', 'Favor', 'L2NormSiLU', 'FEATURE_MAPS', 'make_feature_map', 'FastWeightsAttention',
           'FastWeightsAttentionTransformerLayer', 'FeedForward', 'FastWeightsAttentionTransformer', 'KERNELS',
           'UPDATE_RULES', 'GATED_RULES', 'DEFAULT_CHUNK_SIZE', 'SUM_RULE_CHUNK_SIZE', 'run_update_rule',
           'run_delta_rule', 'check_update_rule', 'check_kernel', 'check_rule_options', 'per_layer_state',
           'DecayGate', 'delta_rule_step', 'delta_rule_loop', 'delta_rule_chunked', 'sum_rule_step', 'sum_rule_loop',
           'sum_rule_chunked', 'gated_delta_rule_step', 'gated_delta_rule_loop', 'gated_delta_rule_chunked',
           'delta_product_step', 'delta_product_loop', 'delta_product_chunked', 'gated_sum_step', 'gated_sum_loop',
           'gated_sum_chunked', 'gla_step', 'gla_loop', 'gla_chunked', 'kda_step', 'kda_loop', 'kda_chunked',
           'dplr_step', 'dplr_loop', 'dplr_chunked', 'divide_by_last_column',
           'join_state', 'normalise_by_attention', 'split_state', 'LayerStepFunction', 'TransformerStepFunction',
           'layer_step_function', 'one_token_inference', 'projector', 'transformer_step_function',
           'PrepareForMultiHeadAttention', 'PreNormLayer', 'check_heads', 'check_n_layers', 'clone_module_list']
