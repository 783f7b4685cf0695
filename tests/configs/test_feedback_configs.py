"""FeedbackConfigs builds labml-nn 0.5.1's feedback models (same seed → same state dict and outputs), and its
items reach the modules."""
import pytest
import torch
from torch import nn

from lazylab.configs.feedback import FeedbackConfigs
from lazylab.models import feedback as fb
from lazylab.models.autoregressive import AutoregressiveModel
from lazylab.models.feedback.reference import reference_forward
from lazylab.testing import replaced

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


@pytest.mark.parametrize('name', ['feedback_transformer_kv', 'feedback_transformer'])
def test_memory_span_reaches_the_model_and_limits_what_it_attends_to(name):
    torch.manual_seed(0)
    spanned = configs(model=name, memory_span=3).model
    torch.manual_seed(0)
    full = configs(model=name).model
    assert spanned.transformer.memory_span == 3 and full.transformer.memory_span == 0
    tokens = torch.randint(0, SMALL['n_tokens'], (12, 2))
    with torch.no_grad():
        x = spanned.src_embed(tokens)
        torch.testing.assert_close(spanned.transformer(x), reference_forward(spanned.transformer, x))
        assert not torch.allclose(spanned(tokens)[0], full(tokens)[0])
        torch.testing.assert_close(spanned(tokens[:4])[0], full(tokens[:4])[0])  # 3 earlier steps at most: same


def test_generation_longer_than_the_positions_is_refused_before_it_starts():
    from lazylab.errors import DataError
    model = configs(n_positions=8).model
    prompt = torch.randint(0, SMALL['n_tokens'], (3,))
    assert model.generate(prompt, 7, temperature=0).shape == (10,)  # the last fed token has 8 earlier steps
    with pytest.raises(DataError, match=r'n_positions=8.*at most 7 tokens'):
        model.generate(prompt, 8, temperature=0)
    spanned = configs(n_positions=8, memory_span=8).model  # with a span, any length
    assert spanned.generate(prompt, 30, temperature=0).shape == (33,)


# ---------------------------------------------------------------------------------------------------------------
# the feedback experiment: n_positions checked before anything is written, bfloat16 training
# ---------------------------------------------------------------------------------------------------------------

TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=2', 'seq_len=16', 'batch_size=4', 'valid_interval=10',
        'valid_batches=2', 'final_valid_batches=2', 'log_interval=5', 'sample_tokens=8', 'device=cpu', 'threads=1',
        'optimizer.optimizer=AdamW', 'optimizer.learning_rate=0.01']


def run_cli(argv, capsys):
    from lazylab import cli
    threads = torch.get_num_threads()
    try:
        code = cli.main(argv)
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize('extra, needed, use', [([], 15, 'seq_len=16'), (['feedback.memory_span=12'], 12, 'seq_len=16'),
                                               (['sample_tokens=30'], 33, 'the validation samples')])
def test_n_positions_smaller_than_the_memory_a_step_sees_is_one_line_and_writes_nothing(tmp_path, capsys, extra,
                                                                                         needed, use):
    runs = tmp_path / 'runs'
    code, out, err = run_cli(['train', 'feedback', *replaced(TINY, 'max_steps=1', 'feedback.n_positions=8', *extra),
                              f'runs_dir={runs}'], capsys)
    assert code == 2
    assert err.startswith(f'lazylab: error: feedback.n_positions=8 is too small for {use}') and f'≥ {needed}' in err
    assert len(err.strip().splitlines()) == 1 and 'Traceback' not in err + out
    assert not runs.exists()


def test_a_memory_span_within_n_positions_trains_and_generation_past_them_is_one_line(tmp_path, capsys):
    runs = tmp_path / 'runs'
    code, _, err = run_cli(['train', 'feedback', *TINY, 'max_steps=2', 'feedback.n_positions=8',
                            'feedback.memory_span=8', f'runs_dir={runs}'], capsys)
    assert code == 0, err
    runs_dir = next((runs / 'feedback').iterdir())
    code, out, _ = run_cli(['generate', str(runs_dir), '--prompt', 'ab', '--tokens', '40', '--temperature', '0'],
                           capsys)
    assert code == 0 and len(out.rstrip('\n')) == 42
    code, _, err = run_cli(['train', 'feedback', *replaced(TINY, 'max_steps=2', 'seq_len=9', 'sample_tokens=4'),
                            'feedback.n_positions=8', f'runs_dir={runs}'], capsys)
    assert code == 0, err
    second = next(p for p in (runs / 'feedback').iterdir() if p != runs_dir)  # (two runs may share a second)
    code, out, err = run_cli(['generate', str(second), '--prompt', 'ab', '--tokens', '9'], capsys)
    assert code == 2 and err.startswith('lazylab: error: generating 9 tokens after a 2-token prompt')
    assert 'feedback.n_positions' in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize('model', ['feedback_transformer_kv', 'feedback_transformer'])
def test_the_feedback_experiment_trains_in_bfloat16(tmp_path, capsys, model):
    """`dtype=bfloat16` (CPU autocast) trains both variants; the validation loss falls."""
    from lazylab.experiments.trainer import read_metrics
    runs = tmp_path / 'runs'
    code, _, err = run_cli(['train', 'feedback', *TINY, 'max_steps=20', 'dtype=bfloat16', f'model={model}',
                            f'runs_dir={runs}'], capsys)
    assert code == 0, err
    records = read_metrics(next((runs / 'feedback').iterdir()) / 'metrics.jsonl')
    valid = [r['loss.valid'] for r in records if 'loss.valid' in r]
    assert len(valid) == 2 and valid[1] < valid[0] < 4.3
