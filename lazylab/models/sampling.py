"""Picking the next token from a model's logits: greedy, temperature and top-k sampling.

    next_id = sample_next(logits[-1], temperature=0.8, top_k=40, generator=g)   # [batch_size, n_vocab] → [batch_size]

With temperature T > 0 the next token is drawn from softmax(logits / T) (T < 1 sharpens the distribution, T > 1
flattens it); T = 0 is the limit, the argmax. Top-k sampling
(Fan, Lewis & Dauphin 2018, "Hierarchical Neural Story Generation") first keeps only the k largest logits.

A row of logits with a NaN, or with no finite value (all −inf: no token possible), has no next token: that is an
error (`NonFiniteLogitsError`), never a silent token 0.
"""
import math
from collections.abc import Sequence
from typing import Optional

import torch

__all__ = ['sample_next', 'check_generate_arguments', 'NonFiniteLogitsError', 'MAX_NEW_TOKENS']

#: the most tokens one generate call may add (a million characters; more is a mistake, not a request)
MAX_NEW_TOKENS = 1_000_000


class NonFiniteLogitsError(ValueError):
    """The logits of a row are NaN somewhere or −inf everywhere: the model's output gives no next token
    (typically weights that became NaN)."""


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One token per row of `logits`.

    Args:
        logits: [batch_size, n_vocab], unnormalised; +inf marks tokens that must be taken (several: drawn
            among them), −inf tokens that cannot.
        temperature: divide the logits by it before the softmax; 0 picks the argmax (no randomness used).
        top_k: sample only among the k largest logits of each row (ties with the k-th are kept); None or
            k ≥ n_vocab: all of them.
        generator: the torch.Generator to draw from (on the logits' device), for reproducible samples.

    Shapes:
        logits: [batch_size, n_vocab] → LongTensor [batch_size]

    Raises:
        NonFiniteLogitsError (a ValueError): a row has a NaN logit or no logit above −inf.
    """
    bad = logits.isnan().any(dim=-1) | (logits == float('-inf')).all(dim=-1)
    if bad.any():
        row = int(bad.nonzero()[0, 0])
        what = 'NaN' if logits[row].isnan().any() else 'all −inf'
        raise NonFiniteLogitsError(f'the logits of row {row} are {what}: no next token (are the weights finite?)')
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float('-inf'))
    # subtract each row's largest logit before dividing, and divide in float64 (a temperature below float32's
    # range, 1e-300, would be 0 there): a tiny temperature then gives −huge or −inf, never inf − inf = NaN
    top = logits.max(dim=-1, keepdim=True).values
    if torch.isinf(top).any():  # +inf logits: those tokens only, equally likely
        scaled = torch.where(logits == top, 0.0, float('-inf'))
    else:
        scaled = (logits - top).double() / temperature
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_generate_arguments(max_new_tokens: int, temperature: float, top_k: Optional[int],
                             names: Sequence[str] = ('max_new_tokens', 'temperature', 'top_k')) -> None:
    """The checks every generate path shares: 0 ≤ max_new_tokens ≤ MAX_NEW_TOKENS, temperature a finite number
    ≥ 0, top_k None or ≥ 1.

    Args:
        names: what to call the three arguments in the message (a command line names its flags, e.g.
            ('--tokens', '--temperature', '--top-k')).

    Raises:
        ValueError: '<name> must be …, got <value>' for the first argument out of range.
    """
    tokens_name, temperature_name, top_k_name = names
    if max_new_tokens < 0:
        raise ValueError(f'{tokens_name} must be ≥ 0, got {max_new_tokens}')
    if max_new_tokens > MAX_NEW_TOKENS:
        raise ValueError(f'{tokens_name} must be ≤ {MAX_NEW_TOKENS:,}, got {max_new_tokens}')
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f'{temperature_name} must be a finite number ≥ 0, got {temperature}')
    if top_k is not None and top_k < 1:
        raise ValueError(f'{top_k_name} must be ≥ 1, got {top_k}')
