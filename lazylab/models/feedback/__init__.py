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

The modules' `forward` is the fast step loop of `memory.py`: each memory vector's keys and values are computed
once, into a buffer that grows (no 512-step limit), with hand-written gradients of the memory; `reference.py` is
the plain loop it equals (re-stack the memory, call each layer's `forward`), which the tests compare against,
besides labml-nn itself.

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
import torch.nn.functional as F
from torch import nn

from lazylab.models.feedback.memory import LayerStep, Memory, ReadMemory, Tape
from lazylab.models.mha import PrepareForMultiHeadAttention
from lazylab.models.utils import check_heads, check_n_layers, clone_module_list

__all__ = ['FeedbackAttention', 'FeedbackTransformerLayer', 'FeedbackTransformer', 'FeedbackTransformerKV',
           'FeedbackState', 'DEFAULT_N_POSITIONS']

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
                f"(config key 'n_positions') or use sequences of at most {self.P + 1} steps")

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


class FeedbackTransformerLayer(nn.Module):
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

    def __init__(self, *, d_model: int, attn: FeedbackAttention, feed_forward: nn.Module, dropout_prob: float):
        super().__init__()
        self.size = d_model
        self.attn = attn
        self.feed_forward = feed_forward
        self.dropout = nn.Dropout(dropout_prob)
        self.norm_self_attn = nn.LayerNorm([d_model])
        self.norm_ff = nn.LayerNorm([d_model])

    def forward(self, *, x: torch.Tensor, key: Optional[torch.Tensor], value: Optional[torch.Tensor]) -> torch.Tensor:
        if key is not None:
            x = x + self.dropout(self.attn(query=self.norm_self_attn(x), key=key, value=value))
        return x + self.dropout(self.feed_forward(self.norm_ff(x)))


class FeedbackState:
    """Opaque incremental state of a feedback transformer: the key/value memory of the steps seen so far."""

    def __init__(self, memory: Memory, n: int):
        self.memory = memory
        self.n = n

    def __len__(self) -> int:
        return self.n


class _FeedbackBase(nn.Module):
    """What the two variants share: the layer stack, the memory weights w and the final LayerNorm."""

    layers: nn.ModuleList

    def __init__(self, layer: FeedbackTransformerLayer, n_layers: int):
        super().__init__()
        check_n_layers(n_layers, type(self).__name__)
        self.layers = clone_module_list(layer, n_layers)
        self.norm = nn.LayerNorm([layer.size])
        # m_τ = Σ_l softmax(weights)_l x_τ^l over the embedding (l = 0) and each layer's output.
        self.weights = nn.Parameter(torch.ones(n_layers + 1))
        self.softmax = nn.Softmax(0)

    # Subclasses: the projections of a memory vector, as one affine map m [b, d_model] → [b, groups·heads·d_k].
    def _memory_projection(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        raise NotImplementedError

    def _groups(self) -> int:
        raise NotImplementedError

    def _kv_groups(self, i: int) -> tuple[int, int]:
        """Memory groups holding layer i's keys and values."""
        raise NotImplementedError

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        """x_seq [seq_len, batch_size, d_model] → LayerNorm of the last layer's outputs, same shape."""
        return self.forward_with_state(x_seq)[0]

    def forward_with_state(self, x_seq: torch.Tensor, state: Optional[FeedbackState] = None
                           ) -> tuple[torch.Tensor, FeedbackState]:
        """Run x_seq [seq_len, batch_size, d_model] after the steps held in `state` (None: from scratch).

        Returns (outputs [seq_len, batch_size, d_model], new state). Chained calls give the outputs of one call
        over the concatenated sequence. A state may be continued more than once (it is copied when needed);
        gradients do not flow into it.

        Raises:
            ValueError: x_seq is not [seq_len, batch_size, d_model]; the batch size differs from the state's;
                the memory would exceed a layer's `n_positions`.
        """
        attn0 = self.layers[0].attn
        d_model = self.layers[0].size
        if x_seq.dim() != 3 or x_seq.shape[-1] != d_model:
            raise ValueError(f"{type(self).__name__} expects x_seq [seq_len, batch_size, d_model={d_model}], "
                             f"got {tuple(x_seq.shape)}")
        steps, batch = x_seq.shape[0], x_seq.shape[1]
        n0 = 0 if state is None else state.n
        if state is not None and state.memory.batch != batch:
            raise ValueError(f"{type(self).__name__}: state holds batch_size={state.memory.batch}, "
                             f"x_seq has batch_size={batch}")
        layer_steps = [LayerStep(layer, i, n0 + steps - 1, *self._kv_groups(i))
                       for i, layer in enumerate(self.layers)]
        if state is None:
            memory = Memory(self._groups(), batch, attn0.heads, attn0.d_k, steps, x_seq)
        else:
            memory = state.memory if state.memory.n == n0 else state.memory.fork(n0)
            memory.reserve(n0 + steps)

        training = self.training
        w = torch.softmax(self.weights, dim=0)
        proj_w, proj_b = self._memory_projection()
        grad = torch.is_grad_enabled()
        tape = Tape(memory, n0, steps, layer_steps) if grad and n0 + steps > 1 else None
        anchor = None
        outputs = []
        for i, x in enumerate(x_seq.unbind(0)):
            t = n0 + i
            token = None
            if tape is not None and anchor is not None:
                positions = [p for s in layer_steps for p in (s.pos, s.bias)] if t == n0 + 1 else []
                token = ReadMemory.apply(tape, t, anchor, *positions)
            views = memory.views(t) if t > 0 else None
            layer_outputs = [x]
            for step in layer_steps:
                if views is None:
                    k = v = None
                else:
                    k, v = views[step.k_group], views[step.v_group]
                x = step(x, k, v, t, training, tape, token)
                layer_outputs.append(x)
            mem = torch.stack(layer_outputs, dim=-1) @ w                         # [b, d_model]
            anchor = F.linear(mem, proj_w, proj_b)
            memory.write(anchor)
            outputs.append(x)
        return self.norm(torch.stack(outputs)), FeedbackState(memory, memory.n)


class FeedbackTransformer(_FeedbackBase):
    """The original Feedback Transformer: per-layer key/value projections of the shared memory.

    Args:
        layer: a `FeedbackTransformerLayer` whose attention has its own `key`/`value` (is_kv_precomputed=False);
            it is deep-copied n_layers times.
        n_layers: L.

    Parameters (labml-nn names): `layers.*`, `norm` (final LayerNorm), `weights [L+1]` (memory mixing logits).

    Shapes:
        x_seq: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]

    Raises:
        ValueError: n_layers < 1; a layer whose attention has no key/value projections.
    """

    def __init__(self, layer: FeedbackTransformerLayer, n_layers: int):
        if layer.attn.key is None:
            raise ValueError("FeedbackTransformer needs FeedbackAttention(..., is_kv_precomputed=False); "
                             "use FeedbackTransformerKV for precomputed keys and values")
        super().__init__(layer, n_layers)

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

    Parameters (labml-nn names): `layers.*`, `norm`, `weights [L+1]`, `key.linear.weight`, `value.linear.weight`
    (no biases).

    Shapes:
        x_seq: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]

    Raises:
        ValueError: n_layers < 1; d_model not divisible by heads; a layer whose attention projects keys itself.
    """

    def __init__(self, layer: FeedbackTransformerLayer, n_layers: int, d_model: int, heads: int):
        if layer.attn.key is not None:
            raise ValueError("FeedbackTransformerKV needs FeedbackAttention(..., is_kv_precomputed=True)")
        check_heads(d_model, heads, 'FeedbackTransformerKV')
        super().__init__(layer, n_layers)
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
