"""Feedback Transformer (Fan, Lavril, Grave, Joulin & Sukhbaatar 2020, "Addressing Some Limitations of
Transformers with Feedback Memory", arXiv:2002.09402).

A normal transformer's layer l attends to layer l-1's outputs. In the Feedback Transformer every layer at step t
attends to one *memory vector* per earlier step τ < t, the softmax-weighted sum of that step's embedding and all of
its layer outputs (paper eq. 4):

    m_τ = Σ_{l=0..L} softmax(w)_l x_τ^l

so the top layers' abstractions of the past are visible to the bottom layers of the present, and the model has to
run token by token.

Two variants, both with labml-nn 0.5.1's class names, constructor arguments, state_dict keys and the
sequence-first layout [seq_len, batch_size, d_model]:

- `FeedbackTransformer`: every layer l has its own key and value projections of the memory,
  k_τ^l = W_k^l m_τ and v_τ^l = W_v^l m_τ + b_v^l.
- `FeedbackTransformerKV`: one key and one value projection shared by all layers, k_τ = W_k m_τ, v_τ = W_v m_τ.

The modules' `forward` is the fast path of `sequence.py`: the whole sequence is one autograd node with
backpropagation through time written out, and each memory vector's keys and values are computed once, into the
buffer of `memory.py` that grows (no 512-step limit); `reference.py` is the plain loop it equals (re-stack the
memory, call each layer's `forward`), which the tests compare against, besides labml-nn itself.

Memory span (`memory_span` N, an addition): each step attends only to the last N memory vectors, as the
official implementation's attention limit does, so the cost per token stops growing with the sequence and
n_positions need only be ≥ N. N = 0 (the default, labml-nn's behaviour) is every earlier step.

Relative positions (Transformer-XL style, as in labml-nn): a key at distance δ = t - τ ∈ [1, P] from the query
uses row P - δ of `key_pos_embeddings [P, heads, d_k]` and `key_pos_bias [P, heads]`. P = `n_positions` (4096 by
default, labml-nn's fixed 2**12). A step whose memory is longer than P raises a ValueError naming
`n_positions`, before anything runs; there is no silent wrap-around.

Incremental use: `forward_with_state(x, state)` carries the key/value memory between calls, so generation costs
one step per token and the outputs equal those of one call over the whole sequence. Gradients do not flow into a
carried-in state (it is treated as a constant, like Transformer-XL's memory).
"""
import math
from typing import Optional

import torch
from torch import nn

from lazylab.errors import DataError
from lazylab.models.autoregressive import AutoregressiveModel
from lazylab.models.feedback.memory import Memory
from lazylab.models.feedback.sequence import SequencePlan, run_sequence
from lazylab.models.mha import PrepareForMultiHeadAttention
from lazylab.models.utils import PreNormLayer, check_heads, check_n_layers, clone_module_list

__all__ = ['FeedbackAttention', 'FeedbackTransformerLayer', 'FeedbackTransformer', 'FeedbackTransformerKV',
           'FeedbackState', 'FeedbackLanguageModel', 'DEFAULT_N_POSITIONS']

# labml-nn 0.5.1's fixed number of relative positions.
DEFAULT_N_POSITIONS = 2 ** 12


class FeedbackAttention(nn.Module):
    r"""Attention of one query step over the feedback memory, with relative positions.

    For the query q = W_q z (z: the normalised layer input at step t) and the memory key k_τ, value v_τ of an
    earlier step τ at distance δ = t - τ, per head (Transformer-XL's decomposition, term D replaced by a bias):

        A_τ = (q + u)ᵀ k_τ  +  qᵀ p_δ  +  s_δ          u: query_pos_bias, p: key_pos_embeddings, s: key_pos_bias
        a = softmax_τ(A / √d_k),    out = W_o Σ_τ a_τ v_τ + b_o

    Args:
        heads: number of heads h.
        d_model: model width; d_k = d_model // heads.
        dropout_prob: dropout on the attention weights a.
        is_kv_precomputed: keys and values come already projected ([seq, batch, heads, d_k]), as in
            `FeedbackTransformerKV`; then this module has no `key`/`value` projections.
        n_positions: P, rows of the relative-position tables (labml-nn: 4096). Memories longer than P raise.

    Shapes (`forward`, the plain per-step form):
        query: [batch_size, d_model]; key, value: [mem_len, batch_size, d_model]
        (or [mem_len, batch_size, heads, d_k] when precomputed) → [batch_size, d_model]

    Raises:
        ValueError: d_model not divisible by heads; n_positions < 1; mem_len > n_positions (on forward).
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, *,
                 is_kv_precomputed: bool = False, n_positions: int = DEFAULT_N_POSITIONS):
        super().__init__()
        check_heads(d_model, heads, 'FeedbackAttention')
        if n_positions < 1:
            raise ValueError(f"FeedbackAttention: n_positions must be ≥ 1, got {n_positions}")
        self.d_k = d_model // heads
        self.heads = heads
        self.query = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
        if not is_kv_precomputed:
            self.key = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
            self.value = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=True)
        else:
            self.key = None
            self.value = None
        self.output = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout_prob)
        self.scale = 1 / math.sqrt(self.d_k)
        self.softmax = nn.Softmax(dim=0)
        self.P = n_positions
        # Row P - δ belongs to distance δ ∈ [1, P]; zeros at start, as in labml-nn.
        self.key_pos_embeddings = nn.Parameter(torch.zeros((self.P, heads, self.d_k)))
        self.key_pos_bias = nn.Parameter(torch.zeros((self.P, heads)))
        self.query_pos_bias = nn.Parameter(torch.zeros((heads, self.d_k)))
        # Kept for labml-nn compatibility (it never fills it either).
        self.attn = None

    def check_memory_length(self, mem_len: int):
        """Raise a ValueError when a query would attend over more than P = n_positions memory steps."""
        if mem_len > self.P:
            raise ValueError(
                f"FeedbackAttention: a step attends over {mem_len} memory steps but the relative-position "
                f"tables have n_positions={self.P} rows; build FeedbackAttention(..., n_positions≥{mem_len}) "
                f"(config key 'n_positions'), use sequences of at most {self.P + 1} steps, or a memory_span "
                f"≤ {self.P}")

    def get_scores(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """A (unscaled) for query [batch, heads, d_k], keys [mem_len, batch, heads, d_k] → [mem_len, batch, heads]."""
        mem_len = key.shape[0]
        self.check_memory_length(mem_len)
        p = self.key_pos_embeddings[self.P - mem_len:]
        s = self.key_pos_bias[self.P - mem_len:]
        content = torch.einsum('bhd,jbhd->jbh', query + self.query_pos_bias[None], key)
        position = torch.einsum('bhd,jhd->jbh', query, p) + s[:, None, :]
        return content + position

    def forward(self, *, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        q = self.query(query)
        if self.key is not None:
            key = self.key(key)
        if self.value is not None:
            value = self.value(value)
        attn = self.dropout(torch.softmax(self.get_scores(q, key) * self.scale, dim=0))
        x = torch.einsum('jbh,jbhd->bhd', attn, value)
        return self.output(x.reshape(x.shape[0], -1))


class FeedbackTransformerLayer(PreNormLayer):
    """Pre-norm layer: x + Dropout(Attention(LN(x), memory)), then x + Dropout(FFN(LN(x))).

    At the first step there is no memory, so only the FFN half runs.

    Args:
        d_model: model width.
        attn: the `FeedbackAttention` of this layer.
        feed_forward: the position-wise FFN (`lazylab.models.feed_forward.FeedForward` or compatible).
        dropout_prob: dropout on the attention and FFN outputs before the residual additions.

    Shapes (`forward`, one step):
        x: [batch_size, d_model]; key, value: memory [mem_len, batch_size, ...] or None → [batch_size, d_model]
    """

    def forward(self, *, x: torch.Tensor, key: Optional[torch.Tensor], value: Optional[torch.Tensor]) -> torch.Tensor:
        if key is not None:
            x = x + self.dropout(self.attn(query=self.norm_self_attn(x), key=key, value=value))
        return x + self.dropout(self.feed_forward(self.norm_ff(x)))


class FeedbackState:
    """Opaque incremental state of a feedback transformer: the key/value memory of the steps seen so far.

    Made by the models' `forward_with_state`, not by hand.

    Args:
        memory: the memory buffer of the steps seen so far.
        n: the number of those steps (``len(state)``).
    """

    def __init__(self, memory: Memory, n: int):
        self.memory = memory
        self.n = n

    def __len__(self) -> int:
        return self.n


class _FeedbackBase(nn.Module):
    """What the two variants share: the layer stack, the memory weights w, the final LayerNorm and the step loop."""

    layers: nn.ModuleList

    def __init__(self, layer: FeedbackTransformerLayer, n_layers: int, memory_span: int = 0):
        super().__init__()
        check_n_layers(n_layers, type(self).__name__)
        if memory_span < 0:
            raise ValueError(f"{type(self).__name__}: memory_span must be ≥ 0 (0: every earlier step), "
                             f"got {memory_span}")
        self.layers = clone_module_list(layer, n_layers)
        self.norm = nn.LayerNorm([layer.size])
        # m_τ = Σ_l softmax(weights)_l x_τ^l over the embedding (l = 0) and each layer's output.
        self.weights = nn.Parameter(torch.ones(n_layers + 1))
        self.softmax = nn.Softmax(0)
        self.memory_span = memory_span

    # Subclasses: the projections of a memory vector, as one affine map m [b, d_model] → [b, groups·heads·d_k].
    def _memory_projection(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        raise NotImplementedError

    def _groups(self) -> int:
        raise NotImplementedError

    def _kv_groups(self, i: int) -> tuple[int, int]:
        """Memory groups holding layer i's keys and values."""
        raise NotImplementedError

    def _dtypes(self, x_seq: torch.Tensor) -> tuple[torch.dtype, torch.dtype, torch.dtype, bool]:
        """(matmul dtype, state dtype, output dtype, under autocast) for a call on x_seq."""
        device_type = x_seq.device.type
        param_dtype = self.weights.dtype
        autocast = torch.is_autocast_enabled(device_type) and param_dtype == torch.float32
        compute_dtype = torch.get_autocast_dtype(device_type) if autocast else param_dtype
        state_dtype = torch.promote_types(param_dtype, torch.float32)
        return compute_dtype, state_dtype, state_dtype if autocast else x_seq.dtype, autocast

    def _memory_for(self, x_seq: torch.Tensor, state: Optional[FeedbackState], dtype: torch.dtype) -> Memory:
        """The memory a call on x_seq continues (a new one without state; a copy when the state was continued
        before or holds another dtype), with room for its steps."""
        steps, batch = x_seq.shape[0], x_seq.shape[1]
        if state is None:
            attn0 = self.layers[0].attn
            return Memory(self._groups(), batch, attn0.heads, attn0.d_k, steps, dtype, x_seq.device)
        memory = state.memory
        if memory.n != state.n or memory.dtype != dtype:
            memory = memory.fork(state.n, dtype)
        memory.reserve(state.n + steps)
        return memory

    def step_function(self):
        """`forward_with_state` for generation, one token x [1, batch_size, d_model] at a time in eval mode without
        autograd (see `lazylab.models.autoregressive`), with the weights prepared once when it is made
        (transposed, the position tables folded for every distance up to n_positions or the memory span) instead
        of at every token. Other calls go to `forward_with_state`. Returns f(x, state) → (y, state)."""
        plans = {}
        limit = self.layers[0].attn.P
        positions = min(self.memory_span, limit) if self.memory_span else limit

        def step(x: torch.Tensor, state: Optional[FeedbackState]) -> tuple[torch.Tensor, FeedbackState]:
            if state is None or x.shape[0] != 1 or self.training or torch.is_grad_enabled():
                return self.forward_with_state(x, state)
            if state.memory.batch != x.shape[1]:
                raise ValueError(f"{type(self).__name__}: state holds batch_size={state.memory.batch}, "
                                 f"x_seq has batch_size={x.shape[1]}")
            compute_dtype, state_dtype, out_dtype, autocast = key = self._dtypes(x)
            memory = self._memory_for(x, state, compute_dtype)
            plan = plans.get(key)
            if plan is None:
                plan = plans[key] = SequencePlan(self, memory, 1, self.memory_span, compute_dtype=compute_dtype,
                                                 state_dtype=state_dtype, out_dtype=out_dtype, autocast=autocast,
                                                 positions=positions)
            y = run_sequence(plan.continued(memory, 1), x)
            return self.norm(y), FeedbackState(memory, memory.n)
        return step

    def longest_memory(self, steps: int) -> int:
        """The most memory vectors a step attends over in a sequence of `steps` steps: steps - 1, or the memory
        span if that is smaller. The layers' `n_positions` must be at least this."""
        longest = max(steps - 1, 0)
        return min(longest, self.memory_span) if self.memory_span else longest

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        """x_seq [seq_len, batch_size, d_model] → LayerNorm of the last layer's outputs, same shape."""
        return self.forward_with_state(x_seq)[0]

    def forward_with_state(self, x_seq: torch.Tensor, state: Optional[FeedbackState] = None
                           ) -> tuple[torch.Tensor, FeedbackState]:
        """Run x_seq [seq_len, batch_size, d_model] after the steps held in `state` (None: from scratch).

        Returns (outputs [seq_len, batch_size, d_model], new state). Chained calls give the outputs of one call
        over the concatenated sequence. A state may be continued more than once (it is copied when needed);
        gradients do not flow into it.

        Under autocast the matrix products run in the autocast dtype and the rest in float32 (`sequence.py`,
        "Precision"); the outputs are then float32.

        Raises:
            ValueError: x_seq is not [seq_len, batch_size, d_model]; the batch size differs from the state's;
                a step would attend over more memory than a layer's `n_positions`.
        """
        d_model = self.layers[0].size
        if x_seq.dim() != 3 or x_seq.shape[-1] != d_model:
            raise ValueError(f"{type(self).__name__} expects x_seq [seq_len, batch_size, d_model={d_model}], "
                             f"got {tuple(x_seq.shape)}")
        steps, batch = x_seq.shape[0], x_seq.shape[1]
        if state is not None and state.memory.batch != batch:
            raise ValueError(f"{type(self).__name__}: state holds batch_size={state.memory.batch}, "
                             f"x_seq has batch_size={batch}")
        compute_dtype, state_dtype, out_dtype, autocast = self._dtypes(x_seq)
        memory = self._memory_for(x_seq, state, compute_dtype)
        plan = SequencePlan(self, memory, steps, self.memory_span, compute_dtype=compute_dtype,
                            state_dtype=state_dtype, out_dtype=out_dtype, autocast=autocast)
        y = run_sequence(plan, x_seq)
        return self.norm(y), FeedbackState(memory, memory.n)


class FeedbackTransformer(_FeedbackBase):
    """The original Feedback Transformer: per-layer key/value projections of the shared memory.

    Args:
        layer: a `FeedbackTransformerLayer` whose attention has its own `key`/`value` (is_kv_precomputed=False);
            it is deep-copied n_layers times.
        n_layers: L.
        memory_span: N, attend only to the last N memory vectors (0: every earlier step; see the module docstring).

    Parameters (labml-nn names): `layers.*`, `norm` (final LayerNorm), `weights [L+1]` (memory mixing logits).

    Shapes:
        x_seq: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]

    Raises:
        ValueError: n_layers < 1; memory_span < 0; a layer whose attention has no key/value projections.
    """

    def __init__(self, layer: FeedbackTransformerLayer, n_layers: int, *, memory_span: int = 0):
        if layer.attn.key is None:
            raise ValueError("FeedbackTransformer needs FeedbackAttention(..., is_kv_precomputed=False); "
                             "use FeedbackTransformerKV for precomputed keys and values")
        super().__init__(layer, n_layers, memory_span)

    def _groups(self) -> int:
        return 2 * len(self.layers)

    def _memory_projection(self):
        weights, biases = [], []
        for layer in self.layers:
            for proj in (layer.attn.key.linear, layer.attn.value.linear):
                weights.append(proj.weight)
                biases.append(proj.bias if proj.bias is not None else proj.weight.new_zeros(proj.out_features))
        return torch.cat(weights), torch.cat(biases)

    def _kv_groups(self, i):
        return 2 * i, 2 * i + 1


class FeedbackTransformerKV(_FeedbackBase):
    """Feedback Transformer with keys and values shared by all layers (computed once per memory vector).

    Args:
        layer: a `FeedbackTransformerLayer` whose attention has is_kv_precomputed=True; deep-copied n_layers times.
        n_layers: L.
        d_model: model width.
        heads: number of heads (d_k = d_model // heads).
        memory_span: N, attend only to the last N memory vectors (0: every earlier step; see the module docstring).

    Parameters (labml-nn names): `layers.*`, `norm`, `weights [L+1]`, `key.linear.weight`, `value.linear.weight`
    (no biases).

    Shapes:
        x_seq: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]

    Raises:
        ValueError: n_layers < 1; memory_span < 0; d_model not divisible by heads; a layer whose attention
            projects keys itself.
    """

    def __init__(self, layer: FeedbackTransformerLayer, n_layers: int, d_model: int, heads: int, *,
                 memory_span: int = 0):
        if layer.attn.key is not None:
            raise ValueError("FeedbackTransformerKV needs FeedbackAttention(..., is_kv_precomputed=True)")
        check_heads(d_model, heads, 'FeedbackTransformerKV')
        super().__init__(layer, n_layers, memory_span)
        d_k = d_model // heads
        self.key = PrepareForMultiHeadAttention(d_model, heads, d_k, bias=False)
        self.value = PrepareForMultiHeadAttention(d_model, heads, d_k, bias=False)

    def _groups(self) -> int:
        return 2

    def _memory_projection(self):
        return torch.cat([self.key.linear.weight, self.value.linear.weight]), None

    def _kv_groups(self, i):
        return 0, 1

    def free(self):
        """No-op, for labml-nn compatibility (its KV model keeps a stack between calls; ours keeps nothing)."""


class FeedbackLanguageModel(AutoregressiveModel):
    """`AutoregressiveModel` (labml-nn's layout and state-dict keys) around a feedback core, whose `generate`
    refuses up front a sequence longer than the core's relative positions can hold (instead of failing at the
    token that crosses the limit).

    Raises (generate):
        DataError (a ValueError): the prompt and the new tokens need a memory longer than the layers'
            n_positions; the message names the sizes and what to change.
    """

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, *args, **kwargs) -> torch.Tensor:
        """Sample `max_new_tokens` tokens after a prompt (`AutoregressiveModel.generate`), once the memory they need
        is known to fit the relative positions.

        Args:
            prompt_ids: LongTensor [prompt_len] or [prompt_len, batch_size], prompt_len ≥ 1.
            max_new_tokens: number of tokens to add (≥ 0).
            *args, **kwargs: the rest of `AutoregressiveModel.generate`'s arguments (temperature, top_k,
                use_state, generator, on_token).

        Returns:
            LongTensor with the prompt followed by the new tokens: [prompt_len + max_new_tokens(, batch_size)].

        Raises:
            DataError: the prompt and the new tokens need a memory longer than the layers' n_positions.
            ValueError: as `AutoregressiveModel.generate` (an empty prompt, a negative count or temperature, …).
        """
        core = self.transformer
        if max_new_tokens > 0 and prompt_ids.dim() >= 1:
            prompt_len = prompt_ids.shape[0]
            needed = core.longest_memory(prompt_len + max_new_tokens - 1)  # the last new token is not fed back
            limit = core.layers[0].attn.P
            if needed > limit:
                raise DataError(f"generating {max_new_tokens} tokens after a {prompt_len}-token prompt needs "
                                f"a memory of {needed} steps, but the model has n_positions={limit} (the run's "
                                f"feedback.n_positions); generate at most {limit + 2 - prompt_len} tokens, or "
                                f"train with feedback.memory_span ≤ {limit}")
        return super().generate(prompt_ids, max_new_tokens, *args, **kwargs)
