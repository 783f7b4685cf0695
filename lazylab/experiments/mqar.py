"""Multi-query associative recall (MQAR): the recall task of Zoology (Arora et al. 2023, "Zoology: Measuring and
Improving Recall in Efficient Language Models", section 3 and appendix E), on the CPU in minutes.

    lazylab train mqar                                        ≡  python -m lazylab.experiments.mqar …
    lazylab train mqar model=fast_weights fast_weights.update_rule=delta
    lazylab train mqar n_pairs=16 seq_len=128 vocab_size=256

A sequence of `seq_len` tokens is `n_pairs` key-value pairs k₁ v₁ k₂ v₂ … (keys distinct, drawn from 1 … V/2 − 1;
values distinct, drawn from V/2 … V − 1; V = `vocab_size`), then the query region: `n_queries` of those keys again,
each once, in the region's even slots. Zoology's power law picks the slots: slot i = 1, 2, … (offset 2(i − 1) in the
region) with probability ∝ iᵅ⁻¹, α = 0.01, so early slots are likelier. Every other position of the region is a
token drawn uniformly from the whole vocabulary. At each query the model must output the value paired with that key
earlier: only the query positions are scored (cross-entropy over the vocabulary, and accuracy), as in Zoology's
`multiquery_ar` data, whose label sits at the query's position.

Zoology's sizes (vocab_size 8192, seq_len 64 … 512, n_pairs 4 … 64, every key asked) are settings; the defaults
are small enough for a 2-layer model to learn in a few CPU minutes. Impossible combinations are one error line
before a run starts: more pairs than keys (V/2 − 1, which is fewer than the values), more queries than pairs, or
pairs and queries that do not fit in seq_len (2·n_pairs + 2·n_queries ≤ seq_len). Zoology's generator also asks for
an even seq_len and vocab_size > seq_len; the sequences do not need either, so neither is required here. Training
batches are fresh at every step, drawn from (seed, epoch, batch index); the validation set is fixed by the seed. The
model is any of lazylab's three families (`model=transformer|feedback|fast_weights`, see
`lazylab.experiments.synthetic`).
"""
import sys
from typing import Annotated

import torch
from annotated_types import Interval

from lazylab.configs import option
from lazylab.configs.types import PositiveInt
from lazylab.errors import UsageError, plural
from lazylab.experiments import Batch, Task, main
from lazylab.experiments.memory import FLOAT, Need
from lazylab.experiments.synthetic import SyntheticConfigs, SyntheticTask, synthetic_needs, task_arguments

#: α of the power law of the gaps before the queries (Zoology's `power_a`)
POWER_A = 0.01
#: the vocabulary's bound (Zoology's largest is 8192); the key and value draws take batch × vocab_size numbers
VocabSize = Annotated[int, Interval(ge=4, le=2 ** 20)]


def check_sizes(vocab_size: int, n_pairs: int, n_queries: int, seq_len: int) -> None:
    """That MQAR sequences of these sizes exist (see the module docstring).

    Raises:
        UsageError: naming the keys and the bound they break, with what to change.
    """
    keys = vocab_size // 2 - 1  # (fewer than the values, V − V/2: the keys bound n_pairs)
    if n_pairs > keys:
        raise UsageError(f'n_pairs={n_pairs} is too many for vocab_size={vocab_size}: the keys are the tokens 1 … '
                         f'{keys} ({plural(keys, "key")}, each once per sequence); set n_pairs ≤ {keys}, or '
                         f'vocab_size ≥ {2 * (n_pairs + 1)}')
    if n_queries > n_pairs:
        raise UsageError(f'n_queries={n_queries} is more than n_pairs={n_pairs}: each key is asked at most once; set '
                         f'n_queries ≤ {n_pairs}, or leave it out (every key is asked)')
    if 2 * n_pairs + 2 * n_queries > seq_len:
        raise UsageError(f'n_pairs={n_pairs} and n_queries={n_queries} do not fit in seq_len={seq_len}: the pairs '
                         f'take 2·n_pairs tokens, and the queries one of every 2 tokens after them; set seq_len ≥ '
                         f'{2 * n_pairs + 2 * n_queries}, or fewer pairs or queries')


def mqar_batch(vocab_size: int, n_pairs: int, n_queries: int, seq_len: int, batch_size: int,
               generator: torch.Generator) -> Batch:
    """`batch_size` MQAR sequences (see the module docstring) and their labels: the draws, put in place by
    `mqar_sequences`.

    Args:
        vocab_size, n_pairs, n_queries, seq_len: the sizes (checked by `check_sizes`).
        batch_size: sequences.
        generator: every random draw comes from it.

    Returns:
        x, y: LongTensors [seq_len, batch_size], as `mqar_sequences` returns them.
    """
    half, slots = vocab_size // 2, (seq_len - 2 * n_pairs) // 2
    keys = torch.rand(batch_size, half - 1, generator=generator).argsort(-1)[:, :n_pairs] + 1
    values = torch.rand(batch_size, vocab_size - half, generator=generator).argsort(-1)[:, :n_pairs] + half
    weights = POWER_A * torch.arange(1, slots + 1, dtype=torch.float64) ** (POWER_A - 1)
    slot = torch.multinomial(weights.expand(batch_size, slots), n_queries, replacement=False, generator=generator)
    filler = torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator)
    return mqar_sequences(keys, values, slot, filler)


def mqar_sequences(keys: torch.Tensor, values: torch.Tensor, slot: torch.Tensor, filler: torch.Tensor) -> Batch:
    """MQAR sequences from their parts: the pairs (kᵢ, vᵢ) at positions 2i, 2i + 1, then key i asked in slot[i] of
    the query region (position 2·n_pairs + 2·slot[i]) for i < n_queries, `filler` everywhere else.

    Shapes:
        keys, values: LongTensor [batch_size, n_pairs]; slot: LongTensor [batch_size, n_queries] (distinct per
        sequence); filler: LongTensor [batch_size, seq_len] →
        x: LongTensor [seq_len, batch_size], the tokens; y: LongTensor [seq_len, batch_size], values[i] where key i
        is asked, −1 elsewhere
    """
    context, n_queries = 2 * keys.shape[1], slot.shape[1]
    x = filler.clone()
    x[:, 0:context:2], x[:, 1:context:2] = keys, values
    where = context + 2 * slot
    x.scatter_(1, where, keys[:, :n_queries])
    y = torch.full_like(x, -1).scatter_(1, where, values[:, :n_queries])
    return x.T.contiguous(), y.T.contiguous()


class MQARTask(SyntheticTask):
    """MQAR (see the module docstring) for the trainer: fresh batches, a fixed validation set, the loss and accuracy
    at the queries.

    Args:
        vocab_size, n_pairs, n_queries: the data's sizes (seq_len and the rest: `SyntheticTask`'s).
        kwargs: `SyntheticTask`'s arguments but n_tokens and lengths.

    Raises:
        UsageError: sizes no sequence has (`check_sizes`).
    """
    loss_unit, loss_label = 'nats/query', 'cross-entropy at the queries (nats/query)'

    def __init__(self, *, vocab_size: int, n_pairs: int, n_queries: int, **kwargs):
        check_sizes(vocab_size, n_pairs, n_queries, kwargs['seq_len'])
        self.vocab_size, self.n_pairs, self.n_queries = vocab_size, n_pairs, n_queries
        super().__init__(n_tokens=vocab_size, lengths=(1,), **kwargs)

    def draw(self, seq_len: int, batch_size: int, generator: torch.Generator) -> Batch:
        return mqar_batch(self.vocab_size, self.n_pairs, self.n_queries, seq_len, batch_size, generator)


class Configs(SyntheticConfigs):
    """Multi-query associative recall (see the module docstring). `lazylab options mqar` lists every key."""
    vocab_size: VocabSize = 64           # V: keys 1 … V/2 − 1, values V/2 … V − 1 (Zoology: 8192)
    n_pairs: PositiveInt = 4             # key-value pairs at the start of each sequence
    n_queries: PositiveInt = 'every_key'  # keys asked after them (default: every key, as Zoology)
    seq_len: PositiveInt = 32            # tokens per sequence: 2·n_pairs of pairs, then the query region
    task: Task = 'mqar'                  # the data, the loss and the evaluation


@option(Configs.n_queries, 'every_key')
def _n_queries(c: Configs):
    return c.n_pairs


@option(Configs.task, 'mqar')
def _task(c: Configs):
    check_sizes(c.vocab_size, c.n_pairs, c.n_queries, c.seq_len)
    return MQARTask(vocab_size=c.vocab_size, n_pairs=c.n_pairs, n_queries=c.n_queries, **task_arguments(c))


def memory_needs(c: Configs) -> list[Need]:
    """The least memory a run takes (`lazylab.experiments.memory`): the model's and the evaluation batches'
    (`synthetic.synthetic_needs`), and the draws of distinct keys and values (batch_size × vocab_size numbers).

    Raises:
        UsageError: sizes no sequence has (`check_sizes`), before any size is computed from them.
    """
    check_sizes(c.vocab_size, c.n_pairs, c.n_queries, c.seq_len)
    return synthetic_needs(c, c.vocab_size, (1,)) + [
        Need('the draws of distinct keys and values', 3 * FLOAT * c.batch_size * c.vocab_size,
             (('batch_size', c.batch_size), ('vocab_size', c.vocab_size)))]


if __name__ == '__main__':
    sys.exit(main(Configs))
