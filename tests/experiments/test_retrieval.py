"""The associative-retrieval experiment: its data (setting 1 and 2, targets, evaluation over every key), its models
(the sum of one-hot writes equals the sum rule; the kernels agree), short runs whose loss falls (float32, bfloat16,
the softmax baseline) and stop at the target loss, the capacity script; and bfloat16 training of the fast-weights
language model (issue 14: CPU autocast, the fast-weight state in float32)."""
import io
import json
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

from lazylab import cli
from lazylab.configs import apply_overrides
from lazylab.experiments.configure import make_configs, prepare
from lazylab.experiments.retrieval import RetrievalTask, retrieval_batch
from lazylab.experiments.trainer import read_metrics
from lazylab.models import fast_weights as fw
from lazylab.models.fast_weights.retrieval import FastWeightsRetrieval, SoftmaxRetrieval, sum_of_writes
from lazylab.models.fast_weights.sum_rule import sum_rule_loop

ROOT = Path(__file__).resolve().parents[2]


def last_value_by_loop(pairs: torch.Tensor, n_keys: int) -> torch.Tensor:
    """The value last paired with each key, walking the pairs in order (−1: never seen)."""
    out = torch.full((pairs.shape[1], n_keys), -1)
    for b in range(pairs.shape[1]):
        for key, value in pairs[:, b].tolist():
            out[b, key] = value
    return out


def test_setting_1_is_every_key_once_with_a_permutation_of_the_values():
    pairs, last = retrieval_batch(7, False, 5, torch.Generator().manual_seed(0))
    assert pairs.shape == (7, 5, 2)
    for b in range(5):
        assert sorted(pairs[:, b, 0].tolist()) == list(range(7))
        assert sorted(pairs[:, b, 1].tolist()) == list(range(7))
    assert torch.equal(last, last_value_by_loop(pairs, 7))


def test_setting_2_target_is_the_value_last_paired_with_the_key():
    pairs, last = retrieval_batch(6, True, 40, torch.Generator().manual_seed(1))
    assert pairs.shape == (12, 40, 2)
    assert torch.equal(last, last_value_by_loop(pairs, 6))
    keys = pairs[..., 0]
    assert (last == -1).any() and (last >= 0).any()  # some keys are missing from some sequences ...
    repeated = [(b, k) for b in range(40) for k in range(6) if (keys[:, b] == k).sum() > 1]
    assert repeated  # ... and some occur several times, the later pairs overwriting the earlier


def task(**kwargs):
    args = dict(n_keys=5, replace=True, batch_size=8, seed=3, valid_batches=2, final_valid_batches=3,
                stop_loss=0.001, device=torch.device('cpu'))
    args.update(kwargs)
    return RetrievalTask(**args)


def test_training_batches_ask_a_key_of_the_sequence_and_are_a_pure_function_of_epoch_and_index():
    t = task()
    batches = list(t.batches(epoch=2))
    assert len(batches) == t.batches_per_epoch
    x, y = batches[7]
    assert x.shape == (10 + 1, 8, 2) and y.shape == (1, 8)
    pairs, query = x[:10], x[10, :, 0]
    expected = last_value_by_loop(pairs, 5)
    assert torch.equal(y[0], expected[torch.arange(8), query])
    assert (y >= 0).all()  # the query is the key of one of the pairs
    resumed_x, resumed_y = next(t.batches(epoch=2, start=7))
    assert torch.equal(resumed_x, x) and torch.equal(resumed_y, y)
    assert not torch.equal(next(t.batches(epoch=3, start=7))[0], x)  # fresh data every epoch


def test_evaluation_asks_every_key_of_fixed_sequences():
    t = task()
    assert len(t.valid_quick) == 2 and len(t.valid_full) == 3
    for x, y in t.valid_full:
        pairs, queries = x[:10], x[10:, :, 0]
        assert torch.equal(queries, torch.arange(5).unsqueeze(1).expand(5, 8))
        assert torch.equal(y, last_value_by_loop(pairs, 5).T)  # −1 exactly for the keys that do not occur
    again = task()
    assert all(torch.equal(a[0], b[0]) for a, b in zip(t.valid_full, again.valid_full))


def test_loss_is_half_the_squared_error_over_the_keys_that_occur():
    t = task(replace=False, n_keys=3, batch_size=2)

    class Fixed(torch.nn.Module):
        def forward(self, pairs, queries):  # ŷ = 0.5 everywhere
            return torch.full((*queries.shape, 3), 0.5)

    x, y = t.valid_quick[0]
    batch = t.loss(Fixed(), x, y)
    # per query ½ (0.5² + 0.5² + 0.5²) = 0.375; argmax of a constant is 0, right where the target is 0
    assert batch.loss.item() == pytest.approx(0.375)
    assert batch.count == 6 and batch.correct == int((y == 0).sum())
    y_missing = y.clone()
    y_missing[0, 0] = -1
    assert t.loss(Fixed(), x, y_missing, reduction='sum').count == 5


def test_sum_of_one_hot_writes_equals_the_sum_rule():
    g = torch.Generator().manual_seed(0)
    keys = torch.rand(9, 3, 6, generator=g, dtype=torch.float64)
    value_ids = torch.randint(0, 4, (9, 3), generator=g)
    one_hot = torch.nn.functional.one_hot(value_ids, 4).double()
    _, expected = sum_rule_loop(keys.unsqueeze(2), keys.unsqueeze(2), one_hot.unsqueeze(2))
    torch.testing.assert_close(sum_of_writes(keys, value_ids, 4), expected[:, 0], rtol=1e-12, atol=1e-12)


RULES = {'sum': {'update_rule': 'sum'}, 'delta': {'update_rule': 'delta'},
         'gated_delta': {'update_rule': 'gated_delta'},
         'gated_delta-neg': {'update_rule': 'gated_delta', 'negative_eigenvalues': True},
         'delta_product': {'update_rule': 'delta_product', 'householder_steps': 3},
         'delta_product-gated': {'update_rule': 'delta_product', 'gated': True}}


@pytest.mark.parametrize('rule', RULES)
def test_retrieval_model_kernels_agree_and_the_projection_equals_the_one_hot_product(rule):
    torch.manual_seed(0)
    model = FastWeightsRetrieval(5, 5, 11, 8, fw.DPFP(nu=2), **RULES[rule], kernel='loop').double()
    pairs, _ = retrieval_batch(5, True, 4, torch.Generator().manual_seed(2))
    queries = torch.arange(5).unsqueeze(1).expand(5, 4)
    reference = model(pairs, queries)
    assert reference.shape == (5, 4, 5)
    for kernel, chunk in [('chunked', 3), ('step', 1)]:
        model.kernel, model.chunk_size = kernel, chunk
        torch.testing.assert_close(model(pairs, queries), reference, rtol=1e-10, atol=1e-10)
    x = torch.cat([torch.eye(5, dtype=torch.float64)[pairs[..., 1]], model.key_embedding(pairs[..., 0])], -1)
    torch.testing.assert_close(model.project_pairs(model.key, pairs, model.key_embedding(pairs[..., 0])),
                               model.key(x), rtol=1e-12, atol=1e-12)


def test_softmax_baseline_reads_the_value_of_a_matching_key():
    model = SoftmaxRetrieval(3, 3, 4, 4)
    with torch.no_grad():  # keys and queries equal to the key embedding (×10): attention picks the matching pair
        model.key_embedding.weight.copy_(torch.eye(3, 4))
        model.key.weight.zero_()
        model.key.weight[:, 3:] = 10 * torch.eye(4)
        model.key.bias.zero_()
        model.query.weight.copy_(10 * torch.eye(4))
        model.query.bias.zero_()
    pairs = torch.tensor([[[0, 2]], [[1, 0]], [[2, 1]]])  # 0→2, 1→0, 2→1
    y = model(pairs, torch.tensor([[0], [1], [2]]))
    assert y.argmax(-1).view(-1).tolist() == [2, 0, 1]


def train(tmp_path, *keys) -> list[dict]:
    runs = tmp_path / 'runs'
    threads = torch.get_num_threads()
    try:
        with redirect_stdout(io.StringIO()):
            assert cli.main(['train', 'retrieval', *keys, 'threads=1', 'device=cpu', f'runs_dir={runs}']) == 0
    finally:
        torch.set_num_threads(threads)
    return read_metrics(next((runs / 'retrieval').iterdir()) / 'metrics.jsonl')


@pytest.mark.parametrize('keys', [['phi=dpfp', 'nu=2'], ['model=softmax'], ['dtype=bfloat16'],
                                  ['replace=true', 'update_rule=delta']],
                         ids=['dpfp2-sum', 'softmax', 'bf16', 'setting2-delta'])
def test_a_short_run_learns_and_writes_loss_valid_and_accuracy(tmp_path, keys):
    records = train(tmp_path, 'n_keys=6', 'max_steps=60', 'valid_interval=20', 'log_interval=20',
                    'optimizer.learning_rate=0.01', 'stop_loss=0', *keys)
    valid = [r for r in records if 'loss.valid' in r]
    assert len(valid) >= 2 and 'accuracy.valid' in valid[-1]
    assert valid[-1]['loss.valid'] < 0.7 * valid[0]['loss.valid']


def test_training_stops_at_the_target_loss(tmp_path):
    records = train(tmp_path, 'n_keys=4', 'max_steps=3000', 'valid_interval=20', 'log_interval=20',
                    'optimizer.learning_rate=0.01', 'stop_loss=0.01')
    last = records[-1]
    assert last['loss.valid'] <= 0.01 and last['step'] < 3000
    assert all(r['loss.valid'] > 0.01 for r in records[:-1] if 'loss.valid' in r)  # stopped at the first
    run = next((tmp_path / 'runs' / 'retrieval').iterdir())
    before = (run / 'metrics.jsonl').read_bytes()
    with redirect_stdout(io.StringIO()):
        assert cli.main(['resume', str(run)]) == 0       # the run has ended: a resume does not train on
    assert (run / 'metrics.jsonl').read_bytes() == before
    assert json.loads((run / 'run.json').read_text())['steps'] == last['step']


def test_generate_on_a_retrieval_run_is_one_line(tmp_path, capsys):
    train(tmp_path, 'n_keys=4', 'max_steps=2', 'valid_interval=2', 'log_interval=1')
    run = next((tmp_path / 'runs' / 'retrieval').iterdir())
    assert cli.main(['generate', str(run), '--prompt', 'a', '--tokens', '3']) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f'lazylab: error: {run} is a retrieval run, which does not generate text; lazylab generate '
                   f'takes a run of a text model (an NLPAutoRegressionConfigs experiment)')


@pytest.mark.parametrize('name, keys, position, loss', [
    ('retrieval', ['n_keys=4'], '32×4 pairs', '(½‖y − ŷ‖² per query)'),
    ('transformer', ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4',
                     'sample_tokens=4', 'valid_batches=1', 'final_valid_batches=1'], '4×16 characters', 'nats/char'),
], ids=['retrieval', 'transformer'])
def test_the_first_and_last_lines_use_the_units_of_the_task(tmp_path, capsys, name, keys, position, loss):
    runs = tmp_path / 'runs'
    threads = torch.get_num_threads()
    try:
        assert cli.main(['train', name, *keys, 'max_steps=2', 'valid_interval=2', 'max_minutes=0', 'threads=1',
                         'device=cpu', f'runs_dir={runs}']) == 0
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.splitlines()
    run = next((runs / name).iterdir())
    info, last = json.loads((run / 'run.json').read_text()), read_metrics(run / 'metrics.jsonl')[-1]
    assert lines[0] == f'{name}: {info["parameters"]:,} parameters, 2 steps of {position} on cpu → {run}'
    assert lines[-1].startswith(f'done: step 2, valid loss {last["loss.valid"]:.4f} {loss}, accuracy ')
    if name == 'retrieval':
        assert 'characters' not in '\n'.join(lines) and 'nats' not in '\n'.join(lines)
    assert info['loss_label'] == {'retrieval': 'squared error ½‖y − ŷ‖² per query',
                                  'transformer': 'cross-entropy (nats/char)'}[name]


def test_plots_label_the_loss_as_the_runs_task_does(tmp_path, monkeypatch):
    import matplotlib.axes
    train(tmp_path, 'n_keys=4', 'max_steps=2', 'valid_interval=2', 'log_interval=1')
    retrieval = next((tmp_path / 'runs' / 'retrieval').iterdir())
    text = tmp_path / 'runs' / 'transformer' / 'old'  # a text run from before run.json said what its loss is
    text.mkdir(parents=True)
    (text / 'run.json').write_text('{"experiment": "transformer"}')
    (text / 'metrics.jsonl').write_text('{"step": 1, "tokens": 64, "loss.train": 4.1}\n')
    labels = []
    monkeypatch.setattr(matplotlib.axes.Axes, 'set_ylabel', lambda ax, label, **kw: labels.append(label))
    for runs in ([retrieval], [text], [retrieval, text]):
        assert cli.main(['plot', *map(str, runs), '-o', str(tmp_path / 'loss.png')]) == 0
    assert cli.main(['compare', str(retrieval), '--plot', str(tmp_path / 'compare.png')]) == 0
    assert labels == ['squared error ½‖y − ŷ‖² per query', 'cross-entropy (nats/char)', 'loss',
                      'loss.valid: squared error ½‖y − ŷ‖² per query']


@pytest.mark.parametrize('keys, message', [
    (['phi=favor'], 'phi has no effect with model=softmax (only the fast-weight model reads it); leave it out, or '
                    'use model=fast_weights'),
    (['nu=3', 'favor_features=8', 'update_rule=delta', 'sum_normalization=true', 'attention_normalization=false',
      'kernel=loop', 'chunk_size=4'],
     'nu, favor_features, update_rule, sum_normalization, attention_normalization, kernel, chunk_size have no effect '
     'with model=softmax (only the fast-weight model reads them); leave them out, or use model=fast_weights'),
    (['--config', '{tmp}/fast.yaml', 'hidden_size=8'],
     'phi (from --config {tmp}/fast.yaml:1) has no effect with model=softmax (only the fast-weight model reads it); '
     'leave it out, or use model=fast_weights'),
], ids=['phi', 'every fast-weight key', 'from a --config file'])
def test_fast_weight_keys_given_with_the_softmax_model_are_an_error(tmp_path, capsys, keys, message):
    (tmp_path / 'fast.yaml').write_text('phi: linear\n')
    runs = tmp_path / 'runs'
    argv = ['train', 'retrieval', 'model=softmax', 'n_keys=4', 'max_steps=2', 'device=cpu', 'threads=1',
            f'runs_dir={runs}', *(k.format(tmp=tmp_path) for k in keys)]
    threads = torch.get_num_threads()
    try:
        assert cli.main(argv) == 2
    finally:
        torch.set_num_threads(threads)
    assert capsys.readouterr().err == f'lazylab: error: {message.format(tmp=tmp_path)}\n'
    assert not runs.exists()


def test_a_presets_fast_weight_key_is_no_error_with_the_softmax_model():
    conf = make_configs('retrieval', ['preset=setting2', 'model=softmax', 'n_keys=4', 'threads=1', 'device=cpu'])
    threads = torch.get_num_threads()
    try:
        prepare(conf)  # setting2's update_rule=delta is for the fast-weight model; softmax ignores it
    finally:
        torch.set_num_threads(threads)
    assert isinstance(conf.model, SoftmaxRetrieval) and conf.replace and conf.update_rule == 'delta'


def test_a_fast_weight_key_that_code_gives_is_no_error_with_the_softmax_model():
    # `lazylab sweep retrieval model=fast_weights,softmax`: the check of its points hands the feature map the first
    # point built to the second, as an override; only what a person gave is a mistake
    conf = make_configs('retrieval', ['model=softmax', 'n_keys=4', 'threads=1', 'device=cpu'])
    apply_overrides(conf, {'phi': 'linear'})
    prepare(conf)
    assert isinstance(conf.model, SoftmaxRetrieval)


def test_keys_reach_the_model_and_defaults_follow_the_rule():
    conf = make_configs('retrieval', ['n_keys=9', 'replace=true', 'phi=favor', 'favor_features=5',
                                      'hidden_size=16', 'update_rule=delta', 'threads=1'])
    prepare(conf)
    model = conf.model
    assert conf.seq_len == 18 and conf.embedding_size == int(1.1 * 18)
    assert isinstance(model.phi, fw.Favor) and model.phi.projection.shape == (5, 16)
    assert model.phi.sum_normalization and not model.attention_normalization  # the delta rule's defaults
    assert type(conf.optimizer.optimizer) is torch.optim.Adam and conf.optimizer.optimizer.param_groups[0]['lr'] == 1e-3
    conf = make_configs('retrieval', ['nu=3', 'sum_normalization=true', 'threads=1'])
    assert conf.model.phi.nu == 3 and conf.model.phi.sum_normalization and conf.model.attention_normalization


def test_the_successor_rules_keys_reach_the_model():
    conf = make_configs('retrieval', ['n_keys=6', 'replace=true', 'update_rule=delta_product', 'householder_steps=3',
                                      'gated=true', 'negative_eigenvalues=true', 'phi=l2', 'threads=1'])
    prepare(conf)
    model = conf.model
    assert (model.update_rule, model.householder_steps, model.negative_eigenvalues) == ('delta_product', 3, True)
    assert isinstance(model.decay, fw.DecayGate) and isinstance(model.phi, fw.L2NormSiLU)
    assert model.key.out_features == 3 * conf.hidden_size and model.beta.out_features == 3
    assert not model.attention_normalization  # the delta family's default
    conf = make_configs('retrieval', ['update_rule=gated_delta', 'threads=1'])
    assert conf.model.decay is not None and conf.model.phi.sum_normalization  # (as the delta rule's)


def test_the_gated_model_without_its_decay_is_the_delta_rule_model():
    # exp(A_log) = 0 makes g = 0: the gated delta rule's retrieval model reads what the delta rule's does (the same
    # weights but the gate's), and with its decay something else
    torch.manual_seed(0)
    model = FastWeightsRetrieval(4, 4, 8, 16, fw.L2NormSiLU(), update_rule='gated_delta').double()
    pairs, last = retrieval_batch(4, True, 3, torch.Generator().manual_seed(1))
    queries = torch.arange(4).unsqueeze(1).expand(4, 3)
    gated = model(pairs, queries)
    with torch.no_grad():
        model.decay.A_log.fill_(-float('inf'))  # exp(A_log) = 0: g = 0, no decay
    delta = FastWeightsRetrieval(4, 4, 8, 16, fw.L2NormSiLU(), update_rule='delta').double()
    delta.load_state_dict(model.state_dict(), strict=False)
    torch.testing.assert_close(model(pairs, queries), delta(pairs, queries), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(gated, delta(pairs, queries))


def test_a_key_the_rule_does_not_have_is_a_one_line_error(tmp_path, cli_error):
    runs = tmp_path / 'runs'
    threads = torch.get_num_threads()
    try:
        got = cli_error(['train', 'retrieval', 'update_rule=delta', 'gated=true', 'n_keys=4', 'max_steps=1',
                         'threads=1', f'runs_dir={runs}'])
    finally:
        torch.set_num_threads(threads)
    assert got == ('gated=true is the decay gate of update_rule=delta_product, got update_rule=delta (the gated '
                   'delta rule is update_rule=gated_delta)')
    assert not runs.exists()


@pytest.mark.parametrize('variant', ['delta rule', 'DeltaProduct n_h=2 gated'])
def test_capacity_script_runs_and_writes_the_figure_and_numbers(tmp_path, variant):
    out = tmp_path / 'cap.png'
    done = subprocess.run([sys.executable, 'scripts/retrieval_capacity.py', '--quick', '--variants', variant,
                           '--out', str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    numbers = json.loads(out.with_suffix('.json').read_text())
    runs = [r for variants in numbers['results'].values() for points in variants.values() for r in points.values()]
    assert len(runs) == 1 and 0 <= runs[0]['loss'] < 1
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


# ---- bfloat16 training of the fast-weights language model (issue 14) ----

def test_fast_weights_experiment_trains_in_bfloat16(tmp_path):
    runs = tmp_path / 'runs'
    tiny = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=32', 'batch_size=4', 'max_steps=30',
            'valid_interval=10', 'valid_batches=2', 'final_valid_batches=2', 'log_interval=5', 'sample_tokens=8',
            'device=cpu', 'threads=1', 'dtype=bfloat16', 'optimizer.learning_rate=0.01', 'optimizer.warmup=5',
            'fast_weights.chunk_size=8']
    threads = torch.get_num_threads()
    try:
        with redirect_stdout(io.StringIO()):
            assert cli.main(['train', 'fast_weights', *tiny, f'runs_dir={runs}']) == 0
    finally:
        torch.set_num_threads(threads)
    valid = [r['loss.valid'] for r in read_metrics(next((runs / 'fast_weights').iterdir()) / 'metrics.jsonl')
             if 'loss.valid' in r]
    assert len(valid) == 3 and valid[-1] < valid[0] < 4.3


def test_readme_fast_weights_variant_command_trains(tmp_path):
    # README: lazylab train fast_weights fast_weights.phi=favor fast_weights.update_rule=sum (tiny sizes)
    runs = tmp_path / 'runs'
    tiny = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'max_steps=20',
            'valid_interval=10', 'valid_batches=2', 'final_valid_batches=2', 'sample_tokens=8', 'device=cpu',
            'threads=1', 'optimizer.learning_rate=0.01', 'optimizer.warmup=5']
    threads = torch.get_num_threads()
    try:
        with redirect_stdout(io.StringIO()):
            assert cli.main(['train', 'fast_weights', 'fast_weights.phi=favor', 'fast_weights.update_rule=sum',
                             *tiny, f'runs_dir={runs}']) == 0
    finally:
        torch.set_num_threads(threads)
    valid = [r['loss.valid'] for r in read_metrics(next((runs / 'fast_weights').iterdir()) / 'metrics.jsonl')
             if 'loss.valid' in r]
    assert len(valid) == 2 and valid[1] < valid[0]


def test_options_lists_the_retrieval_keys(capsys):
    assert cli.main(['options', 'retrieval']) == 0
    out = capsys.readouterr().out
    for key in ('n_keys', 'replace', 'phi', 'nu', 'favor_features', 'update_rule', 'hidden_size', 'stop_loss',
                'max_steps'):
        assert f'\n{key}' in out or out.startswith(key) or f' {key} ' in out, key
