"""FastWeightsConfigs builds labml-nn 0.5.1's fast-weights model (same seed → same state dict and outputs), and
its items reach the modules."""
import pytest
import torch
from torch import nn

from lazylab.configs.fast_weights import FastWeightsConfigs
from lazylab.models import fast_weights as fw
from lazylab.models.fast_weights import token_wise as fw_tw

SMALL = {'n_tokens': 11, 'd_model': 16, 'heads': 2, 'd_ff': 24, 'n_layers': 2}


def configs(**values):
    conf = FastWeightsConfigs()
    conf._set_values({**SMALL, **values})
    return conf


def labml_nn_model(seed, nu=1):
    """The expression of labml-nn's `fast_weights_transformer` option (its experiment module needs torchvision,
    so it is repeated here with labml-nn's classes; the wrapper has the same layout and creation order)."""
    from labml_nn.transformers import fast_weights as ref
    from labml_nn.transformers.feed_forward import FeedForward

    from lazylab.models.autoregressive import AutoregressiveModel
    d_model, heads, d_ff, n_layers = SMALL['d_model'], SMALL['heads'], SMALL['d_ff'], SMALL['n_layers']
    torch.manual_seed(seed)
    return AutoregressiveModel(
        SMALL['n_tokens'], d_model,
        ref.FastWeightsAttentionTransformer(
            ref.FastWeightsAttentionTransformerLayer(d_model=d_model,
                                                     attn=ref.FastWeightsAttention(heads, d_model, 0.0,
                                                                                   ref.DPFP(nu=nu)),
                                                     feed_forward=FeedForward(d_model, d_ff, 0.0),
                                                     dropout_prob=0.0),
            n_layers))


def test_defaults_are_labml_nn_experiment_defaults():
    conf = FastWeightsConfigs()
    assert (conf.d_model, conf.heads, conf.d_ff, conf.n_layers, conf.dropout, conf.nu) == (512, 8, 2048, 6, 0.0, 1)
    assert (conf.kernel, conf.chunk_size) == ('chunked', fw.DEFAULT_CHUNK_SIZE)


@pytest.mark.parametrize('nu', [1, 2])
def test_same_seed_builds_labml_nn_model(nu):
    theirs = labml_nn_model(seed=3, nu=nu)
    torch.manual_seed(3)
    ours = configs(nu=nu).model
    ours_sd, theirs_sd = ours.state_dict(), theirs.state_dict()
    assert list(ours_sd) == list(theirs_sd)
    for key in ours_sd:
        assert torch.equal(ours_sd[key], theirs_sd[key]), key
    tokens = torch.randint(0, SMALL['n_tokens'], (20, 2))
    torch.testing.assert_close(ours(tokens)[0], theirs(tokens)[0], rtol=0, atol=1e-5)


def test_items_reach_the_modules():
    conf = configs(nu=3, kernel='loop', chunk_size=8, dropout=0.25, **{'ffn.activation': 'GELU'})
    model = conf.model
    layer = model.transformer.layers[0]
    assert len(model.transformer.layers) == SMALL['n_layers']
    assert isinstance(layer.attn, fw.FastWeightsAttention)
    assert (layer.attn.phi.nu, layer.attn.kernel, layer.attn.chunk_size) == (3, 'loop', 8)
    assert isinstance(layer.feed_forward.activation, nn.GELU)
    assert layer.feed_forward.layer1.out_features == SMALL['d_ff']
    assert layer.dropout.p == 0.25 and layer.feed_forward.dropout.p == 0.25
    assert model.generator.out_features == SMALL['n_tokens']
    # layers do not share weights
    other = model.transformer.layers[1]
    assert layer.feed_forward.layer1.weight.data_ptr() != other.feed_forward.layer1.weight.data_ptr()


def test_token_wise_option_builds_the_token_wise_model_with_equal_outputs():
    torch.manual_seed(0)
    whole = configs().model
    token_wise = configs(transformer='token_wise').model
    assert isinstance(token_wise.transformer.layers[0].attn, fw_tw.FastWeightsAttention)
    token_wise.load_state_dict({k.replace('.interpolation_weight.', '.gate.'): v
                                for k, v in whole.state_dict().items()})
    tokens = torch.randint(0, SMALL['n_tokens'], (15, 2))
    torch.testing.assert_close(token_wise(tokens)[0], whole(tokens)[0], rtol=0, atol=1e-5)


def test_heads_not_dividing_d_model_is_reported():
    conf = configs(heads=3)
    with pytest.raises(Exception, match=r'd_model=16.*heads=3'):
        _ = conf.model


@pytest.mark.parametrize('phi,cls', [('dpfp', fw.DPFP), ('linear', fw.LinearElu), ('favor', fw.Favor)])
@pytest.mark.parametrize('rule', ['delta', 'sum'])
def test_feature_map_and_update_rule_options_reach_every_layer(phi, cls, rule):
    conf = configs(phi=phi, nu=2, favor_features=5, sum_normalization=False, update_rule=rule,
                   attention_normalization=True)
    model = conf.model
    for layer in model.transformer.layers:
        attn = layer.attn
        assert type(attn.phi) is cls and attn.phi.sum_normalization is False
        assert (attn.update_rule, attn.attention_normalization) == (rule, True)
        assert (attn.interpolation_weight is None) == (rule == 'sum')
    if phi == 'favor':
        assert model.transformer.layers[0].attn.phi.projection.shape == (5, SMALL['d_model'] // SMALL['heads'])
    if phi == 'dpfp':
        assert model.transformer.layers[0].attn.phi.nu == 2
    tokens = torch.randint(0, SMALL['n_tokens'], (9, 2))
    logits, state = model.forward_with_state(tokens)
    assert logits.shape == (9, 2, SMALL['n_tokens'])
    d_k = SMALL['d_model'] // SMALL['heads']
    assert state[0].shape[-2] == d_k + 1  # attention normalisation carries z as one more row


def test_token_wise_option_takes_the_feature_map_and_rule():
    conf = configs(transformer='token_wise', phi='linear', update_rule='sum')
    attn = conf.model.transformer.layers[0].attn
    assert isinstance(attn, fw_tw.FastWeightsAttention)
    assert type(attn.phi) is fw.LinearElu and attn.update_rule == 'sum' and attn.gate is None


def test_experiment_keys_select_the_variants():
    from lazylab.experiments.configure import make_configs
    conf = make_configs('fast_weights', ['fast_weights.phi=favor', 'fast_weights.favor_features=7',
                                         'fast_weights.update_rule=sum', 'd_model=16', 'heads=2'])
    conf.n_tokens = 11
    attn = conf.model.transformer.layers[0].attn
    assert type(attn.phi) is fw.Favor and attn.phi.features == 7 and attn.update_rule == 'sum'
