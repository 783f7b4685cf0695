"""FeedForwardConfigs / TransformerConfigs against labml-nn 0.5.1's configs (labml.configs + labml_nn modules):
for each option and GLU variant, the same overrides build the same modules from the same seed, whose state
dicts load both ways and whose outputs and gradients agree."""
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from labml_nn.transformers import configs as ref_configs
from torch import nn

from lazylab.configs import ConfigError
from lazylab.configs.transformer import FeedForwardConfigs, TransformerConfigs
from lazylab.models import feed_forward, mha, relative_mha, transformer
from lazylab.models.mha import subsequent_mask

ATTN = ['mha', 'relative']
EMBED = ['fixed_pos', 'learned_pos', 'no_pos']
GLU = ['none', 'GLU', 'Bilinear', 'ReGLU', 'GEGLU', 'SwiGLU']
ACTIVATION = ['ReLU', 'GELU', 'SiLU']
SMALL = {'d_model': 16, 'n_heads': 2, 'n_layers': 2, 'dropout': 0.0, 'ffn.d_ff': 24}


def _for_reference(overrides):
    """labml-nn has no 'SiLU' option; give it the module itself."""
    overrides = dict(overrides)
    for key in ('activation', 'ffn.activation'):
        if overrides.get(key) == 'SiLU':
            overrides[key] = nn.SiLU()
    return overrides


def _build(conf_cls, overrides, seed=0, item='encoder_decoder'):
    conf = conf_cls()
    if item != 'ffn':
        conf.n_src_vocab = 11
        conf.n_tgt_vocab = 13
    conf._set_values(dict(overrides))
    torch.manual_seed(seed)
    return conf, getattr(conf, item)


def _pair(overrides, seed=0, item='encoder_decoder'):
    ours_conf, ours = _build(TransformerConfigs, {**SMALL, **overrides}, seed, item)
    ref_conf, ref = _build(ref_configs.TransformerConfigs, _for_reference({**SMALL, **overrides}), seed, item)
    return ours_conf, ours.eval(), ref_conf, ref.eval()


def _set_sdpa(model, flag):
    for m in model.modules():
        if isinstance(m, mha.MultiHeadAttention):
            m.use_sdpa = flag


def _forward_backward(model, inputs):
    out = model.generator(model(*inputs))
    out.pow(2).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return out, grads


def _check_equivalent(ours, ref, seed):
    # same seed → same parameters and buffers, the same number of them, and loading works both ways
    assert list(ours.state_dict()) == list(ref.state_dict())
    for (name, a), b in zip(ref.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    with torch.no_grad():  # give the zero-initialised relative-position parameters values that matter
        for p in ref.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.3)
    ours.load_state_dict(ref.state_dict())
    ref.load_state_dict(ours.state_dict())

    gen = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(0, 11, (6, 2), generator=gen), torch.randint(0, 13, (5, 2), generator=gen)
    src_mask = torch.ones(1, 6, 2, dtype=torch.bool)
    src_mask[:, 4:, 0] = False  # padding in batch element 0
    for inputs in [(src, tgt, None, None), (src, tgt, src_mask, subsequent_mask(5))]:
        out_r, grads_r = _forward_backward(ref, inputs)
        for use_sdpa in (False, True):
            _set_sdpa(ours, use_sdpa)
            out_o, grads_o = _forward_backward(ours, inputs)
            assert grads_o.keys() == grads_r.keys()
            for name, a, b in [('output', out_o, out_r)] + [(n, grads_o[n], grads_r[n]) for n in grads_r]:
                if use_sdpa:  # fused kernel: fp32 rounding, accumulated over layers (see test_transformer_models)
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * max(1.0, b.abs().max().item()),
                                               msg=name)
                else:  # the reference's operations in its order
                    assert torch.equal(a, b), name


ONE_AT_A_TIME = ([{}]
                 + [{item: v} for item in ('encoder_attn', 'decoder_attn', 'decoder_mem_attn') for v in ATTN[1:]]
                 + [{item: v} for item in ('src_embed', 'tgt_embed') for v in EMBED[1:]]
                 + [{'ffn.glu_variant': v} for v in GLU[1:]]
                 + [{'ffn.activation': v} for v in ACTIVATION[1:]]
                 + [{'ffn.glu_variant': 'SwiGLU', 'encoder_attn': 'relative', 'src_embed': 'learned_pos'}])


_BUILT = {'encoder_attn': lambda m: m.encoder.layers[0].self_attn,
          'decoder_attn': lambda m: m.decoder.layers[0].self_attn,
          'decoder_mem_attn': lambda m: m.decoder.layers[0].src_attn,
          'src_embed': lambda m: m.src_embed, 'tgt_embed': lambda m: m.tgt_embed,
          'ffn.glu_variant': lambda m: m.decoder.layers[1].feed_forward.activation,
          'ffn.activation': lambda m: m.encoder.layers[1].feed_forward.activation}
_EXPECTED_TYPE = {'relative': relative_mha.RelativeMultiHeadAttention,
                  'learned_pos': transformer.EmbeddingsWithLearnedPositionalEncoding, 'no_pos': nn.Embedding,
                  'GLU': nn.Sigmoid, 'Bilinear': nn.Identity, 'ReGLU': nn.ReLU, 'GEGLU': nn.GELU, 'SwiGLU': nn.SiLU,
                  'GELU': nn.GELU, 'SiLU': nn.SiLU}


@pytest.mark.parametrize('overrides', ONE_AT_A_TIME, ids=lambda o: ','.join(f'{k}={v}' for k, v in o.items()))
def test_each_option_builds_the_reference_model(overrides):
    ours_conf, ours, _, ref = _pair(overrides)
    for key, value in overrides.items():  # the option really took effect in the built model
        built, expected = _BUILT[key](ours), _EXPECTED_TYPE.get(value)
        if expected is not None:
            assert type(built) is expected, key
    _check_equivalent(ours, ref, seed=0)


@settings(max_examples=6, deadline=None)
@given(enc=st.sampled_from(ATTN), dec=st.sampled_from(ATTN), mem=st.sampled_from(ATTN), src=st.sampled_from(EMBED),
       tgt=st.sampled_from(EMBED), glu=st.sampled_from(GLU), act=st.sampled_from(ACTIVATION),
       seed=st.integers(0, 1000))
def test_any_combination_builds_the_reference_model(enc, dec, mem, src, tgt, glu, act, seed):
    overrides = {'encoder_attn': enc, 'decoder_attn': dec, 'decoder_mem_attn': mem, 'src_embed': src,
                 'tgt_embed': tgt, 'ffn.glu_variant': glu}
    if glu == 'none':
        overrides['ffn.activation'] = act
    _, ours, _, ref = _pair(overrides, seed)
    _check_equivalent(ours, ref, seed)


def test_issue_example_overrides_build_the_named_parts():
    conf, model, _, _ = _pair({'ffn.glu_variant': 'SwiGLU', 'encoder_attn': 'relative',
                               'src_embed': 'learned_pos'})
    layer = model.encoder.layers[0]
    assert type(layer.self_attn) is relative_mha.RelativeMultiHeadAttention
    assert type(model.decoder.layers[0].self_attn) is mha.MultiHeadAttention
    assert type(model.src_embed) is transformer.EmbeddingsWithLearnedPositionalEncoding
    assert type(model.tgt_embed) is transformer.EmbeddingsWithPositionalEncoding
    ffn = layer.feed_forward
    assert type(ffn) is feed_forward.FeedForward and ffn.is_gated and isinstance(ffn.activation, nn.SiLU)
    assert ffn.layer1.bias is None and ffn.layer2.bias is None and ffn.linear_v.bias is None
    assert conf.ffn.d_model == 16 and conf.ffn.d_ff == 24


def test_no_pos_is_a_bare_embedding_and_generator_projects_to_target_vocab():
    _, model, _, _ = _pair({'src_embed': 'no_pos', 'tgt_embed': 'no_pos'})
    assert type(model.src_embed) is nn.Embedding and model.src_embed.num_embeddings == 11
    assert model.tgt_embed.num_embeddings == 13 and model.generator.projection.out_features == 13


def test_ffn_follows_parent_d_model_and_dropout_unless_overridden():
    conf = TransformerConfigs()
    conf._set_values({'d_model': 32, 'dropout': 0.25})
    assert conf.ffn.d_model == 32 and conf.ffn.dropout == 0.25
    conf = TransformerConfigs()
    conf._set_values({'d_model': 32, 'dropout': 0.25, 'ffn.dropout': 0.5})
    assert conf.ffn.dropout == 0.5 and conf.ffn.ffn.dropout.p == 0.5


def test_each_layer_has_its_own_ffn_and_attention_uses_dropout():
    conf, model, _, _ = _pair({'dropout': 0.2, 'encoder_attn': 'relative'})
    enc_ffn, dec_ffn = model.encoder.layers[0].feed_forward, model.decoder.layers[0].feed_forward
    assert enc_ffn is not conf.ffn.ffn and dec_ffn is not conf.ffn.ffn and enc_ffn is not dec_ffn
    assert model.encoder.layers[0].feed_forward is not model.encoder.layers[1].feed_forward
    # 'relative' follows `dropout` too (labml-nn keeps its 0.1 default there)
    assert model.encoder.layers[0].self_attn.dropout.p == 0.2
    assert model.decoder.layers[0].src_attn.dropout.p == 0.2


@pytest.mark.parametrize('glu, act', list(itertools.product(GLU, ACTIVATION)))
def test_feed_forward_configs_equal_reference(glu, act):
    overrides = {'d_model': 8, 'd_ff': 12, 'dropout': 0.0, 'glu_variant': glu, 'activation': act}
    ours_conf, ours = _build(FeedForwardConfigs, overrides, item='ffn')
    ref_conf, ref = _build(ref_configs.FeedForwardConfigs, _for_reference(overrides), item='ffn')
    expected = {'none': None, 'GLU': nn.Sigmoid, 'Bilinear': nn.Identity, 'ReGLU': nn.ReLU, 'GEGLU': nn.GELU,
                'SwiGLU': nn.SiLU}[glu]
    # an explicitly set activation wins over the variant's
    assert type(ours.activation) is type(ref.activation) is {'ReLU': nn.ReLU, 'GELU': nn.GELU, 'SiLU': nn.SiLU}[act]
    assert ours.is_gated == (expected is not None) == ref.is_gated
    assert list(ours.state_dict()) == list(ref.state_dict())
    for a, b in zip(ours.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)
    x = torch.randn(3, 2, 8)
    assert torch.equal(ours(x), ref(x))


@pytest.mark.parametrize('glu', GLU[1:])
def test_glu_variant_sets_gate_biases_and_activation(glu):
    conf = FeedForwardConfigs()
    conf._set_values({'d_model': 8, 'd_ff': 12, 'glu_variant': glu})
    ffn = conf.ffn
    expected = {'GLU': nn.Sigmoid, 'Bilinear': nn.Identity, 'ReGLU': nn.ReLU, 'GEGLU': nn.GELU, 'SwiGLU': nn.SiLU}
    assert type(ffn.activation) is expected[glu] and ffn.is_gated
    assert sorted(ffn.state_dict()) == ['layer1.weight', 'layer2.weight', 'linear_v.weight']
    explicit = FeedForwardConfigs()
    explicit._set_values({'d_model': 8, 'd_ff': 12, 'glu_variant': glu, 'bias1': True})
    assert explicit.ffn.layer1.bias is not None and explicit.ffn.layer2.bias is None


def test_defaults_match_reference():
    conf, ref = FeedForwardConfigs(), ref_configs.FeedForwardConfigs()
    for name in ('d_ff', 'dropout', 'is_gated', 'bias1', 'bias2', 'bias_gate', 'glu_variant'):
        assert getattr(conf, name) == getattr(ref, name), name
    conf, ref = TransformerConfigs(), ref_configs.TransformerConfigs()
    for name in ('n_heads', 'd_model', 'n_layers', 'dropout'):
        assert getattr(conf, name) == getattr(ref, name), name


def test_unknown_option_is_a_config_error_naming_the_path():
    conf = TransformerConfigs()
    with pytest.raises(ConfigError, match='activation'):
        conf._set_values({'ffn.activation': 'gleu'})
        _ = conf.ffn.ffn


def test_d_model_not_divisible_by_heads_names_both():
    conf = TransformerConfigs()
    conf._set_values({'d_model': 30, 'n_heads': 4})
    with pytest.raises(ConfigError, match=r'encoder_attn.*d_model=30.*heads=4') as error:
        _ = conf.encoder_attn
    assert isinstance(error.value.__cause__, ValueError)


def test_misspelt_glu_variant_is_an_error_naming_the_choices():
    from lazylab.configs import BadValueError, apply_overrides
    conf = TransformerConfigs()
    with pytest.raises(BadValueError, match=r"ffn\.glu_variant: expected one of 'none', 'GLU', .*got 'SwiGlu'"):
        apply_overrides(conf, {'ffn.glu_variant': 'SwiGlu'})
