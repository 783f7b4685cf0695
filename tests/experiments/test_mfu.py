"""MFU (lazylab.experiments.flops): the FLOPs of a training step against a hand count, the machine's peak measured
once and cached, and MFU in the progress and done lines, metrics.jsonl, run.json and `lazylab compare`, for the
built-in experiments and a user's own; counting changes nothing in the run, bit for bit.

The hand count (each product of an m×k by a k×n matrix is 2·m·n·k FLOPs, as torch's FlopCounterMode counts it).
A pre-norm transformer layer of width d, h heads (d = h·d_k), FFN width f, on a batch of b sequences of s tokens
(T = s·b tokens) does in its forward pass

    Q, K, V and output projections   4 · 2·T·d·d          = 8·T·d²
    the FFN's two layers             2·T·d·f + 2·T·f·d    = 4·T·d·f
    Q Kᵀ, per sequence and head      b·h · 2·s·s·d_k      = 2·b·s²·d
    weights × V                      b·h · 2·s·d_k·s      = 2·b·s²·d

and in its backward pass, for each projection, the gradient of its input and of its weight, each a product of the
forward's size (2× the forward; the layer norms before them have weights, so every input gradient is needed); the
attention written out (einsum) likewise 2×, the fused kernel 2.5× (it recomputes Q Kᵀ, then four products). Per
token, forward and backward:

    24·d² + 12·d·f + 12·s·d    (attention written out)        24·d² + 12·d·f + 14·s·d    (fused attention)

A language model adds its output projection to V logits, 2·d·V forward, 3× that in all: 6·d·V per token. Biases,
norms, softmax and the embedding lookup are not products: they count 0.
"""
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lazylab import cli
from lazylab.experiments import flops, trainer
from lazylab.experiments.checkpoint import load_checkpoint
from lazylab.experiments.flops import StepFlops, machine_key, peak_flops
from lazylab.experiments.metrics import percent, read_metrics
from lazylab.models.feed_forward import FeedForward
from lazylab.models.mha import MultiHeadAttention, subsequent_mask
from lazylab.models.transformer import TransformerLayer
from lazylab.runs import CHECKPOINT_PT, METRICS_JSONL, RUN_JSON, load_run
from lazylab.sweeps import compare
from lazylab.testing import as_stopped, replaced

SMALL = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'sample_tokens=5',
         'valid_batches=1', 'final_valid_batches=1', 'device=cpu', 'threads=1', 'max_steps=4', 'valid_interval=2',
         'log_interval=1']


def layer_flops_per_token(d: int, f: int, s: int, fused: bool) -> int:
    """The module docstring's count for one transformer layer, per token."""
    return 24 * d * d + 12 * d * f + (14 if fused else 12) * s * d


def _only_run(runs: Path) -> Path:
    run, = (d for d in runs.glob('*/*') if (d / RUN_JSON).is_file())
    return run


def _record(run: Path) -> dict:
    return json.loads((run / RUN_JSON).read_text())


# --- (a) the count against the hand count ----------------------------------------------------------------------

@settings(max_examples=8)
@given(heads=st.integers(1, 3), d_k=st.integers(2, 6), d_ff=st.integers(1, 24), seq_len=st.integers(2, 9),
       batch=st.integers(1, 3), fused=st.booleans())
def test_a_transformer_layer_counts_as_its_hand_count(heads, d_k, d_ff, seq_len, batch, fused):
    """(With d_k and seq_len ≥ 2: einsum computes a product with a side of 1 elementwise, which counts 0.)"""
    torch.manual_seed(0)
    d = heads * d_k
    layer = TransformerLayer(d_model=d, self_attn=MultiHeadAttention(heads, d, dropout_prob=0.0, use_sdpa=fused),
                             feed_forward=FeedForward(d, d_ff, dropout=0.0), dropout_prob=0.0)
    x, mask = torch.randn(seq_len, batch, d), subsequent_mask(seq_len)
    count = StepFlops()
    with count.counting(tokens=seq_len * batch):
        layer(x=x, mask=mask).square().sum().backward()
    assert count.per_token == layer_flops_per_token(d, d_ff, seq_len, fused)


def test_a_training_step_of_the_transformer_counts_as_its_hand_count(tmp_path):
    """What the trainer reports for a run: its layers and its output projection to the characters."""
    assert cli.main(['train', 'transformer', *replaced(SMALL, 'n_layers=2', 'd_ff=24', 'seq_len=12'),
                     f'runs_dir={tmp_path}']) == 0
    run = _only_run(tmp_path)
    n_tokens = len(load_checkpoint(run / CHECKPOINT_PT)['vocabulary'])
    assert _record(run)['flops_per_token'] == 2 * layer_flops_per_token(16, 24, 12, fused=True) + 6 * 16 * n_tokens


def test_counting_changes_nothing_in_the_step():
    """The same step, counted and not: the same loss, gradients and random state after it, bit for bit (a dropout
    draws from the generator; a weight used twice sums its gradients in an order FlopCounterMode's module tracking
    would change)."""
    shared = torch.nn.Linear(8, 8)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), shared, torch.nn.Dropout(0.3), torch.nn.ReLU(), shared,
                                torch.nn.Linear(8, 11))
    x = torch.arange(12).remainder(11).view(3, 4)

    def step(counted: bool):
        torch.manual_seed(7)
        model.zero_grad(set_to_none=True)
        count = StepFlops(enabled=counted)
        with count.counting(tokens=x.numel()):
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()], torch.rand(3), count.per_token

    loss_a, grads_a, after_a, flops_a = step(counted=False)
    loss_b, grads_b, after_b, flops_b = step(counted=True)
    # per token: three layers (the shared one twice), each forward, weight gradient and input gradient (the
    # embedding's weight needs the first one's)
    assert flops_a is None and flops_b == 3 * (2 * 8 * 8 + 2 * 8 * 8 + 2 * 8 * 11)
    assert torch.equal(loss_a, loss_b) and torch.equal(after_a, after_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))


def test_an_op_whose_formula_fails_leaves_no_count_and_the_step_goes_on(monkeypatch):
    def broken(*args, **kwargs):
        raise AssertionError('a shape the formula does not know')
    monkeypatch.setitem(torch.utils.flop_counter.flop_registry, torch.ops.aten.mm, broken)
    a, b = torch.ones(2, 3, requires_grad=True), torch.ones(3, 4)
    count = StepFlops()
    with count.counting(tokens=2):
        out = a @ b
        out.sum().backward()
    assert count.per_token is None and torch.equal(out, torch.full((2, 4), 3.0))
    assert torch.equal(a.grad, torch.full((2, 3), 4.0))


def test_a_step_without_any_product_has_no_count():
    count = StepFlops()
    with count.counting(tokens=4):
        (torch.ones(4, requires_grad=True) * 2).sum().backward()
    assert count.per_token is None


def test_only_the_first_step_is_counted():
    count, a = StepFlops(), torch.ones(2, 2)
    with count.counting(tokens=2):
        a @ a
    with count.counting(tokens=1):  # not counted: per_token stays the first step's
        a @ a @ a
    assert count.per_token == 2 * 2 * 2 * 2 / 2


# --- (b) the peak ----------------------------------------------------------------------------------------------

@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The peak cache file of this test alone (cache.path), and a spy on the measurement: cache.measured lists its
    calls."""
    path = tmp_path / 'cache' / 'peak_flops.json'
    monkeypatch.setenv(flops.CACHE_ENV, str(path))
    measured, measure = [], flops.measure_peak_flops

    def spy(device, dtype, seconds=0.02):
        measured.append((device, dtype))
        return measure(device, dtype, seconds)
    monkeypatch.setattr(flops, 'measure_peak_flops', spy)
    return SimpleNamespace(path=path, measured=measured)


def test_the_peak_is_measured_once_then_read_from_the_cache(cache):
    cpu = torch.device('cpu')
    first = peak_flops(cpu, 'float32')
    assert len(cache.measured) == 1 and math.isfinite(first) and first > 0
    assert peak_flops(cpu, 'float32') == first and len(cache.measured) == 1  # the cached value: not measured again
    assert json.loads(cache.path.read_text())['peaks'][machine_key(cpu, 'float32')]['flops'] == first


def test_the_peak_is_cached_per_thread_count_and_dtype(cache):
    cpu, threads = torch.device('cpu'), torch.get_num_threads()
    peak_flops(cpu, 'float32')
    torch.set_num_threads(threads + 1)  # (the conftest's fixture sets it back)
    peak_flops(cpu, 'float32')
    peak_flops(cpu, 'bfloat16')
    keys = set(json.loads(cache.path.read_text())['peaks'])
    assert len(cache.measured) == 3 and len(keys) == 3
    assert any(f'| {threads} threads |' in k for k in keys) and any(f'| {threads + 1} threads |' in k for k in keys)


def test_the_measured_rate_is_the_products_flops_over_their_time():
    """2·n³ FLOPs a product: with a clock that advances 1 s a reading, each timed product takes 1 s."""
    ticks = iter(range(10**6))
    n = flops.MATRIX['cpu']
    assert flops.measure_peak_flops(torch.device('cpu'), 'float32', seconds=0.5,
                                    clock=lambda: float(next(ticks))) == 2 * n ** 3


@pytest.mark.parametrize('one, two, peak', [(100.0, 10.0, 100.0), (100.0, 180.0, 180.0)])
def test_several_cpu_threads_measure_at_least_the_rate_of_one(monkeypatch, one, two, peak):
    """A busy machine can starve a two-thread product below one thread's rate: the peak is the larger."""
    torch.set_num_threads(2)  # (the conftest's fixture sets it back)
    monkeypatch.setattr(flops, '_best_rate', lambda device, dtype, seconds, clock: {1: one, 2: two}[
        torch.get_num_threads()])
    assert flops.measure_peak_flops(torch.device('cpu'), 'float32') == peak and torch.get_num_threads() == 2


@pytest.mark.parametrize('damage', ['{not json', '[1, 2]', '{"format": 1, "peaks": [1]}',
                                    '{"format": 99, "peaks": {}}', 'KEY -1', 'KEY "fast"', 'KEY NaN', '\x00\xff'])
def test_a_damaged_cache_is_measured_again_and_written_anew(cache, damage):
    cpu = torch.device('cpu')
    cache.path.parent.mkdir(parents=True)
    if damage.startswith('KEY '):  # a well-formed file whose entry for this machine is not a positive rate
        damage = json.dumps({'format': 1, 'peaks': {machine_key(cpu, 'float32'): {'flops': 0}}}).replace(
            '0}', damage[4:] + '}')
    cache.path.write_bytes(damage.encode('latin-1'))
    value = peak_flops(cpu, 'float32')
    written = json.loads(cache.path.read_text())
    assert len(cache.measured) == 1 and value > 0
    assert written['format'] == 1 and list(written['peaks']) == [machine_key(cpu, 'float32')]
    assert written['peaks'][machine_key(cpu, 'float32')]['flops'] == value


def test_a_cache_that_cannot_be_written_still_gives_the_measured_peak(cache):
    cache.path.mkdir(parents=True)  # a folder where the file should be
    assert peak_flops(torch.device('cpu'), 'float32') > 0 and len(cache.measured) == 1


def test_the_peak_setting_is_used_without_measuring(cache):
    assert peak_flops(torch.device('cpu'), 'float32', tflops=989) == 989e12
    assert cache.measured == [] and not cache.path.exists()


def test_a_peak_that_cannot_be_measured_is_none(cache, monkeypatch):
    def out_of_memory(device, dtype, seconds=0.0):
        raise RuntimeError('out of memory')
    monkeypatch.setattr(flops, 'measure_peak_flops', out_of_memory)
    assert peak_flops(torch.device('cpu'), 'float32') is None and not cache.path.exists()


def test_peak_tflops_is_checked_like_any_setting(cli_error):
    assert 'peak_tflops' in cli_error(['train', 'transformer', 'peak_tflops=-1'])


# --- (c) a run shows MFU everywhere ----------------------------------------------------------------------------

def test_a_run_has_mfu_in_its_lines_records_run_json_and_compare(tmp_path, capsys, cache):
    assert cli.main(['train', 'transformer', *SMALL, f'runs_dir={tmp_path}']) == 0
    out = capsys.readouterr().out.splitlines()
    run = _only_run(tmp_path)
    record, pos = _record(run), load_checkpoint(run / CHECKPOINT_PT)['position']
    per_token, peak = record['flops_per_token'], record['peak_flops']
    assert peak == json.loads(cache.path.read_text())['peaks'][machine_key(torch.device('cpu'), 'float32')]['flops']
    # run.json: the run's average, from its tokens over its training seconds
    assert record['mfu'] == pytest.approx(per_token * (pos['tokens'] / pos['train_seconds']) / peak, rel=1e-12)
    assert f'(the run\'s average), MFU {percent(record["mfu"])}; stopped' in out[-1]
    # every record with a speed has its MFU; each validation's progress line shows it
    records = read_metrics(run / METRICS_JSONL)
    assert len(records) == 4 and all(r['mfu'] == pytest.approx(per_token * r['tokens_per_s'] / peak, rel=1e-12)
                                     for r in records)
    assert list(records[0])[list(records[0]).index('tokens_per_s') + 1] == 'mfu'
    by_step = {r['step']: r for r in records}
    shown = {int(re.match(r'epoch \d+ step (\d+)', line).group(1)): line.split(' | ')[2] for line in out
             if line.startswith('epoch ')}  # (off a terminal: each validation's line, and one every 15 s)
    assert {2, 4} <= set(shown) and all(part == f'MFU {percent(by_step[step]["mfu"])}' for step, part in shown.items())
    # compare: the run's speed (as the done line's) with run.json's counts
    assert cli.main(['compare', str(tmp_path / 'transformer')]) == 0
    header, row = capsys.readouterr().out.splitlines()[1:3]
    at = header.split().index('MFU')
    assert header.split()[at - 1] == 'tok/s'
    loaded = load_run(run)
    assert loaded.mfu() == pytest.approx(per_token * loaded.tokens_per_s() / peak, rel=1e-12)
    assert row.split()[at] == percent(loaded.mfu())


def test_the_peak_setting_is_the_runs_peak(tmp_path, cache):
    assert cli.main(['train', 'transformer', *SMALL, 'peak_tflops=0.5', f'runs_dir={tmp_path}']) == 0
    assert _record(_only_run(tmp_path))['peak_flops'] == 0.5e12 and cache.measured == []


def test_a_run_whose_peak_cannot_be_measured_trains_without_mfu(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(trainer, 'peak_flops', lambda *args, **kwargs: None)
    assert cli.main(['train', 'transformer', *SMALL, f'runs_dir={tmp_path}']) == 0
    out = capsys.readouterr().out
    run = _only_run(tmp_path)
    assert 'MFU' not in out and not {'flops_per_token', 'peak_flops', 'mfu'} & set(_record(run))
    assert not any('mfu' in r for r in read_metrics(run / METRICS_JSONL))
    assert cli.main(['compare', str(run)]) == 0
    header, row = capsys.readouterr().out.splitlines()[1:3]
    assert row.split()[header.split().index('MFU')] == '—'


def test_under_a_sequence_length_warm_up_the_first_full_length_step_is_counted(tmp_path):
    assert cli.main(['train', 'transformer', *replaced(SMALL, 'seq_len_start=4', 'seq_len_warmup=2', 'max_steps=4'),
                     f'runs_dir={tmp_path}']) == 0
    run = _only_run(tmp_path)
    n_tokens = len(load_checkpoint(run / CHECKPOINT_PT)['vocabulary'])
    assert _record(run)['flops_per_token'] == layer_flops_per_token(16, 32, 16, fused=True) + 6 * 16 * n_tokens
    records = read_metrics(run / METRICS_JSONL)  # (a record a step: steps 1 and 2 are shorter, not counted)
    assert ['mfu' in r for r in records] == [False, False, True, True]


@pytest.mark.parametrize('experiment, settings', [
    ('transformer', ['dropout=0.1']), ('feedback', ['dropout=0.1']), ('fast_weights', ['dropout=0.1']),
    ('retrieval', ['n_keys=4', 'max_steps=4', 'valid_interval=2', 'device=cpu', 'threads=1'])])
def test_a_counted_run_equals_an_uncounted_one_bit_for_bit(tmp_path, monkeypatch, experiment, settings):
    base = settings if experiment == 'retrieval' else replaced(SMALL, *settings)
    assert cli.main(['train', experiment, *base, f'runs_dir={tmp_path / "counted"}']) == 0
    monkeypatch.setattr(trainer, 'StepFlops', lambda enabled: StepFlops(enabled=False))
    assert cli.main(['train', experiment, *base, f'runs_dir={tmp_path / "uncounted"}']) == 0
    counted, uncounted = _only_run(tmp_path / 'counted'), _only_run(tmp_path / 'uncounted')
    assert _record(counted)['flops_per_token'] > 0 and 'flops_per_token' not in _record(uncounted)
    a, b = load_checkpoint(counted / CHECKPOINT_PT), load_checkpoint(uncounted / CHECKPOINT_PT)
    assert all(torch.equal(a['model'][k], v) for k, v in b['model'].items())
    clock_free = ('step', 'loss.train', 'accuracy.train', 'loss.valid', 'accuracy.valid')
    assert [{k: r.get(k) for k in clock_free} for r in read_metrics(counted / METRICS_JSONL)] == \
        [{k: r.get(k) for k in clock_free} for r in read_metrics(uncounted / METRICS_JSONL)]


def test_a_resume_counts_again_and_keeps_mfu(tmp_path):
    """A resume may run on another machine: it counts the FLOPs and takes the peak again, and records them."""
    assert cli.main(['train', 'transformer', *replaced(SMALL, 'peak_tflops=0.5'), f'runs_dir={tmp_path}']) == 0
    run = as_stopped(_only_run(tmp_path), steps_left=2)
    record = {k: v for k, v in _record(run).items() if k not in ('flops_per_token', 'peak_flops', 'mfu')}
    (run / RUN_JSON).write_text(json.dumps(record))
    assert cli.main(['resume', str(run)]) == 0
    record = _record(run)
    assert record['flops_per_token'] == layer_flops_per_token(16, 32, 16, fused=True) + 6 * 16 * len(
        load_checkpoint(run / CHECKPOINT_PT)['vocabulary'])
    assert record['peak_flops'] == 0.5e12 and record['mfu'] > 0


# --- (d) a user's own experiment -------------------------------------------------------------------------------

#: a model of the user's: embedding, then two linear layers (no lazylab module)
MLP = '''\
import sys

from torch import nn

from lazylab.configs import option
from lazylab.experiments import NLPAutoRegressionConfigs, device_of, main


class Configs(NLPAutoRegressionConfigs):
    model: nn.Module = 'mlp'
    hidden: int = 24      # hidden width


@option(Configs.model, 'mlp')
def _mlp(c):
    return nn.Sequential(nn.Embedding(c.n_tokens, c.d_model), nn.Linear(c.d_model, c.hidden), nn.ReLU(),
                         nn.Linear(c.hidden, c.n_tokens)).to(device_of(c))


if __name__ == '__main__':
    sys.exit(main(Configs))
'''


def test_a_users_own_experiment_gets_mfu(tmp_path, monkeypatch, capsys):
    """Per token: the two layers forward (2·d·hidden + 2·hidden·V), their weight gradients and both input
    gradients (the embedding's weight needs the first one's): 6·d·hidden + 6·hidden·V."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'my_mlp.py').write_text(MLP, encoding='utf-8')
    settings = ['d_model=8', 'hidden=24', 'seq_len=16', 'batch_size=4', 'max_steps=2', 'valid_interval=1',
                'valid_batches=1', 'final_valid_batches=1', 'sample_tokens=5', 'device=cpu', 'threads=1']
    assert cli.main(['train', 'my_mlp.py', *settings, f'runs_dir={tmp_path / "runs"}']) == 0
    done = capsys.readouterr().out.splitlines()[-1]
    run = _only_run(tmp_path / 'runs')
    record, n_tokens = _record(run), len(load_checkpoint(run / CHECKPOINT_PT)['vocabulary'])
    assert record['flops_per_token'] == 6 * 8 * 24 + 6 * 24 * n_tokens
    assert re.search(r", MFU \d+\.\d%; stopped", done) and f'MFU {percent(record["mfu"])}' in done


def test_compare_by_mfu_puts_the_highest_first(tmp_path):
    for name, value in (('a', 0.01), ('b', 0.03), ('c', 0.02)):
        (tmp_path / name).mkdir()
        (tmp_path / name / RUN_JSON).write_text('{"status": "completed"}')
        (tmp_path / name / METRICS_JSONL).write_text(json.dumps({'step': 1, 'tokens': 10, 'tokens_per_s': 5.0,
                                                                 'mfu': value}) + '\n')
    table = compare.compare([str(tmp_path / n) for n in 'abc'], metric='mfu')
    assert [row['final'] for row in table.rows] == [0.03, 0.02, 0.01]
