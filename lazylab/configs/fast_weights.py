"""Configurable Fast Weights Transformer (`lazylab.models.fast_weights`): `FastWeightsConfigs`.

The defaults are those of labml-nn 0.5.1's fast-weights experiment (d_model 512, 8 heads, d_ff 2048, 6 layers,
no dropout, ν = 1); `model` builds the same `AutoregressiveModel` as its `'fast_weights_transformer'` option, so
from the same seed the state dicts are equal. Added: how the update rule is computed (`kernel`, `chunk_size`;
results are equal whichever is chosen), a `'token_wise'` option for `transformer` (labml-nn's token-wise model),
and the paper's variants (Schlag, Irie & Schmidhuber 2021, sections 4-5) as options:

    phi                      'dpfp' (with nu; labml_nn's), 'linear' (ELU + 1), 'favor' (FAVOR+, favor_features m),
                             'l2' (SiLU, then L2 normalisation: DeltaNet's keys and queries)
                             — an option item: register another with @option(FastWeightsConfigs.phi, 'name')
    sum_normalization        φ' = φ / (Σφ + eps) (default True, as DPFP has it in labml_nn; not for 'l2')
    update_rule              'delta' (default), 'sum' (no β), and the delta rule's successors:
                             'gated_delta' (Gated DeltaNet: a decay gate before each write, Yang, Kautz &
                             Hatamizadeh 2025) and 'delta_product' (DeltaProduct: householder_steps writes per
                             token, with the gate if `gated`; Siems et al. 2025)
    householder_steps        n_h of delta_product (default 2)
    gated                    delta_product with the gate (default False)
    negative_eigenvalues     β = 2σ(·) ∈ (0, 2) instead of σ(·) (Grazzi et al. 2025; every rule with a β)
    attention_normalization  yᵢ / (zᵢ · φ'(qᵢ)), zᵢ = Σ_{j≤i} φ'(kⱼ) (default False; delta and sum rules)

    conf = FastWeightsConfigs()
    conf._set_values({'n_tokens': 65, 'd_model': 128, 'heads': 4, 'd_ff': 512, 'n_layers': 4, 'nu': 2,
                      'ffn.activation': 'GELU'})
    model = conf.model          # AutoregressiveModel(65, 128, FastWeightsAttentionTransformer(...))

The FFN is a `FeedForwardConfigs` whose d_model, d_ff and dropout default to this config's; each layer gets its
own copy (the transformer deep-copies the layer).
"""
from typing import Literal

from torch import nn

from lazylab.configs import BaseConfigs, option
from lazylab.configs.transformer import FeedForwardConfigs, feed_forward_configs
from lazylab.configs.types import PositiveInt, Probability
from lazylab.errors import UsageError
from lazylab.models import fast_weights
from lazylab.models.autoregressive import AutoregressiveModel
from lazylab.models.fast_weights import token_wise


class FastWeightsConfigs(BaseConfigs):
    """Fast Weights Transformer (Schlag, Irie & Schmidhuber 2021) language model and its parts."""
    n_tokens: PositiveInt  # vocabulary size (the experiment sets it from the dataset)
    d_model: PositiveInt = 512  # model width
    heads: PositiveInt = 8  # attention heads; d_model must be divisible by it
    d_ff: PositiveInt = 2048  # FFN hidden width
    n_layers: PositiveInt = 6  # transformer layers
    dropout: Probability = 0.0  # on attention and FFN outputs (and the FFN hidden layer)
    nu: PositiveInt = 1  # ν of the DPFP feature map: d_dot = 2 · (d_model / heads) · ν
    kernel: Literal['chunked', 'loop', 'step'] = 'chunked'  # update rule: chunked (fast), loop (reference)
    chunk_size: PositiveInt = fast_weights.DEFAULT_CHUNK_SIZE  # tokens per chunk for 'chunked'
    phi: nn.Module = 'dpfp'  # feature map φ': dpfp (labml_nn's), linear (ELU + 1), favor (FAVOR+) or l2 (L2-SiLU)
    favor_features: PositiveInt = 64  # m, random features of FAVOR+ (d_dot = 2m)
    sum_normalization: bool = True  # φ' = φ / (Σ φ + eps) after the feature map (not for l2)
    # delta rule (with β), the sum rule (linear attention), the gated delta rule or DeltaProduct
    update_rule: Literal['delta', 'sum', 'gated_delta', 'delta_product'] = 'delta'
    householder_steps: PositiveInt = 2  # n_h, delta-rule writes per token of delta_product
    gated: bool = False  # delta_product with the gated delta rule's decay gate
    negative_eigenvalues: bool = False  # β = 2σ(·) ∈ (0, 2): eigenvalues of I − β k kᵀ down to −1
    attention_normalization: bool = False  # divide the read-out by zᵢ · φ'(qᵢ), zᵢ = Σ φ'(kⱼ) (delta, sum rules)

    ffn: FeedForwardConfigs
    transformer: nn.Module = 'default'  # 'default' (whole sequence) or 'token_wise' (labml_nn's token-wise)
    model: AutoregressiveModel = 'fast_weights_transformer'


@option(FastWeightsConfigs.ffn, 'default')
def _ffn_configs(c: FastWeightsConfigs):
    return feed_forward_configs(c, ('d_model', 'd_ff', 'dropout'))


def _phi(c: FastWeightsConfigs, name: str):
    return fast_weights.make_feature_map(name, c.d_model // c.heads, nu=c.nu, features=c.favor_features,
                                         sum_normalization=c.sum_normalization)


@option(FastWeightsConfigs.phi, 'dpfp')
def _dpfp(c: FastWeightsConfigs):
    """DPFP with ν = nu (Schlag et al. 2021, section 4.2)."""
    return _phi(c, 'dpfp')


@option(FastWeightsConfigs.phi, 'linear')
def _linear_elu(c: FastWeightsConfigs):
    """ELU(x) + 1 (Katharopoulos et al. 2020)."""
    return _phi(c, 'linear')


@option(FastWeightsConfigs.phi, 'favor')
def _favor(c: FastWeightsConfigs):
    """FAVOR+ with favor_features random features, drawn from torch's generator (the run's seed) when built."""
    return _phi(c, 'favor')


@option(FastWeightsConfigs.phi, 'l2')
def _l2_silu(c: FastWeightsConfigs):
    """SiLU, then L2 normalisation (DeltaNet's and Gated DeltaNet's keys and queries); d_dot = d_model / heads."""
    return _phi(c, 'l2')


def check_rule_keys(update_rule: str, gated: bool, negative_eigenvalues: bool, attention_normalization: bool):
    """The keys beside `update_rule` that only some rules have (householder_steps ≥ 1 is its type's check).

    Raises:
        UsageError: naming the key, its value and the rule: gated=true without update_rule=delta_product,
            negative_eigenvalues=true with update_rule=sum (no β), attention_normalization=true with gated_delta or
            delta_product.
    """
    if gated and update_rule != 'delta_product':
        raise UsageError(f'gated=true is the decay gate of update_rule=delta_product, got update_rule={update_rule} '
                         f'(the gated delta rule is update_rule=gated_delta)')
    if negative_eigenvalues and update_rule == 'sum':
        raise UsageError('negative_eigenvalues=true doubles β, which update_rule=sum does not have')
    if attention_normalization and update_rule in ('gated_delta', 'delta_product'):
        raise UsageError(f'attention_normalization=true is for update_rule=delta or sum, got update_rule={update_rule}')


def _rule_kwargs(c: FastWeightsConfigs) -> dict:
    """The update rule and its options, for FastWeightsAttention (checked: `check_rule_keys`)."""
    check_rule_keys(c.update_rule, c.gated, c.negative_eigenvalues, c.attention_normalization)
    return {'update_rule': c.update_rule, 'attention_normalization': c.attention_normalization,
            'householder_steps': c.householder_steps, 'gated': c.gated, 'negative_eigenvalues': c.negative_eigenvalues}


@option(FastWeightsConfigs.transformer, 'default')
def _fast_weights_transformer(c: FastWeightsConfigs):
    m = fast_weights
    attn = m.FastWeightsAttention(c.heads, c.d_model, c.dropout, c.phi, kernel=c.kernel,
                                  chunk_size=c.chunk_size, **_rule_kwargs(c))
    layer = m.FastWeightsAttentionTransformerLayer(d_model=c.d_model, attn=attn, feed_forward=c.ffn.ffn,
                                                   dropout_prob=c.dropout)
    return m.FastWeightsAttentionTransformer(layer, c.n_layers)


@option(FastWeightsConfigs.transformer, 'token_wise')
def _token_wise_transformer(c: FastWeightsConfigs):
    m = token_wise
    check_rule_keys(c.update_rule, c.gated, c.negative_eigenvalues, c.attention_normalization)
    if c.update_rule not in ('delta', 'sum') or c.negative_eigenvalues:
        raise UsageError(f"transformer=token_wise is labml_nn's token-wise model: update_rule delta or sum, without "
                         f"negative_eigenvalues (got update_rule={c.update_rule}"
                         f"{', negative_eigenvalues=true' if c.negative_eigenvalues else ''}); the whole-sequence "
                         f"model (transformer=default) generates token by token with every rule")
    attn = m.FastWeightsAttention(c.heads, c.d_model, c.dropout, c.phi,
                                  update_rule=c.update_rule, attention_normalization=c.attention_normalization)
    layer = m.FastWeightsAttentionTransformerLayer(d_model=c.d_model, attn=attn, feed_forward=c.ffn.ffn,
                                                   dropout_prob=c.dropout)
    return m.FastWeightsAttentionTransformer(layer, c.n_layers)


@option(FastWeightsConfigs.model, 'fast_weights_transformer')
def _model(c: FastWeightsConfigs):
    return AutoregressiveModel(c.n_tokens, c.d_model, c.transformer)
