"""FeedbackConfigs builds labml-nn 0.5.1's feedback models (same seed → same state dict and outputs), and its
items reach the modules."""
import pytest
import torch
from torch import nn

from lazylab.configs.feedback import FeedbackConfigs
from lazylab.models import feedback as fb
from lazylab.models.autoregressive import AutoregressiveModel
from lazylab.models.feedback.reference import reference_forward

SMALL = {'n_tokens': 11, 'd_model': 16, 'heads': 2, 'd_ff': 24, 'n_layers': 2}


def configs(**values):
    conf = FeedbackConfigs()
    conf._set_values({**SMALL, **values})
    return conf


def labml_nn_model(seed, kv):
    """The expressions of labml-nn's 'feedback_transformer(_kv)' options (its experiment module pulls in the
    whole NLP trainer, so they are repeated here with labml-nn's classes and the same creation order)."""
    from labml_nn.transformers import feedback as ref
    from labml_nn.transformers.feed_forward import FeedForward
    d_model, heads, d_ff, n_layers = SMALL['d_model'], SMALL['heads'], SMALL['d_ff'], SMALL['n_layers']
    torch.manual_seed(seed)
    layer = ref.FeedbackTransformerLayer(d_model=d_model,
                                         attn=ref.FeedbackAttention(heads, d_model, 0.0, is_kv_precomputed=kv),
                                         feed_forward=FeedForward(d_model, d_ff, 0.0), dropout_prob=0.0)
    core = ref.FeedbackTransformerKV(layer, n_layers, d_model, heads) if kv else ref.FeedbackTransformer(layer,
                                                                                                     n_layers)
    return AutoregressiveModel(SMALL['n_tokens'], d_model, core)


def test_defaults_are_labml_nn_experiment_defaults():
    conf = FeedbackConfigs()
    assert (conf.d_model, conf.heads, conf.d_ff, conf.n_layers, conf.dropout) == (512, 8, 2048, 6, 0.0)
    assert conf.n_positions == 4096


@pytest.mark.parametrize('name, kv', [('feedback_transformer_kv', True), ('feedback_transformer', False)])
def test_same_seed_builds_labml_nn_model(name, kv):
    theirs = labml_nn_model(seed=3, kv=kv)
    torch.manual_seed(3)
    ours = configs(model=name).model
    assert isinstance(ours.transformer, fb.FeedbackTransformerKV if kv else fb.FeedbackTransformer)
    ours_sd, theirs_sd = ours.state_dict(), theirs.state_dict()
    assert list(ours_sd) == list(theirs_sd)
    for key in ours_sd:
        assert torch.equal(ours_sd[key], theirs_sd[key]), key
    tokens = torch.randint(0, SMALL['n_tokens'], (20, 2))
    torch.testing.assert_close(ours(tokens)[0], theirs(tokens)[0], rtol=0, atol=1e-5)


def test_default_model_is_the_kv_variant():
    assert isinstance(configs().model.transformer, fb.FeedbackTransformerKV)


def test_items_reach_the_modules():
    conf = configs(model='feedback_transformer', dropout=0.25, n_positions=64, **{'ffn.glu_variant': 'SwiGLU'})
    model = conf.model
    layers = model.transformer.layers
    assert len(layers) == SMALL['n_layers']
    layer = layers[0]
    assert layer.attn.heads == SMALL['heads'] and layer.attn.d_k == SMALL['d_model'] // SMALL['heads']
    assert layer.attn.key_pos_embeddings.shape == (64, SMALL['heads'], 8)
    assert layer.feed_forward.is_gated and isinstance(layer.feed_forward.activation, nn.SiLU)
    assert layer.feed_forward.layer1.bias is None and layer.feed_forward.layer1.out_features == SMALL['d_ff']
    assert layer.dropout.p == 0.25 and layer.attn.dropout.p == 0.25 and layer.feed_forward.dropout.p == 0.25
    assert model.generator.out_features == SMALL['n_tokens']
    # layers do not share weights
    assert layer.feed_forward.layer1.weight.data_ptr() != layers[1].feed_forward.layer1.weight.data_ptr()


def test_swiglu_model_trains_and_equals_the_plain_loop():
    torch.manual_seed(0)
    model = configs(**{'ffn.glu_variant': 'SwiGLU'}).model
    tokens = torch.randint(0, SMALL['n_tokens'], (12, 2))
    logits, _ = model(tokens)
    logits.sum().backward()
    core = model.transformer
    with torch.no_grad():
        x = model.src_embed(tokens)
        torch.testing.assert_close(core(x), reference_forward(core, x))


def test_n_positions_limit_names_the_key():
    model = configs(n_positions=4).model
    with pytest.raises(ValueError, match="n_positions"):
        model(torch.randint(0, SMALL['n_tokens'], (6, 1)))
