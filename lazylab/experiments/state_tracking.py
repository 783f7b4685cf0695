"""State tracking: parity and the word problem of S5, trained on short sequences and evaluated on longer ones
(Merrill, Petty & Sabharwal 2024, "The Illusion of State in State-Space Models"; Grazzi et al. 2025, "Unlocking
State-Tracking in Linear RNNs Through Negative Eigenvalues"), on the CPU in minutes.

    lazylab train state_tracking                              ≡  python -m lazylab.experiments.state_tracking …
    lazylab train state_tracking preset=deltanet_negative     (DeltaNet with β ∈ (0, 2): eigenvalues down to −1)
    lazylab train state_tracking group=s5 n_layers=4

Each token is an element of a group G, drawn uniformly; the label at position t is the product of the prefix,
s_t = g_t ∘ s_{t−1} (s₀ the identity): a model that tracks the state reads one token and updates it, whatever the
length. `group=parity`: G = {0, 1} under addition mod 2, so the label is the parity of the bits up to and including
position t. `group=s5`: G = the 120 permutations of five elements, token i the i-th of
`itertools.permutations(range(5))` (lexicographic order: token 0 is the identity), composed as functions,
(p ∘ q)(i) = p(q(i)), so g₁ acts first: as tuples s_t[i] = g_t[s_{t−1}[i]]; the label is the index of s_t. Every
position is scored (cross-entropy over the group's elements, and accuracy).

Training batches are fresh at every step, of `seq_len` tokens, drawn from (seed, epoch, batch index); the
validation sets are fixed by the seed, at seq_len (metrics `loss.valid`, `accuracy.valid`), 2 × seq_len
(`loss.valid_2x`, `accuracy.valid_2x`) and 4 × seq_len (`loss.valid_4x`, `accuracy.valid_4x`), each accuracy over
every position of its sequences: for parity, a model right up to seq_len that guesses beyond it scores 0.75 at 2×
and 0.625 at 4×. The model is any of lazylab's three families (`model=transformer|feedback|fast_weights`, see
`lazylab.experiments.synthetic`), built to take the 4 × seq_len sequences of the evaluation (the transformer's
learned positions beyond seq_len are never trained: what length generalisation it shows is its own).
"""
import functools
import itertools
import sys
from typing import Literal

import torch

from lazylab.configs import option
from lazylab.configs.types import PositiveInt
from lazylab.experiments import Batch, Task, main
from lazylab.experiments.memory import Need
from lazylab.experiments.synthetic import SyntheticConfigs, SyntheticTask, synthetic_needs, task_arguments

#: the evaluation lengths, as multiples of seq_len
LENGTHS = (1, 2, 4)
#: the groups `group` names
GROUPS = ('parity', 's5')


@functools.cache
def elements(group: str) -> tuple[tuple[int, ...], ...]:
    """The group's elements in token order: parity's 0 and 1 as (0,) and (1,); S5's 120 permutations of
    (0, 1, 2, 3, 4) as tuples p with p[i] the image of i, in lexicographic order (the identity first).

    Raises:
        ValueError: an unknown group.
    """
    if group == 'parity':
        return (0,), (1,)
    if group == 's5':
        return tuple(itertools.permutations(range(5)))
    raise ValueError(f'unknown group {group!r}; groups: {", ".join(GROUPS)}')


@functools.cache
def cayley_table(group: str) -> torch.Tensor:
    """table[a, b] = the token of a ∘ b: (a + b) mod 2 for parity, the permutation i ↦ a[b[i]] for S5.

    Returns:
        LongTensor [n, n], n = 2 or 120.

    Raises:
        ValueError: an unknown group.
    """
    items = elements(group)
    if group == 'parity':
        return torch.tensor([[(a[0] + b[0]) % 2 for b in items] for a in items])
    index = {p: i for i, p in enumerate(items)}
    return torch.tensor([[index[tuple(a[b[i]] for i in range(5))] for b in items] for a in items])


def prefix_products(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """s_t = x_t ∘ s_{t−1} at every position (s₀ = the identity, token 0), by the Cayley table.

    Shapes:
        x: LongTensor [seq_len, batch_size] of tokens → LongTensor [seq_len, batch_size] of tokens
    """
    state = torch.zeros(x.shape[1:], dtype=torch.long)
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        state = table[x[t], state]
        out[t] = state
    return out


def state_tracking_batch(group: str, seq_len: int, batch_size: int, generator: torch.Generator) -> Batch:
    """`batch_size` sequences of `seq_len` group elements drawn uniformly, and their prefix products.

    Returns:
        x, y: LongTensors [seq_len, batch_size]: the tokens, and the token of the product of each prefix.

    Raises:
        ValueError: an unknown group.
    """
    table = cayley_table(group)
    x = torch.randint(0, table.shape[0], (seq_len, batch_size), generator=generator)
    return x, prefix_products(x, table)


class StateTrackingTask(SyntheticTask):
    """State tracking (see the module docstring) for the trainer: fresh batches, validation at 1×, 2× and 4× the
    training length, every position scored. A prefix of a sequence, with its labels, is a sequence: the task takes
    the trainer's sequence-length warm-up (`seq_len_start`).

    Args:
        group: 'parity' or 's5'.
        kwargs: `SyntheticTask`'s arguments but n_tokens and lengths.
    """
    shorter_sequences = True
    loss_unit, loss_label = 'nats/token', 'cross-entropy of the state (nats/token)'

    def __init__(self, *, group: str, **kwargs):
        self.group = group
        super().__init__(n_tokens=len(elements(group)), lengths=LENGTHS, **kwargs)

    def draw(self, seq_len: int, batch_size: int, generator: torch.Generator) -> Batch:
        return state_tracking_batch(self.group, seq_len, batch_size, generator)


class Configs(SyntheticConfigs):
    """State tracking (see the module docstring). `lazylab options state_tracking` lists every key."""
    group: Literal['parity', 's5'] = 'parity'  # parity (bits), or s5 (the 120 permutations of five elements)
    seq_len: PositiveInt = 16            # training length; validation also at 2× and 4× it
    task: Task = 'state_tracking'        # the data, the loss and the evaluation


@option(Configs.task, 'state_tracking')
def _task(c: Configs):
    return StateTrackingTask(group=c.group, **task_arguments(c))


def memory_needs(c: Configs) -> list[Need]:
    """The least memory a run takes (`lazylab.experiments.memory`): the model's and the evaluation batches' at every
    length (`synthetic.synthetic_needs`)."""
    return synthetic_needs(c, len(elements(c.group)), LENGTHS)


#: named settings applied before the user's: DeltaNet (the delta rule on L2-normalised keys) with β ∈ (0, 1), and
#: with β ∈ (0, 2), whose eigenvalues reach −1: Grazzi et al.'s pair, the second of which can track parity
PRESETS = {
    'deltanet': {'model': 'fast_weights', 'fast_weights.phi': 'l2'},
    'deltanet_negative': {'model': 'fast_weights', 'fast_weights.phi': 'l2', 'fast_weights.negative_eigenvalues': True},
}


if __name__ == '__main__':
    sys.exit(main(Configs))
