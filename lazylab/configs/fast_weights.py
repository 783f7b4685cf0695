"""Configurable Fast Weights Transformer (`lazylab.models.fast_weights`): `FastWeightsConfigs`.

The defaults are those of labml-nn 0.5.1's fast-weights experiment (d_model 512, 8 heads, d_ff 2048, 6 layers,
no dropout, ν = 1); `model` builds the same `AutoregressiveModel` as its `'fast_weights_transformer'` option, so
from the same seed the state dicts are equal. Added: how the delta rule is computed (`kernel`, `chunk_size`;
results are equal whichever is chosen) and a `'token_wise'` option for `transformer` (labml-nn's token-wise model).

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
from lazylab.models import fast_weights
from lazylab.models.autoregressive import AutoregressiveModel


class FastWeightsConfigs(BaseConfigs):
    """Fast Weights Transformer (Schlag, Irie & Schmidhuber 2021) language model and its parts."""
    n_tokens: PositiveInt  # vocabulary size (the experiment sets it from the dataset)
    d_model: PositiveInt = 512  # model width
    heads: PositiveInt = 8  # attention heads; d_model must be divisible by it
    d_ff: PositiveInt = 2048  # FFN hidden width
    n_layers: PositiveInt = 6  # transformer layers
    dropout: Probability = 0.0  # on attention and FFN outputs (and the FFN hidden layer)
    nu: PositiveInt = 1  # ν of the DPFP feature map: d_dot = 2 · (d_model / heads) · ν
    kernel: Literal['chunked', 'loop', 'step'] = 'chunked'  # delta rule: chunked (fast), loop (reference)
    chunk_size: PositiveInt = fast_weights.DEFAULT_CHUNK_SIZE  # tokens per chunk for 'chunked'

    ffn: FeedForwardConfigs
    transformer: nn.Module = 'default'  # 'default' (whole sequence) or 'token_wise' (labml_nn's token-wise)
    model: AutoregressiveModel = 'fast_weights_transformer'


@option(FastWeightsConfigs.ffn, 'default')
def _ffn_configs(c: FastWeightsConfigs):
    return feed_forward_configs(c, ('d_model', 'd_ff', 'dropout'))


@option(FastWeightsConfigs.transformer, 'default')
def _fast_weights_transformer(c: FastWeightsConfigs):
    m = fast_weights
    attn = m.FastWeightsAttention(c.heads, c.d_model, c.dropout, m.DPFP(nu=c.nu), kernel=c.kernel,
                                  chunk_size=c.chunk_size)
    layer = m.FastWeightsAttentionTransformerLayer(d_model=c.d_model, attn=attn, feed_forward=c.ffn.ffn,
                                                   dropout_prob=c.dropout)
    return m.FastWeightsAttentionTransformer(layer, c.n_layers)


@option(FastWeightsConfigs.transformer, 'token_wise')
def _token_wise_transformer(c: FastWeightsConfigs):
    from lazylab.models.fast_weights import token_wise as m
    attn = m.FastWeightsAttention(c.heads, c.d_model, c.dropout, m.DPFP(nu=c.nu))
    layer = m.FastWeightsAttentionTransformerLayer(d_model=c.d_model, attn=attn, feed_forward=c.ffn.ffn,
                                                   dropout_prob=c.dropout)
    return m.FastWeightsAttentionTransformer(layer, c.n_layers)


@option(FastWeightsConfigs.model, 'fast_weights_transformer')
def _model(c: FastWeightsConfigs):
    return AutoregressiveModel(c.n_tokens, c.d_model, c.transformer)
