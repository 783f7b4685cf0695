"""Baseline: a causal decoder-only softmax transformer on characters.

    lazylab train transformer [key=value …]          ≡  python -m lazylab.experiments.transformer …

A pre-norm transformer (Vaswani et al. 2017) under a causal mask, built from `TransformerConfigs` so that FFN
variants, relative attention and the kind of positional embedding can be compared on the same data.
"""
import sys

from torch import nn

from lazylab.configs import option
from lazylab.configs.transformer import TransformerConfigs
from lazylab.configs.types import LayerCount, PositiveInt, Probability
from lazylab.experiments import LABML_NN_PRESET, NLPAutoRegressionConfigs, device_of, main
from lazylab.experiments.memory import Need, language_model_needs, named
from lazylab.models.autoregressive import AutoregressiveTransformer, TokenAndPositionEmbeddings


class Configs(NLPAutoRegressionConfigs):
    """The causal transformer baseline. Common keys (d_model, heads, d_ff, n_layers, dropout) are copied into
    `transformer` (a TransformerConfigs), whose own options select the parts to compare, e.g.
    `transformer.ffn.glu_variant=SwiGLU`, `transformer.encoder_attn=relative`, `transformer.src_embed=fixed_pos`.
    The input embeddings default to `lazylab.models.autoregressive.TokenAndPositionEmbeddings` (learned positions
    starting as sinusoids, no √d_model scale); `transformer.src_embed=fixed_pos` gives labml_nn's (the `labml_nn`
    preset does). The model is `lazylab.models.autoregressive.AutoregressiveTransformer`.
    """
    model: nn.Module = 'transformer'
    transformer: TransformerConfigs  # the parts: attention, FFN variant, embeddings
    heads: PositiveInt = 4           # attention heads
    d_ff: PositiveInt = 512          # feed-forward hidden width
    n_layers: LayerCount = 4         # transformer layers
    dropout: Probability = 0.0       # dropout probability


@option(Configs.transformer, 'TransformerConfigs')
def _transformer_configs(c: Configs):
    conf = TransformerConfigs()
    conf.n_src_vocab = conf.n_tgt_vocab = c.n_tokens
    conf.d_model, conf.n_heads, conf.n_layers, conf.dropout = c.d_model, c.heads, c.n_layers, c.dropout
    conf._set_values({'ffn.d_ff': c.d_ff})  # reaches the FFN sub-config when it is created
    # unless transformer.src_embed names one of TransformerConfigs' options (fixed_pos, learned_pos, no_pos)
    conf.set_default(TransformerConfigs.src_embed,
                     func=lambda: TokenAndPositionEmbeddings(c.d_model, c.n_tokens, c.seq_len))
    return conf


@option(Configs.model, 'transformer')
def _transformer(c: Configs):
    t = c.transformer
    return AutoregressiveTransformer(t.encoder, t.src_embed, t.generator, c.seq_len).to(device_of(c))


def memory_needs(c: Configs) -> list[Need]:
    """The least memory a run takes (`lazylab.experiments.memory`), from the sizes `transformer` is built with."""
    t = c.transformer
    return language_model_needs(c, {'d_model': named(c, 'd_model', 'transformer.d_model', t.d_model),
                                    'd_ff': named(c, 'd_ff', 'transformer.ffn.d_ff', t.ffn.d_ff),
                                    'n_layers': named(c, 'n_layers', 'transformer.n_layers', t.n_layers),
                                    'heads': named(c, 'heads', 'transformer.n_heads', t.n_heads)})


#: named settings applied before the user's (`preset=labml_nn`)
PRESETS = {
    'labml_nn': {**LABML_NN_PRESET, 'transformer.src_embed': 'fixed_pos'},
}


if __name__ == '__main__':
    sys.exit(main(Configs))
