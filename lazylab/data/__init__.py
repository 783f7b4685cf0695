"""Character-level text data: the bundled Tiny Shakespeare, a character tokenizer, the standard 90/10 split, and
batch loaders that lay batches out sequence-first, `[seq_len, batch_size]`, as labml_nn's models expect.

    text = load_text()                       # the bundled Tiny Shakespeare (sha256 checked), or load_text(PATH)
    data = TextDataset(text)                 # vocabulary = sorted characters of train+valid; 90% / 10% split
    data.check_seq_len(128)                  # DataError when a split has fewer than seq_len + 1 characters
    loader = ShuffledLoader(data.train, seq_len=128, batch_size=16, seed=0)
    for x, y in loader.epoch(0):             # x, y: LongTensor [seq_len, batch_size]; y is x shifted by one
        ...

Every user mistake (missing file, bytes that are not UTF-8, a text too short for `seq_len`, a prompt character
outside the vocabulary) raises `DataError` (`lazylab.errors.DataError`, also importable from here), whose message
is one line naming the file and the culprit; the command line prints it as `lazylab: error: …` and exits with
code 2.

The loaders draw their randomness from a generator seeded by `(seed, epoch)` only, so batch `i` of epoch `e` is a
pure function of the configuration: resuming from a checkpoint needs nothing but `(epoch, batch index)`, and
several processes can each take a disjoint shard of the same permutation (`rank`, `world_size`).
"""
import hashlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Optional, Union

import torch

from lazylab import user_files
from lazylab.errors import DataError

__all__ = ['DataError', 'TINY_SHAKESPEARE', 'TINY_SHAKESPEARE_SHA256', 'bundled_text_path', 'load_text',
           'CharTokenizer', 'vocabulary_change', 'TextDataset', 'ShuffledLoader', 'SequentialLoader']

#: name that selects the bundled text (`text=tiny_shakespeare`)
TINY_SHAKESPEARE = 'tiny_shakespeare'
#: sha256 of the bundled copy (karpathy/char-rnn data/tinyshakespeare/input.txt, 1,115,394 bytes)
TINY_SHAKESPEARE_SHA256 = '86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed'
#: fraction of characters in the training split (labml_nn and nanoGPT use the first 90%)
TRAIN_FRACTION = 0.9


def bundled_text_path() -> Path:
    """Path of the Tiny Shakespeare copy shipped inside the package."""
    return Path(__file__).resolve().parent / 'tiny_shakespeare.txt'


def load_text(path: Union[str, Path, None] = None) -> str:
    """Read a UTF-8 text file; `None` or 'tiny_shakespeare' reads the bundled Tiny Shakespeare.

    Raises:
        DataError: the file is missing, is not a regular file (a directory, a FIFO or a device, which could block or
            never end: which, is said), or larger than `lazylab.user_files.TEXT` allows (256 MB, or
            LAZYLAB_MAX_TEXT_MB); its bytes are not valid UTF-8 (the message gives the byte offset of the first bad
            byte); the bundled copy does not match its sha256 (a damaged install).
    """
    bundled = path is None or str(path) == TINY_SHAKESPEARE
    file = bundled_text_path() if bundled else Path(path).expanduser()
    raw = user_files.read_bytes(file, 'text file', user_files.TEXT, DataError)
    if bundled:
        digest = hashlib.sha256(raw).hexdigest()
        if digest != TINY_SHAKESPEARE_SHA256:
            raise DataError(f'bundled {file.name} is damaged: sha256 {digest}, expected {TINY_SHAKESPEARE_SHA256}; '
                            f'reinstall lazylab')
    try:
        return raw.decode('utf-8')
    except UnicodeDecodeError as e:
        raise DataError(f'{file} is not UTF-8 text: invalid byte 0x{raw[e.start]:02x} at byte offset {e.start}') \
            from None


class CharTokenizer:
    """Maps each character to its index in a fixed vocabulary (`itos`, a string of distinct characters)."""

    def __init__(self, itos: str):
        if len(set(itos)) != len(itos):
            raise ValueError('vocabulary characters must be distinct')
        self.itos = itos
        self.stoi = {c: i for i, c in enumerate(itos)}

    @classmethod
    def from_text(cls, text: str) -> 'CharTokenizer':
        """Vocabulary = the sorted set of characters of `text`."""
        return cls(''.join(sorted(set(text))))

    @property
    def n_tokens(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> torch.Tensor:
        """str of length n → LongTensor [n].

        Raises:
            DataError: a character of `text` is not in the vocabulary (the message shows it and its position).
        """
        try:
            return torch.tensor([self.stoi[c] for c in text], dtype=torch.long)
        except KeyError as e:
            c = e.args[0]
            raise DataError(f'character {c!r} (position {text.index(c)}) is not in the vocabulary of '
                            f'{self.n_tokens} characters the model was trained on') from None

    def decode(self, ids: Union[torch.Tensor, list[int]]) -> str:
        """LongTensor [n] (or list of ints) → str of length n.

        Raises:
            DataError: an id outside 0 … n_tokens − 1 (the message shows it and its position).
        """
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        n = len(self.itos)
        for position, i in enumerate(ids):
            if not 0 <= i < n:
                raise DataError(f'token id {i} (position {position}) is outside the vocabulary of {n} characters '
                                f'(ids 0 … {n - 1})')
        return ''.join(self.itos[i] for i in ids)


def vocabulary_change(old: str, new: str) -> Optional[str]:
    """What differs between two vocabularies (strings of distinct characters, in id order), in a few words, or
    None when they are the same: the sizes, the characters added and removed (up to 10 of each shown), or, with
    the same characters, that their order (so every id's meaning) changed.

        vocabulary_change('abc', 'abd') == "3 → 3 characters; added 'd'; removed 'c'"
    """
    if old == new:
        return None
    added = [c for c in new if c not in set(old)]
    removed = [c for c in old if c not in set(new)]

    def shown(chars: list[str]) -> str:
        text = ', '.join(repr(c) for c in chars[:10])
        return text + (f' and {len(chars) - 10} more' if len(chars) > 10 else '')
    parts = [f'{len(old)} → {len(new)} characters']
    if added:
        parts.append(f'added {shown(added)}')
    if removed:
        parts.append(f'removed {shown(removed)}')
    if not added and not removed:
        moved = [c for i, c in enumerate(new) if old[i] != c]
        parts.append(f'the same characters in another order ({shown(moved)} moved)')
    return '; '.join(parts)


class TextDataset:
    """A text split into training (first 90% of characters) and validation (last 10%), both tokenized.

    Attributes:
        tokenizer: CharTokenizer over the characters of train + valid.
        train, valid: LongTensor [n_train], [n_valid] of token ids.
        name: where the text came from (for messages).
        sha256, size: the sha256 (hex) and the length in bytes of the text's UTF-8 encoding, which for a text read
            by `load_text` are those of the file (decoding and encoding valid UTF-8 gives back the same bytes); a
            checkpoint records them, so a resume can tell that the text changed even when its characters did not.
    """

    def __init__(self, text: str, name: str = 'text'):
        split = int(len(text) * TRAIN_FRACTION)
        self.name = name
        encoded = text.encode('utf-8', 'surrogatepass')  # a str made in code may hold lone surrogates
        self.sha256, self.size = hashlib.sha256(encoded).hexdigest(), len(encoded)
        self.tokenizer = CharTokenizer.from_text(text)
        self.train = self.tokenizer.encode(text[:split])
        self.valid = self.tokenizer.encode(text[split:])

    @classmethod
    def load(cls, path: Union[str, Path, None] = None) -> 'TextDataset':
        """`TextDataset(load_text(path))`; see `load_text` for the errors."""
        name = TINY_SHAKESPEARE if path is None or str(path) == TINY_SHAKESPEARE else str(path)
        return cls(load_text(path), name)

    @property
    def n_tokens(self) -> int:
        return self.tokenizer.n_tokens

    def check_seq_len(self, seq_len: int, processes: int = 1) -> None:
        """Raise DataError unless both splits hold at least one window of `seq_len` inputs plus its next token,
        and at least one such window per training process (each process trains on its own windows)."""
        for split, ids in (('training', self.train), ('validation', self.valid)):
            if len(ids) < seq_len + 1:
                raise DataError(f'the {split} split of {self.name} has {len(ids)} characters, fewer than '
                                f'seq_len + 1 = {seq_len + 1}; use a longer text or a smaller seq_len')
            windows = (len(ids) - 1) // seq_len
            if windows < processes:
                raise DataError(f'the {split} split of {self.name} has {windows} windows of seq_len {seq_len}, '
                                f'fewer than the {processes} processes; use a longer text, a smaller seq_len or '
                                f'fewer processes')


def _windows(data: torch.Tensor, starts: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut windows of seq_len + 1 tokens at `starts` [b] → (inputs, targets), each [seq_len, b]."""
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    w = data[idx].t()
    return w[:-1].contiguous(), w[1:].contiguous()


class ShuffledLoader:
    """Random windows, as labml_nn's shuffled loader: the text is cut into `(n - 1) // seq_len` slots of
    `seq_len` tokens, each epoch visits the slots in a random order, and each window starts at a random offset
    inside its slot (so the model does not always see the same boundaries). The last batch may be smaller.

    Batch `i` of epoch `e` depends only on `(seed, e, i)` (and the shard), never on global random state.

    Args:
        data: LongTensor [n] with n ≥ seq_len + 1.
        seq_len, batch_size: window length and windows per batch.
        seed: base seed; epoch e uses a generator seeded with seed * 1_000_003 + e.
        rank, world_size: this process takes every world_size-th slot of the permutation, starting at rank,
            after trimming it to a multiple of world_size (so all ranks have the same number of batches).

    Shapes:
        each batch: (inputs, targets), LongTensor [seq_len, batch_size]; targets[t] = inputs[t + 1] shifted.
    """

    def __init__(self, data: torch.Tensor, *, seq_len: int, batch_size: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1):
        if len(data) < seq_len + 1:
            raise ValueError(f'data has {len(data)} tokens, fewer than seq_len + 1 = {seq_len + 1}')
        self.data, self.seq_len, self.batch_size = data, seq_len, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.n_slots = (len(data) - 1) // seq_len
        self.n_local = max(1, self.n_slots // world_size)

    def __len__(self) -> int:
        """Batches per epoch."""
        return math.ceil(self.n_local / self.batch_size)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield the batches of `epoch`, beginning with batch index `start` (to resume mid-epoch)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(self.n_slots, generator=g)
        starts = perm * self.seq_len
        # the random offset keeps each window inside the text: start + seq_len + 1 ≤ n
        room = (len(self.data) - (starts + self.seq_len + 1)).clamp(max=self.seq_len - 1)
        starts = starts + (torch.rand(self.n_slots, generator=g) * (room + 1)).long()
        if self.world_size > 1:
            starts = starts[:self.n_local * self.world_size][self.rank::self.world_size]
        for b in range(start, len(self)):
            yield _windows(self.data, starts[b * self.batch_size:(b + 1) * self.batch_size], self.seq_len)


class SequentialLoader:
    """Non-overlapping windows in text order, for a deterministic validation loss.

    Window i covers tokens [i·seq_len, i·seq_len + seq_len] (inputs and the shifted targets). With `max_batches`,
    an evenly spaced subset of the windows is used, so a quick estimate still spans the whole split.

    Shapes:
        each batch: (inputs, targets), LongTensor [seq_len, b] with b ≤ batch_size.
    """

    def __init__(self, data: torch.Tensor, *, seq_len: int, batch_size: int, max_batches: Optional[int] = None):
        if len(data) < seq_len + 1:
            raise ValueError(f'data has {len(data)} tokens, fewer than seq_len + 1 = {seq_len + 1}')
        self.data, self.seq_len, self.batch_size = data, seq_len, batch_size
        n = (len(data) - 1) // seq_len
        slots = torch.arange(n)
        if max_batches is not None and max_batches * batch_size < n:
            slots = torch.linspace(0, n - 1, max_batches * batch_size).round().long()
        self.starts = slots * seq_len

    def __len__(self) -> int:
        return math.ceil(len(self.starts) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for b in range(len(self)):
            yield _windows(self.data, self.starts[b * self.batch_size:(b + 1) * self.batch_size], self.seq_len)
