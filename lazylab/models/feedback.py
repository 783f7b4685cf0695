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

How this is faster than the reference and has no step limit
-----------------------------------------------------------
The memory never changes once written, so its keys and values are computed **once**, when m_τ is made (the
reference recomputes every layer's projections of the whole memory at every step in `FeedbackTransformer`),
and written into a pre-allocated buffer `[groups, batch·heads, capacity, d_k]` that only grows (capacity doubles;
no 512-step stack). Each step's attention reads a *view* of the first t slots; nothing is re-stacked.

Autograd and the in-place writes: a view read at step t is used by step t's attention, and later steps write
slots ≥ t. Those slots are outside the view, so what step t's backward reads is never changed; the writes go
through an alias whose version counter is separate (`Tensor.data`), so autograd's modified-in-place check, which
would otherwise fire on any write to the shared storage, does not.

Gradients of the memory are accumulated by hand in a per-call `_Tape`, with one autograd node per layer and step
for the whole attention (`_AttendMemory`: scores, softmax, weighted values) and one per step for the memory
(`_ReadMemory`):
- `_AttendMemory` backward returns ∂q and writes ∂(position table) in place; the slot gradients
  (∂k_τ = Σ gs_τ q, ∂v_τ = Σ a_τ ∂o) are stashed as factors;
- `_ReadMemory(t)` backward adds the stashed factors of step t into the slot gradients with one in-place
  batched matmul per group (for the KV model: the L layers in one product) and returns the finished gradient of
  slot t-1 to the projection that wrote it; the read of the first step also returns the position gradients.
This is correct because autograd runs these nodes backwards in time: step t+1 depends, through slot t, on all of
step t (its token makes every `_AttendMemory` of step t run before `_ReadMemory(t)`), so every later step has
added its share to slot t-1 before `_ReadMemory(t)` runs. The tape checks this order and raises if it is ever
violated, and starts from zero in each new backward pass (retain_graph, autograd.grad).
`forward_reference` is the slow, obviously correct loop (re-stack the memory, call each layer's plain
`forward`) that the tests compare against, besides labml-nn itself.

Relative positions (Transformer-XL style, as in labml-nn): a key at distance δ = t - τ ∈ [1, P] from the query
uses row P - δ of `key_pos_embeddings [P, heads, d_k]` and `key_pos_bias [P, heads]`. P = `n_positions` (4096 by
default, labml-nn's fixed 2**12). A step whose memory is longer than P raises a ValueError naming
`n_positions`, before anything runs; there is no silent wrap-around.

Incremental use: `forward_with_state(x, state)` carries the key/value memory between calls, so generation costs
one step per token and the outputs equal those of one call over the whole sequence. Gradients do not flow into a
carried-in state (it is treated as a constant, like Transformer-XL's memory).
"""
import copy
import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from lazylab.models.feed_forward import FeedForward
from lazylab.models.mha import PrepareForMultiHeadAttention

__all__ = ['FeedbackAttention', 'FeedbackTransformerLayer', 'FeedbackTransformer', 'FeedbackTransformerKV',
           'FeedbackState']

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
        if heads <= 0 or d_model % heads != 0:
            raise ValueError(f"FeedbackAttention: d_model={d_model} must be divisible by heads={heads}")
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
        """A (unscaled) for query [batch, heads, d_k] and keys [mem_len, batch, heads, d_k] → [mem_len, batch, heads]."""
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


# ----------------------------------------------------------------------------------------------------------------
# The growing key/value memory and its autograd bridge
# ----------------------------------------------------------------------------------------------------------------

class _Memory:
    """Keys and values of the memory steps written so far: `data [groups, batch·heads, capacity, d_k]`.

    groups = 2 (k, v) for the KV variant and 2·n_layers (k¹, v¹, k², v², …) for the original. Slot τ of group g
    holds that projection of m_τ with the batch-major head index b·heads + h. Only slots < n are valid.
    """

    def __init__(self, groups: int, batch: int, heads: int, d_k: int, capacity: int, like: torch.Tensor):
        self.groups, self.batch, self.heads, self.d_k = groups, batch, heads, d_k
        self.n = 0
        self._alloc(max(capacity, 1), like)

    def _alloc(self, capacity: int, like: torch.Tensor):
        self.data = like.new_zeros(self.groups, self.batch * self.heads, capacity, self.d_k)
        # Reads take views of this alias; its version counter is separate from `data`'s, so writing later slots
        # through `data` does not trip autograd's in-place check on views saved earlier (see module docstring).
        self.alias = self.data.data

    @property
    def capacity(self) -> int:
        return self.data.shape[2]

    def reserve(self, capacity: int):
        """Make room for `capacity` slots (at least doubling), keeping the n written ones."""
        if capacity > self.capacity:
            old = self.data
            self._alloc(max(capacity, 2 * self.capacity), old)
            self.data[:, :, :self.n] = old[:, :, :self.n]

    def fork(self, n: int) -> '_Memory':
        """A copy holding only the first n slots (used when an older state is continued a second time)."""
        other = copy.copy(self)
        other.n = n
        other._alloc(self.capacity, self.data)
        other.data[:, :, :n] = self.data[:, :, :n]
        return other

    def write(self, kv: torch.Tensor):
        """Store slot n from kv [batch, groups·heads·d_k] (group-major features), then n += 1."""
        g, b, h, d = self.groups, self.batch, self.heads, self.d_k
        with torch.no_grad():
            self.data.view(g, b, h, -1, d)[:, :, :, self.n].copy_(kv.view(b, g, h, d).transpose(0, 1))
        self.n += 1

    def views(self, t: int) -> Tuple[torch.Tensor, ...]:
        """The first t slots of each group: `groups` views [batch·heads, t, d_k]."""
        return tuple(self.alias[g, :, :t] for g in range(self.groups))


class _Tape:
    """Backward-pass accumulators of one forward call (its memory slots are n0 … n0 + steps - 1).

    - `grad [groups, batch·heads, steps, d_k]`: gradients of the slots written by this call;
    - `pos_grad[l] [heads, d_k, R]`, `bias_grad[l] [heads, 1, R]`: gradients of layer l's position terms;
    - `pending`: per group, the (left, right) factors of the current step's slot gradients, added with one
      in-place batched matmul per group when the step's read runs (for the KV model that sums the L layers'
      contributions in one product instead of L).
    """

    def __init__(self, memory: _Memory, n0: int, steps: int, layer_steps: List['_LayerStep']):
        self.memory = memory
        self.n0 = n0
        self.layer_steps = layer_steps
        self.grad = memory.data.new_zeros(memory.groups, memory.batch * memory.heads, steps, memory.d_k)
        self.pos_grad = [torch.zeros_like(s.pos_data) for s in layer_steps]
        self.bias_grad = [torch.zeros_like(s.bias_data) for s in layer_steps]
        self.pending: List[List[Tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(memory.groups)]
        self.pass_id = None  # the autograd graph task (backward pass) that last used the tape
        self.horizon = None  # t of the latest read whose backward has run in that pass

    def begin(self, t: int, is_read: bool):
        """Start from zero in a new backward pass; check that steps run backwards in time within one."""
        pass_id = torch._C._current_graph_task_id()
        if pass_id != self.pass_id:
            # A new pass (retain_graph, or autograd.grad after a pass that skipped reads it did not need).
            self.pass_id, self.horizon = pass_id, None
            self.grad.zero_()
            for g in self.pos_grad + self.bias_grad:
                g.zero_()
            self.pending = [[] for _ in self.pending]
        elif self.horizon is not None and t >= self.horizon:
            raise RuntimeError(f"feedback memory: backward reached step {t} after the read of step "
                               f"{self.horizon}; steps must run backwards in time")
        if is_read:
            self.horizon = t

    def stash(self, group: int, left: torch.Tensor, right: torch.Tensor):
        """Record slot-gradient factors of one layer at the current step: Σ_τ left[:, 0, τ] ⊗ right[:, 0, :]."""
        self.pending[group].append((left, right))

    def flush(self, t: int):
        """Add the pending factors of step t into the gradients of slots n0 … t-1, in place."""
        n0 = self.n0
        for g, items in enumerate(self.pending):
            if not items:
                continue
            left = items[0][0] if len(items) == 1 else torch.cat([a for a, _ in items], dim=1)   # [bh, n, t]
            right = items[0][1] if len(items) == 1 else torch.cat([b for _, b in items], dim=1)  # [bh, n, d]
            self.grad[g, :, :t - n0].baddbmm_(left[:, :, n0:t].transpose(1, 2), right)
            items.clear()


class _ReadMemory(torch.autograd.Function):
    """The dependency edge from step t's attention to slot t-1 (`anchor`: the projections written at step t-1,
    [batch, groups·heads·d_k]); returns a 0-dim token that step t's `_AttendMemory` calls take as input.

    Backward (after all of step t's attention backwards, which the token guarantees): flushes their slot
    gradients and returns the finished gradient of slot t-1 to the step that wrote it. The read of the call's
    first attending step (t = n0 + 1), which runs last, also takes the layers' position tensors and returns
    their accumulated gradients. See the module docstring for why the order is right.
    """

    @staticmethod
    def forward(ctx, tape: _Tape, t: int, anchor: torch.Tensor, *positions: torch.Tensor):
        ctx.tape, ctx.t, ctx.n_positions = tape, t, len(positions)
        return anchor.new_zeros(())

    @staticmethod
    @once_differentiable
    def backward(ctx, _token_grad):
        tape, t = ctx.tape, ctx.t
        tape.begin(t, is_read=True)
        tape.flush(t)
        m = tape.memory
        slot = tape.grad[:, :, t - 1 - tape.n0].view(m.groups, m.batch, m.heads, m.d_k)
        anchor_grad = slot.transpose(0, 1).clone(memory_format=torch.contiguous_format).view(m.batch, -1)
        position_grads = []
        if ctx.n_positions:
            for pos, bias in zip(tape.pos_grad, tape.bias_grad):
                position_grads += [pos.clone(), bias.clone()]
        return (None, None, anchor_grad, *position_grads)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor,
            heads: int, d_k: int, p_drop: float, training: bool):
    """Attention of one step over t memory slots.

    q [b, h·d] (already c(W_q z + u)), k, v [b·h, t, d], pos [h, d, t], bias [h, 1, t].
    Returns o [b, h·d], the attention a [b·h, 1, t] and the dropout mask (scaled by 1/(1-p)) or None.
    """
    b, t = q.shape[0], k.shape[1]
    pos_scores = torch.baddbmm(bias, q.view(b, heads, d_k).transpose(0, 1), pos)          # [h, b, t]
    scores = torch.bmm(q.view(b * heads, 1, d_k), k.transpose(1, 2)).view(b, heads, t) + pos_scores.transpose(0, 1)
    a = torch.softmax(scores, dim=-1).view(b * heads, 1, t)
    mask = None
    if training and p_drop > 0:
        mask = torch.empty_like(a).bernoulli_(1 - p_drop).div_(1 - p_drop)
    o = torch.bmm(a if mask is None else a * mask, v)
    return o.view(b, heads * d_k), a, mask


class _AttendMemory(torch.autograd.Function):
    """`_attend` as one autograd node whose backward writes the key/value/position gradients in place.

    Forward as `_attend`. Backward, with gs the score gradient [b·h, 1, t]: returns ∂q; adds qᵀgs into the
    layer's position gradients; stashes (gs, q) for the keys and (a, ∂o) for the values on the tape.
    """

    @staticmethod
    def forward(ctx, token, q, tape: _Tape, step: '_LayerStep', t: int, k, v, training: bool):
        r = step.max_mem - t
        o, a, mask = _attend(q, k, v, step.pos_data[:, :, r:], step.bias_data[:, :, r:], step.heads, step.d_k,
                             step.p_attn, training)
        ctx.save_for_backward(q)
        ctx.tape, ctx.step, ctx.t, ctx.k, ctx.v, ctx.a, ctx.mask = tape, step, t, k, v, a, mask
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_o):
        (q,) = ctx.saved_tensors
        tape, step, t, a, mask = ctx.tape, ctx.step, ctx.t, ctx.a, ctx.mask
        tape.begin(t, is_read=False)
        b, h, d = q.shape[0], step.heads, step.d_k
        r = step.max_mem - t
        pos = step.pos_data[:, :, r:]
        go = grad_o.reshape(b * h, 1, d)
        grad_a = torch.bmm(go, ctx.v.transpose(1, 2))                                         # [bh, 1, t]
        if mask is not None:
            grad_a = grad_a * mask
        gs = torch._softmax_backward_data(grad_a, a, -1, a.dtype)                           # [bh, 1, t]
        gs_h = gs.view(b, h, t).transpose(0, 1)                                              # [h, b, t]
        grad_q = torch.bmm(gs_h, pos.transpose(1, 2)).transpose(0, 1).reshape(b * h, 1, d)  # position part
        grad_q.baddbmm_(gs, ctx.k)                                                           # + content part
        tape.pos_grad[step.index][:, :, r:].baddbmm_(q.view(b, h, d).permute(1, 2, 0), gs_h)
        tape.bias_grad[step.index][:, :, r:] += gs_h.sum(1, keepdim=True)
        tape.stash(step.k_group, gs, q.view(b * h, 1, d))
        tape.stash(step.v_group, a if mask is None else a * mask, go)
        return grad_o.new_zeros(()), grad_q.view(b, h * d), None, None, None, None, None, None


class FeedbackState:
    """Opaque incremental state of a feedback transformer: the key/value memory of the steps seen so far."""

    def __init__(self, memory: _Memory, n: int):
        self.memory = memory
        self.n = n

    def __len__(self) -> int:
        return self.n


# ----------------------------------------------------------------------------------------------------------------
# The fast step loop shared by both variants
# ----------------------------------------------------------------------------------------------------------------

def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    return F.dropout(x, p, True) if training and p > 0 else x


def _feed_forward(ff: nn.Module, z: torch.Tensor, training: bool) -> torch.Tensor:
    """FFN of one step; inlines labml-nn-style `FeedForward` (ours or labml-nn's), otherwise calls the module."""
    if isinstance(ff, FeedForward) or type(ff).__name__ == 'FeedForward' and hasattr(ff, 'layer1'):
        act = ff.activation
        hidden = F.linear(z, ff.layer1.weight, ff.layer1.bias)
        hidden = torch.relu(hidden) if type(act) is nn.ReLU else act(hidden)
        if ff.is_gated:
            hidden = hidden * F.linear(z, ff.linear_v.weight, ff.linear_v.bias)
        hidden = _dropout(hidden, ff.dropout.p, training)
        return F.linear(hidden, ff.layer2.weight, ff.layer2.bias)
    return ff(z)


class _LayerStep:
    """Per-call constants of one layer's attention, with the position terms folded in once per call.

    With scale c = 1/√d_k and the query written as q' = c (W_q z + u) (one affine map), the scaled score is

        c A_τ = q'ᵀ k_τ + q'ᵀ p_δ + c (s_δ − uᵀ p_δ)

    so the per-step work is two batched matmuls; `bias [heads, 1, R]` holds c (s_δ − uᵀ p_δ) and
    `pos [heads, d_k, R]` the p_δ, for distances δ = R … 1 (column R - δ), R the longest memory of the call.
    """

    def __init__(self, layer: FeedbackTransformerLayer, index: int, max_mem: int, k_group: int, v_group: int):
        attn = layer.attn
        self.layer, self.index, self.k_group, self.v_group = layer, index, k_group, v_group
        self.heads, self.d_k = attn.heads, attn.d_k
        c = attn.scale
        self.w_q = attn.query.linear.weight * c
        self.b_q = attn.query_pos_bias.reshape(-1) * c
        if attn.query.linear.bias is not None:
            self.b_q = self.b_q + attn.query.linear.bias * c
        self.max_mem = max_mem
        if max_mem > 0:
            attn.check_memory_length(max_mem)
            p = attn.key_pos_embeddings[attn.P - max_mem:]                       # [R, h, d]
            s = attn.key_pos_bias[attn.P - max_mem:]                             # [R, h]
            s = (s - torch.einsum('rhd,hd->rh', p, attn.query_pos_bias)) * c
            self.pos = p.permute(1, 2, 0).contiguous()                           # [h, d, R]
            self.bias = s.t().unsqueeze(1).contiguous()                          # [h, 1, R]
            self.pos_data, self.bias_data = self.pos.detach(), self.bias.detach()
        self.p_attn = attn.dropout.p
        self.p_layer = layer.dropout.p
        ln = layer.norm_self_attn
        self.ln_attn = (ln.normalized_shape, ln.weight, ln.bias, ln.eps)
        ln = layer.norm_ff
        self.ln_ff = (ln.normalized_shape, ln.weight, ln.bias, ln.eps)
        self.w_o, self.b_o = attn.output.weight, attn.output.bias

    def __call__(self, x: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], t: int,
                 training: bool, tape: Optional[_Tape], token: Optional[torch.Tensor]) -> torch.Tensor:
        """One layer at one step: x [batch, d_model]; k, v: [batch·heads, t, d_k] views or None (no memory)."""
        if k is not None:
            q = F.linear(F.layer_norm(x, *self.ln_attn), self.w_q, self.b_q)     # [b, h·d]
            if token is not None:
                o = _AttendMemory.apply(token, q, tape, self, t, k, v, training)
            else:
                r = self.max_mem - t
                o = _attend(q, k, v, self.pos[:, :, r:], self.bias[:, :, r:], self.heads, self.d_k,
                            self.p_attn, training)[0]
            x = x + _dropout(F.linear(o, self.w_o, self.b_o), self.p_layer, training)
        ff = _feed_forward(self.layer.feed_forward, F.layer_norm(x, *self.ln_ff), training)
        return x + _dropout(ff, self.p_layer, training)


class _FeedbackBase(nn.Module):
    """What the two variants share: the layer stack, the memory weights w and the final LayerNorm."""

    layers: nn.ModuleList

    def __init__(self, layer: FeedbackTransformerLayer, n_layers: int):
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"{type(self).__name__}: n_layers must be ≥ 1, got {n_layers}")
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(n_layers)])
        self.norm = nn.LayerNorm([layer.size])
        # m_τ = Σ_l softmax(weights)_l x_τ^l over the embedding (l = 0) and each layer's output.
        self.weights = nn.Parameter(torch.ones(n_layers + 1))
        self.softmax = nn.Softmax(0)

    # Subclasses: the projections of a memory vector, as one affine map m [b, d_model] → [b, groups·heads·d_k].
    def _memory_projection(self) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        raise NotImplementedError

    def _groups(self) -> int:
        raise NotImplementedError

    def _kv_groups(self, i: int) -> Tuple[int, int]:
        """Memory groups holding layer i's keys and values."""
        raise NotImplementedError

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        """x_seq [seq_len, batch_size, d_model] → LayerNorm of the last layer's outputs, same shape."""
        return self.forward_with_state(x_seq)[0]

    def forward_with_state(self, x_seq: torch.Tensor, state: Optional[FeedbackState] = None
                           ) -> Tuple[torch.Tensor, FeedbackState]:
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
        layer_steps = [_LayerStep(layer, i, n0 + steps - 1, *self._kv_groups(i)) for i, layer in enumerate(self.layers)]
        if state is None:
            memory = _Memory(self._groups(), batch, attn0.heads, attn0.d_k, steps, x_seq)
        else:
            memory = state.memory if state.memory.n == n0 else state.memory.fork(n0)
            memory.reserve(n0 + steps)

        training = self.training
        w = torch.softmax(self.weights, dim=0)
        proj_w, proj_b = self._memory_projection()
        grad = torch.is_grad_enabled()
        tape = _Tape(memory, n0, steps, layer_steps) if grad and n0 + steps > 1 else None
        anchor = None
        outputs = []
        for i, x in enumerate(x_seq.unbind(0)):
            t = n0 + i
            token = None
            if tape is not None and anchor is not None:
                positions = [p for s in layer_steps for p in (s.pos, s.bias)] if t == n0 + 1 else []
                token = _ReadMemory.apply(tape, t, anchor, *positions)
            views = memory.views(t) if t > 0 else None
            layer_outputs = [x]
            for li, step in enumerate(layer_steps):
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

    def forward_reference(self, x_seq: torch.Tensor) -> torch.Tensor:
        """The slow, plain loop (labml-nn's algorithm): re-stack the memory and call each layer every step."""
        mem: List[torch.Tensor] = []
        res = []
        w = self.softmax(self.weights)
        for x in x_seq.unbind(0):
            layer_outputs = [x]
            mem_tensor = torch.stack(mem) if mem else None
            for layer in self.layers:
                x = layer(x=x, key=mem_tensor, value=mem_tensor)
                layer_outputs.append(x)
            mem.append(torch.einsum('lbd,l->bd', torch.stack(layer_outputs), w))
            res.append(x)
        return self.norm(torch.stack(res))


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
    """

    def __init__(self, layer: FeedbackTransformerLayer, n_layers: int, d_model: int, heads: int):
        if layer.attn.key is not None:
            raise ValueError("FeedbackTransformerKV needs FeedbackAttention(..., is_kv_precomputed=True)")
        if heads <= 0 or d_model % heads != 0:
            raise ValueError(f"FeedbackTransformerKV: d_model={d_model} must be divisible by heads={heads}")
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

    def forward_reference(self, x_seq: torch.Tensor) -> torch.Tensor:
        """The slow, plain loop: keys/values of each memory vector kept in lists and re-stacked every step."""
        keys: List[torch.Tensor] = []
        values: List[torch.Tensor] = []
        res = []
        w = self.softmax(self.weights)
        for x in x_seq.unbind(0):
            layer_outputs = [x]
            k = torch.stack(keys) if keys else None
            v = torch.stack(values) if values else None
            for layer in self.layers:
                x = layer(x=x, key=k, value=v)
                layer_outputs.append(x)
            mem = torch.einsum('lbd,l->bd', torch.stack(layer_outputs), w)
            keys.append(self.key(mem))
            values.append(self.value(mem))
            res.append(x)
        return self.norm(torch.stack(res))
