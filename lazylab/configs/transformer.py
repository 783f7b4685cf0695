"""Configurable transformer components: `FeedForwardConfigs` and `TransformerConfigs`.

The same items, options and defaults as labml-nn 0.5.1's `labml_nn.transformers.configs`, built on
`lazylab.configs` and `lazylab.models`, so a config that works there works here and, from the same seed, builds
modules with the same state dict. Additions: the 'SiLU' activation option.

Everything is lazy: reading `conf.encoder` builds only what the encoder needs. Overrides reach the FFN sub-config
by its path, e.g.

    conf = TransformerConfigs()
    conf.n_src_vocab = conf.n_tgt_vocab = 65
    conf._set_values({'d_model': 128, 'ffn.glu_variant': 'SwiGLU', 'encoder_attn': 'relative',
                      'src_embed': 'learned_pos'})
    model = conf.encoder_decoder

One deliberate difference: labml-nn builds 'relative' attention with its default dropout (0.1) whatever
`dropout` says; here it uses `dropout`, like 'mha' does. With the default dropout (0.1) the two agree.
"""
import copy
from collections.abc import Sequence
from typing import Literal

from torch import nn

from lazylab.configs import BaseConfigs, aggregate, calculate, option
from lazylab.configs.types import LayerCount, PositiveInt, Probability
from lazylab.models.feed_forward import FeedForward
from lazylab.models.mha import MultiHeadAttention
from lazylab.models.relative_mha import RelativeMultiHeadAttention
from lazylab.models.transformer import (
    Decoder,
    EmbeddingsWithLearnedPositionalEncoding,
    EmbeddingsWithPositionalEncoding,
    Encoder,
    EncoderDecoder,
    Generator,
    TransformerLayer,
)

#: the names `glu_variant` accepts: 'none' (plain FFN) or one of the aggregates below
GLUVariant = Literal['none', 'GLU', 'Bilinear', 'ReGLU', 'GEGLU', 'SwiGLU']


class FeedForwardConfigs(BaseConfigs):
    """Position-wise FFN (`lazylab.models.feed_forward.FeedForward`) and its GLU variants (Shazeer 2020).

    `glu_variant` selects a preset that sets is_gated=True, all three biases off and the activation:
    'GLU' (sigmoid), 'Bilinear' (identity), 'ReGLU' (ReLU), 'GEGLU' (GELU), 'SwiGLU' (SiLU). Items set
    explicitly win over the preset.
    """
    ffn: FeedForward  # the module
    d_model: PositiveInt  # token width (TransformerConfigs sets it to its own d_model)
    d_ff: PositiveInt = 2048  # hidden width
    dropout: Probability = 0.1  # on the hidden layer
    activation: nn.Module = 'ReLU'  # 'ReLU', 'GELU' or 'SiLU'
    is_gated: bool = False  # gate the hidden layer (GLU): act(x W₁) ⊗ (x V)
    bias1: bool = True  # bias of the first layer
    bias2: bool = True  # bias of the second layer
    bias_gate: bool = False  # bias of the gate's linear layer
    glu_variant: GLUVariant = 'none'  # 'none', 'GLU', 'Bilinear', 'ReGLU', 'GEGLU' or 'SwiGLU'


@option(FeedForwardConfigs.activation, 'ReLU')
def _relu():
    """max(0, x)"""
    return nn.ReLU()


@option(FeedForwardConfigs.activation, 'GELU')
def _gelu():
    """x Φ(x), Φ the standard normal CDF (Hendrycks & Gimpel 2016)."""
    return nn.GELU()


@option(FeedForwardConfigs.activation, 'SiLU')
def _silu():
    """x σ(x), also Swish₁ (Ramachandran et al. 2017)."""
    return nn.SiLU()


@option(FeedForwardConfigs.ffn, 'default')
def _feed_forward(c: FeedForwardConfigs):
    return FeedForward(c.d_model, c.d_ff, dropout=c.dropout, activation=c.activation, is_gated=c.is_gated,
                       bias1=c.bias1, bias2=c.bias2, bias_gate=c.bias_gate)


def _glu_variant(name: str, activation: nn.Module):
    aggregate(FeedForwardConfigs.glu_variant, name,
              (FeedForwardConfigs.is_gated, True),
              (FeedForwardConfigs.bias1, False),
              (FeedForwardConfigs.bias2, False),
              (FeedForwardConfigs.bias_gate, False),
              (FeedForwardConfigs.activation, activation))


_glu_variant('GLU', nn.Sigmoid())
_glu_variant('Bilinear', nn.Identity())
_glu_variant('ReGLU', nn.ReLU())
_glu_variant('GEGLU', nn.GELU())
_glu_variant('SwiGLU', nn.SiLU())


class TransformerConfigs(BaseConfigs):
    """An encoder-decoder transformer (`lazylab.models.transformer`) and all of its parts, each selectable.

    Attention items ('mha' or 'relative'): `encoder_attn`, `decoder_attn` (decoder self-attention),
    `decoder_mem_attn` (decoder attention over the encoder output). Embedding items ('fixed_pos', 'learned_pos'
    or 'no_pos', a bare nn.Embedding): `src_embed`, `tgt_embed`. `ffn` is a FeedForwardConfigs whose d_model
    and dropout default to this config's; each layer gets its own copy of the FFN.
    """
    n_heads: PositiveInt = 8  # attention heads; d_model must be divisible by it
    d_model: PositiveInt = 512  # model width
    n_layers: LayerCount = 6  # layers of the encoder (and of the decoder)
    dropout: Probability = 0.1  # on attention weights, layer outputs and the FFN's hidden layer
    n_src_vocab: PositiveInt  # source vocabulary size
    n_tgt_vocab: PositiveInt  # target vocabulary size (the generator's outputs)

    encoder_attn: MultiHeadAttention = 'mha'  # encoder self-attention: 'mha' or 'relative'
    decoder_attn: MultiHeadAttention = 'mha'  # decoder self-attention: 'mha' or 'relative'
    decoder_mem_attn: MultiHeadAttention = 'mha'  # decoder attention over the encoder output: 'mha' or 'relative'

    ffn: FeedForwardConfigs  # the position-wise FFN (d_model and dropout default to this config's)

    encoder_layer: TransformerLayer = 'default'  # one encoder layer (copied n_layers times)
    decoder_layer: TransformerLayer = 'default'  # one decoder layer (copied n_layers times)
    encoder: Encoder = 'default'  # the encoder stack
    decoder: Decoder = 'default'  # the decoder stack

    src_embed: nn.Module = 'fixed_pos'  # source embeddings: 'fixed_pos', 'learned_pos' or 'no_pos'
    tgt_embed: nn.Module = 'fixed_pos'  # target embeddings: 'fixed_pos', 'learned_pos' or 'no_pos'
    generator: Generator = 'default'  # the final projection to logits

    encoder_decoder: EncoderDecoder  # the whole encoder-decoder model


def _mha(c: TransformerConfigs):
    return MultiHeadAttention(c.n_heads, c.d_model, dropout_prob=c.dropout)


def _relative_mha(c: TransformerConfigs):
    return RelativeMultiHeadAttention(c.n_heads, c.d_model, dropout_prob=c.dropout)


for _item in (TransformerConfigs.encoder_attn, TransformerConfigs.decoder_attn, TransformerConfigs.decoder_mem_attn):
    calculate(_item, 'mha', _mha)
    calculate(_item, 'relative', _relative_mha)


def feed_forward_configs(parent: BaseConfigs, shared: Sequence[str]) -> FeedForwardConfigs:
    """The `ffn` sub-config of a model config: a FeedForwardConfigs whose items named in `shared` (e.g. 'd_model',
    'dropout') default to the parent's items of the same name, read when first needed. So `d_model=256` reaches
    the FFN, and `ffn.d_model=…` still wins."""
    conf = FeedForwardConfigs()
    for name in shared:
        conf.set_default(getattr(FeedForwardConfigs, name), func=lambda name=name: getattr(parent, name))
    return conf


@option(TransformerConfigs.ffn, 'default')
def _ffn_configs(c: TransformerConfigs):
    return feed_forward_configs(c, ('d_model', 'dropout'))  # d_ff is the FFN's own (2048, as labml-nn)


@option(TransformerConfigs.encoder_layer, 'default')
def _encoder_layer(c: TransformerConfigs):
    return TransformerLayer(d_model=c.d_model, self_attn=c.encoder_attn, src_attn=None,
                            feed_forward=copy.deepcopy(c.ffn.ffn), dropout_prob=c.dropout)


@option(TransformerConfigs.decoder_layer, 'default')
def _decoder_layer(c: TransformerConfigs):
    return TransformerLayer(d_model=c.d_model, self_attn=c.decoder_attn, src_attn=c.decoder_mem_attn,
                            feed_forward=copy.deepcopy(c.ffn.ffn), dropout_prob=c.dropout)


@option(TransformerConfigs.encoder, 'default')
def _encoder(c: TransformerConfigs):
    return Encoder(c.encoder_layer, c.n_layers)


@option(TransformerConfigs.decoder, 'default')
def _decoder(c: TransformerConfigs):
    return Decoder(c.decoder_layer, c.n_layers)


@option(TransformerConfigs.generator, 'default')
def _generator(c: TransformerConfigs):
    return Generator(c.n_tgt_vocab, c.d_model)


def _no_pos(d_model: int, n_vocab: int) -> nn.Embedding:
    """A bare token embedding, without positions or scale."""
    return nn.Embedding(n_vocab, d_model)


# embedding option name -> module built from (d_model, n_vocab)
_EMBEDDINGS = {'fixed_pos': EmbeddingsWithPositionalEncoding,
               'learned_pos': EmbeddingsWithLearnedPositionalEncoding,
               'no_pos': _no_pos}


def _embedding(make, vocab: str):
    def build(c: TransformerConfigs):
        return make(c.d_model, getattr(c, vocab))
    return build


for _item, _vocab in ((TransformerConfigs.src_embed, 'n_src_vocab'), (TransformerConfigs.tgt_embed, 'n_tgt_vocab')):
    for _name, _make in _EMBEDDINGS.items():
        calculate(_item, _name, _embedding(_make, _vocab))


@option(TransformerConfigs.encoder_decoder, 'default')
def _encoder_decoder(c: TransformerConfigs):
    return EncoderDecoder(c.encoder, c.decoder, c.src_embed, c.tgt_embed, c.generator)
