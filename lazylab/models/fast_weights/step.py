"""Generation step functions of the fast-weights modules, and the checks that say when one may stand in for them.

A one-token generation step does little arithmetic (a few small matmuls per layer), so what it costs is mostly
Python: module calls, shape checks and identity dropouts. A *step function* is a layer's or a transformer's
`forward_with_state` for one token in eval mode without autograd, written as a plain function over the weights,
with every check made once when it is made: the same operations in the same order, so the same result bit for bit.
It is made only where that holds:

- `spelled_out`: every submodule in eval mode and no forward hooks (`has_forward_hooks`), since the function skips
  the module calls that would run dropout and hooks;
- the parts are the standard ones (checked in `layer_step_function`), and the projections can be stacked
  (`projector`).

`projector` also serves the modules' own forward: one matmul for q, k, v and β instead of four.

The modules' `step_function()` methods (`FastWeightsAttentionTransformerLayer`, `FastWeightsAttentionTransformer`,
in `layers.py`) call the functions here; this module does not import the layers (they import it), so the layer
checks the type of its attention itself.
"""
from typing import Callable, Optional

import torch
from torch import nn

from lazylab.models._torch_compat import global_forward_hooks_registered
from lazylab.models.fast_weights.delta_product import delta_product_step_unchecked
from lazylab.models.fast_weights.delta_rule import delta_rule_step_unchecked
from lazylab.models.fast_weights.feature_maps import DPFP, Favor, L2NormSiLU, LinearElu
from lazylab.models.fast_weights.gated_delta_rule import gated_delta_rule_step_unchecked
from lazylab.models.fast_weights.normalization import (
    divide_by_last_column,
    join_state,
    normalise_by_attention,
    split_state,
)
from lazylab.models.fast_weights.sum_rule import sum_rule_step_unchecked
from lazylab.models.feed_forward import FeedForward
from lazylab.models.mha import PrepareForMultiHeadAttention

__all__ = ['has_forward_hooks', 'spelled_out', 'one_token_inference', 'per_layer_state', 'projector',
           'layer_step_function', 'transformer_step_function']

LayerStepFunction = Callable[[torch.Tensor, Optional[torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]
TransformerStepFunction = Callable[[torch.Tensor, Optional[list[torch.Tensor]]],
                                   tuple[torch.Tensor, list[torch.Tensor]]]
Projector = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]


def per_layer_state(state: Optional[list[Optional[torch.Tensor]]], n_layers: int) -> list[Optional[torch.Tensor]]:
    """The per-layer fast weights a transformer continues from: None → one None (zeros) per layer.

    Raises:
        ValueError: a list whose length is not n_layers.
    """
    if state is None:
        return [None] * n_layers
    if len(state) != n_layers:
        raise ValueError(f"state has {len(state)} entries; expected one per layer (n_layers={n_layers})")
    return list(state)


def has_forward_hooks(modules) -> bool:
    """Whether a forward (pre-)hook, of one of `modules` or global, would run: code that skips module calls must
    not be used then."""
    return global_forward_hooks_registered() or any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def spelled_out(module: nn.Module) -> bool:
    """Whether a step function may stand in for `module`'s calls: every submodule in eval mode (no dropout) and
    no forward hooks."""
    modules = list(module.modules())
    return not any(m.training for m in modules) and not has_forward_hooks(modules)


def one_token_inference(x: torch.Tensor) -> bool:
    """One token [1, batch_size, d_model] without autograd: the case a step function computes."""
    return x.dim() == 3 and x.shape[0] == 1 and not torch.is_grad_enabled()


#: feature maps that act on each vector alone, with no per-head parameters: q and k of all heads go through one call
STACKABLE_FEATURE_MAPS = (DPFP, LinearElu, Favor, L2NormSiLU)


def _stackable(attn: nn.Module) -> bool:
    """Whether q, k, v and β (none for the sum rule) of a `FastWeightsAttention` are the standard bias-free
    projections, without forward hooks: then one matmul computes all of them (see `projector`)."""
    gate = attn.interpolation_weight
    projections, wrappers = [attn.query, attn.key, attn.value], []
    if gate is not None:
        if not (isinstance(gate, nn.Sequential) and len(gate) == 2 and type(gate[1]) is nn.Sigmoid):
            return False
        projections.append(gate[0])
        wrappers = [gate, gate[1]]
    linears = [p.linear for p in projections]
    if attn.decay is not None:  # the gate's W_a (a plain bias-free Linear)
        if type(attn.decay.projection) is not nn.Linear or attn.decay.projection.bias is not None:
            return False
        wrappers.append(attn.decay)
        linears.append(attn.decay.projection)
    return (all(type(p) is PrepareForMultiHeadAttention and p.linear.bias is None for p in projections) and
            not has_forward_hooks([*wrappers, *projections, *linears]))


def _steps_first(t: torch.Tensor, x: torch.Tensor, n_h: int) -> torch.Tensor:
    """DeltaProduct's step axis: t [*lead, n_h · heads, *tail] (lead = x's leading dims, step-major columns) →
    [seq_len, n_h, batch, heads, *tail] for a sequence x [seq_len, batch, d_model], [n_h, batch, heads, *tail]
    for a token x [batch, d_model] (the kernels' layouts; a view)."""
    lead = x.dim() - 1
    t = t.view(*t.shape[:lead], n_h, t.shape[lead] // n_h, *t.shape[lead + 1:])
    return t.movedim(lead, lead - 1)


def _module_projector(attn: nn.Module) -> Projector:
    """`projector`'s function for projections that cannot be stacked: each submodule called as a module."""
    phi, gate, decay = attn.phi, attn.interpolation_weight, attn.decay
    product, n_h, scale = attn.update_rule == 'delta_product', attn.householder_steps, attn.negative_eigenvalues

    def project(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        key, value, beta = phi(attn.key(x)), attn.value(x), None if gate is None else gate(x)
        if product:
            key, value, beta = (_steps_first(t, x, n_h) for t in (key, value, beta.squeeze(-1)))
        if scale:
            beta = 2 * beta
        return phi(attn.query(x)), key, value, beta, None if decay is None else decay(x)
    return project


def projector(attn: nn.Module, step: bool = False) -> Optional[Projector]:
    """The function x [..., d_model] → (φ'(q), φ'(k), v, β, g) that a `FastWeightsAttention` applies: β σ(W_β x)
    (2σ with negative eigenvalues; None for the sum rule), g the gate's log decay (None without a gate).

    Shapes of the results, for x [*lead, d_model] (lead = seq_len, batch or batch): φ'(q), φ'(k) [*lead, heads,
    d_dot]; v [*lead, heads, d_k]; β [*lead, heads] (stacked) or [*lead, heads, 1] (the gate module's); g [*lead,
    heads]. DeltaProduct's φ'(k), v and β have the step axis n_h after seq_len, or first for a token: the kernels'
    layouts, [seq_len, n_h, batch, heads, d] (`delta_product.py`).

    With the standard projections it is one matmul for all of them, and for DPFP, ELU + 1, FAVOR+ and L2-SiLU one
    call of φ' for q and k together (they act on each head's vector alone, so stacking the heads changes nothing):
    fewer operations, which is what a one-token generation step pays for; the same numbers as calling the
    submodules. The function holds the weights stacked as they are now. With `step`, for a generation step
    function, the DPFP is called as `DPFP.plain` (same bits, fewer checks), and without the standard projections
    there is no function (None): a step function spells out only the stacked form. Without `step`, other
    projections are called as modules.
    """
    if not _stackable(attn):
        return None if step else _module_projector(attn)
    phi, h, d_k, gate, decay = attn.phi, attn.heads, attn.d_k, attn.interpolation_weight, attn.decay
    product, n_h, scale = attn.update_rule == 'delta_product', attn.householder_steps, attn.negative_eigenvalues
    stack_phi = type(phi) in STACKABLE_FEATURE_MAPS  # another φ' may hold per-head parameters: q, k separately
    if step and type(phi) is DPFP:
        phi = phi.plain
    # [(1 + 2 n_h)·h·d_k (+ n_h·h) (+ h), d_model]; in the graph when autograd is on, so that each weight gets its
    # gradient
    weights = [attn.query.linear.weight, attn.key.linear.weight, attn.value.linear.weight]
    sizes = [(1 + n_h) * h * d_k, n_h * h * d_k]
    if gate is not None:
        weights.append(gate[0].linear.weight)
        sizes.append(n_h * h)
    if decay is not None:
        weights.append(decay.projection.weight)
        sizes.append(h)
    weight = torch.cat(weights)

    # (the C-level split_with_sizes, chunk and view: Tensor.split and unflatten add Python-level wrappers)
    def project(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.dim() == 3 and x.shape[0] > 1 and torch.is_grad_enabled():
            # a sequence under autograd: q, k in one matmul and the rest in another, so that the backward pass
            # needs no concatenation of their gradients (3-5% of a training step of the attention); one token
            # (what a step function computes) keeps the single matmul, so the two paths agree bit for bit
            qk = nn.functional.linear(x, weight[:sizes[0]])
            value, *rest = nn.functional.linear(x, weight[sizes[0]:]).split_with_sizes(sizes[1:], dim=-1)
        else:
            qk, value, *rest = nn.functional.linear(x, weight).split_with_sizes(sizes, dim=-1)
        qk = qk.view(*qk.shape[:-1], (1 + n_h) * h, d_k)
        parts = [h, n_h * h]
        query, key = phi(qk).split_with_sizes(parts, dim=-2) if stack_phi else map(phi, qk.split_with_sizes(parts, -2))
        value = value.view(*value.shape[:-1], n_h * h, d_k)
        beta = torch.sigmoid(rest[0]) if gate is not None else None
        if product:
            key, value, beta = (_steps_first(t, x, n_h) for t in (key, value, beta))
        if scale:
            beta = 2 * beta
        return query, key, value, beta, None if decay is None else decay.log_decay(rest[-1])
    return project


def layer_step_function(layer: nn.Module) -> Optional[LayerStepFunction]:
    """The step function of a `FastWeightsAttentionTransformerLayer` whose attention is a `FastWeightsAttention`
    (the layer checks that; see its `step_function`): (x [batch_size, d_model], state [batch_size, heads, d_k,
    d_dot] or None) → (x', state'), or None where it would not be the module path bit for bit."""
    attn, ff, norm = layer.attn, layer.feed_forward, layer.norm_ff
    if not (type(ff) is FeedForward and not ff.is_gated and type(ff.activation) is nn.ReLU and
            type(norm) is nn.LayerNorm and attn.kernel != 'loop' and type(attn.output) is nn.Linear and
            spelled_out(layer)):
        return None
    project, linear = projector(attn, step=True), nn.functional.linear
    if project is None:
        return None
    heads, d_k, normalise = attn.heads, attn.d_k, attn.attention_normalization
    rule_step = _rule_step(attn)
    rows = d_k + 1 if normalise else d_k  # (z is the last row of a normalising layer's state)
    out_w, out_b = attn.output.weight, attn.output.bias
    norm_args = (norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    w1, b1, w2, b2 = ff.layer1.weight, ff.layer1.bias, ff.layer2.weight, ff.layer2.bias

    def step(x: torch.Tensor, state: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        query, key, value, beta, g = project(x)
        if state is not None and state.shape != (x.shape[0], heads, rows, key.shape[-1]):
            raise ValueError(f"fast-weights state must be [batch_size, heads, {'d_k + 1' if normalise else 'd_k'}, "
                             f"d_dot] = {(x.shape[0], heads, rows, key.shape[-1])}; got {tuple(state.shape)}")
        y, state = rule_step(query, key, value, beta, g, state)
        x = x + linear(y.reshape(x.shape), out_w, out_b)
        hidden = linear(torch.layer_norm(x, *norm_args), w1, b1).relu_()
        return x + linear(hidden, w2, b2), state
    return step


def _rule_step(attn: nn.Module) -> Callable:
    """One token of `attn`'s update rule, (q, k, v, β, g, state) → (y, state), by the operations the module path
    runs for a sequence of one token (`rules.run_update_rule` takes the rule's step there), without the checks."""
    rule, normalise, eps = attn.update_rule, attn.attention_normalization, attn.eps
    if rule == 'gated_delta':
        return lambda q, k, v, beta, g, state: gated_delta_rule_step_unchecked(q, k, v, beta.unsqueeze(-1), g, state)
    if rule == 'delta_product':
        return lambda q, k, v, beta, g, state: delta_product_step_unchecked(q, k, v, beta, g, state)
    if rule == 'sum' and not normalise:
        return lambda q, k, v, beta, g, state: sum_rule_step_unchecked(q, k, v, state)
    if rule == 'sum':  # as the module: z is the sum rule's row for a value of 1
        def sum_normalised(q, k, v, beta, g, state):
            y, state = sum_rule_step_unchecked(q, k, torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1), state)
            return divide_by_last_column(y, eps), state
        return sum_normalised

    def delta(q, k, v, beta, g, state):
        weights, z = split_state(state) if normalise else (state, None)
        y, weights = delta_rule_step_unchecked(q, k, v, beta.unsqueeze(-1), weights)
        if normalise:  # the module path's normaliser on a sequence of one token: the same operations
            y, z = normalise_by_attention(y.unsqueeze(0), q.unsqueeze(0), k.unsqueeze(0), z, eps)
            y, weights = y[0], join_state(weights, z)
        return y, weights
    return delta


def transformer_step_function(model: nn.Module) -> Optional[TransformerStepFunction]:
    """The step function of a `FastWeightsAttentionTransformer` (see its `step_function`): (x [1, batch_size,
    d_model], per-layer state or None) → (y [1, batch_size, d_model], new per-layer state), or None where a layer
    has none or the final norm is not a LayerNorm in eval mode without forward hooks."""
    steps = [layer.step_function() for layer in model.layers]
    if None in steps or type(model.norm) is not nn.LayerNorm or not spelled_out(model.norm):
        return None
    norm = model.norm
    norm_args = (norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    d_model = model.layers[0].size

    def step(x: torch.Tensor, state: Optional[list[torch.Tensor]]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if x.dim() != 3 or x.shape[0] != 1 or x.shape[2] != d_model:
            raise ValueError(f"a step function takes one token, x [1, batch_size, d_model={d_model}]; "
                             f"got {tuple(x.shape)}")
        state = per_layer_state(state, len(steps))
        x, new_state = x[0], []
        for layer_step, layer_state in zip(steps, state):
            x, layer_state = layer_step(x, layer_state)
            new_state.append(layer_state)
        return torch.layer_norm(x, *norm_args).unsqueeze(0), new_state
    return step
