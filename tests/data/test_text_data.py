"""lazylab.data: bundled text, tokenizer, split, loaders and the one-line DataErrors."""
import hashlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lazylab.data import (
    TINY_SHAKESPEARE_SHA256,
    CharTokenizer,
    DataError,
    SequentialLoader,
    ShuffledLoader,
    TextDataset,
    bundled_text_path,
    load_text,
)


def test_bundled_text_is_tiny_shakespeare_with_standard_split_and_65_characters():
    raw = bundled_text_path().read_bytes()
    assert hashlib.sha256(raw).hexdigest() == TINY_SHAKESPEARE_SHA256
    data = TextDataset.load()
    assert data.n_tokens == 65
    assert data.tokenizer.itos == ''.join(sorted(set(raw.decode())))
    # first 90% of characters train, the rest valid (int(1115394 * 0.9) = 1003854)
    assert len(data.train) == 1003854 and len(data.valid) == 1115394 - 1003854
    assert data.tokenizer.decode(data.train[:14]) == 'First Citizen:'
    assert data.tokenizer.decode(data.valid[-10:]) == raw.decode()[-10:]


def test_tokenizer_round_trip_and_unknown_character_error():
    tok = CharTokenizer.from_text('hello world')
    assert tok.itos == ' dehlorw'
    assert tok.encode('hold').tolist() == [3, 5, 4, 1]  # ' '0 d1 e2 h3 l4 o5 r6 w7
    assert tok.decode(tok.encode('low hello')) == 'low hello'
    with pytest.raises(DataError, match=r"character 'z' \(position 2\) is not in the vocabulary"):
        tok.encode('hoz')


def test_missing_file_and_directory_errors(tmp_path):
    with pytest.raises(DataError, match='text file not found: .*nope.txt'):
        load_text(tmp_path / 'nope.txt')
    with pytest.raises(DataError, match='is a directory'):
        load_text(tmp_path)


def test_non_utf8_error_reports_byte_offset(tmp_path):
    f = tmp_path / 'bad.txt'
    f.write_bytes('héllo'.encode() + b'\xff rest')  # 'héllo' is 6 bytes, so the bad byte is at offset 6
    with pytest.raises(DataError, match=r'bad.txt is not UTF-8 text: invalid byte 0xff at byte offset 6$'):
        load_text(f)


def test_damaged_bundled_copy_is_reported(tmp_path, monkeypatch):
    import lazylab.data as data
    fake = tmp_path / 'tiny_shakespeare.txt'
    fake.write_text('not shakespeare')
    monkeypatch.setattr(data, 'bundled_text_path', lambda: fake)
    with pytest.raises(DataError, match='damaged'):
        data.load_text()


def test_short_text_error_names_split_and_seq_len():
    data = TextDataset('abcdefghij' * 10, name='short.txt')  # 90 train, 10 valid characters
    data.check_seq_len(9)
    with pytest.raises(DataError, match=r'validation split of short.txt has 10 characters.*seq_len \+ 1 = 11'):
        data.check_seq_len(10)
    with pytest.raises(DataError, match=r'training split of short.txt has 90 characters.*seq_len \+ 1 = 91'):
        data.check_seq_len(90)


def test_too_few_windows_for_the_processes_is_a_data_error():
    # validation: 10 characters = 9 inputs + next; seq_len 4 → (10 − 1) // 4 = 2 windows, one per process for 2
    data = TextDataset('abcdefghij' * 10, name='short.txt')
    data.check_seq_len(4, processes=2)
    with pytest.raises(DataError, match=r'validation split of short.txt has 2 windows of seq_len 4, fewer than '
                                        r'the 3 processes'):
        data.check_seq_len(4, processes=3)
    with pytest.raises(DataError, match=r'training split of short.txt has 11 windows of seq_len 8, fewer than '
                                        r'the 12 processes'):
        data.check_seq_len(8, processes=12)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 300), seq_len=st.integers(1, 40), batch_size=st.integers(1, 9), seed=st.integers(0, 5),
       epoch=st.integers(0, 3))
def test_shuffled_loader_windows_are_shifted_text_inside_bounds(n, seq_len, batch_size, seed, epoch):
    if n < seq_len + 1:
        return
    data = torch.arange(n) * 7 % 1000  # distinct values for n ≤ 1000 identify positions
    loader = ShuffledLoader(data, seq_len=seq_len, batch_size=batch_size, seed=seed)
    batches = list(loader.epoch(epoch))
    assert len(batches) == len(loader) == -(-((n - 1) // seq_len) // batch_size)
    starts = []
    for x, y in batches:
        assert x.shape == y.shape and x.shape[0] == seq_len and 1 <= x.shape[1] <= batch_size
        assert torch.equal(x[1:], y[:-1])
        for b in range(x.shape[1]):
            s = int((x[0, b] * 143) % 1000)  # 7 * 143 = 1001 ≡ 1 (mod 1000) inverts the encoding
            assert torch.equal(x[:, b], data[s:s + seq_len]) and torch.equal(y[:, b], data[s + 1:s + seq_len + 1])
            starts.append(s)
    # one window per slot, each inside its own slot
    assert sorted(s // seq_len for s in starts) == list(range((n - 1) // seq_len))


def test_shuffled_loader_is_a_function_of_seed_epoch_and_start():
    data = torch.randint(0, 50, (5000,), generator=torch.Generator().manual_seed(1))
    a = ShuffledLoader(data, seq_len=16, batch_size=8, seed=3)
    torch.manual_seed(123)  # global random state must not matter
    first = list(a.epoch(2))
    torch.manual_seed(456)
    again = list(ShuffledLoader(data, seq_len=16, batch_size=8, seed=3).epoch(2))
    resumed = list(a.epoch(2, start=5))
    assert all(torch.equal(p[0], q[0]) for p, q in zip(first, again))
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(first[5:], resumed))
    assert len(resumed) == len(first) - 5
    other_epoch = next(a.epoch(3))[0]
    assert not torch.equal(first[0][0], other_epoch)


def test_shuffled_loader_shards_are_disjoint_and_equal_sized():
    data = torch.arange(1000)
    shards = [ShuffledLoader(data, seq_len=10, batch_size=4, seed=0, rank=r, world_size=3) for r in range(3)]
    assert len({len(s) for s in shards}) == 1
    firsts = [set(int(v) for x, _ in s.epoch(0) for v in x[0]) for s in shards]
    assert sum(len(f) for f in firsts) == 99 and len(set.union(*firsts)) == 99  # 99 slots, 33 per rank, disjoint


def test_sequential_loader_covers_windows_in_order_and_subsets_evenly():
    data = torch.arange(101)
    loader = SequentialLoader(data, seq_len=10, batch_size=3)
    batches = list(loader)
    assert len(batches) == len(loader) == 4
    xs = torch.cat([x for x, _ in batches], dim=1)
    assert xs[0].tolist() == list(range(0, 100, 10))
    assert torch.equal(torch.cat([y for _, y in batches], dim=1), xs + 1)
    sub = SequentialLoader(data, seq_len=10, batch_size=2, max_batches=2)
    assert torch.cat([x for x, _ in sub], dim=1)[0].tolist() == [0, 30, 60, 90]


def test_a_dataset_knows_the_sha256_and_size_of_its_texts_bytes(tmp_path):
    # FIPS 180-2's example: sha256('abc')
    abc = TextDataset('abc')
    assert (abc.sha256, abc.size) == ('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad', 3)
    path = tmp_path / 't.txt'
    path.write_text('naïve café\n' * 3, encoding='utf-8')
    data, raw = TextDataset.load(path), path.read_bytes()
    assert (data.sha256, data.size) == (hashlib.sha256(raw).hexdigest(), 39)  # 11 characters, ï and é 2 bytes each
