"""Plain `torch.nn` models, sequence-first ([seq_len, batch_size, d_model]), named and laid out like labml-nn 0.5.1.

Import what you need from its module, e.g. `from lazylab.models.mha import MultiHeadAttention`:

- `mha`: PrepareForMultiHeadAttention, MultiHeadAttention, subsequent_mask
- `relative_mha`: RelativeMultiHeadAttention (Transformer-XL), shift_right
- `feed_forward`: FeedForward (ReLU/GELU/… activations, GLU variants)
- `transformer`: embeddings with fixed / learned positional encodings, TransformerLayer, Encoder, Decoder,
  Generator, EncoderDecoder

This package never imports `lazylab.configs` or `lazylab.experiments`; importing it alone loads no submodule.
"""
