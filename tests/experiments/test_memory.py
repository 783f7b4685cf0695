"""Absurd sizes are refused from the sizes alone, before anything is allocated or written: one line naming the keys
of the biggest part, exit code 2 (lazylab.experiments.memory)."""
import pytest
import torch

from lazylab.errors import UsageError
from lazylab.experiments import memory
from lazylab.experiments.memory import Need, check_memory, size_text
from lazylab.testing import replaced

TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'device=cpu', 'threads=1',
        'max_steps=1']


# the figures worked by hand from each experiment's memory_needs (float32: 4 bytes; ids: 8)
CASES = [
    # retrieval defaults (S = 20 keys and pairs, batch 32, hidden 64, embedding ⌊1.1 · 40⌋ = 44): DPFP's d_dot =
    # 2 · 64 · 10⁶; features 4 · 32 · (20 + 20) · d_dot = 655.36 GB, fast weights 4 · 32 · 20 · d_dot = 327.68 GB,
    # parameters 8 · (20 · 44 + (20 + 88) · 64), one-hot values 4 · 20², 5 evaluation batches 8 · 5 · 32 · 100,
    # predictions 4 · 20 · 32 · 20: in all 983.04 GB and 243,136 bytes
    (['train', 'retrieval', 'nu=1000000'],
     'the run needs at least 983.0 GB of memory, more than the 1.0 GB available (cpu): fast-weight features φ(k), '
     'φ(q) alone take 655.4 GB (nu=1000000, hidden_size=64, n_keys=20, batch_size=32); make one of them smaller'),
    # parameters 8 · (65 · 10⁷ + 2 · 10¹⁴ + 2 · 32 · 10⁷) = 1.6 PB
    (['train', 'transformer', *replaced(TINY, 'd_model=10000000')],
     'the run needs at least 1.6 PB of memory, more than the 1.0 GB available (cpu): parameters and their gradients '
     'alone take 1.6 PB (d_model=10000000, d_ff=32, n_layers=1); make one of them smaller'),
    # the same key of the sub-config: named by its path; features 4 · 2 · 4 · 16 · 2 · (2 · 8 · 10⁶) = 16.4 GB,
    # state 4 · 4 · 16 · 16 · 10⁶ = 4.1 GB
    (['train', 'fast_weights', *TINY, 'fast_weights.nu=1000000'],
     'the run needs at least 20.5 GB of memory, more than the 1.0 GB available (cpu): fast-weight features φ(k), '
     'φ(q) alone take 16.4 GB (fast_weights.nu=1000000, d_model=16, batch_size=4, seq_len=16, n_layers=1); make one '
     'of them smaller'),
    # activations 4 · 10⁴ · 10³ · (16 + 32 + 65) = 4.52 GB, the biggest part
    (['train', 'feedback', *replaced(TINY, 'batch_size=10000', 'seq_len=1000', 'feedback.n_positions=1000')],
     'the run needs at least 4.5 GB of memory, more than the 1.0 GB available (cpu): activations kept for the '
     'backward pass alone take 4.5 GB (batch_size=10000, seq_len=1000, d_model=16, d_ff=32, n_layers=1); make one '
     'of them smaller'),
]


@pytest.mark.parametrize('argv, message', CASES, ids=['retrieval nu', 'transformer d_model', 'fast_weights.nu',
                                                      'feedback batch'])
def test_a_run_too_big_for_the_memory_is_refused_naming_its_keys(tmp_path, cli_error, monkeypatch, argv, message):
    monkeypatch.setattr(memory, 'available_bytes', lambda device: 10**9)
    assert cli_error([*argv, f'runs_dir={tmp_path / "runs"}']) == message
    assert not (tmp_path / 'runs').exists()


def test_this_machines_memory_refuses_an_absurd_size(tmp_path, cli_error):
    import re
    text = cli_error(['train', 'retrieval', 'n_keys=1000000', 'device=cpu', f'runs_dir={tmp_path / "runs"}'])
    assert re.fullmatch(r'the run needs at least 149\.7 TB of memory, more than the [\d.]+ [kMGT]?B available '
                        r'\(cpu\): the predictions for every key of a batch alone take 128\.0 TB \(n_keys=1000000, '
                        r'batch_size=32\); make one of them smaller', text), text
    assert not (tmp_path / 'runs').exists()


def test_check_memory_compares_the_sum_and_names_the_biggest_part():
    needs = [Need('a', 600, (('x', 1),)), Need('b', 500, (('y', 2), ('z', 3)))]
    check_memory(needs, 'cpu', available=1100)  # fits exactly
    with pytest.raises(UsageError) as e:
        check_memory(needs, 'cpu', available=1099)
    assert str(e.value) == 'the run needs at least 1.1 kB of memory, more than the 1.1 kB available (cpu): a alone ' \
                           'take 600 B (x=1); make one of them smaller'


def test_size_text_in_decimal_units():
    assert [size_text(n) for n in (0, 999, 1000, 1_234_567, 10**12, 10**15, 4 * 10**18)] == \
        ['0 B', '999 B', '1.0 kB', '1.2 MB', '1.0 TB', '1.0 PB', '4.0e+03 PB']


def test_the_available_memory_is_what_the_system_says(monkeypatch):
    monkeypatch.setattr(memory, '_meminfo_available', lambda: 8 * 10**9)
    monkeypatch.setattr(memory, '_cgroup_available', lambda: 3 * 10**9)
    assert memory.available_bytes(torch.device('cpu')) == 3 * 10**9  # the cgroup's limit is what counts
    monkeypatch.setattr(memory, '_cgroup_available', lambda: None)
    assert memory.available_bytes(torch.device('cpu')) == 8 * 10**9
