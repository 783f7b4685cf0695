"""Autoregressive language models: token embedding → transformer → logits, and generation.

- `LanguageModel`: what they share, `generate` (prompt → prompt + sampled tokens, see `lazylab.models.sampling`).
- `AutoregressiveModel`: the layout (`src_embed`, `transformer`, `generator`) of the `AutoregressiveModel` of
  labml_nn's feedback and fast-weights experiments, so their checkpoints load here and ours load there.
- `AutoregressiveTransformer` (+ `TokenAndPositionEmbeddings`): a causal softmax transformer laid out as labml_nn's
  basic `AutoregressiveTransformer` (`src_embed`, `encoder`, `generator`).

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
from typing import Any, Callable, Optional

import torch
from torch import nn

from lazylab.models.mha import subsequent_mask
from lazylab.models.sampling import check_generate_arguments, sample_next
from lazylab.models.transformer import get_positional_encoding

#: (token ids [seq_len, batch_size], state) → (logits [seq_len, batch_size, n_vocab], new state)
IncrementalStep = Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]]


class LanguageModel(nn.Module):
    """Base of the next-token models here: `forward(x) → (logits, None)` is the subclass's; `generate` is shared.

    A subclass may offer an incremental step (`incremental_step()`, the module docstring's protocol), so that
    generation costs one step per new token; without one, `generate` re-runs the model on the prefix for every
    token, on at most the last `max_context` tokens (None: all of them).
    """
    max_context: Optional[int] = None

    def incremental_step(self) -> Optional[IncrementalStep]:
        """A function (ids, state) → (logits, state) that carries the model's state, made once per `generate`
        call; None when the model has none (the default)."""
        return None

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: Optional[int] = None, *, use_state: bool = True,
                 generator: Optional[torch.Generator] = None,
                 on_token: Optional[Callable[[torch.Tensor], None]] = None) -> torch.Tensor:
        """Sample `max_new_tokens` tokens after a prompt (in eval mode; the training mode is restored after).

        Args:
            prompt_ids: LongTensor [prompt_len] or [prompt_len, batch_size], prompt_len ≥ 1.
            max_new_tokens: number of tokens to add (≥ 0).
            temperature: logits are divided by it; 0 means greedy (argmax).
            top_k: if given, sample only among the k most likely tokens.
            use_state: carry the model's state so each new token costs one step (when it has an incremental
                step); False re-runs the whole prefix per token, as labml_nn's samplers do.
            generator: optional torch.Generator for reproducible sampling.
            on_token: called with each new token, LongTensor [1(, batch_size)], as soon as it is sampled (to show
                the text as it comes); it does not change what is sampled.

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
        check_generate_arguments(max_new_tokens, temperature, top_k)

        was_training = self.training
        self.eval()
        try:
            out = [ids]
            step = self.incremental_step() if use_state else None
            state = None
            chunk = ids  # what the model has not seen yet
            for _ in range(max_new_tokens):
                if step is not None:
                    logits, state = step(chunk, state)
                else:
                    prefix = torch.cat(out, dim=0)
                    logits, _ = self(prefix if self.max_context is None else prefix[-self.max_context:])
                chunk = sample_next(logits[-1], temperature, top_k, generator).unsqueeze(0)
                out.append(chunk)
                if on_token is not None:
                    on_token(chunk.squeeze(-1) if squeeze else chunk)
        finally:
            self.train(was_training)
        result = torch.cat(out, dim=0)
        return result.squeeze(-1) if squeeze else result


class AutoregressiveModel(LanguageModel):
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

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Logits for every position; the second element is None (labml_nn's experiments expect a pair)."""
        return self.generator(self.transformer(self.src_embed(x))), None

    @property
    def supports_state(self) -> bool:
        """True when the core transformer implements `forward_with_state`."""
        return callable(getattr(self.transformer, 'forward_with_state', None))

    def forward_with_state(self, x: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        """Logits for a chunk x [seq_len, batch_size] continuing from `state`; returns (logits, new_state).

        Raises:
            TypeError: the core transformer has no `forward_with_state`.
        """
        if not self.supports_state:
            raise TypeError(f'{type(self.transformer).__name__} has no forward_with_state; '
                            f'use forward() on the whole sequence')
        y, state = self.transformer.forward_with_state(self.src_embed(x), state)
        return self.generator(y), state

    def incremental_step(self) -> Optional[IncrementalStep]:
        """`forward_with_state` for generation (None when the core has no state), one-token calls going through
        the core's `step_function()` when it offers one (made here, once)."""
        if not self.supports_state:
            return None
        make = getattr(self.transformer, 'step_function', None)
        core_step = make() if callable(make) else None
        if core_step is None:
            return self.forward_with_state
        embed, generator = self.src_embed, self.generator

        def step(ids: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
            if ids.shape[0] != 1:  # the prompt
                return self.forward_with_state(ids, state)
            y, state = core_step(embed(ids), state)
            return generator(y), state
        return step


class TokenAndPositionEmbeddings(nn.Module):
    """Token embedding plus a learned embedding per position that starts as the sinusoidal encoding
    (Vaswani et al. 2017, section 3.5), without the √d_model scale of labml_nn's embeddings.

    Why: labml_nn's embeddings multiply N(0, 1) token vectors by √d_model (≈ 11 at d_model 128); in a pre-norm
    transformer that residual stream is then ~10× larger than what each layer adds, and learning is slow; and
    positions that start at zero give attention nothing to tell tokens apart by. Measured on Tiny Shakespeare
    (d_model 128, 4 layers, 250 steps of 32×64, under load): validation loss 2.43 with labml_nn's scaled
    sinusoids, 2.36 with unscaled zero-initialised learned positions, 2.10 with unscaled sinusoids.

    Args:
        d_model: width.
        n_vocab: vocabulary size.
        max_len: number of positions (the training seq_len).

    Shapes:
        x: LongTensor [seq_len, batch_size] with seq_len ≤ max_len → [seq_len, batch_size, d_model]

    Raises:
        ValueError: seq_len > max_len.
    """

    def __init__(self, d_model: int, n_vocab: int, max_len: int):
        super().__init__()
        self.linear = nn.Embedding(n_vocab, d_model)
        self.positional_encodings = nn.Parameter(get_positional_encoding(d_model, max_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.positional_encodings.shape[0]:
            raise ValueError(f'seq_len={x.shape[0]} exceeds max_len={self.positional_encodings.shape[0]}')
        return self.linear(x) + self.positional_encodings[:x.shape[0]]


class AutoregressiveTransformer(LanguageModel):
    """A decoder-only transformer LM, laid out as labml_nn's `AutoregressiveTransformer` (basic experiment):
    `src_embed` (token + positional embedding), `encoder` (layers under a causal mask, final LayerNorm),
    `generator` (logits), so state dicts load both ways.

    Args:
        encoder: `lazylab.models.transformer.Encoder`, called as encoder(x, mask).
        src_embed: token ids [seq_len, batch_size] → [seq_len, batch_size, d_model] (with positions).
        generator: [seq_len, batch_size, d_model] → logits [seq_len, batch_size, n_vocab].
        max_context: generation feeds the model at most this many most recent tokens (the training seq_len,
            so positions stay within those it learned).

    Shapes:
        x: LongTensor [seq_len, batch_size] → (logits [seq_len, batch_size, n_vocab], None)
    """

    def __init__(self, encoder: nn.Module, src_embed: nn.Module, generator: nn.Module, max_context: int):
        super().__init__()
        self.src_embed = src_embed
        self.encoder = encoder
        self.generator = generator
        self.max_context = max_context

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        mask = subsequent_mask(x.shape[0], x.device)
        return self.generator(self.encoder(self.src_embed(x), mask)), None

    @property
    def supports_state(self) -> bool:
        """False: generation re-runs the last `max_context` tokens for each new one."""
        return False
