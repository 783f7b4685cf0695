"""The fast path of the Feedback Transformer: the growing key/value memory, its autograd nodes and the step loop's
per-layer work (used by `lazylab.models.feedback`; the plain loop it equals is `reference.py`).

How this is faster than the reference and has no step limit
-----------------------------------------------------------
The memory never changes once written, so its keys and values are computed **once**, when m_τ is made (the
reference recomputes every layer's projections of the whole memory at every step in `FeedbackTransformer`),
and written into a pre-allocated buffer `[groups, batch·heads, capacity, d_k]` that only grows (capacity doubles;
no 512-step stack). Each step's attention reads a *view* of the first t slots; nothing is re-stacked.

Autograd and the in-place writes: a view read at step t is used by step t's attention, and later steps write
slots ≥ t. Those slots are outside the view, so what step t's backward reads is never changed; the reads go
through an alias whose version counter is separate (`_torch_compat.untracked_alias`), so autograd's
modified-in-place check, which would otherwise fire on any write to the shared storage, does not.

Gradients of the memory are accumulated by hand in a per-call `Tape`, with one autograd node per layer and step
for the whole attention (`AttendMemory`: scores, softmax, weighted values) and one per step for the memory
(`ReadMemory`):
- `AttendMemory` backward returns ∂q and writes ∂(position table) in place; the slot gradients
  (∂k_τ = Σ gs_τ q, ∂v_τ = Σ a_τ ∂o) are stashed as factors;
- `ReadMemory(t)` backward adds the stashed factors of step t into the slot gradients with one in-place
  batched matmul per group (for the KV model: the L layers in one product) and returns the finished gradient of
  slot t-1 to the projection that wrote it; the read of the first step also returns the position gradients.
This is correct because autograd runs these nodes backwards in time: step t+1 depends, through slot t, on all of
step t (its token makes every `AttendMemory` of step t run before `ReadMemory(t)`), so every later step has
added its share to slot t-1 before `ReadMemory(t)` runs. The tape checks this order and raises if it is ever
violated, and starts from zero in each new backward pass (retain_graph, autograd.grad).
"""
import copy
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from lazylab.models._torch_compat import backward_pass_id, softmax_backward, untracked_alias
from lazylab.models.feed_forward import FeedForward

__all__ = ['Memory', 'Tape', 'ReadMemory', 'AttendMemory', 'LayerStep']


# ----------------------------------------------------------------------------------------------------------------
# The growing key/value memory, the tape of its gradients, and the autograd nodes between them
# ----------------------------------------------------------------------------------------------------------------

class Memory:
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
        self.alias = untracked_alias(self.data)

    @property
    def capacity(self) -> int:
        return self.data.shape[2]

    def reserve(self, capacity: int):
        """Make room for `capacity` slots (at least doubling), keeping the n written ones."""
        if capacity > self.capacity:
            old = self.data
            self._alloc(max(capacity, 2 * self.capacity), old)
            self.data[:, :, :self.n] = old[:, :, :self.n]

    def fork(self, n: int) -> 'Memory':
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

    def views(self, t: int) -> tuple[torch.Tensor, ...]:
        """The first t slots of each group: `groups` views [batch·heads, t, d_k]."""
        return tuple(self.alias[g, :, :t] for g in range(self.groups))


class Tape:
    """Backward-pass accumulators of one forward call (its memory slots are n0 … n0 + steps - 1).

    - `grad [groups, batch·heads, steps, d_k]`: gradients of the slots written by this call;
    - `pos_grad[l] [heads, d_k, R]`, `bias_grad[l] [heads, 1, R]`: gradients of layer l's position terms;
    - `pending`: per group, the (left, right) factors of the current step's slot gradients, added with one
      in-place batched matmul per group when the step's read runs (for the KV model that sums the L layers'
      contributions in one product instead of L).
    """

    def __init__(self, memory: Memory, n0: int, steps: int, layer_steps: list['LayerStep']):
        self.memory = memory
        self.n0 = n0
        self.layer_steps = layer_steps
        self.grad = memory.data.new_zeros(memory.groups, memory.batch * memory.heads, steps, memory.d_k)
        self.pos_grad = [torch.zeros_like(s.pos_data) for s in layer_steps]
        self.bias_grad = [torch.zeros_like(s.bias_data) for s in layer_steps]
        self.pending: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(memory.groups)]
        self.pass_id = None  # the autograd graph task (backward pass) that last used the tape
        self.horizon = None  # t of the latest read whose backward has run in that pass

    def begin(self, t: int, is_read: bool):
        """Start from zero in a new backward pass; check that steps run backwards in time within one."""
        pass_id = backward_pass_id()
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


class ReadMemory(torch.autograd.Function):
    """The dependency edge from step t's attention to slot t-1 (`anchor`: the projections written at step t-1,
    [batch, groups·heads·d_k]); returns a 0-dim token that step t's `AttendMemory` calls take as input.

    Backward (after all of step t's attention backwards, which the token guarantees): flushes their slot
    gradients and returns the finished gradient of slot t-1 to the step that wrote it. The read of the call's
    first attending step (t = n0 + 1), which runs last, also takes the layers' position tensors and returns
    their accumulated gradients. See the module docstring for why the order is right.
    """

    @staticmethod
    def forward(ctx, tape: Tape, t: int, anchor: torch.Tensor, *positions: torch.Tensor):
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


class AttendMemory(torch.autograd.Function):
    """`_attend` as one autograd node whose backward writes the key/value/position gradients in place.

    Forward as `_attend`. Backward, with gs the score gradient [b·h, 1, t]: returns ∂q; adds qᵀgs into the
    layer's position gradients; stashes (gs, q) for the keys and (a, ∂o) for the values on the tape.
    """

    @staticmethod
    def forward(ctx, token, q, tape: Tape, step: 'LayerStep', t: int, k, v, training: bool):
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
        gs = softmax_backward(grad_a, a, -1)                                                 # [bh, 1, t]
        gs_h = gs.view(b, h, t).transpose(0, 1)                                              # [h, b, t]
        grad_q = torch.bmm(gs_h, pos.transpose(1, 2)).transpose(0, 1).reshape(b * h, 1, d)  # position part
        grad_q.baddbmm_(gs, ctx.k)                                                           # + content part
        tape.pos_grad[step.index][:, :, r:].baddbmm_(q.view(b, h, d).permute(1, 2, 0), gs_h)
        tape.bias_grad[step.index][:, :, r:] += gs_h.sum(1, keepdim=True)
        tape.stash(step.k_group, gs, q.view(b * h, 1, d))
        tape.stash(step.v_group, a if mask is None else a * mask, go)
        return grad_o.new_zeros(()), grad_q.view(b, h * d), None, None, None, None, None, None


# ----------------------------------------------------------------------------------------------------------------
# One layer at one step, for the step loop of both variants
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


class LayerStep:
    """Per-call constants of one layer's attention, with the position terms folded in once per call.

    With scale c = 1/√d_k and the query written as q' = c (W_q z + u) (one affine map), the scaled score is

        c A_τ = q'ᵀ k_τ + q'ᵀ p_δ + c (s_δ − uᵀ p_δ)

    so the per-step work is two batched matmuls; `bias [heads, 1, R]` holds c (s_δ − uᵀ p_δ) and
    `pos [heads, d_k, R]` the p_δ, for distances δ = R … 1 (column R - δ), R the longest memory of the call.
    `layer` is a `FeedbackTransformerLayer`; `index` its place in the stack; `k_group`, `v_group` the memory
    groups holding its keys and values.
    """

    def __init__(self, layer: nn.Module, index: int, max_mem: int, k_group: int, v_group: int):
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
                 training: bool, tape: Optional[Tape], token: Optional[torch.Tensor]) -> torch.Tensor:
        """One layer at one step: x [batch, d_model]; k, v: [batch·heads, t, d_k] views or None (no memory)."""
        if k is not None:
            q = F.linear(F.layer_norm(x, *self.ln_attn), self.w_q, self.b_q)     # [b, h·d]
            if token is not None:
                o = AttendMemory.apply(token, q, tape, self, t, k, v, training)
            else:
                r = self.max_mem - t
                o = _attend(q, k, v, self.pos[:, :, r:], self.bias[:, :, r:], self.heads, self.d_k,
                            self.p_attn, training)[0]
            x = x + _dropout(F.linear(o, self.w_o, self.b_o), self.p_layer, training)
        ff = _feed_forward(self.layer.feed_forward, F.layer_norm(x, *self.ln_ff), training)
        return x + _dropout(ff, self.p_layer, training)

