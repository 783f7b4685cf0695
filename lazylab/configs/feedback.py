"""Configurable Feedback Transformer (`lazylab.models.feedback`): `FeedbackConfigs`.

The defaults are those of labml-nn 0.5.1's feedback experiment (d_model 512, 8 heads, d_ff 2048, 6 layers, no
dropout, model 'feedback_transformer_kv'); each `model` option builds the same `AutoregressiveModel` as labml-nn's
option of that name, so from the same seed the state dicts are equal (the model is a `FeedbackLanguageModel`, an
`AutoregressiveModel` whose generation checks its length up front). Added: `n_positions`, the rows of each layer's
relative-position tables (labml-nn's fixed 4096), the longest memory a step may attend over; `memory_span`,
attend only to the last N memory vectors (0, the default: every earlier step, as labml-nn).

    conf = FeedbackConfigs()
    conf._set_values({'n_tokens': 65, 'd_model': 128, 'heads': 4, 'd_ff': 512, 'n_layers': 4,
                      'model': 'feedback_transformer', 'ffn.glu_variant': 'SwiGLU'})
    model = conf.model          # AutoregressiveModel(65, 128, FeedbackTransformer(...))

The FFN is a `FeedForwardConfigs` whose d_model, d_ff and dropout default to this config's; each layer gets its
own copy (the transformer deep-copies the layer).
"""
from lazylab.configs import BaseConfigs, option
from lazylab.configs.transformer import FeedForwardConfigs, feed_forward_configs
from lazylab.configs.types import NonNegativeInt, PositiveInt, Probability
from lazylab.models import feedback
from lazylab.models.autoregressive import AutoregressiveModel


class FeedbackConfigs(BaseConfigs):
    """Feedback Transformer (Fan et al. 2020) language model and its parts."""
    n_tokens: PositiveInt  # vocabulary size (the experiment sets it from the dataset)
    d_model: PositiveInt = 512  # model width
    heads: PositiveInt = 8  # attention heads; d_model must be divisible by it
    d_ff: PositiveInt = 2048  # FFN hidden width
    n_layers: PositiveInt = 6  # transformer layers
    dropout: Probability = 0.0  # on attention weights, attention and FFN outputs, and the FFN hidden layer
    n_positions: PositiveInt = feedback.DEFAULT_N_POSITIONS  # relative positions per layer: longest memory a step sees
    memory_span: NonNegativeInt = 0  # attend to the last N memory vectors only (0: every earlier step)

    ffn: FeedForwardConfigs
    model: AutoregressiveModel = 'feedback_transformer_kv'  # or 'feedback_transformer' (the original)


@option(FeedbackConfigs.ffn, 'default')
def _ffn_configs(c: FeedbackConfigs):
    return feed_forward_configs(c, ('d_model', 'd_ff', 'dropout'))


def _layer(c: FeedbackConfigs, kv: bool) -> feedback.FeedbackTransformerLayer:
    # Attention before FFN: labml-nn's creation order, so one seed gives the same weights.
    attn = feedback.FeedbackAttention(c.heads, c.d_model, c.dropout, is_kv_precomputed=kv,
                                      n_positions=c.n_positions)
    return feedback.FeedbackTransformerLayer(d_model=c.d_model, attn=attn, feed_forward=c.ffn.ffn,
                                             dropout_prob=c.dropout)


@option(FeedbackConfigs.model, 'feedback_transformer')
def _feedback_transformer(c: FeedbackConfigs):
    """The original: every layer projects the memory to its own keys and values."""
    core = feedback.FeedbackTransformer(_layer(c, False), c.n_layers, memory_span=c.memory_span)
    return feedback.FeedbackLanguageModel(c.n_tokens, c.d_model, core)


@option(FeedbackConfigs.model, 'feedback_transformer_kv')
def _feedback_transformer_kv(c: FeedbackConfigs):
    """Keys and values computed once per memory vector and shared by all layers."""
    core = feedback.FeedbackTransformerKV(_layer(c, True), c.n_layers, c.d_model, c.heads, memory_span=c.memory_span)
    return feedback.FeedbackLanguageModel(c.n_tokens, c.d_model, core)
