"""The update rules by name, and the choice of kernel: what the fast-weight modules call to run a rule.

    'delta'          the delta rule (Schlag, Irie & Schmidhuber 2021; `delta_rule.py`)
    'sum'            the sum rule, linear attention as a fast-weight programmer (`sum_rule.py`; no β)
    'gated_delta'    the gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2025; `gated_delta_rule.py`)
    'delta_product'  DeltaProduct, n_h delta-rule writes per token, with or without the gate (Siems et al. 2025;
                     `delta_product.py`)

Each computed three ways (`KERNELS`): 'chunked' (chunkwise-parallel, fast for training), 'loop' (the token-by-token
reference) and 'step' (the recurrent step generation uses), with equal results up to rounding.
"""
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from lazylab.models.fast_weights.delta_product import delta_product_chunked, delta_product_loop, delta_product_step
from lazylab.models.fast_weights.delta_rule import delta_rule_chunked, delta_rule_loop, delta_rule_step
from lazylab.models.fast_weights.gated_delta_rule import (
    gated_delta_rule_chunked,
    gated_delta_rule_loop,
    gated_delta_rule_step,
)
from lazylab.models.fast_weights.sum_rule import sum_rule_chunked, sum_rule_loop, sum_rule_step

__all__ = ['KERNELS', 'UPDATE_RULES', 'GATED_RULES', 'DEFAULT_CHUNK_SIZE', 'SUM_RULE_CHUNK_SIZE', 'check_kernel',
           'check_update_rule', 'run_update_rule', 'run_delta_rule']

KERNELS = ('chunked', 'loop', 'step')
UPDATE_RULES = ('delta', 'sum', 'gated_delta', 'delta_product')
#: the rules with a decay gate (DeltaProduct's is optional)
GATED_RULES = ('gated_delta', 'delta_product')
DEFAULT_CHUNK_SIZE = 16  # fastest on CPU for d_dot = 64 (small batched matmuls); GPUs prefer 64
#: the sum rule's smallest chunk: it has no within-chunk inverse, and longer chunks mean fewer, larger products
#: (at seq_len 256 on the CPU, chunks of 32-64 run 1.6× faster than 16); results are the same for any chunk size
SUM_RULE_CHUNK_SIZE = 64


@dataclass(frozen=True)
class _Rule:
    step: Callable
    loop: Callable
    chunked: Callable
    takes_beta: bool
    takes_g: bool


_RULES = {
    'delta': _Rule(delta_rule_step, delta_rule_loop, delta_rule_chunked, True, False),
    'sum': _Rule(sum_rule_step, sum_rule_loop, sum_rule_chunked, False, False),
    'gated_delta': _Rule(gated_delta_rule_step, gated_delta_rule_loop, gated_delta_rule_chunked, True, True),
    'delta_product': _Rule(delta_product_step, delta_product_loop, delta_product_chunked, True, True),
}


def check_kernel(kernel: str, chunk_size: int):
    """Raises ValueError for an unknown kernel or chunk_size < 1."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}; got kernel={kernel!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got chunk_size={chunk_size}")


def check_update_rule(update_rule: str, rules: tuple[str, ...] = UPDATE_RULES, where: str = ''):
    """Raises ValueError unless update_rule is one of `rules` (`where` names the module that takes only those)."""
    if update_rule not in rules:
        raise ValueError(f"{where + ': ' if where else ''}update_rule must be one of {', '.join(rules)}; "
                         f"got update_rule={update_rule!r}")


def run_update_rule(update_rule: str, kernel: str, chunk_size: int, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, beta: Optional[torch.Tensor], state: Optional[torch.Tensor],
                    g: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `update_rule` over a sequence with the named kernel (shapes as in its kernel module: DeltaProduct's k, v
    and beta have the n_h axis after seq_len). The sum rule takes no beta and runs in chunks of at least
    SUM_RULE_CHUNK_SIZE; the gated delta rule needs g; DeltaProduct takes g or None; the others take no g.

    A single token always takes the recurrent step: it is the same computation, without the chunking set-up.

    Args:
        update_rule: one of `UPDATE_RULES`: 'delta', 'sum', 'gated_delta', 'delta_product'.
        kernel: one of `KERNELS`: 'chunked', 'loop', 'step' (equal results).
        chunk_size: tokens per chunk of the chunked kernel.
        q, k: [seq_len, batch, heads, d_dot] (DeltaProduct's k: [seq_len, n_h, batch, heads, d_dot]).
        v: [seq_len, batch, heads, d_v] (DeltaProduct's: with the n_h axis, as k).
        beta: the write strengths, [seq_len, batch, heads] (DeltaProduct's with the n_h axis); None for 'sum'.
        state: the fast weights before the first token, [batch, heads, d_v, d_dot]; None means zeros.
        g: the log decays (≤ 0) of the gated rules, [seq_len, batch, heads]; None otherwise.

    Returns:
        y: [seq_len, batch, heads, d_v] and the final state.
    """
    rule = _RULES[update_rule]
    args = ((beta,) if rule.takes_beta else ()) + ((g,) if rule.takes_g else ())
    if update_rule == 'sum':
        chunk_size = max(chunk_size, SUM_RULE_CHUNK_SIZE)
    if kernel == 'loop' or q.shape[0] == 0:
        return rule.loop(q, k, v, *args, state)
    if q.shape[0] == 1 or kernel == 'step':
        ys = []
        for i in range(q.shape[0]):
            y, state = rule.step(q[i], k[i], v[i], *(None if a is None else a[i] for a in args), state)
            ys.append(y)
        return torch.stack(ys), state
    return rule.chunked(q, k, v, *args, state, chunk_size=chunk_size)


def run_delta_rule(kernel: str, chunk_size: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   beta: torch.Tensor, state: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`run_update_rule('delta', …)` (the name before the sum rule came)."""
    return run_update_rule('delta', kernel, chunk_size, q, k, v, beta, state)
