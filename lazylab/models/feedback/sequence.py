"""The fast path of the Feedback Transformer: the whole sequence as one autograd node, with backpropagation through
time written out (used by `lazylab.models.feedback`; the plain loop it equals is `reference.py`).

Why one node
------------
The model must run token by token, so a training step is T·L small layer steps (T steps, L layers). Recorded by
autograd, each costs a dozen graph nodes and, in the backward pass, a weight-gradient product per linear map and
step, plus the accumulation of those products into `.grad`. Here the forward loop runs with autograd off and
keeps, per step, only what the backward needs (layer inputs, LayerNorm statistics, queries, attention weights, FFN
activations). The backward loop runs the steps in reverse and computes only the gradients that carry the
recurrence: of the residual stream, the queries and the memory slots. Every weight gradient is a sum over steps
of (output gradient)ᵀ·(input), so it is left to the end and done as one matrix product over all T·B rows.

The memory
----------
Step t writes the keys and values of m_t = Σ_l softmax(w)_l x_t^l (one projection per group: 2 for
`FeedbackTransformerKV`, 2L for the original) into slot t of `Memory`, once; its attention reads the slots
lo … t-1, lo = max(0, t - N) with memory span N (0: every earlier step). In the backward pass a slot's gradient
is complete once every later step has been processed, which is exactly when the reverse loop reaches the step
that wrote it: each step adds its attention's share to the slots it read (∂k_τ += Σ_l gs_τ q_l,
∂v_τ += Σ_l a_τ ∂o_l, one batched product per group), and step t begins by sending slot t's gradient through
the projection into m_t and so into every layer's output at step t.

Relative positions
------------------
With scale c = 1/√d_k and the query written as q' = c (W_q z + u) (one affine map, folded outside the node, so
autograd takes its gradient back to W_q and u), the scaled score of the slot at distance δ is

    c A_δ = q'ᵀ k + q'ᵀ p_δ + c (s_δ − uᵀ p_δ)

so `pos [heads, d_k, R]` holds p_δ and `pos_bias [heads, 1, R]` holds c (s_δ − uᵀ p_δ), column R - δ for
δ = 1 … R, R the longest memory a step of the call attends over.

Precision
---------
Under autocast (CPU or CUDA, bfloat16 or float16) the matrix products take the autocast dtype, as autocast
would give them; the residual stream, LayerNorm, softmax, the memory mix and every gradient accumulated over
steps (memory slots, position tables, weights) are float32. The memory slots are stored in the matmul dtype:
each is written once and only read by products.
"""
import copy
import functools
from typing import Callable, NamedTuple, Optional

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from lazylab.models._torch_compat import layer_norm_backward, layer_norm_with_statistics, softmax_backward
from lazylab.models.feed_forward import FeedForward
from lazylab.models.feedback.memory import Memory

__all__ = ['SequencePlan', 'run_sequence']

# Activations that act elementwise: their derivative is taken for all steps at once, in the backward pass.
_ELEMENTWISE = (nn.ReLU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Identity, nn.LeakyReLU, nn.ELU, nn.Softplus,
                nn.Mish, nn.Hardswish, nn.Hardtanh)

# Per-layer tensors, in this order among the node's inputs (None where a layer has none).
_LAYER_KEYS = ('ln1_w', 'ln1_b', 'wq', 'bq', 'pos', 'pos_bias', 'wo', 'bo',
               'ln2_w', 'ln2_b', 'w1', 'b1', 'wv', 'bv', 'w2', 'b2')
_WEIGHTS = ('wq', 'wo', 'w1', 'wv', 'w2')
_BIASES = ('bq', 'bo', 'b1', 'bv', 'b2')
# Steps whose shares of the slot gradients are gathered before they are added (`_SlotGradients`).
BLOCK = 16


def by_hand(ff: nn.Module) -> bool:
    """Whether an FFN is done by hand: our `FeedForward` or labml-nn's (the same attributes) with an elementwise
    activation. Any other module is called as it is, with autograd, step by step."""
    shaped = isinstance(ff, FeedForward) or (type(ff).__name__ == 'FeedForward' and hasattr(ff, 'layer1'))
    return shaped and isinstance(ff.activation, _ELEMENTWISE)


class _Layer:
    """What one layer contributes to a call: its constants and its tensors (see `tensors`)."""

    def __init__(self, layer: nn.Module, index: int, k_group: int, v_group: int, attends: bool):
        attn, ff = layer.attn, layer.feed_forward
        self.index, self.k_group, self.v_group, self.attends = index, k_group, v_group, attends
        self.p_attn, self.p_layer = attn.dropout.p, layer.dropout.p
        self.eps1, self.eps2 = layer.norm_self_attn.eps, layer.norm_ff.eps
        self.ff = ff
        self.by_hand = by_hand(ff)
        if self.by_hand:
            self.activation, self.is_gated, self.p_hidden = ff.activation, ff.is_gated, ff.dropout.p
        # A module FFN's own parameters are inputs of the node too, so that their gradients reach them.
        self.extra = [] if self.by_hand else [p for p in ff.parameters() if p.requires_grad]

    def tensors(self, layer: nn.Module, R: int) -> list[Optional[torch.Tensor]]:
        """The layer's tensors in `_LAYER_KEYS` order, then `extra`; the query map and the position tables folded
        as the module docstring says (differentiably: autograd takes their gradients back to the parameters)."""
        attn, ff = layer.attn, layer.feed_forward
        t = dict.fromkeys(_LAYER_KEYS)
        if self.attends:
            c = attn.scale
            u = attn.query_pos_bias                                                   # [h, d]
            t['ln1_w'], t['ln1_b'] = layer.norm_self_attn.weight, layer.norm_self_attn.bias
            t['wq'] = attn.query.linear.weight * c
            t['bq'] = u.reshape(-1) * c
            if attn.query.linear.bias is not None:
                t['bq'] = t['bq'] + attn.query.linear.bias * c
            p = attn.key_pos_embeddings[attn.P - R:]                                  # [R, h, d]
            s = attn.key_pos_bias[attn.P - R:]                                        # [R, h]
            t['pos'] = p.permute(1, 2, 0)                                             # [h, d, R]
            t['pos_bias'] = ((s - torch.einsum('rhd,hd->rh', p, u)) * c).t().unsqueeze(1)   # [h, 1, R]
            t['wo'], t['bo'] = attn.output.weight, attn.output.bias
        t['ln2_w'], t['ln2_b'] = layer.norm_ff.weight, layer.norm_ff.bias
        if self.by_hand:
            t['w1'], t['b1'] = ff.layer1.weight, ff.layer1.bias
            t['w2'], t['b2'] = ff.layer2.weight, ff.layer2.bias
            if ff.is_gated:
                t['wv'], t['bv'] = ff.linear_v.weight, ff.linear_v.bias
        return [t[k] for k in _LAYER_KEYS] + self.extra


class SequencePlan:
    """One call's constants: sizes, memory, span, dtypes, and the layout of the node's tensor inputs.

    Args:
        model: a `FeedbackTransformer` or `FeedbackTransformerKV` (its `_kv_groups`, `_memory_projection`).
        memory: the key/value memory, holding n0 slots and room for n0 + steps.
        steps: T, the steps of this call.
        span: N, the memory span (0: every earlier step).
        compute_dtype: the dtype of the matrix products (the autocast dtype under autocast).
        state_dtype: of the residual stream and the accumulated gradients (float32 or wider).
        out_dtype: of the returned outputs.
        autocast: whether the caller runs under autocast (a module FFN is then called under it too).
        positions: R, the distances the position tables are folded for (default: what this call needs); the step
            function folds them once for every distance and reuses the plan (`continued`).

    Raises:
        ValueError: a step would attend over more memory than a layer's n_positions.
    """

    def __init__(self, model: nn.Module, memory: Memory, steps: int, span: int, *, compute_dtype: torch.dtype,
                 state_dtype: torch.dtype, out_dtype: torch.dtype, autocast: bool, positions: Optional[int] = None):
        layer0 = model.layers[0]
        self.model = model
        self.memory, self.n0, self.steps, self.span = memory, memory.n, steps, span
        self.heads, self.d_k = layer0.attn.heads, layer0.attn.d_k
        self.groups, self.n_layers = memory.groups, len(model.layers)
        self.training = model.training
        self.cd, self.sd, self.out_dtype, self.autocast = compute_dtype, state_dtype, out_dtype, autocast
        needed = self._check_memory()                           # the longest memory a step attends over
        self.R = needed if positions is None else positions
        # The first step of the call that attends (a sequence's first step has no memory), and whether a slot
        # written here is read here (only then do the memory mix and the projection get gradients).
        self.first_attending = 0 if self.n0 > 0 else 1
        self.reads_own_slots = steps > 1
        self.layers = [_Layer(layer, i, *model._kv_groups(i), self.R > 0) for i, layer in enumerate(model.layers)]
        for lp in self.layers:  # its place among the layers reading its key group (and so its value group)
            lp.user = sum(other.k_group == lp.k_group for other in self.layers[:lp.index])
        mix = torch.softmax(model.weights, dim=0)
        proj_w, proj_b = model._memory_projection()
        self.tensors: list[Optional[torch.Tensor]] = [mix, proj_w, proj_b]
        if not self.reads_own_slots:
            # The slot is still written (a later call may read it), but nothing here depends on it.
            self.detached = [None if t is None else t.detach() for t in self.tensors]
            self.tensors = [None, None, None]
        self.offsets = []
        for layer, plan in zip(model.layers, self.layers):
            self.offsets.append(len(self.tensors))
            self.tensors += plan.tensors(layer, self.R)
        self._prepared = None

    def _check_memory(self) -> int:
        longest = self.n0 + self.steps - 1                      # the memory of the call's last step
        needed = min(longest, self.span) if self.span else longest
        for layer in self.model.layers:
            layer.attn.check_memory_length(needed)
        return needed

    def continued(self, memory: Memory, steps: int) -> 'SequencePlan':
        """This plan (its tensors and their prepared forms) for a later call on `memory` with the same number of
        steps, when the position tables cover it (used by the step function, one token per call)."""
        self.forward_weights(self.tensors)  # prepared once, shared by the copies
        other = copy.copy(self)
        other.memory, other.n0 = memory, memory.n
        if other.n0 == 0 or steps != self.steps or other._check_memory() > self.R:
            raise ValueError('SequencePlan.continued: a plan for another kind of call')
        return other

    def forward_weights(self, tensors) -> list[dict]:
        """The layers' weights prepared for the forward loop (`_forward_weights`), once per plan."""
        if self._prepared is None:
            self._prepared = _forward_weights(self, tensors)
        return self._prepared

    def mix_and_projection(self, tensors) -> list[Optional[torch.Tensor]]:
        return list(tensors[:3]) if self.reads_own_slots else self.detached

    def layer_tensors(self, tensors, i: int) -> dict[str, Optional[torch.Tensor]]:
        start = self.offsets[i]
        return dict(zip(_LAYER_KEYS, tensors[start:start + len(_LAYER_KEYS)]))

    def window(self, t: int) -> tuple[int, int]:
        """(lo, n): step t attends over the n slots lo … t-1."""
        lo = max(0, t - self.span) if self.span else 0
        return lo, t - lo


def run_sequence(plan: SequencePlan, x_seq: torch.Tensor) -> torch.Tensor:
    """The last layer's outputs [T, B, d_model] for x_seq [T, B, d_model]; writes the T slots into plan.memory.

    With gradients needed this is one autograd node (`_Sequence`); without, the same loop keeps nothing.
    """
    needs_grad = torch.is_grad_enabled() and (x_seq.requires_grad or any(
        t is not None and t.requires_grad for t in plan.tensors))
    with torch.autocast(x_seq.device.type, enabled=False):
        if needs_grad:
            return _Sequence.apply(plan, x_seq, *plan.tensors)
        with torch.no_grad():
            return _forward(plan, x_seq, plan.tensors, None).to(plan.out_dtype)


def _linear(x: torch.Tensor, w_t: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    """x wᵀ + b, given w_t = wᵀ contiguous (for a few rows MKL is several times faster so than with w)."""
    return torch.mm(x, w_t) if b is None else torch.addmm(b, x, w_t)


def _caster(dtype: torch.dtype, needed: bool):
    """t ↦ t.to(dtype), or the identity when every tensor has that dtype already (a call saved per use)."""
    return (lambda t: t.to(dtype)) if needed else (lambda t: t)


def _keep_mask(like: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout's multiplier: 0 with probability p, else 1 / (1 - p)."""
    return torch.empty_like(like).bernoulli_(1 - p).div_(1 - p)


def _activate(activation: nn.Module, u: torch.Tensor) -> torch.Tensor:
    return torch.relu(u) if type(activation) is nn.ReLU else activation(u)


class _AttentionStep(NamedTuple):
    """What the attention half of one layer at one attending step keeps for the backward."""
    stat: tuple                      # LayerNorm 1's (mean, rstd) of the layer input x
    z: torch.Tensor                  # LN1(x), in the matmul dtype [B, D]
    q: torch.Tensor                  # the query [B, H·d]
    a: torch.Tensor                  # the attention weights [B, H, n]
    mask: Optional[torch.Tensor]     # attention dropout's keep mask (scaled), None without dropout
    a_drop: torch.Tensor             # the weights after it
    o: torch.Tensor                  # the attention's output before W_o [B, H·d]
    drop: Optional[torch.Tensor]     # the layer dropout's keep mask on W_o o + b_o


class _FfnStep(NamedTuple):
    """What the FFN half of one layer at one step keeps for the backward (u … drop_h: an FFN computed here;
    graph: a module FFN's (input, output), recorded by autograd)."""
    h: torch.Tensor                  # the half's input (x after the attention half) [B, D]
    stat: tuple                      # LayerNorm 2's (mean, rstd) of h
    z: torch.Tensor                  # LN2(h), in the matmul dtype
    drop: Optional[torch.Tensor]     # the layer dropout's keep mask on the FFN output
    u: Optional[torch.Tensor] = None       # the first linear map's output [B, d_ff]
    act: Optional[torch.Tensor] = None     # its activation
    gate: Optional[torch.Tensor] = None    # the gate's linear map (gated FFNs)
    hidden: Optional[torch.Tensor] = None  # the second map's input, after the gate and dropout
    drop_h: Optional[torch.Tensor] = None  # hidden dropout's keep mask
    graph: Optional[tuple] = None


class _Saved:
    """What the forward keeps for the backward: per step (the residual stream, the memory vector) and, per layer,
    one record per step of each half (the attention's for the attending steps only)."""

    def __init__(self, n_layers: int):
        self.xs: list[torch.Tensor] = []      # per step: the layer inputs and the last output, [L+1, B, D]
        self.inputs: list[list[torch.Tensor]] = []  # the same, as the list of its L+1 tensors
        self.m: list[torch.Tensor] = []       # per step: the memory vector m_t [B, D]
        self.attention: list[list[_AttentionStep]] = [[] for _ in range(n_layers)]
        self.ffn: list[list[_FfnStep]] = [[] for _ in range(n_layers)]

    def over_steps(self, half: str, li: int, field: str) -> list:
        """One field of layer li's records of `half` ('attention' or 'ffn'), as a list over steps."""
        return [getattr(step, field) for step in getattr(self, half)[li]]


class _Dims(NamedTuple):
    """The sizes and dtype casts every half-step uses."""
    B: int
    H: int
    d: int
    sd: torch.dtype
    to_cd: Callable[[torch.Tensor], torch.Tensor]  # into the matmul dtype (the identity when it is the state dtype)
    to_sd: Callable[[torch.Tensor], torch.Tensor]  # from the matmul dtype into the state dtype
    training: bool


def _forward_weights(plan: SequencePlan, tensors) -> list[dict]:
    """Per layer: weights transposed once per call (x Wᵀ with a contiguous Wᵀ) in the matmul dtype, biases in it
    too, LayerNorm parameters in the state dtype; then the memory mix and projection."""
    cd, sd = plan.cd, plan.sd
    mix, proj_w, proj_b = plan.mix_and_projection(tensors)
    out = [{'mix': mix.to(sd)[None], 'proj': proj_w.t().contiguous().to(cd),
            'proj_b': None if proj_b is None else proj_b.to(cd)}]
    for i, lp in enumerate(plan.layers):
        p = plan.layer_tensors(tensors, i)
        w = {key: None if p[key] is None else p[key].t().contiguous().to(cd) for key in _WEIGHTS}
        w.update({key: None if p[key] is None else p[key].to(cd) for key in _BIASES + ('pos', 'pos_bias')})
        w['ln1'] = tuple(None if p[k] is None else p[k].to(sd) for k in ('ln1_w', 'ln1_b')) + (lp.eps1,)
        w['ln2'] = tuple(None if p[k] is None else p[k].to(sd) for k in ('ln2_w', 'ln2_b')) + (lp.eps2,)
        out.append(w)
    return out


def _forward(plan: SequencePlan, x_seq: torch.Tensor, tensors, saved: Optional[_Saved]) -> torch.Tensor:
    """The step loop; returns the last layer's outputs [T, B, D] in the state dtype. `saved`: where to keep what
    the backward needs (None: keep nothing)."""
    T, B, D = x_seq.shape
    L, cd, sd, R, n0 = plan.n_layers, plan.cd, plan.sd, plan.R, plan.n0
    mem = plan.memory
    kv_groups = mem.data.unbind(0)                                # per group [B·H, capacity, d]
    top, *ws = plan.forward_weights(tensors)
    w_row, proj_t, proj_b = top['mix'], top['proj'], top['proj_b']   # [1, L+1], [D, G·H·d], [G·H·d]
    dims = _Dims(B, plan.heads, plan.d_k, sd, _caster(cd, cd != sd), _caster(sd, cd != sd), plan.training)
    to_sd = _caster(sd, x_seq.dtype != sd)  # (the input's dtype may be neither)
    record = saved is not None
    outputs = []
    for i in range(T):
        t = n0 + i
        lo, n = plan.window(t)
        x = to_sd(x_seq[i])
        xs = [x]
        for lp, w in zip(plan.layers, ws):
            if n:
                k = kv_groups[lp.k_group].narrow(1, lo, n)                             # [B·H, n, d]
                v = kv_groups[lp.v_group].narrow(1, lo, n)
                h, step = _attention_forward(lp, w, x, k, v, R - n, dims)
                if record:
                    saved.attention[lp.index].append(step)
            else:
                h = x
            x, step = _ffn_forward(plan, lp, w, h, dims, record)
            xs.append(x)
            if record:
                saved.ffn[lp.index].append(step)
        # The memory vector and its keys and values, into slot t.
        stack = torch.stack(xs)                                                         # [L+1, B, D]
        m = torch.mm(w_row, stack.view(L + 1, B * D)).view(B, D)
        mem.write(_linear(dims.to_cd(m), proj_t, proj_b))
        if record:
            saved.xs.append(stack)
            saved.inputs.append(xs)
            saved.m.append(m)
        outputs.append(x)
    return torch.stack(outputs)


def _attention_forward(lp: _Layer, w: dict, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c0: int,
                       dims: _Dims) -> tuple[torch.Tensor, _AttentionStep]:
    """The attention half of one layer at one step, h = x + drop ⊙ (W_o Attend(q', memory) + b_o), over the n
    slots k, v [B·H, n, d] whose position columns start at c0; returns h and what the backward needs."""
    B, H, d, sd, to_cd = dims.B, dims.H, dims.d, dims.sd, dims.to_cd
    n = k.shape[1]
    z1, mu1, rs1 = layer_norm_with_statistics(x, *w['ln1'])
    z1 = to_cd(z1)
    q = _linear(z1, w['wq'], w['bq'])                                                   # [B, H·d]
    # (q by head made contiguous first: baddbmm is several times slower on the strided view)
    position = torch.baddbmm(w['pos_bias'].narrow(2, c0, n), q.view(B, H, d).transpose(0, 1).contiguous(),
                             w['pos'].narrow(2, c0, n))                                   # [H, B, n]
    scores = torch.bmm(q.view(B * H, 1, d), k.transpose(1, 2)).view(B, H, n) + position.transpose(0, 1)
    a = torch.softmax(scores, dim=-1, dtype=sd)                                           # [B, H, n]
    a_drop, attn_mask = a, None
    if dims.training and lp.p_attn > 0:
        attn_mask = _keep_mask(a, lp.p_attn)
        a_drop = a * attn_mask
    o = torch.bmm(to_cd(a_drop.view(B * H, 1, n)), v).view(B, H * d)
    attn_out = _linear(o, w['wo'], w['bo'])
    drop1 = None
    if dims.training and lp.p_layer > 0:
        drop1 = _keep_mask(attn_out, lp.p_layer)
        attn_out = attn_out * drop1
    return x + attn_out, _AttentionStep((mu1, rs1), z1, q, a, attn_mask, a_drop, o, drop1)


def _ffn_forward(plan: SequencePlan, lp: _Layer, w: dict, h: torch.Tensor, dims: _Dims, record: bool
                 ) -> tuple[torch.Tensor, _FfnStep]:
    """The FFN half of one layer at one step, x' = h + drop ⊙ FFN(LN2(h)); returns x' and what the backward
    needs (`record`: a module FFN's graph is recorded by autograd)."""
    z2, mu2, rs2 = layer_norm_with_statistics(h, *w['ln2'])
    z2 = dims.to_cd(z2)
    u = act = gate = hidden = drop_h = graph = None
    if lp.by_hand:
        u = _linear(z2, w['w1'], w['b1'])                                                 # [B, d_ff]
        act = hidden = _activate(lp.activation, u)
        if lp.is_gated:
            gate = _linear(z2, w['wv'], w['bv'])
            hidden = act * gate
        if dims.training and lp.p_hidden > 0:
            drop_h = _keep_mask(hidden, lp.p_hidden)
            hidden = hidden * drop_h
        ff_out = _linear(hidden, w['w2'], w['b2'])
    else:
        with torch.enable_grad() if record else torch.no_grad(), \
                torch.autocast(h.device.type, dtype=plan.cd, enabled=plan.autocast):
            z_in = z2.detach().requires_grad_(record)
            ff_graph = lp.ff(z_in)
        ff_out = ff_graph.detach()
        graph = (z_in, ff_graph)
    drop2 = None
    if dims.training and lp.p_layer > 0:
        drop2 = _keep_mask(ff_out, lp.p_layer)
        ff_out = ff_out * drop2
    return h + ff_out, _FfnStep(h, (mu2, rs2), z2, drop2, u, act, gate, hidden, drop_h, graph)


class _Sequence(torch.autograd.Function):
    """`_forward` as one node; backward: the reverse step loop (`_backward`), then every weight gradient as one
    product (`_parameter_gradients`)."""

    @staticmethod
    def forward(ctx, plan: SequencePlan, x_seq: torch.Tensor, *tensors):
        saved = _Saved(plan.n_layers)
        y = _forward(plan, x_seq, tensors, saved)
        ctx.plan, ctx.saved, ctx.kv_data, ctx.x_dtype = plan, saved, plan.memory.data, x_seq.dtype
        ctx.present = [t is not None for t in tensors]
        ctx.save_for_backward(*[t for t in tensors if t is not None])
        return y.to(plan.out_dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        it = iter(ctx.saved_tensors)
        tensors = [next(it) if present else None for present in ctx.present]
        with torch.autocast(grad_y.device.type, enabled=False):
            grad_x, *grads = _backward(ctx.plan, ctx.saved, ctx.kv_data, tensors, grad_y)
        return (None, grad_x.to(ctx.x_dtype), *grads)


class _SlotGradients:
    """∂ of the memory slots a call wrote (local index 0 … T-1 for slots n0 … n0+T-1), gathered block by block.

    Each attending layer-step gives each group it reads a share left ⊗ right per batch·head: ∂k_τ += gs_τ q
    and ∂v_τ += a_τ ∂o over the slots τ it read. Adding every share into the slots at once would touch all of
    them at every step, through a strided batched product that PyTorch runs as one small product per batch·head.
    Instead the shares of a block of steps are kept as rows of `left [G·B·H, rows, width]` and
    `right [G·B·H, rows, d]`, one row per step and layer reading the group: a slot inside the block takes them
    with one product when the reverse loop reaches it (`slot`), and at the end of the block one product adds
    them to all the slots before it (`end_block`).
    """

    def __init__(self, plan: 'SequencePlan', batch: int, block: int, device: torch.device):
        G, BH, T, d = plan.groups, batch * plan.heads, plan.steps, plan.d_k
        self.plan, self.block = plan, block
        self.users = len(plan.layers) // (G // 2)            # layers reading each group: L (KV) or 1 (original)
        rows = block * self.users
        width = min(T, plan.span + block) if plan.span else T  # slots a block's steps read
        self.far = torch.zeros(G * BH, T, d, dtype=plan.sd, device=device)
        self.left = torch.empty(G * BH, rows, width, dtype=plan.sd, device=device)
        self.right = torch.empty(G * BH, rows, d, dtype=plan.sd, device=device)
        self.left_of = self.left.view(G, BH, rows, width).unbind(0)     # per group [B·H, rows, width]
        self.right_of = self.right.view(G, BH, rows, d).unbind(0)       # per group [B·H, rows, d]
        self.G, self.BH, self.d = G, BH, d

    def start_block(self, s0: int, s1: int):
        """Begin the steps s0 … s1-1 (local); they read the slots base … s1-1."""
        plan = self.plan
        self.s0, self.s1 = s0, s1
        self.base = max(plan.window(plan.n0 + s0)[0], plan.n0) - plan.n0
        self.left[:, :, :s1 - self.base].zero_()
        self.right.zero_()

    def add_share(self, group: int, user: int, i: int, lo: int, left: torch.Tensor, right: torch.Tensor):
        """Step i's (local) share for `group` from its `user`-th reader: left [B·H, n] over the slots lo, lo+1, …
        (absolute), right [B·H, d]."""
        n0 = self.plan.n0
        j0 = max(lo, n0)
        if j0 >= n0 + i:
            return
        row = (i - self.s0) * self.users + user
        if j0 > lo:
            left = left.narrow(1, j0 - lo, n0 + i - j0)
        self.left_of[group].select(1, row).narrow(1, j0 - n0 - self.base, n0 + i - j0).copy_(left)
        self.right_of[group].select(1, row).copy_(right)

    def slot(self, i: int) -> torch.Tensor:
        """The finished gradient of slot i (every step after i done): [G, B·H, d]."""
        left = self.left
        # left[:, :, c] as [G·B·H, 1, rows] with stride 1 on its size-1 dimension: a column-major block that BLAS
        # reads in place (as a plain strided view it would be copied, or multiplied by a slow path).
        row = left.as_strided((left.shape[0], 1, left.shape[1]), (left.stride(0), 1, left.stride(1)),
                              left.storage_offset() + i - self.base)
        near = torch.bmm(row, self.right)                                               # [G·B·H, 1, d]
        return (self.far[:, i] + near.squeeze(1)).view(self.G, self.BH, self.d)

    def end_block(self):
        """Add the block's shares to the slots before it."""
        if self.s0 > self.base:
            c = self.s0 - self.base
            self.far[:, self.base:self.s0] += torch.bmm(self.left[:, :, :c].transpose(1, 2), self.right)


def _backward(plan: SequencePlan, saved: _Saved, kv_data: torch.Tensor, tensors, grad_y: torch.Tensor):
    """The reverse step loop: the gradients of x_seq, then (`_parameter_gradients`) of the node's tensors."""
    T, B, D = grad_y.shape
    H, d, L, G = plan.heads, plan.d_k, plan.n_layers, plan.groups
    cd, sd, R, n0, first = plan.cd, plan.sd, plan.R, plan.n0, plan.first_attending
    device = grad_y.device
    kv_groups = kv_data.unbind(0)
    grad_y = grad_y.to(sd)
    dims = _Dims(B, H, d, sd, _caster(cd, cd != sd), _caster(sd, cd != sd), plan.training)
    slots = None
    if plan.reads_own_slots:
        mix, proj_w, _ = tensors[:3]
        w_mix = mix.tolist()
        proj = proj_w.to(cd)                                                      # [G·H·d, D]
        slots = _SlotGradients(plan, B, BLOCK, device)
    ws, position_grad, queries, act_grad = [], [], [], []
    for i, lp in enumerate(plan.layers):
        p = plan.layer_tensors(tensors, i)
        w = {key: None if p[key] is None else p[key].to(cd) for key in _WEIGHTS}
        # pᵀ per head, contiguous: the product with the strided view is several times slower
        w['posT'] = None if p['pos'] is None else p['pos'].transpose(1, 2).contiguous().to(cd)
        w['ln1_w'] = None if p['ln1_w'] is None else p['ln1_w'].to(sd)
        w['ln2_w'] = None if p['ln2_w'] is None else p['ln2_w'].to(sd)
        ws.append(w)
        attends = p['pos'] is not None
        # ∂ of the position tables, pos and pos_bias in one [H, d+1, R]: the product of g_s with [q; 1]
        position_grad.append(torch.zeros(H, d + 1, R, dtype=sd, device=device) if attends else None)
        if attends:  # [q; 1] by head for every attending step: [steps, H, d+1, B]
            q_all = torch.stack(saved.over_steps('attention', i, 'q')).to(sd).view(-1, B, H, d).permute(0, 2, 3, 1)
            queries.append(torch.cat([q_all, q_all.new_ones(q_all.shape[0], H, 1, B)], dim=2).unbind(0))
        else:
            queries.append(None)
        deriv = _activation_derivative(lp, saved, i) if lp.by_hand else None
        act_grad.append(None if deriv is None else deriv.unbind(0))

    # Per layer, over steps (in reverse time): the gradients at the linear maps' outputs, for the products at the
    # end; and the module FFNs' parameter gradients, summed.
    grads = {key: [[] for _ in range(L)] for key in ('ff_out', 'u', 'gate', 'z2', 'attn_out', 'q', 'z1')}
    ff_param_grads: list[Optional[list[torch.Tensor]]] = [None] * L
    g_slots, g_mem = [], []                               # per step < T-1, reversed: ∂kv_t [B, G·H·d], ∂m_t [B, D]
    grad_x = torch.empty(T, B, D, dtype=sd, device=device)

    for i in reversed(range(T)):
        t = n0 + i
        lo, n = plan.window(t)
        g = grad_y[i]
        dm = None
        if slots is not None and (i == T - 1 or i == slots.s0 - 1):
            slots.start_block(max(0, i + 1 - BLOCK), i + 1)
        if slots is not None and i < T - 1:
            # Slot t is complete (every later step has added its share): through the projection into m_t.
            g_kv = slots.slot(i).view(G, B, H, d).transpose(0, 1).reshape(B, G * H * d)
            dm = dims.to_sd(torch.mm(dims.to_cd(g_kv), proj))
            g_slots.append(g_kv)
            g_mem.append(dm)
            g = torch.add(g, dm, alpha=w_mix[L])
        for lp, w in zip(reversed(plan.layers), reversed(ws)):
            li = lp.index
            g_h = _ffn_backward(lp, w, g, saved.ffn[li][i], None if act_grad[li] is None else act_grad[li][i],
                                grads, ff_param_grads, dims)
            if n:
                j = i - first                                                            # attending-step index
                k = kv_groups[lp.k_group].narrow(1, lo, n)                              # [B·H, n, d]
                v = kv_groups[lp.v_group].narrow(1, lo, n)
                step = saved.attention[li][j]
                g, g_s, g_o = _attention_backward(lp, w, g_h, step, saved.inputs[i][li], k, v, R - n,
                                                  queries[li][j], position_grad[li], grads, dims)
                if slots is not None:  # this step's shares of the gradients of the slots it read
                    slots.add_share(lp.k_group, lp.user, i, lo, g_s.view(B * H, n), step.q.view(B * H, d))
                    slots.add_share(lp.v_group, lp.user, i, lo, step.a_drop.view(B * H, n), g_o.view(B * H, d))
            else:
                g = g_h
            if dm is not None:
                g = torch.add(g, dm, alpha=w_mix[li])
        grad_x[i] = g
        if slots is not None and i == slots.s0:
            slots.end_block()

    return (grad_x, *_parameter_gradients(plan, saved, tensors, grads, position_grad, ff_param_grads,
                                          g_slots, g_mem))


def _ffn_backward(lp: _Layer, w: dict, g: torch.Tensor, step: _FfnStep, act_grad: Optional[torch.Tensor],
                  grads: dict, ff_param_grads: list, dims: _Dims) -> torch.Tensor:
    """The FFN half's backward at one step: from ∂x' (`g`) to ∂h; keeps the gradients at its linear maps' outputs
    in `grads` (a module FFN's parameter gradients, summed over steps, in `ff_param_grads`)."""
    li, to_cd, to_sd = lp.index, dims.to_cd, dims.to_sd
    g_f = g if step.drop is None else g * step.drop
    if lp.by_hand:
        g_hidden = torch.mm(to_cd(g_f), w['w2'])                                         # [B, d_ff]
        if step.drop_h is not None:
            g_hidden = g_hidden * step.drop_h
        g_u = g_hidden if act_grad is None else g_hidden * act_grad
        g_z = torch.mm(g_u, w['w1'])
        if lp.is_gated:
            g_gate = g_hidden * step.act
            g_z = torch.addmm(g_z, g_gate, w['wv'])
            grads['gate'][li].append(g_gate)
        grads['ff_out'][li].append(g_f)
        grads['u'][li].append(g_u)
    else:
        z_in, ff_graph = step.graph
        params = lp.extra
        found = torch.autograd.grad(ff_graph, [z_in, *params], g_f.to(ff_graph.dtype), allow_unused=True)
        g_z = found[0]
        step_grads = [torch.zeros_like(p) if f is None else f for p, f in zip(params, found[1:])]
        ff_param_grads[li] = step_grads if ff_param_grads[li] is None else [
            a + b for a, b in zip(ff_param_grads[li], step_grads)]
    grads['z2'][li].append(g_z)
    mu2, rs2 = step.stat
    return g + layer_norm_backward(to_sd(g_z), step.h, mu2, rs2, w['ln2_w'])


def _attention_backward(lp: _Layer, w: dict, g_h: torch.Tensor, step: _AttentionStep, x: torch.Tensor,
                        k: torch.Tensor, v: torch.Tensor, c0: int, query: torch.Tensor,
                        position_grad: torch.Tensor, grads: dict, dims: _Dims
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention half's backward at one step: from ∂h to ∂x (the half's input `x`), adding to the position
    tables' gradient and keeping the gradients at its linear maps' outputs in `grads`. Returns ∂x, and ∂ of the
    scores [B, H, n] and of o [B, H·d], from which the caller takes the shares of the slots the step read."""
    li, B, H, d, to_cd, to_sd = lp.index, dims.B, dims.H, dims.d, dims.to_cd, dims.to_sd
    n = k.shape[1]
    g_attn_out = g_h if step.drop is None else g_h * step.drop
    g_o = torch.mm(to_cd(g_attn_out), w['wo'])                                           # [B, H·d]
    g_a = torch.bmm(g_o.view(B * H, 1, d), v.transpose(1, 2)).view(B, H, n)
    if step.mask is not None:
        g_a = g_a * step.mask
    g_s = softmax_backward(to_sd(g_a), step.a, -1)                                      # [B, H, n]: ∂(c·A)
    g_s_c = to_cd(g_s)
    g_q = (torch.bmm(g_s_c.view(B * H, 1, n), k).view(B, H, d)
           + torch.bmm(g_s_c.transpose(0, 1), w['posT'].narrow(1, c0, n)).transpose(0, 1))
    g_q = g_q.reshape(B, H * d)
    # (into a new tensor, then added: a product into the strided slice would run per head)
    position_grad.narrow(2, c0, n).add_(torch.bmm(query, g_s.transpose(0, 1)))
    g_z = torch.mm(g_q, w['wq'])
    mu1, rs1 = step.stat
    grads['attn_out'][li].append(g_attn_out)
    grads['q'][li].append(g_q)
    grads['z1'][li].append(g_z)
    return g_h + layer_norm_backward(to_sd(g_z), x, mu1, rs1, w['ln1_w']), g_s, g_o


def _activation_derivative(lp: _Layer, saved: _Saved, li: int) -> Optional[torch.Tensor]:
    """∂hidden/∂u for all steps at once, [T, B, d_ff]: act'(u), times the gate when gated; None for the identity
    without a gate."""
    gate = torch.stack(saved.over_steps('ffn', li, 'gate')) if lp.is_gated else None
    if type(lp.activation) is nn.Identity:
        return gate
    u = torch.stack(saved.over_steps('ffn', li, 'u'))
    if type(lp.activation) is nn.ReLU:
        deriv = (u > 0).to(u.dtype)
    else:
        with torch.enable_grad():
            u_ = u.detach().requires_grad_()
            (deriv,) = torch.autograd.grad(lp.activation(u_).sum(), [u_])
    return deriv if gate is None else deriv * gate


def _parameter_gradients(plan: SequencePlan, saved: _Saved, tensors, grads, position_grad, ff_param_grads,
                         g_slots, g_mem) -> list[Optional[torch.Tensor]]:
    """Every tensor input's gradient, in the node's order; each weight's as one product over all steps' rows."""
    sd, first = plan.sd, plan.first_attending

    def rows(items: list, reverse: bool) -> torch.Tensor:
        """A list over steps (the backward keeps them in reverse time) as one [steps·B, features]."""
        return torch.stack(items[::-1] if reverse else items).flatten(0, 1)

    def weight(g_out: list, inputs: list, like: Optional[torch.Tensor]):
        if like is None:
            return None
        # a sum over all steps' rows: in the state dtype (float32 under autocast)
        return torch.mm(rows(g_out, True).to(sd).t(), rows(inputs, False).to(sd)).to(like.dtype)

    def bias(g_out: list, like: Optional[torch.Tensor]):
        return None if like is None else rows(g_out, True).sum(0, dtype=sd).to(like.dtype)

    def norm(g_z: list, inputs: list, stats: list, w_like, b_like):
        """LayerNorm weight and bias: Σ ∂z ⊙ x̂ and Σ ∂z over all rows, x̂ = (x − mean)·rstd."""
        g = rows(g_z, True).to(sd)
        x_hat = (rows(inputs, False) - rows([s[0] for s in stats], False)) * rows([s[1] for s in stats], False)
        gw = None if w_like is None else (g * x_hat).sum(0).to(w_like.dtype)
        gb = None if b_like is None else g.sum(0).to(b_like.dtype)
        return gw, gb

    out: list[Optional[torch.Tensor]] = [None, None, None]
    if plan.reads_own_slots:
        mix, proj_w, proj_b = tensors[:3]
        dm = torch.stack(g_mem[::-1])                                             # [T-1, B, D]
        out[0] = torch.einsum('tbd,tlbd->l', dm, torch.stack(saved.xs[:-1])).to(mix.dtype)
        out[1] = weight(g_slots, saved.m[:-1], proj_w)
        out[2] = bias(g_slots, proj_b)
    T = len(saved.xs)
    for i, lp in enumerate(plan.layers):
        p = plan.layer_tensors(tensors, i)
        g = dict.fromkeys(_LAYER_KEYS)
        if lp.attends:
            inputs = [saved.xs[s][i] for s in range(first, T)]
            attention = functools.partial(saved.over_steps, 'attention', i)  # a field over the attending steps
            g['ln1_w'], g['ln1_b'] = norm(grads['z1'][i], inputs, attention('stat'), p['ln1_w'], p['ln1_b'])
            g['wq'], g['bq'] = weight(grads['q'][i], attention('z'), p['wq']), bias(grads['q'][i], p['bq'])
            g['wo'] = weight(grads['attn_out'][i], attention('o'), p['wo'])
            g['bo'] = bias(grads['attn_out'][i], p['bo'])
            d = p['pos'].shape[1]
            g['pos'] = position_grad[i][:, :d].to(p['pos'].dtype)
            g['pos_bias'] = position_grad[i][:, d:].to(p['pos_bias'].dtype)
        ffn = functools.partial(saved.over_steps, 'ffn', i)  # a field over the steps
        g['ln2_w'], g['ln2_b'] = norm(grads['z2'][i], ffn('h'), ffn('stat'), p['ln2_w'], p['ln2_b'])
        if lp.by_hand:
            g['w1'], g['b1'] = weight(grads['u'][i], ffn('z'), p['w1']), bias(grads['u'][i], p['b1'])
            g['w2'] = weight(grads['ff_out'][i], ffn('hidden'), p['w2'])
            g['b2'] = bias(grads['ff_out'][i], p['b2'])
            if lp.is_gated:
                g['wv'], g['bv'] = weight(grads['gate'][i], ffn('z'), p['wv']), bias(grads['gate'][i], p['bv'])
        out += [g[k] for k in _LAYER_KEYS]
        out += ff_param_grads[i] or []
    return out
