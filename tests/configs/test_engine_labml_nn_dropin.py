"""Drop-in check: labml_nn's own config modules, with `labml.configs` replaced by `lazylab.configs`, build the
same modules (same parameter names and values under the same seed) as with labml.configs; and items declared the
way labml_nn declares them take the values labml code gives them (None for `n: int = None`, a device string for a
`torch.device` item)."""
import inspect
import types

import labml_nn.optimizers.configs
import labml_nn.transformers.configs as labml_transformer_configs
import pytest
import torch

from lazylab.configs import BadValueError, BaseConfigs, apply_overrides, load


def _with_lazylab(module):
    """Re-execute a labml_nn module's source with lazylab.configs in place of labml.configs."""
    source = inspect.getsource(module).replace('from labml.configs import', 'from lazylab.configs import')
    assert 'lazylab.configs' in source
    copy = types.ModuleType(module.__name__)  # same name, so classes print the same; not put in sys.modules
    copy.__package__ = module.__package__
    copy.__file__ = module.__file__
    exec(compile(source, module.__file__, 'exec'), copy.__dict__)
    return copy


def _build(configs_module, overrides):
    conf = configs_module.TransformerConfigs()
    conf.n_src_vocab = 11
    conf.n_tgt_vocab = 13
    conf._set_values(overrides)
    torch.manual_seed(0)
    model = conf.encoder
    return conf, model


@pytest.mark.parametrize('overrides', [
    {'d_model': 16, 'n_heads': 2, 'n_layers': 2, 'ffn.d_ff': 32},
    {'d_model': 16, 'n_heads': 4, 'n_layers': 1, 'ffn.glu_variant': 'SwiGLU', 'ffn.d_ff': 24},
    {'d_model': 8, 'n_heads': 2, 'n_layers': 1, 'ffn.activation': 'GELU', 'dropout': 0.0},
])
def test_transformer_configs_build_identical_encoders(overrides):
    ours_module = _with_lazylab(labml_transformer_configs)
    ours, ours_model = _build(ours_module, dict(overrides))
    theirs, theirs_model = _build(labml_transformer_configs, dict(overrides))
    ours_sd, theirs_sd = ours_model.state_dict(), theirs_model.state_dict()
    assert list(ours_sd) == list(theirs_sd)
    for k in ours_sd:
        torch.testing.assert_close(ours_sd[k], theirs_sd[k], rtol=0, atol=0)
    # the FFN of every layer follows the GLU variant / activation through the sub-config
    assert type(ours.ffn.activation) is type(theirs.ffn.activation)
    assert ours.ffn.is_gated == theirs.ffn.is_gated
    assert ours.ffn.d_model == overrides['d_model']
    ours_json, theirs_json = ours._to_json(), theirs._to_json()
    assert set(ours_json) == set(theirs_json)
    for key in ours_json:
        for field in ('order', 'is_explicitly_specified', 'type', 'value'):
            assert ours_json[key][field] == theirs_json[key][field], (key, field)
        # labml keeps aggregate options in a set (arbitrary order); ours keep declaration order
        assert sorted(ours_json[key]['options']) == sorted(theirs_json[key]['options']), key


def test_optimizer_configs_primary_and_dotted_learning_rate():
    ours_module = _with_lazylab(labml_nn.optimizers.configs)
    conf = ours_module.OptimizerConfigs()
    conf.parameters = [torch.nn.Parameter(torch.zeros(3))]
    conf._set_values({'optimizer': 'Adam', 'learning_rate': 0.25, 'betas': (0.5, 0.75)})
    opt = conf.optimizer
    assert type(opt).__name__ == 'Adam'
    assert opt.param_groups[0]['lr'] == 0.25 and opt.param_groups[0]['betas'] == (0.5, 0.75)


class _Idioms(BaseConfigs):
    """Two labml_nn idioms for items a script may give values to."""
    n: int = None                     # the annotation says int, the default is None (labml_nn's optional sizes)
    m: int = 3                        # an int default: None stays refused
    device: torch.device = torch.device('cpu')


def test_an_int_item_whose_default_is_none_takes_none_from_code_assignment_yaml_and_text():
    conf = _Idioms()
    conf._set_values({'n': None})
    assert conf.n is None
    conf = _Idioms()
    conf.n = None
    assert conf.n is None
    conf = _Idioms()
    load(conf, {'n': None})           # a configs.yaml dump writes it as null
    assert conf.n is None
    conf = _Idioms()
    apply_overrides(conf, {'n': 'null'})
    assert conf.n is None
    conf = _Idioms()
    apply_overrides(conf, {'n': '7'})
    assert conf.n == 7
    with pytest.raises(BadValueError, match="^bad value for n: expected int, got 'seven'$"):
        apply_overrides(_Idioms(), {'n': 'seven'})


def test_an_int_item_with_an_int_default_still_refuses_none():
    with pytest.raises(BadValueError, match='^bad value for m: expected int, not null, got None$'):
        _Idioms()._set_values({'m': None})


@pytest.mark.parametrize('given, expected', [('cpu', torch.device('cpu')), ('cuda:1', torch.device('cuda', 1))])
def test_a_torch_device_item_takes_a_device_string_from_code_and_text(given, expected):
    conf = _Idioms()
    conf._set_values({'device': given})
    assert conf.device == expected and isinstance(conf.device, torch.device)
    conf = _Idioms()
    apply_overrides(conf, {'device': given})
    assert conf.device == expected


def test_a_device_string_torch_does_not_know_is_one_line():
    with pytest.raises(BadValueError, match="^bad value for device: expected a device such as cpu, cuda or cuda:0, "
                                            "got 'gpu0'$"):
        _Idioms()._set_values({'device': 'gpu0'})
