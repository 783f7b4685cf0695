"""`lazylab options NAME` and `--help`: every key with its type, default, options and help; the presets."""
import pytest

from lazylab import cli


@pytest.mark.parametrize('name, own', [('feedback', "model: Module = 'feedback_transformer_kv'  options: "
                                                   "feedback_transformer, feedback_transformer_kv"),
                                       ('fast_weights', "fast_weights.kernel: chunked | loop | step = 'chunked'"),
                                       ('transformer', 'transformer.ffn.glu_variant: none | GLU | Bilinear')])
def test_options_lists_every_key_with_type_default_options_and_help(capsys, name, own):
    assert cli.main(['options', name]) == 0
    out = capsys.readouterr().out
    for line in ('seq_len: int = 64', 'batch_size: int = ', 'max_minutes: float = 10.0', 'd_model: int = 128',
                 "optimizer.optimizer: Optimizer = 'AdamW'  options: Adam, AdamW, SGD, Noam",
                 'optimizer.learning_rate: float = 0.003', "device: str = 'auto'", 'heads: int = 4',
                 'presets (preset=NAME, applied before other settings):', own):
        assert line in out, line
    # each key is followed by its help line
    lines = out.splitlines()
    assert lines[lines.index('seq_len: int = 64  (≥ 1)') + 1].strip() == 'characters per sequence'


def test_train_help_prints_the_options(capsys):
    assert cli.main(['train', 'transformer', '--help']) == 0
    out = capsys.readouterr().out
    assert out.startswith('usage: lazylab train transformer [key=value …] [--config FILE.yaml …]')
    assert 'labml_nn: d_model=512 heads=8 n_layers=6' in out
