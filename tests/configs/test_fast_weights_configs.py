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


# ---- the delta rule's successors (issue 28) ----

@pytest.mark.parametrize('values', [
    {'update_rule': 'gated_delta', 'phi': 'l2'},
    {'update_rule': 'gated_delta', 'negative_eigenvalues': True},
    {'update_rule': 'delta_product', 'householder_steps': 3, 'phi': 'l2'},
    {'update_rule': 'delta_product', 'gated': True, 'negative_eigenvalues': True, 'phi': 'l2'},
    {'update_rule': 'delta', 'negative_eigenvalues': True, 'phi': 'l2'},
], ids=['gated-l2', 'gated-neg', 'product3-l2', 'product2-gated-neg-l2', 'delta-neg-l2'])
def test_successor_rules_and_their_keys_reach_every_layer_which_generates_one_step_per_token(values):
    torch.manual_seed(0)
    model = configs(**values).model.eval()
    d_k = SMALL['d_model'] // SMALL['heads']
    rule = values['update_rule']
    n_h = values.get('householder_steps', 2) if rule == 'delta_product' else 1
    for layer in model.transformer.layers:
        attn = layer.attn
        assert (attn.update_rule, attn.householder_steps) == (rule, n_h)
        assert attn.negative_eigenvalues == values.get('negative_eigenvalues', False)
        assert (attn.decay is not None) == (rule == 'gated_delta' or values.get('gated', False))
        assert isinstance(attn.decay, (fw.DecayGate, type(None)))
        assert type(attn.phi) is (fw.L2NormSiLU if values.get('phi') == 'l2' else fw.DPFP)
        assert attn.key.linear.out_features == attn.value.linear.out_features == n_h * SMALL['d_model']
        assert attn.interpolation_weight[0].linear.out_features == n_h * SMALL['heads']
    tokens = torch.randint(0, SMALL['n_tokens'], (12, 2))
    full, _ = model(tokens)
    logits, state = model.forward_with_state(tokens[:5])  # carried state, then one step per token
    assert state[0].shape == (2, SMALL['heads'], d_k, model.transformer.layers[0].attn.phi.out_features(d_k))
    assert model.transformer.step_function() is not None
    stepped = [logits]
    with torch.no_grad():
        for t in range(5, 12):
            logits, state = model.forward_with_state(tokens[t:t + 1], state)
            stepped.append(logits)
    torch.testing.assert_close(torch.cat(stepped), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize('keys,message', [
    (['fast_weights.gated=true'], 'gated=true is the decay gate of update_rule=delta_product, got update_rule=delta '
                                  '(the gated delta rule is update_rule=gated_delta)'),
    (['fast_weights.update_rule=sum', 'fast_weights.negative_eigenvalues=true'],
     'negative_eigenvalues=true doubles β, which update_rule=sum does not have'),
    (['fast_weights.update_rule=gated_delta', 'fast_weights.attention_normalization=true'],
     'attention_normalization=true is for update_rule=delta or sum, got update_rule=gated_delta'),
    (['fast_weights.update_rule=delta_product', 'fast_weights.transformer=token_wise'],
     "transformer=token_wise is labml_nn's token-wise model: update_rule delta or sum, without negative_eigenvalues "
     "(got update_rule=delta_product); the whole-sequence model (transformer=default) generates token by token with "
     "every rule"),
    (['fast_weights.update_rule=delta_product', 'fast_weights.householder_steps=0'],
     'bad value for fast_weights.householder_steps: must be ≥ 1, got 0'),
], ids=['gated-without-product', 'negative-sum', 'attention-normalised-gated', 'token-wise-product', 'n_h-0'])
def test_options_a_rule_does_not_have_are_one_line_errors_before_anything_is_written(tmp_path, cli_error, keys,
                                                                                    message):
    runs = tmp_path / 'runs'
    threads = torch.get_num_threads()
    try:
        got = cli_error(['train', 'fast_weights', *keys, 'max_steps=1', 'd_model=16', 'heads=2', 'threads=1',
                         f'runs_dir={runs}'])
    finally:
        torch.set_num_threads(threads)
    assert got == message
    assert not runs.exists()


def test_the_default_rule_builds_no_gate_and_its_state_dict_loads_into_the_gated_rule():
    torch.manual_seed(1)
    delta = configs().model
    assert all(layer.attn.decay is None for layer in delta.transformer.layers)
    gated = configs(update_rule='gated_delta').model
    missing, unexpected = gated.load_state_dict(delta.state_dict(), strict=False)
    assert not unexpected
    assert sorted({k.split('attn.')[1] for k in missing}) == ['decay.A_log', 'decay.dt_bias', 'decay.projection.weight']


def test_experiment_keys_select_the_successors():
    from lazylab.experiments.configure import make_configs
    conf = make_configs('fast_weights', ['fast_weights.update_rule=delta_product', 'fast_weights.householder_steps=3',
                                         'fast_weights.gated=true', 'fast_weights.phi=l2', 'd_model=16', 'heads=2'])
    conf.n_tokens = 11
    attn = conf.model.transformer.layers[0].attn
    assert (attn.update_rule, attn.householder_steps) == ('delta_product', 3) and attn.decay is not None
    assert type(attn.phi) is fw.L2NormSiLU
