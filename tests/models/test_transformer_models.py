"""Embeddings, TransformerLayer, Encoder, Decoder, Generator and EncoderDecoder against labml-nn 0.5.1."""
import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from labml_nn.transformers import feed_forward as ref_ff
from labml_nn.transformers import mha as ref_mha
from labml_nn.transformers import models as ref_models
from labml_nn.transformers import positional_encoding as ref_pe
from labml_nn.transformers.xl import relative_mha as ref_rel
from torch import nn

from lazylab.models import feed_forward, mha, relative_mha, transformer
from lazylab.models.mha import subsequent_mask

REF = SimpleNamespace(MHA=ref_mha.MultiHeadAttention, Rel=ref_rel.RelativeMultiHeadAttention,
                      FFN=ref_ff.FeedForward, m=ref_models)
OURS = SimpleNamespace(MHA=mha.MultiHeadAttention, Rel=relative_mha.RelativeMultiHeadAttention,
                       FFN=feed_forward.FeedForward, m=transformer)
D_MODEL, HEADS, VOCAB = 16, 2, 11


def _build(lib, seed, attn='mha', gated=False, embed='fixed', n_layers=2):
    """The same construction sequence for either library; with the same seed both draw the same weights."""
    torch.manual_seed(seed)

    def attention():
        return lib.MHA(HEADS, D_MODEL, 0.0) if attn == 'mha' else lib.Rel(HEADS, D_MODEL, 0.0)

    def ffn():
        return lib.FFN(D_MODEL, 24, dropout=0.0, activation=nn.SiLU() if gated else nn.ReLU(), is_gated=gated)

    def embedding():
        if embed == 'fixed':
            return lib.m.EmbeddingsWithPositionalEncoding(D_MODEL, VOCAB, max_len=64)
        return lib.m.EmbeddingsWithLearnedPositionalEncoding(D_MODEL, VOCAB, max_len=64)

    enc_layer = lib.m.TransformerLayer(d_model=D_MODEL, self_attn=attention(), feed_forward=ffn(), dropout_prob=0.0)
    dec_layer = lib.m.TransformerLayer(d_model=D_MODEL, self_attn=attention(), src_attn=attention(),
                                       feed_forward=ffn(), dropout_prob=0.0)
    model = lib.m.EncoderDecoder(lib.m.Encoder(enc_layer, n_layers), lib.m.Decoder(dec_layer, n_layers),
                                 embedding(), embedding(), lib.m.Generator(VOCAB, D_MODEL))
    if embed == 'learned':  # starts at zero unless EncoderDecoder's init touched it; make sure it matters
        assert model.src_embed.positional_encodings.abs().sum() > 0
    return model.eval()


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_positional_encoding_equals_reference_and_closed_form():
    for d_model in (2, 16, 30):
        ours = transformer.get_positional_encoding(d_model, 50)
        assert ours.shape == (50, 1, d_model)
        assert torch.equal(ours, ref_pe.get_positional_encoding(d_model, 50))
    pe = transformer.get_positional_encoding(6, 10).double()[:, 0]
    p, k = 7, 2
    assert math.isclose(pe[p, 2 * k].item(), math.sin(p / 10000 ** (2 * k / 6)), abs_tol=1e-6)
    assert math.isclose(pe[p, 2 * k + 1].item(), math.cos(p / 10000 ** (2 * k / 6)), abs_tol=1e-6)
    odd = transformer.get_positional_encoding(5, 10)[:, 0]  # labml-nn cannot build this one
    assert math.isclose(odd[3, 3].item(), math.cos(3 / 10000 ** (2 / 5)), abs_tol=1e-6)
    assert math.isclose(odd[3, 4].item(), math.sin(3 / 10000 ** (4 / 5)), abs_tol=1e-6)


@pytest.mark.parametrize('cls', ['EmbeddingsWithPositionalEncoding', 'EmbeddingsWithLearnedPositionalEncoding'])
def test_embeddings_equal_reference_and_keep_positional_encodings_in_state_dict(cls):
    torch.manual_seed(0)
    ref = getattr(ref_models, cls)(8, VOCAB, max_len=20)
    torch.manual_seed(0)
    ours = getattr(transformer, cls)(8, VOCAB, max_len=20)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert sorted(ours.state_dict()) == ['linear.weight', 'positional_encodings']
    with torch.no_grad():
        ref.positional_encodings.add_(torch.randn(20, 1, 8))  # for the learned one; harmless for the buffer
    ours.load_state_dict(ref.state_dict())
    ref.load_state_dict(ours.state_dict())
    x = torch.randint(0, VOCAB, (7, 3))
    assert torch.equal(ours(x), ref(x))
    expected = ours.linear.weight[x] * math.sqrt(8) + ours.positional_encodings[:7]
    torch.testing.assert_close(ours(x), expected)


@pytest.mark.parametrize('cls', ['EmbeddingsWithPositionalEncoding', 'EmbeddingsWithLearnedPositionalEncoding'])
def test_embeddings_reject_bad_token_shapes(cls):
    emb = getattr(transformer, cls)(8, VOCAB, max_len=5)
    with pytest.raises(ValueError, match=r'\[seq_len, batch_size\], got \(4,\)'):
        emb(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match='seq_len=6 exceeds max_len=5'):
        emb(torch.zeros(6, 1, dtype=torch.long))


def _set_sdpa(model, flag):
    for m in model.modules():
        if isinstance(m, mha.MultiHeadAttention):
            m.use_sdpa = flag


def _forward_backward(model, src, tgt, src_mask, tgt_mask):
    logits = model.generator(model(src, tgt, src_mask, tgt_mask))
    logits.pow(2).mean().backward()
    grads = _grads(model)
    model.zero_grad()
    return logits, grads


def _compare(ours, ref, inputs, exact, **tol):
    out_r, grads_r = _forward_backward(ref, *inputs)
    out_o, grads_o = _forward_backward(ours, *inputs)
    assert grads_o.keys() == grads_r.keys()
    pairs = [('logits', out_o, out_r)] + [(n, grads_o[n], grads_r[n]) for n in grads_r]
    for name, a, b in pairs:
        if exact:
            assert torch.equal(a, b), name
        else:
            scale = max(1.0, b.abs().max().item())
            torch.testing.assert_close(a, b, msg=name, rtol=tol['rtol'], atol=tol['atol'] * scale)


@settings(max_examples=8, deadline=None)
@given(attn=st.sampled_from(['mha', 'relative']), gated=st.booleans(), embed=st.sampled_from(['fixed', 'learned']),
       masked=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_encoder_decoder_equals_reference(attn, gated, embed, masked, seed):
    ref, ours = _build(REF, seed, attn, gated, embed), _build(OURS, seed, attn, gated, embed)
    # same seed, same construction → same weights (including EncoderDecoder's Xavier re-initialisation)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for (name, a), b in zip(ref.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    # and a third set of weights loads both ways
    other = _build(OURS, seed + 1, attn, gated, embed)
    ref.load_state_dict(other.state_dict())
    ours.load_state_dict(ref.state_dict())

    gen = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(0, VOCAB, (6, 3), generator=gen), torch.randint(0, VOCAB, (5, 3), generator=gen)
    src_mask = tgt_mask = None
    if masked:
        src_mask = torch.ones(1, 6, 3, dtype=torch.bool)
        src_mask[:, 4:, 1] = False  # padding in batch element 1
        tgt_mask = subsequent_mask(5)
    inputs = (src, tgt, src_mask, tgt_mask)
    # Explicit path: the reference's operations in the reference's order → bit-for-bit equal.
    _set_sdpa(ours, False)
    _compare(ours, ref, inputs, exact=True)
    # SDPA path (the default; relative attention always takes the explicit path): fp32 rounding of the fused
    # kernel, ≤ 1e-6 per attention call at unit scale, accumulates over 4 layers and √d_model-scaled embeddings,
    # so allow 1e-6 times the tensor's scale plus 1e-5 relative; in float64 the two agree to 1e-12.
    _set_sdpa(ours, True)
    _compare(ours, ref, inputs, exact=False, rtol=1e-5, atol=1e-6)
    _compare(ours.double(), ref.double(), inputs, exact=False, rtol=0, atol=1e-12)


def test_encoder_equals_reference_with_causal_mask_and_explicit_path_is_exact():
    ref, ours = _build(REF, 3), _build(OURS, 3)
    _set_sdpa(ours, False)
    x = torch.randn(9, 2, D_MODEL)
    assert torch.equal(ours.encoder(x, subsequent_mask(9)), ref.encoder(x, subsequent_mask(9)))
    assert torch.equal(ours.encoder(x, None), ref.encoder(x, None))


def test_transformer_layer_saves_ff_input_when_asked():
    ref, ours = _build(REF, 4), _build(OURS, 4)
    x = torch.randn(5, 2, D_MODEL)
    layer_r, layer_o = ref.encoder.layers[0], ours.encoder.layers[0]
    assert layer_o.is_save_ff_input is False and not hasattr(layer_o, 'ff_input')
    layer_r.is_save_ff_input = layer_o.is_save_ff_input = True
    layer_r(x=x, mask=None), layer_o(x=x, mask=None)
    torch.testing.assert_close(layer_o.ff_input, layer_r.ff_input, rtol=0, atol=1e-6)
    assert layer_o.ff_input.shape == (5, 2, D_MODEL)


def test_layers_are_independent_copies():
    ours = _build(OURS, 0)
    a, b = ours.encoder.layers
    assert a.self_attn.query.linear.weight is not b.self_attn.query.linear.weight
    assert len(ours.decoder.layers) == 2 and ours.decoder.layers[0].src_attn is not None


def test_generator_is_a_projection():
    gen = transformer.Generator(VOCAB, D_MODEL)
    x = torch.randn(3, 2, D_MODEL)
    torch.testing.assert_close(gen(x), x @ gen.projection.weight.T + gen.projection.bias)
    assert list(gen.state_dict()) == ['projection.weight', 'projection.bias']


def test_transformer_layer_rejects_wrong_rank():
    layer = _build(OURS, 0).encoder.layers[0]
    with pytest.raises(ValueError, match=r'd_model=16.*\(5, 16\)'):
        layer(x=torch.randn(5, D_MODEL), mask=None)
