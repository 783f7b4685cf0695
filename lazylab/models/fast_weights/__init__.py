"""Fast Weights Transformer: linear attention as a fast-weight programmer with the delta rule.

Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly Fast Weight Programmers" (ICML 2021).

A linear transformer keeps, per head, a matrix of "fast weights" W that each token writes to and reads from.
The paper (i) replaces the purely additive write W ← W + v ⊗ φ(k) by the delta rule, which first reads the value
v̄ stored under the key and replaces it by a β-mix of old and new, and (ii) introduces the DPFP feature map φ,
normalised by its sum so that no attention denominator is needed:

    kᵢ, vᵢ, qᵢ = W_k xᵢ, W_v xᵢ, W_q xᵢ
    v̄ᵢ = W⁽ⁱ⁻¹⁾ φ'(kᵢ)
    βᵢ = σ(W_β xᵢ)                                    (one scalar per head)
    W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + βᵢ (vᵢ − v̄ᵢ) ⊗ φ'(kᵢ)
    yᵢ = W⁽ⁱ⁾ φ'(qᵢ)                                  (no 1/√d scaling)

The modules here equal labml-nn 0.5.1's `labml_nn.transformers.fast_weights` (names, arguments, state-dict
keys, sequence-first layout), including two of its choices worth knowing:

* the layer adds attention to the *un-normalised* input, x + Attn(x): `norm_self_attn` exists (so state dicts
  match) but is not applied; only the FFN gets a pre-norm;
* `FastWeightsAttention.dropout` exists but is not applied; the layer's dropout on the attention output is the
  only dropout on that path.

What is new: the delta rule can be computed three ways (`kernel=` on `FastWeightsAttention`, see
`lazylab.models.fast_weights.delta_rule`): `'chunked'` (chunkwise-parallel, the default, fast for training),
`'loop'` (the token-by-token reference) and `'step'` (the recurrent step that generation uses); and the fast
weights can be carried between calls with `forward_with_state(x, state) -> (y, state)`.

State layout: per layer, W of shape [batch_size, heads, d_k, d_dot] (values × features, labml_nn's 'bhvk'
order), with d_dot = 2 · d_k · ν for DPFP. The transformer's state is a list with one such tensor per layer.

The token-wise variants (one step per call, as labml_nn's `token_wise.py`) are in
`lazylab.models.fast_weights.token_wise`.
"""
import copy
from typing import Callable, List, Optional, Tuple

import torch
from torch import nn
from torch.nn.modules import module as _module_hooks  # the global forward hooks

from lazylab.models.fast_weights.delta_rule import (delta_rule_chunked, delta_rule_loop, delta_rule_step,
                                                      delta_rule_token)
from lazylab.models.fast_weights.dpfp import dpfp_normalised
from lazylab.models.feed_forward import FeedForward  # re-exported, as labml_nn does (its experiment imports it here)
from lazylab.models.mha import PrepareForMultiHeadAttention

__all__ = ['DPFP', 'FastWeightsAttention', 'FastWeightsAttentionTransformerLayer', 'FeedForward',
           'FastWeightsAttentionTransformer', 'KERNELS', 'DEFAULT_CHUNK_SIZE']

KERNELS = ('chunked', 'loop', 'step')
DEFAULT_CHUNK_SIZE = 16  # fastest on CPU for d_dot = 64 (small batched matmuls); GPUs prefer 64


class DPFP(nn.Module):
    """Deterministic Parameter-Free Projection φ' (Schlag et al. 2021), normalised by its sum.

    With r = ReLU([k, −k]) (size 2·d_key), φ is the concatenation over i = 1..ν of r ⊙ roll(r, i):

        φ_{2·d_key·(i−1) + j}(k) = r_j · r_{(j − i) mod 2·d_key}

    (`torch.roll` by +i: element j of the rolled copy is r_{j−i}). The result has d_dot = 2·d_key·ν features, is
    sparse and nearly orthogonal for different keys. It is normalised so that its entries sum to one:
    φ'(k) = φ(k) / (Σⱼ φ(k)ⱼ + eps).

    Args:
        nu: ν ≥ 1, the number of rolled products (the paper uses ν ∈ {1, 2, 3}).
        eps: added to the sum to avoid dividing by zero (φ(0) = 0).

    Shapes:
        k: [..., d_key] → [..., 2 · d_key · ν]

    Raises:
        ValueError: nu < 1.
    """

    def __init__(self, nu: int = 1, eps: float = 1e-6):
        super().__init__()
        if nu < 1:
            raise ValueError(f"DPFP needs nu >= 1, got nu={nu}")
        self.nu = nu
        self.relu = nn.ReLU()
        self.eps = eps

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        # Both paths give the same bits. The fused one saves passes over large tensors and most of the backward;
        # small inputs without autograd (a generation step) are quicker as the few plain operations.
        small_inference = k.numel() <= 16384 and not (torch.is_grad_enabled() and k.requires_grad)
        if self.nu <= k.shape[-1] and k.is_floating_point() and not small_inference:
            return dpfp_normalised(k, self.nu, self.eps)
        return self.plain(k)

    def plain(self, k: torch.Tensor) -> torch.Tensor:
        """φ'(k) by the definition's operations, without `forward`'s choice of path (a generation step function
        calls this directly): the same bits as `forward`, but no fused backward."""
        phi = self.dpfp(k)
        return phi / (phi.sum(dim=-1, keepdim=True) + self.eps)

    def dpfp(self, k: torch.Tensor) -> torch.Tensor:
        """The un-normalised φ(k): [..., d_key] → [..., 2 · d_key · ν], written as the definition (the reference
        the fused `forward` is tested against)."""
        r = torch.cat([k, -k], dim=-1).relu_()  # `self.relu` is kept for labml_nn's module layout
        if self.nu == 1:  # the common case, without the stack (fewer operations for a generation step)
            return r * r.roll(shifts=1, dims=-1)
        rolled = torch.stack([r.roll(shifts=i, dims=-1) for i in range(1, self.nu + 1)], dim=-2)  # [..., ν, 2·d_key]
        return (r.unsqueeze(-2) * rolled).flatten(-2)  # broadcasting r over the ν copies, no repeat


def _check_kernel(kernel: str, chunk_size: int):
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}; got kernel={kernel!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got chunk_size={chunk_size}")


def run_delta_rule(kernel: str, chunk_size: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   beta: torch.Tensor, state: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Run the delta rule over a sequence with the named kernel (shapes as in `delta_rule`).

    A single token always takes the recurrent step: it is the same computation, without the chunking set-up.
    """
    if kernel == 'loop':
        return delta_rule_loop(q, k, v, beta, state)
    if q.shape[0] == 1:
        y, state = delta_rule_step(q[0], k[0], v[0], beta[0], state)
        return y.unsqueeze(0), state
    if kernel == 'step':
        ys = []
        for i in range(q.shape[0]):
            y, state = delta_rule_step(q[i], k[i], v[i], beta[i], state)
            ys.append(y)
        if not ys:
            return delta_rule_loop(q, k, v, beta, state)
        return torch.stack(ys), state
    return delta_rule_chunked(q, k, v, beta, state, chunk_size=chunk_size)


class FastWeightsAttention(nn.Module):
    """Delta-rule fast-weight attention over a whole sequence (Schlag, Irie & Schmidhuber 2021).

    Per head, with φ' the sum-normalised feature map:
        v̄ᵢ = W⁽ⁱ⁻¹⁾ φ'(kᵢ),   W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + βᵢ (vᵢ − v̄ᵢ) ⊗ φ'(kᵢ),   yᵢ = W⁽ⁱ⁾ φ'(qᵢ),   βᵢ = σ(W_β xᵢ)
    followed by the output projection W_o [y₁; …; y_h] + b_o.

    Args:
        heads: number of heads h; d_model must be divisible by it (d_k = d_model / h).
        d_model: model width d.
        dropout_prob: kept for labml_nn compatibility; not applied here (the layer drops the attention output).
        phi: the feature map φ', e.g. DPFP(nu=1), mapping d_k → d_dot.
        kernel: 'chunked' (default; chunkwise-parallel), 'loop' (reference) or 'step' (recurrent step per token).
        chunk_size: tokens per chunk for 'chunked'; any seq_len works.

    Parameters (labml_nn's names): query.linear, key.linear, value.linear (no bias), interpolation_weight.0.linear
    (W_β, no bias), output (with bias).

    Shapes:
        x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]
        state (forward_with_state, in and out): [batch_size, heads, d_k, d_dot]

    Raises:
        ValueError: d_model not divisible by heads; unknown kernel; chunk_size < 1.
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float, phi: nn.Module, *,
                 kernel: str = 'chunked', chunk_size: int = DEFAULT_CHUNK_SIZE):
        super().__init__()
        if heads <= 0 or d_model % heads != 0:
            raise ValueError(f"FastWeightsAttention: d_model={d_model} must be divisible by heads={heads}")
        _check_kernel(kernel, chunk_size)
        self.d_k = d_model // heads
        self.heads = heads
        # Creation order as in labml_nn, so the same seed gives the same initial weights.
        self.query = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
        self.key = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
        self.value = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=False)
        self.interpolation_weight = nn.Sequential(PrepareForMultiHeadAttention(d_model, heads, 1, bias=False),
                                                  nn.Sigmoid())
        self.phi = phi
        self.output = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout_prob)
        self.kernel = kernel
        self.chunk_size = chunk_size

    def set_kernel(self, kernel: str, chunk_size: Optional[int] = None):
        """Switch how the delta rule is computed (the result is the same up to float rounding)."""
        chunk_size = self.chunk_size if chunk_size is None else chunk_size
        _check_kernel(kernel, chunk_size)
        self.kernel, self.chunk_size = kernel, chunk_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model], starting from zero fast weights."""
        return self.forward_with_state(x)[0]

    def forward_with_state(self, x: torch.Tensor, state: Optional[torch.Tensor] = None
                           ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Continue from fast weights `state` ([batch_size, heads, d_k, d_dot], None = zeros).

        Returns the output [seq_len, batch_size, d_model] and the fast weights after the last token.
        """
        d_model = self.heads * self.d_k
        if x.dim() != 3 or x.shape[-1] != d_model:
            raise ValueError(f"FastWeightsAttention expects x of shape [seq_len, batch_size, d_model={d_model}], "
                             f"got {tuple(x.shape)}")
        seq_len, batch_size, _ = x.shape
        query, key, value, beta = self._project(x)
        y, state = run_delta_rule(self.kernel, self.chunk_size, query, key, value, beta, state)
        return self.output(y.reshape(seq_len, batch_size, d_model)), state  # (no -1: seq_len may be 0)

    def _project(self, x: torch.Tensor):
        """φ'(q), φ'(k): [seq_len, batch_size, heads, d_dot]; v: [..., heads, d_k]; β: [..., heads(, 1)]."""
        return self._projector()(x)

    def _fusable(self) -> bool:
        """Whether q, k, v and β are the standard bias-free projections, without forward hooks: then one matmul
        computes all four (see `_projector`)."""
        gate = self.interpolation_weight
        if not (isinstance(gate, nn.Sequential) and len(gate) == 2 and type(gate[1]) is nn.Sigmoid):
            return False
        projections = (self.query, self.key, self.value, gate[0])
        return (all(type(p) is PrepareForMultiHeadAttention and p.linear.bias is None for p in projections) and
                not _has_forward_hooks([gate, gate[1], *projections, *(p.linear for p in projections)]))

    def _projector(self, step: bool = False) -> Optional[Callable[[torch.Tensor], Tuple[torch.Tensor, ...]]]:
        """The function x [..., d_model] → (φ'(q), φ'(k), v, β) that `_project` applies.

        With the standard projections (`_fusable`) it is one matmul for all four, and for a DPFP φ' one call for
        q and k together (DPFP acts on each head's vector alone, so stacking the heads changes nothing): fewer
        operations, which is what a one-token generation step pays for; the same numbers as calling the
        submodules. The function holds the four weights stacked as they are now. With `step`, for a generation
        step function, the DPFP is called as `DPFP.plain` (same bits, fewer checks), and without the standard
        projections there is no function (None): a step function spells out only the stacked form.
        """
        if not self._fusable():
            if step:
                return None
            phi, gate = self.phi, self.interpolation_weight
            return lambda x: (phi(self.query(x)), phi(self.key(x)), self.value(x), gate(x))
        phi, h, d_k = self.phi, self.heads, self.d_k
        stack_phi = type(phi) is DPFP  # another φ' may hold per-head parameters: it gets q and k separately
        if step and stack_phi:
            phi = phi.plain
        # [3·h·d_k + h, d_model]; in the graph when autograd is on, so that each weight gets its gradient
        weight = torch.cat([self.query.linear.weight, self.key.linear.weight, self.value.linear.weight,
                            self.interpolation_weight[0].linear.weight])
        sizes = [2 * h * d_k, h * d_k, h]

        # (the C-level split_with_sizes, chunk and view: Tensor.split and unflatten add Python-level wrappers)
        def project(x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
            qk, value, beta = nn.functional.linear(x, weight).split_with_sizes(sizes, dim=-1)
            qk = qk.view(*qk.shape[:-1], 2 * h, d_k)
            query, key = phi(qk).chunk(2, dim=-2) if stack_phi else map(phi, qk.chunk(2, dim=-2))
            return query, key, value.view(*value.shape[:-1], h, d_k), torch.sigmoid(beta)
        return project


def per_layer_state(state: Optional[List[Optional[torch.Tensor]]], n_layers: int) -> List[Optional[torch.Tensor]]:
    """The per-layer fast weights a transformer continues from: None → one None (zeros) per layer.

    Raises:
        ValueError: a list whose length is not n_layers.
    """
    if state is None:
        return [None] * n_layers
    if len(state) != n_layers:
        raise ValueError(f"state has {len(state)} entries; expected one per layer (n_layers={n_layers})")
    return list(state)


def _has_forward_hooks(modules) -> bool:
    """Whether a forward (pre-)hook, of one of `modules` or global, would run: code that skips module calls must
    not be used then."""
    global_hooks = (getattr(_module_hooks, name, None) for name in ('_global_forward_hooks',
                                                                    '_global_forward_pre_hooks'))
    return any(global_hooks) or any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def _spelled_out(module: nn.Module) -> bool:
    """Whether a step function may stand in for `module`'s calls: every submodule in eval mode (no dropout) and
    no forward hooks."""
    modules = list(module.modules())
    return not any(m.training for m in modules) and not _has_forward_hooks(modules)


def _one_token_inference(x: torch.Tensor) -> bool:
    """One token [1, batch_size, d_model] without autograd: the case a step function (`step_function`) computes."""
    return x.dim() == 3 and x.shape[0] == 1 and not torch.is_grad_enabled()


class FastWeightsAttentionTransformerLayer(nn.Module):
    """One layer: x + Dropout(Attn(x)), then the pre-norm FFN block x + Dropout(FFN(LayerNorm(x))).

    As in labml_nn, the attention sees x itself; `norm_self_attn` is created (state-dict compatibility) but unused.

    Args:
        d_model: model width.
        attn: a FastWeightsAttention.
        feed_forward: the FFN (e.g. lazylab.models.feed_forward.FeedForward).
        dropout_prob: dropout on the outputs of attention and FFN before each residual add.

    Shapes:
        x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]; state as in FastWeightsAttention.
    """

    def __init__(self, *, d_model: int, attn: FastWeightsAttention, feed_forward: nn.Module, dropout_prob: float):
        super().__init__()
        self.size = d_model
        self.attn = attn
        self.feed_forward = feed_forward
        self.dropout = nn.Dropout(dropout_prob)
        self.norm_self_attn = nn.LayerNorm([d_model])
        self.norm_ff = nn.LayerNorm([d_model])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._add_attention_and_ffn(x, self.attn(x))

    def forward_with_state(self, x: torch.Tensor, state: Optional[torch.Tensor] = None
                           ) -> Tuple[torch.Tensor, torch.Tensor]:
        """`forward` continuing from the fast weights `state`; returns (output, new state). Calls the attention's
        `forward_with_state` directly, so forward hooks of `attn` itself do not run here."""
        if _one_token_inference(x):
            step = self.step_function()
            if step is not None:
                y, state = step(x[0], state)
                return y.unsqueeze(0), state
        attn, state = self.attn.forward_with_state(x, state)
        return self._add_attention_and_ffn(x, attn), state

    def _add_attention_and_ffn(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(attn)
        return x + self.dropout(self.feed_forward(self.norm_ff(x)))

    def step_function(self) -> Optional[Callable[[torch.Tensor, Optional[torch.Tensor]],
                                                 Tuple[torch.Tensor, torch.Tensor]]]:
        """This layer's `forward_with_state` for one token in eval mode, as a function
        (x [batch_size, d_model], state) → (x', state') that runs the same operations in the same order (so the
        same result, bit for bit) without the module calls, shape checks and identity dropouts that otherwise
        cost more than a one-token step's arithmetic. The checks are made here, once: use the function while the
        layer's parts and weights stay as they are. None unless the layer is built from the standard parts
        (FastWeightsAttention with the standard projections and the 'chunked' or 'step' kernel, LayerNorm,
        FeedForward with ReLU, not gated), every submodule is in eval mode and none has forward hooks.
        """
        attn, ff, norm = self.attn, self.feed_forward, self.norm_ff
        if not (type(ff) is FeedForward and not ff.is_gated and type(ff.activation) is nn.ReLU and
                type(norm) is nn.LayerNorm and type(attn) is FastWeightsAttention and attn.kernel != 'loop' and
                type(attn.output) is nn.Linear and _spelled_out(self)):
            return None
        project, linear = attn._projector(step=True), nn.functional.linear
        if project is None:
            return None
        heads, d_k = attn.heads, attn.d_k
        out_w, out_b = attn.output.weight, attn.output.bias
        norm_args = (norm.normalized_shape, norm.weight, norm.bias, norm.eps)
        w1, b1, w2, b2 = ff.layer1.weight, ff.layer1.bias, ff.layer2.weight, ff.layer2.bias

        def step(x: torch.Tensor, state: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
            query, key, value, beta = project(x)
            if state is not None and state.shape != (x.shape[0], heads, d_k, key.shape[-1]):
                raise ValueError(f"fast-weights state must be [batch_size, heads, d_k, d_dot] = "
                                 f"{(x.shape[0], heads, d_k, key.shape[-1])}; got {tuple(state.shape)}")
            y, state = delta_rule_token(query, key, value, beta.unsqueeze(-1), state)
            x = x + linear(y.reshape(x.shape), out_w, out_b)
            hidden = linear(torch.layer_norm(x, *norm_args), w1, b1).relu_()
            return x + linear(hidden, w2, b2), state
        return step


class FastWeightsAttentionTransformer(nn.Module):
    """`n_layers` copies of `layer` followed by a final LayerNorm.

    Args:
        layer: the FastWeightsAttentionTransformerLayer to copy (deep copies: layers do not share weights).
        n_layers: number of layers.

    Shapes:
        x: [seq_len, batch_size, d_model] → [seq_len, batch_size, d_model]
        state (forward_with_state): list of n_layers tensors [batch_size, heads, d_k, d_dot], or None for zeros.

    Raises:
        ValueError: n_layers < 1; a state list of the wrong length.
    """

    def __init__(self, layer: FastWeightsAttentionTransformerLayer, n_layers: int):
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"FastWeightsAttentionTransformer needs n_layers >= 1, got n_layers={n_layers}")
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(n_layers)])
        self.norm = nn.LayerNorm([layer.size])

    def set_kernel(self, kernel: str, chunk_size: Optional[int] = None):
        """Use `kernel` ('chunked', 'loop' or 'step') in every layer's attention."""
        for layer in self.layers:
            layer.attn.set_kernel(kernel, chunk_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def forward_with_state(self, x: torch.Tensor, state: Optional[List[torch.Tensor]] = None
                           ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """Continue from the per-layer fast weights `state`; returns (output, new per-layer fast weights).

        Calling this on consecutive chunks of a sequence, carrying the state, gives the outputs of one call on
        the whole sequence (the incremental-state protocol of `lazylab.models.autoregressive`). When training on
        consecutive segments, detach the state between them (`[w.detach() for w in state]`) to truncate
        backpropagation at the segment boundary. The layers' `forward_with_state` are called directly, so their
        own forward hooks do not run here (those of their parts do).
        """
        if _one_token_inference(x):
            step = self.step_function()
            if step is not None:
                return step(x, state)
        state = per_layer_state(state, len(self.layers))
        new_state = []
        for layer, layer_state in zip(self.layers, state):
            x, layer_state = layer.forward_with_state(x, layer_state)
            new_state.append(layer_state)
        return self.norm(x), new_state

    def step_function(self) -> Optional[Callable[[torch.Tensor, Optional[List[torch.Tensor]]],
                                                 Tuple[torch.Tensor, List[torch.Tensor]]]]:
        """For generation: `forward_with_state` on one token in eval mode without autograd, as a function
        (x [1, batch_size, d_model], state) → (y, new_state) with every check and set-up done here, once
        (each layer's `step_function`). Bit for bit the module path's result. Use it while the modules and
        weights stay as they are: `AutoregressiveModel.generate` makes one per call. None when a layer has none
        (see `FastWeightsAttentionTransformerLayer.step_function`), or the final norm is not a LayerNorm in eval
        mode without forward hooks.

        The function raises ValueError for x that is not one token [1, batch_size, d_model], or a state list of
        the wrong length or shapes.
        """
        steps = [layer.step_function() for layer in self.layers]
        if None in steps or type(self.norm) is not nn.LayerNorm or not _spelled_out(self.norm):
            return None
        norm = self.norm
        norm_args = (norm.normalized_shape, norm.weight, norm.bias, norm.eps)
        d_model = self.layers[0].size

        def step(x: torch.Tensor, state: Optional[List[torch.Tensor]]) -> Tuple[torch.Tensor, List[torch.Tensor]]:
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
