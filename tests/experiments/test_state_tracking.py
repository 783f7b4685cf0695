"""The state-tracking experiment (parity and S5): the group tables against plain Python (tuples composed by hand),
the labels of known bit strings and, for any seed and length, labels recomputed independently; validation at 1×,
2× and 4× the training length, checked with models whose accuracy is known; the checks that every model family
takes the longest sequences; a short run through the command line whose metrics `lazylab compare` shows."""
import io
import itertools
import math
from contextlib import redirect_stdout

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lazylab import cli
from lazylab.configs import apply_overrides
from lazylab.experiments.configure import make_configs, prepare
from lazylab.experiments.metrics import read_metrics
from lazylab.experiments.state_tracking import (
    StateTrackingTask,
    cayley_table,
    elements,
    prefix_products,
    state_tracking_batch,
)
from lazylab.testing import replaced

TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=8', 'batch_size=4', 'valid_batches=1',
        'final_valid_batches=1', 'device=cpu', 'threads=1']
IDENTITY = (0, 1, 2, 3, 4)


def test_parity_labels_of_known_bit_strings():
    bits = torch.tensor([[1, 0, 1, 1, 0, 0, 1], [0, 0, 0, 1, 1, 1, 1]]).T
    labels = prefix_products(bits, cayley_table('parity'))
    assert labels.T.tolist() == [[1, 1, 0, 1, 1, 1, 0], [0, 0, 0, 1, 0, 1, 0]]


def test_the_s5_elements_are_the_120_permutations_with_the_identity_first():
    perms = elements('s5')
    assert len(perms) == len(set(perms)) == 120 and set(perms) == set(itertools.permutations(range(5)))
    assert perms[0] == IDENTITY and list(perms) == sorted(perms)
    table = cayley_table('s5')
    assert table.shape == (120, 120)
    assert table[0].tolist() == list(range(120)) and table[:, 0].tolist() == list(range(120))  # e ∘ b = b, a ∘ e = a
    assert all(sorted(row) == list(range(120)) for row in table.tolist())  # a group's table: a Latin square


def test_s5_composes_as_functions_the_right_one_acting_first():
    perms = elements('s5')
    a, b = (1, 0, 2, 3, 4), (0, 2, 1, 3, 4)   # the swaps 0 ↔ 1 and 1 ↔ 2, as tuples p[i] = image of i
    table = cayley_table('s5')
    # (a ∘ b)(i) = a(b(i)): 0 → 0 → 1, 1 → 2 → 2, 2 → 1 → 0
    assert perms[table[perms.index(a), perms.index(b)]] == (1, 2, 0, 3, 4)
    assert perms[table[perms.index(b), perms.index(a)]] == (2, 0, 1, 3, 4)
    # s₂ = g₂ ∘ g₁: the first token acts first
    x = torch.tensor([[perms.index(b)], [perms.index(a)]])
    assert [perms[i] for i in prefix_products(x, table)[:, 0].tolist()] == [b, (1, 2, 0, 3, 4)]


def labels_by_hand(group: str, x: torch.Tensor) -> list[list[int]]:
    """The prefix products of each sequence (column) of x, with Python ints and tuples."""
    out = []
    for column in x.T.tolist():
        if group == 'parity':
            out.append([sum(column[:t + 1]) % 2 for t in range(len(column))])
            continue
        perms, state, labels = list(itertools.permutations(range(5))), IDENTITY, []
        for token in column:
            g = perms[token]
            state = tuple(g[state[i]] for i in range(5))
            labels.append(perms.index(state))
        out.append(labels)
    return out


@settings(max_examples=30)
@given(group=st.sampled_from(['parity', 's5']), seq_len=st.integers(1, 40), batch_size=st.integers(1, 4),
       seed=st.integers(0, 2 ** 32 - 1))
def test_the_labels_are_the_prefix_products_recomputed_by_hand(group, seq_len, batch_size, seed):
    x, y = state_tracking_batch(group, seq_len, batch_size, torch.Generator().manual_seed(seed))
    assert x.shape == y.shape == (seq_len, batch_size)
    assert ((x >= 0) & (x < len(elements(group)))).all()
    assert y.T.tolist() == labels_by_hand(group, x)


def task(**kwargs) -> StateTrackingTask:
    args = dict(group='parity', seq_len=6, batch_size=4, seed=2, valid_batches=2, final_valid_batches=3,
                stop_accuracy=1.0, device=torch.device('cpu'))
    args.update(kwargs)
    return StateTrackingTask(**args)


class Oracle(torch.nn.Module):
    """Logits that are 10 at the true state up to position `upto` and favour token 0 after it (None: everywhere)."""

    def __init__(self, group: str, upto=None):
        super().__init__()
        self.table, self.upto = cayley_table(group), upto

    def forward(self, x):
        labels = prefix_products(x, self.table)
        if self.upto is not None:
            labels[self.upto:] = 0
        return 10.0 * torch.nn.functional.one_hot(labels, self.table.shape[0]).float()


def test_validation_at_one_two_and_four_times_the_training_length_is_named_by_its_length():
    t = task()
    assert [x.shape for x, _ in (t.valid_quick[m][0] for m in (1, 2, 4))] == [(6, 4), (12, 4), (24, 4)]
    assert t.longest == 24 and t.probe_batch()[0].shape == (24, 4)
    perfect = t.evaluate(Oracle('parity'), final=False)
    assert set(perfect) == {'loss', 'accuracy', 'loss.valid_2x', 'accuracy.valid_2x', 'loss.valid_4x',
                            'accuracy.valid_4x'}
    assert perfect['accuracy'] == perfect['accuracy.valid_2x'] == perfect['accuracy.valid_4x'] == 1.0
    assert perfect['loss.valid_4x'] == pytest.approx(math.log1p(math.exp(-10)), abs=1e-5)  # (float32 logits)
    # right for the first 6 positions only, then "0": the accuracy beyond is the fraction of states that are 0
    short = t.evaluate(Oracle('parity', upto=6), final=True)
    for m, name in ((1, 'accuracy'), (2, 'accuracy.valid_2x'), (4, 'accuracy.valid_4x')):
        y = torch.cat([y for _, y in t.valid_full[m]], dim=1)
        expected = (6 * y.shape[1] + int((y[6:] == 0).sum())) / y.numel()
        assert short[name] == pytest.approx(expected)
    assert short['accuracy'] == 1.0 and short['accuracy.valid_4x'] < 1.0


def test_a_prefix_of_a_batch_is_a_batch_so_the_length_can_warm_up():
    t = task(group='s5')
    x, y = next(t.batches(0))
    short_x, short_y = t.shorten(x, y, 3)
    assert t.shorter_sequences and torch.equal(prefix_products(short_x, cayley_table('s5')), short_y)


def _train(tmp_path, *keys) -> list[dict]:
    runs = tmp_path / 'runs'
    with redirect_stdout(io.StringIO()):
        assert cli.main(['train', 'state_tracking', *replaced(TINY, 'max_steps=4', 'valid_interval=2',
                                                              'log_interval=2', f'runs_dir={runs}', *keys)]) == 0
    return read_metrics(next((runs / 'state_tracking').iterdir()) / 'metrics.jsonl')


@pytest.mark.parametrize('keys', [['model=transformer'], ['model=feedback'], ['preset=deltanet_negative'],
                                  ['group=s5', 'model=fast_weights', 'fast_weights.update_rule=delta_product',
                                   'seq_len_start=4', 'seq_len_warmup=2']],
                         ids=['transformer', 'feedback', 'deltanet_negative', 's5-delta_product-warmup'])
def test_every_family_trains_and_records_the_accuracy_at_every_length(tmp_path, keys):
    records = _train(tmp_path, *keys)
    valid = [r for r in records if 'loss.valid' in r]
    assert [r['step'] for r in valid] == [2, 4]
    names = ('accuracy.valid', 'accuracy.valid_2x', 'accuracy.valid_4x')
    assert all(0 <= r[name] <= 1 for r in valid for name in names)
    assert all(math.isfinite(r[f'loss.{which}']) for r in valid for which in ('valid', 'valid_2x', 'valid_4x'))


def test_deltanet_tracks_parity_at_four_times_the_length_with_negative_eigenvalues_and_not_without(tmp_path):
    # Grazzi et al. 2025: β ∈ (0, 2) lets the delta rule's transition flip a state (eigenvalue −1), which parity
    # needs; with β ∈ (0, 1) it cannot. At tiny sizes, 60 steps (seconds) tell them apart.
    learns = ['max_steps=60', 'valid_interval=20', 'optimizer.warmup=5', 'optimizer.learning_rate=0.01',
              'stop_accuracy=0']
    negative = _train(tmp_path / 'negative', 'preset=deltanet_negative', *learns)[-1]
    assert negative['accuracy.valid'] == 1.0 and negative['accuracy.valid_4x'] >= 0.9
    positive = _train(tmp_path / 'positive', 'preset=deltanet', *learns)[-1]
    assert max(positive['accuracy.valid'], positive['accuracy.valid_2x'], positive['accuracy.valid_4x']) < 0.8


def test_compare_shows_the_accuracy_at_four_times_the_length(tmp_path, capsys):
    records = _train(tmp_path)
    capsys.readouterr()
    assert cli.main(['compare', str(tmp_path / 'runs' / 'state_tracking'), '--metric', 'accuracy.valid_4x']) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:3] == ['run', 'accuracy.valid_4x', 'best']
    assert out[2].split()[1] == f'{records[-1]["accuracy.valid_4x"]:.4f}'


@pytest.mark.parametrize('keys, message', [
    (['model=feedback', 'feedback.n_positions=20'],
     'feedback.n_positions=20 is too small for the evaluation at 4 × seq_len = 32 tokens: a step attends over up to '
     '31 memory vectors; set feedback.n_positions ≥ 31 (or feedback.memory_span ≤ 20)'),
    (['model=transformer', 'transformer.src_embed=fixed_pos', 'seq_len=1500'],
     'transformer.src_embed=fixed_pos has positions for 5,000 tokens, fewer than the evaluation at 4 × seq_len = '
     '6000 tokens; leave transformer.src_embed out (positions for every length the task shows), or use no_pos'),
    (['model=transformer', 'fast_weights.update_rule=sum'],
     'fast_weights.update_rule has no effect with model=transformer (only model=fast_weights reads it); leave it out, '
     'or use model=fast_weights'),
    (['model=fast_weights', 'feedback.memory_span=4', 'transformer.n_layers=3'],
     'feedback.memory_span, transformer.n_layers have no effect with model=fast_weights (only model=feedback, '
     'model=transformer read them, each its own); leave them out'),
    (['group=s4'], "bad value for group: expected one of 'parity', 's5', got 's4'"),
], ids=['feedback positions', 'transformer positions', 'another family', 'other families', 'group'])
def test_a_model_that_cannot_take_the_longest_sequences_is_one_error_line(tmp_path, cli_error, keys, message):
    runs = tmp_path / 'runs'
    assert cli_error(['train', 'state_tracking', *replaced(TINY, 'max_steps=2', f'runs_dir={runs}', *keys)]) == message
    assert not runs.exists()


def test_the_feedback_check_counts_the_memory_span():
    # a memory span of 8 needs 8 relative positions, whatever the length (32 tokens at 4 × seq_len)
    conf = make_configs('state_tracking', [*TINY, 'model=feedback', 'feedback.n_positions=8',
                                           'feedback.memory_span=8'])
    prepare(conf)
    assert (conf.task.longest, conf.feedback.n_positions, conf.feedback.memory_span) == (32, 8, 8)


def test_another_familys_values_that_code_gives_are_no_error():
    # a sweep's check of its points hands the parts one point built to the next (here model=transformer's to
    # model=fast_weights's), as overrides: only what a person gave is a mistake
    conf = make_configs('state_tracking', [*TINY, 'model=fast_weights'])
    apply_overrides(conf, {'transformer.n_layers': 3})
    prepare(conf)
    assert type(conf.model).__name__ == 'AutoregressiveModel' and conf.transformer.n_layers == 3
