"""Autoregressive language model: token embedding → transformer → logits, and incremental generation.

The module layout (`src_embed`, `transformer`, `generator`) matches the `AutoregressiveModel` of labml_nn's
feedback and fast-weights experiments, so their checkpoints load here and ours load there.

Incremental-state protocol: a core transformer may define

    forward_with_state(x, state=None) -> (y, new_state)

with x: [seq_len, batch_size, d_model] and an opaque `state` (None = nothing seen yet). Calling it on
consecutive chunks while carrying the state must give the outputs of one call on the whole sequence. `generate`
then costs one step per new token; a core without it is re-run on the whole prefix for every token (what labml_nn's
samplers do).

A core with `forward_with_state` may also offer

    step_function() -> f(x, state) -> (y, new_state)   (or None)

a function for one token x [1, batch_size, d_model] in eval mode without autograd, equal to `forward_with_state`
on that token, with the checks and set-up done once, when it is made. `generate` makes one per call and uses it
for every token after the prompt.
"""
from typing import Any, Callable, Optional, Tuple

import torch
from torch import nn


class AutoregressiveModel(nn.Module):
    """Next-token model over a vocabulary of `n_vocab` tokens.

    Args:
        n_vocab: vocabulary size.
        d_model: embedding width; must be the core transformer's width.
        transformer: core module mapping [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model].

    Shapes:
        x: LongTensor [seq_len, batch_size] → logits [seq_len, batch_size, n_vocab]
    """

    def __init__(self, n_vocab: int, d_model: int, transformer: nn.Module):
        super().__init__()
        self.src_embed = nn.Embedding(n_vocab, d_model)
        self.transformer = transformer
        self.generator = nn.Linear(d_model, n_vocab)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, None]:
        """Logits for every position; the second element is None (labml_nn's experiments expect a pair)."""
        return self.generator(self.transformer(self.src_embed(x))), None

    @property
    def supports_state(self) -> bool:
        """True when the core transformer implements `forward_with_state`."""
        return callable(getattr(self.transformer, 'forward_with_state', None))

    def forward_with_state(self, x: torch.Tensor, state: Any = None) -> Tuple[torch.Tensor, Any]:
        """Logits for a chunk x [seq_len, batch_size] continuing from `state`; returns (logits, new_state).

        Raises:
            TypeError: the core transformer has no `forward_with_state`.
        """
        if not self.supports_state:
            raise TypeError(f'{type(self.transformer).__name__} has no forward_with_state; '
                            f'use forward() on the whole sequence')
        y, state = self.transformer.forward_with_state(self.src_embed(x), state)
        return self.generator(y), state

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: Optional[int] = None, *, use_state: bool = True,
                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Sample `max_new_tokens` tokens after a prompt.

        Args:
            prompt_ids: LongTensor [prompt_len] or [prompt_len, batch_size], prompt_len ≥ 1.
            max_new_tokens: number of tokens to add (≥ 0).
            temperature: logits are divided by it; 0 means greedy (argmax).
            top_k: if given, sample only among the k most likely tokens.
            use_state: carry the core's state so each new token costs one step (when the core supports it);
                False re-runs the whole prefix per token, as labml_nn's samplers do.
            generator: optional torch.Generator for reproducible sampling.

        Returns:
            LongTensor with the prompt followed by the new tokens: [prompt_len + max_new_tokens(, batch_size)].

        Raises:
            ValueError: empty prompt, negative max_new_tokens or temperature, or top_k < 1.
        """
        squeeze = prompt_ids.dim() == 1
        ids = prompt_ids.unsqueeze(-1) if squeeze else prompt_ids
        if ids.dim() != 2 or ids.shape[0] == 0:
            raise ValueError(f'prompt_ids must be [prompt_len] or [prompt_len, batch_size] with prompt_len ≥ 1, '
                             f'got shape {tuple(prompt_ids.shape)}')
        if max_new_tokens < 0:
            raise ValueError(f'max_new_tokens must be ≥ 0, got {max_new_tokens}')
        if temperature < 0:
            raise ValueError(f'temperature must be ≥ 0, got {temperature}')
        if top_k is not None and top_k < 1:
            raise ValueError(f'top_k must be ≥ 1, got {top_k}')

        was_training = self.training
        self.eval()
        try:
            out = [ids]
            step = self._incremental_step() if use_state and self.supports_state else None
            state = None
            chunk = ids  # what the model has not seen yet
            for _ in range(max_new_tokens):
                if step is not None:
                    logits, state = step(chunk, state)
                else:
                    logits, _ = self(torch.cat(out, dim=0))
                next_id = _sample(logits[-1], temperature, top_k, generator)
                chunk = next_id.unsqueeze(0)
                out.append(chunk)
        finally:
            self.train(was_training)
        result = torch.cat(out, dim=0)
        return result.squeeze(-1) if squeeze else result

    def _incremental_step(self) -> Callable[[torch.Tensor, Any], Tuple[torch.Tensor, Any]]:
        """`forward_with_state` for generation: (ids [seq_len, batch_size], state) → (logits, state), one-token
        calls going through the core's `step_function()` when it offers one (made here, once)."""
        make = getattr(self.transformer, 'step_function', None)
        core_step = make() if callable(make) else None
        if core_step is None:
            return self.forward_with_state
        embed, generator = self.src_embed, self.generator

        def step(ids: torch.Tensor, state: Any) -> Tuple[torch.Tensor, Any]:
            if ids.shape[0] != 1:  # the prompt
                return self.forward_with_state(ids, state)
            y, state = core_step(embed(ids), state)
            return generator(y), state
        return step


def _sample(logits: torch.Tensor, temperature: float, top_k: Optional[int],
            generator: Optional[torch.Generator]) -> torch.Tensor:
    """Pick one token per row of logits [batch_size, n_vocab] → [batch_size]."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float('-inf'))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
