"""Picking the next token from a model's logits: greedy, temperature and top-k sampling.

    next_id = sample_next(logits[-1], temperature=0.8, top_k=40, generator=g)   # [batch_size, n_vocab] → [batch_size]

With temperature T > 0 the next token is drawn from softmax(logits / T) (T < 1 sharpens the distribution, T > 1
flattens it); T = 0 is the limit, the argmax. Top-k sampling
(Fan, Lewis & Dauphin 2018, "Hierarchical Neural Story Generation") first keeps only the k largest logits.
"""
from collections.abc import Sequence
from typing import Optional

import torch

__all__ = ['sample_next', 'check_generate_arguments']


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One token per row of `logits`.

    Args:
        logits: [batch_size, n_vocab], unnormalised.
        temperature: divide the logits by it before the softmax; 0 picks the argmax (no randomness used).
        top_k: sample only among the k largest logits of each row (ties with the k-th are kept); None or
            k ≥ n_vocab: all of them.
        generator: the torch.Generator to draw from (on the logits' device), for reproducible samples.

    Shapes:
        logits: [batch_size, n_vocab] → LongTensor [batch_size]
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float('-inf'))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_generate_arguments(max_new_tokens: int, temperature: float, top_k: Optional[int],
                             names: Sequence[str] = ('max_new_tokens', 'temperature', 'top_k')) -> None:
    """The checks every generate path shares: max_new_tokens ≥ 0, temperature ≥ 0, top_k None or ≥ 1.

    Args:
        names: what to call the three arguments in the message (a command line names its flags, e.g.
            ('--tokens', '--temperature', '--top-k')).

    Raises:
        ValueError: '<name> must be ≥ <bound>, got <value>' for the first argument out of range.
    """
    tokens_name, temperature_name, top_k_name = names
    if max_new_tokens < 0:
        raise ValueError(f'{tokens_name} must be ≥ 0, got {max_new_tokens}')
    if temperature < 0:
        raise ValueError(f'{temperature_name} must be ≥ 0, got {temperature}')
    if top_k is not None and top_k < 1:
        raise ValueError(f'{top_k_name} must be ≥ 1, got {top_k}')
