"""Transformer encoder and decoder (Vaswani et al. 2017, "Attention Is All You Need"), pre-norm, in labml-nn
0.5.1's layout: sequence-first tensors, the same class names, constructor arguments and state-dict keys.

- Embeddings: token embedding × √d_model plus positional encodings, fixed sinusoidal (section 3.5)

      PE[p, 2k] = sin(p / 10000^(2k / d_model)),   PE[p, 2k+1] = cos(p / 10000^(2k / d_model))

  or learned (one vector per position, initialised to zero).
- TransformerLayer, pre-norm (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture"):

      x ← x + Dropout(SelfAttn(LN(x)))
      x ← x + Dropout(SrcAttn(LN(x), memory))         (decoder layers only)
      x ← x + Dropout(FFN(LN(x)))

- Encoder / Decoder: n deep copies of a layer and a final LayerNorm. Generator: the output projection to logits.
"""
import math
from typing import Optional

import torch
from torch import nn

from lazylab.models.feed_forward import FeedForward
from lazylab.models.mha import MultiHeadAttention
from lazylab.models.utils import check_n_layers, clone_module_list


def get_positional_encoding(d_model: int, max_len: int = 5000) -> torch.Tensor:
    """Fixed sinusoidal encodings (Vaswani et al. 2017, section 3.5) as [max_len, 1, d_model], float32.

    Equal, bit for bit, to labml-nn's `get_positional_encoding`; an odd d_model (which labml-nn rejects) gets one
    more sine than cosine column.

    Args:
        d_model: the encoding's width.
        max_len: the number of positions.

    Raises:
        ValueError: d_model or max_len is not positive.
    """
    if d_model <= 0 or max_len <= 0:
        raise ValueError(f"positional encoding needs positive sizes, got d_model={d_model}, max_len={max_len}")
    position = torch.arange(0, max_len, dtype=torch.float32)[:, None]  # p
    two_k = torch.arange(0, d_model, 2, dtype=torch.float32)  # 2k
    inv_wavelength = torch.exp(two_k * -(math.log(10000.0) / d_model))  # 10000^(−2k/d_model)
    angle = position * inv_wavelength  # [max_len, ceil(d_model / 2)]
    encodings = torch.zeros(max_len, d_model)
    encodings[:, 0::2] = torch.sin(angle)
    encodings[:, 1::2] = torch.cos(angle[:, :d_model // 2])
    return encodings[:, None, :]


def _check_tokens(x: torch.Tensor, max_len: int, who: str):
    if x.dim() != 2:
        raise ValueError(f"{who} expects token ids of shape [seq_len, batch_size], got {tuple(x.shape)}")
    if x.shape[0] > max_len:
        raise ValueError(f"{who}: seq_len={x.shape[0]} exceeds max_len={max_len}")


class EmbeddingsWithPositionalEncoding(nn.Module):
    """Token embeddings scaled by √d_model plus fixed sinusoidal positional encodings.

    The encodings are a buffer `positional_encodings` [max_len, 1, d_model] that is saved in the state dict
    (persistent), as in labml-nn.

    Args:
        d_model: token width.
        n_vocab: vocabulary size.
        max_len: number of positions (the longest sequence it takes).

    Shapes:
        x: LongTensor [seq_len, batch_size] → [seq_len, batch_size, d_model]

    Raises:
        ValueError: x is not of rank 2, or seq_len > max_len.
    """

    def __init__(self, d_model: int, n_vocab: int, max_len: int = 5000):
        super().__init__()
        self.linear = nn.Embedding(n_vocab, d_model)
        self.d_model = d_model
        self.register_buffer('positional_encodings', get_positional_encoding(d_model, max_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_tokens(x, self.positional_encodings.shape[0], type(self).__name__)
        pe = self.positional_encodings[:x.shape[0]]
        return self.linear(x) * math.sqrt(self.d_model) + pe


class EmbeddingsWithLearnedPositionalEncoding(nn.Module):
    """Token embeddings scaled by √d_model plus a learned vector per position (parameter `positional_encodings`
    [max_len, 1, d_model], initialised to zero).

    Args:
        d_model: token width.
        n_vocab: vocabulary size.
        max_len: number of positions (the longest sequence it takes).

    Shapes:
        x: LongTensor [seq_len, batch_size] → [seq_len, batch_size, d_model]

    Raises:
        ValueError: x is not of rank 2, or seq_len > max_len.
    """

    def __init__(self, d_model: int, n_vocab: int, max_len: int = 5000):
        super().__init__()
        self.linear = nn.Embedding(n_vocab, d_model)
        self.d_model = d_model
        self.positional_encodings = nn.Parameter(torch.zeros(max_len, 1, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_tokens(x, self.positional_encodings.shape[0], type(self).__name__)
        return self.linear(x) * math.sqrt(self.d_model) + self.positional_encodings[:x.shape[0]]


class TransformerLayer(nn.Module):
    """One pre-norm encoder layer, or decoder layer when `src_attn` is given (equations in the module docstring).

    Args:
        d_model: token width.
        self_attn: self-attention module (called with keyword arguments query, key, value, mask).
        src_attn: attention over the encoder output (decoder layers), or None.
        feed_forward: the position-wise FFN.
        dropout_prob: dropout on each sub-layer's output before it is added to the residual stream.

    Attributes:
        is_save_ff_input: when True, forward keeps a copy of the normalised FFN input in `self.ff_input`
            (labml-nn uses this, e.g. for kNN-LM).

    Shapes:
        x: [seq_len, batch_size, d_model]; mask: [seq_len or 1, seq_len, batch_size or 1] or None;
        src: [src_len, batch_size, d_model]; src_mask: [seq_len or 1, src_len, batch_size or 1] or None.
        Output: [seq_len, batch_size, d_model].

    Raises:
        ValueError: x not [seq_len, batch_size, d_model] (on forward).
    """

    def __init__(self, *,
                 d_model: int,
                 self_attn: MultiHeadAttention,
                 src_attn: Optional[MultiHeadAttention] = None,
                 feed_forward: FeedForward,
                 dropout_prob: float):
        super().__init__()
        # Registration order follows labml-nn so that parameters() (and thus EncoderDecoder's init) line up.
        self.size = d_model
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.dropout = nn.Dropout(dropout_prob)
        self.norm_self_attn = nn.LayerNorm([d_model])
        if self.src_attn is not None:
            self.norm_src_attn = nn.LayerNorm([d_model])
        self.norm_ff = nn.LayerNorm([d_model])
        self.is_save_ff_input = False

    def forward(self, *,
                x: torch.Tensor,
                mask: Optional[torch.Tensor],
                src: Optional[torch.Tensor] = None,
                src_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.size:
            raise ValueError(f"TransformerLayer expects x of shape [seq_len, batch_size, d_model={self.size}], "
                             f"got {tuple(x.shape)}")
        z = self.norm_self_attn(x)
        x = x + self.dropout(self.self_attn(query=z, key=z, value=z, mask=mask))
        if src is not None:
            z = self.norm_src_attn(x)
            x = x + self.dropout(self.src_attn(query=z, key=src, value=src, mask=src_mask))
        z = self.norm_ff(x)
        if self.is_save_ff_input:
            self.ff_input = z.clone()
        return x + self.dropout(self.feed_forward(z))


class Encoder(nn.Module):
    """`n_layers` independent copies of `layer` (self-attention only) and a final LayerNorm.

    Args:
        layer: the encoder `TransformerLayer` to copy.
        n_layers: the number of copies (≥ 1).

    Shapes:
        x: [seq_len, batch_size, d_model], mask: [seq_len or 1, seq_len, batch_size or 1] or None
        → [seq_len, batch_size, d_model]

    Raises:
        ValueError: n_layers < 1.
    """

    def __init__(self, layer: TransformerLayer, n_layers: int):
        super().__init__()
        check_n_layers(n_layers, 'Encoder')
        self.layers = clone_module_list(layer, n_layers)
        self.norm = nn.LayerNorm([layer.size])

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x=x, mask=mask)
        return self.norm(x)


class Decoder(nn.Module):
    """`n_layers` independent copies of a decoder `layer` (self- and source attention) and a final LayerNorm.

    Args:
        layer: the decoder `TransformerLayer` (with `src_attn`) to copy.
        n_layers: the number of copies (≥ 1).

    Shapes:
        x: [tgt_len, batch_size, d_model], memory: [src_len, batch_size, d_model],
        src_mask: [tgt_len or 1, src_len, batch_size or 1] or None, tgt_mask: [tgt_len or 1, tgt_len, batch or 1]
        or None → [tgt_len, batch_size, d_model]

    Raises:
        ValueError: n_layers < 1.
    """

    def __init__(self, layer: TransformerLayer, n_layers: int):
        super().__init__()
        check_n_layers(n_layers, 'Decoder')
        self.layers = clone_module_list(layer, n_layers)
        self.norm = nn.LayerNorm([layer.size])

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: Optional[torch.Tensor],
                tgt_mask: Optional[torch.Tensor]) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x=x, mask=tgt_mask, src=memory, src_mask=src_mask)
        return self.norm(x)


class Generator(nn.Module):
    """Projection to logits over the vocabulary (no softmax; pair with cross-entropy).

    Args:
        n_vocab: vocabulary size.
        d_model: token width.

    Shapes:
        x: [..., d_model] → [..., n_vocab]
    """

    def __init__(self, n_vocab: int, d_model: int):
        super().__init__()
        self.projection = nn.Linear(d_model, n_vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x)


class EncoderDecoder(nn.Module):
    """Encoder-decoder transformer. On construction every parameter of rank ≥ 2 is re-initialised with Glorot /
    Xavier uniform (as labml-nn and the Annotated Transformer do); biases and norms keep their defaults.

    `forward` returns the decoder's output [tgt_len, batch_size, d_model]; apply `generator` for logits.

    Args:
        encoder: the `Encoder`.
        decoder: the `Decoder`.
        src_embed: embeds the source token ids, [src_len, batch_size] → [src_len, batch_size, d_model].
        tgt_embed: embeds the target token ids, [tgt_len, batch_size] → [tgt_len, batch_size, d_model].
        generator: the projection to logits (a `Generator`), kept for the caller.

    Shapes:
        src: [src_len, batch_size] token ids, tgt: [tgt_len, batch_size] token ids, src_mask and tgt_mask as in
        Decoder → [tgt_len, batch_size, d_model]
    """

    def __init__(self, encoder: Encoder, decoder: Decoder, src_embed: nn.Module, tgt_embed: nn.Module,
                 generator: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: Optional[torch.Tensor],
                tgt_mask: Optional[torch.Tensor]) -> torch.Tensor:
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src: torch.Tensor, src_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """src ids [src_len, batch_size] → memory [src_len, batch_size, d_model]."""
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory: torch.Tensor, src_mask: Optional[torch.Tensor], tgt: torch.Tensor,
               tgt_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """tgt ids [tgt_len, batch_size] attending to memory → [tgt_len, batch_size, d_model]."""
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)
