"""How a command line becomes a configuration: preset, then --config FILE, then key=value (later wins)."""
from lazylab.configs import dump, to_dict
from lazylab.experiments import configure


def test_config_file_then_command_line_keys(tmp_path):
    f = tmp_path / 'small.yaml'
    f.write_text('d_model: 48\nheads: 3\noptimizer.learning_rate: 0.002\nseq_len: 32\n')
    conf = configure.make_configs('transformer', ['seq_len=16', 'optimizer.warmup=7'], config=str(f))
    assert (conf.d_model, conf.heads, conf.seq_len) == (48, 3, 16)
    assert conf.optimizer.learning_rate == 0.002 and conf.optimizer.warmup == 7


def test_a_configs_yaml_dump_is_a_valid_config_file(tmp_path):
    conf = configure.make_configs('fast_weights', ['d_model=32', 'heads=2', 'nu=2', 'fast_weights.kernel=loop'])
    configure.prepare(conf)
    dump(conf, tmp_path / 'configs.yaml')
    again = configure.make_configs('fast_weights', config=str(tmp_path / 'configs.yaml'))
    configure.prepare(again)
    assert to_dict(again)['values'] == to_dict(conf)['values']
    assert again.fast_weights.kernel == 'loop' and again.fast_weights.nu == 2


def test_preset_labml_nn_then_user_keys_win():
    conf = configure.make_configs('feedback', ['preset=labml_nn', 'batch_size=8', 'device=cpu'])
    assert (conf.d_model, conf.heads, conf.n_layers, conf.d_ff, conf.seq_len) == (512, 8, 6, 2048, 128)
    assert conf.batch_size == 8 and conf.max_minutes == 0 and conf.epochs == 128 and conf.inner_iterations == 25
    assert conf.model.transformer.__class__.__name__ == 'FeedbackTransformerKV'
    opt = conf.optimizer
    assert type(opt.optimizer).__name__ == 'Noam' and opt.learning_rate == 1.0 and opt.warmup == 2000
    assert opt.d_model == 512
