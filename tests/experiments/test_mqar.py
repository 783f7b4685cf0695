"""The MQAR experiment (Zoology's multi-query associative recall): its sequences against a hand-built one and, for
any sizes and seed, against what a query's label must be; Zoology's power law of the query slots; batches that are a
pure function of (seed, epoch, index) and a fixed validation set; the loss at the queries only; impossible sizes as
one error line; a short run through the command line whose loss falls and whose metrics hold the accuracy."""
import io
import math
from contextlib import redirect_stdout

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lazylab import cli
from lazylab.experiments.metrics import read_metrics
from lazylab.experiments.mqar import POWER_A, MQARTask, mqar_batch, mqar_sequences

TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'batch_size=8', 'valid_batches=1', 'final_valid_batches=1',
        'device=cpu', 'threads=1']


def test_a_hand_built_sequence_has_its_tokens_labels_and_mask():
    # vocab_size 8: keys 1 … 3, values 4 … 7; pairs 3→6, 1→5; seq_len 10: 4 tokens of pairs, then slots at 4, 6, 8;
    # key 3 asked in slot 1 (position 6), key 1 in slot 0 (position 4); filler 7 everywhere else
    keys, values = torch.tensor([[3, 1]]), torch.tensor([[6, 5]])
    x, y = mqar_sequences(keys, values, torch.tensor([[1, 0]]), torch.full((1, 10), 7))
    assert x[:, 0].tolist() == [3, 6, 1, 5, 1, 7, 3, 7, 7, 7]
    assert y[:, 0].tolist() == [-1, -1, -1, -1, 5, -1, 6, -1, -1, -1]
    # one query (n_queries 1 < n_pairs 2): the first key only, in slot 2
    x, y = mqar_sequences(keys, values, torch.tensor([[2]]), torch.full((1, 10), 0))
    assert x[:, 0].tolist() == [3, 6, 1, 5, 0, 0, 0, 0, 3, 0]
    assert y[:, 0].tolist() == [-1] * 8 + [6, -1]


def value_of_each_query(x: torch.Tensor, n_pairs: int) -> dict[tuple[int, int], int]:
    """(position, sequence) → the value paired with the token there among the pairs, walking them in plain Python
    (only for positions after the pairs whose token is one of their keys)."""
    out = {}
    for b in range(x.shape[1]):
        tokens = x[:, b].tolist()
        pairs = {tokens[2 * i]: tokens[2 * i + 1] for i in range(n_pairs)}
        for t in range(2 * n_pairs, len(tokens)):
            if tokens[t] in pairs:
                out[t, b] = pairs[tokens[t]]
    return out


@st.composite
def sizes(draw):
    vocab_size = draw(st.integers(4, 40))
    n_pairs = draw(st.integers(1, vocab_size // 2 - 1))
    n_queries = draw(st.integers(1, n_pairs))
    seq_len = draw(st.integers(2 * n_pairs + 2 * n_queries, 2 * n_pairs + 2 * n_queries + 9))
    return vocab_size, n_pairs, n_queries, seq_len


@settings(max_examples=40)
@given(sizes=sizes(), batch_size=st.integers(1, 5), seed=st.integers(0, 2 ** 32 - 1))
def test_every_query_asks_a_key_of_the_pairs_and_its_label_is_that_keys_value(sizes, batch_size, seed):
    vocab_size, n_pairs, n_queries, seq_len = sizes
    x, y = mqar_batch(vocab_size, n_pairs, n_queries, seq_len, batch_size, torch.Generator().manual_seed(seed))
    assert x.shape == y.shape == (seq_len, batch_size) and x.dtype == y.dtype == torch.long
    assert ((x >= 0) & (x < vocab_size)).all()
    half = vocab_size // 2
    for b in range(batch_size):
        keys, values = x[0:2 * n_pairs:2, b].tolist(), x[1:2 * n_pairs:2, b].tolist()
        assert len(set(keys)) == n_pairs and all(1 <= k < half for k in keys)
        assert len(set(values)) == n_pairs and all(half <= v < vocab_size for v in values)
        asked = (y[:, b] >= 0).nonzero().view(-1).tolist()
        assert len(asked) == n_queries                         # n_queries labels, in the query region's even slots
        assert all(t >= 2 * n_pairs and (t - 2 * n_pairs) % 2 == 0 for t in asked)
        assert len({x[t, b].item() for t in asked}) == n_queries  # each key asked once
    answers = value_of_each_query(x, n_pairs)
    labelled = {(t, b): y[t, b].item() for t, b in (y >= 0).nonzero().tolist()}
    assert all(answers[where] == value for where, value in labelled.items())


def test_the_query_slots_follow_zoologys_power_law():
    # one query among 8 slots: P(slot i) = i^(α−1) / Σⱼ j^(α−1), i = 1 … 8; 20,000 draws, each frequency within 4σ
    n = 20_000
    x, y = mqar_batch(64, 1, 1, 2 + 2 * 8, n, torch.Generator().manual_seed(0))
    slot = ((y >= 0).float().argmax(0) - 2) // 2
    weights = [i ** (POWER_A - 1) for i in range(1, 9)]
    for i, w in enumerate(weights):
        p = w / sum(weights)
        frequency = (slot == i).float().mean().item()
        assert abs(frequency - p) < 4 * math.sqrt(p * (1 - p) / n), (i, frequency, p)


def task(**kwargs) -> MQARTask:
    args = dict(vocab_size=16, n_pairs=3, n_queries=2, seq_len=14, batch_size=4, seed=5, valid_batches=2,
                final_valid_batches=3, stop_accuracy=1.0, device=torch.device('cpu'))
    args.update(kwargs)
    return MQARTask(**args)


def test_batches_are_a_pure_function_of_seed_epoch_and_index_and_the_validation_set_is_fixed():
    t = task()
    x, y = list(t.batches(epoch=1))[6]
    resumed = next(t.batches(epoch=1, start=6))
    assert torch.equal(resumed[0], x) and torch.equal(resumed[1], y)       # a resumed run sees the same batch
    assert not torch.equal(next(t.batches(epoch=2, start=6))[0], x)         # fresh data every epoch
    again = task()
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(t.valid_full[1], again.valid_full[1]))
    assert len(t.valid_quick[1]) == 2 and len(t.valid_full[1]) == 3 and t.final_valid_ratio == 1.5
    assert not torch.equal(task(seed=6).valid_quick[1][0][0], t.valid_quick[1][0][0])


class Uniform(torch.nn.Module):
    """Logits 0 for every token: cross-entropy log V, and the argmax token 0, which no value is."""

    def forward(self, x):
        return torch.zeros(*x.shape, 16, requires_grad=True)


def test_the_loss_and_accuracy_count_the_queries_only():
    t = task()
    x, y = t.valid_quick[1][0]
    batch = t.loss(Uniform(), x, y, reduction='sum')
    assert (batch.count, batch.correct) == (4 * 2, 0)
    assert batch.loss.item() == pytest.approx(8 * math.log(16))
    assert t.loss(Uniform(), x, y).loss.item() == pytest.approx(math.log(16))


@pytest.mark.parametrize('keys, message', [
    (['n_pairs=40'], 'n_pairs=40 is too many for vocab_size=64: the keys are the tokens 1 … 31 (31 keys, each once '
                     'per sequence); set n_pairs ≤ 31, or vocab_size ≥ 82'),
    (['n_pairs=3', 'n_queries=4'], 'n_queries=4 is more than n_pairs=3: each key is asked at most once; set '
                                   'n_queries ≤ 3, or leave it out (every key is asked)'),
    (['n_pairs=5', 'seq_len=19'], 'n_pairs=5 and n_queries=5 do not fit in seq_len=19: the pairs take 2·n_pairs '
                                  'tokens, and the queries one of every 2 tokens after them; set seq_len ≥ 20, or '
                                  'fewer pairs or queries'),
    (['vocab_size=3'], 'bad value for vocab_size: must be ≥ 4, got 3'),
], ids=['pairs over keys', 'queries over pairs', 'not in seq_len', 'vocabulary'])
def test_impossible_sizes_are_one_error_line_and_nothing_is_written(tmp_path, cli_error, keys, message):
    runs = tmp_path / 'runs'
    assert cli_error(['train', 'mqar', *TINY, 'max_steps=2', f'runs_dir={runs}', *keys]) == message
    assert not runs.exists()


def test_a_short_run_learns_where_the_values_are_and_records_its_accuracy(tmp_path):
    runs = tmp_path / 'runs'
    with redirect_stdout(io.StringIO()):
        assert cli.main(['train', 'mqar', *TINY, 'max_steps=60', 'valid_interval=10', 'log_interval=10',
                         'optimizer.warmup=5', 'optimizer.learning_rate=0.01', 'stop_accuracy=0',
                         f'runs_dir={runs}']) == 0
    records = read_metrics(next((runs / 'mqar').iterdir()) / 'metrics.jsonl')
    valid = [r for r in records if 'loss.valid' in r]
    assert [r['step'] for r in valid] == [10, 20, 30, 40, 50, 60]
    assert all(0 <= r['accuracy.valid'] <= 1 and 0 <= r['accuracy.train'] <= 1 for r in valid)
    # from ln 64 (every token alike) towards ln 32 (a value, not a key or a filler) = ln 64 − 0.69, and below
    assert valid[-1]['loss.valid'] < min(valid[0]['loss.valid'], math.log(64) - 0.5)
