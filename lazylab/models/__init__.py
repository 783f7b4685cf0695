"""Plain `torch.nn` models, sequence-first ([seq_len, batch_size, d_model]), named and laid out like labml-nn 0.5.1.

Import what you need from its module, e.g. `from lazylab.models.mha import MultiHeadAttention`:

- `mha`: PrepareForMultiHeadAttention, MultiHeadAttention, subsequent_mask
- `relative_mha`: RelativeMultiHeadAttention (Transformer-XL), shift_right
- `feed_forward`: FeedForward (ReLU/GELU/… activations, GLU variants)
- `transformer`: embeddings with fixed / learned positional encodings, TransformerLayer, Encoder, Decoder,
  Generator, EncoderDecoder
- `feedback`: the Feedback Transformer (`memory.py` its fast path, `reference.py` the plain loop)
- `fast_weights`: the Fast Weights Transformer (`feature_maps.py`, `delta_rule.py`, `step.py`, `token_wise.py`)
- `autoregressive`: AutoregressiveModel (embedding → core → logits) and incremental generation
- `utils`: clone_module_list and the size checks the models share; `_torch_compat`: the private PyTorch APIs
  relied on, in one place

This package never imports `lazylab.configs` or `lazylab.experiments`; importing it alone loads no submodule.
"""
