"""Fast Weights Transformer modules: equal to labml-nn 0.5.1 (whole-sequence and token-wise), the three kernels
agree on outputs and parameter gradients, carried state equals one pass, and generation steps equal the full pass.
"""
import labml_nn.transformers.fast_weights as ref
import labml_nn.transformers.fast_weights.token_wise as ref_tw
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import lazylab.models.fast_weights as fw
import lazylab.models.fast_weights.token_wise as fw_tw
from lazylab.models.autoregressive import AutoregressiveModel
from lazylab.models.feed_forward import FeedForward
from lazylab.testing import max_relative_error

D_MODEL, HEADS, D_FF = 16, 2, 32  # d_k = 8, d_dot = 16·ν: small, so the token loops stay fast


def build(module, *, nu=1, n_layers=2, d_model=D_MODEL, heads=HEADS, **attn_kwargs):
    """The same construction as labml_nn's experiment, from `module`'s classes."""
    attn = module.FastWeightsAttention(heads, d_model, 0.0, module.DPFP(nu=nu), **attn_kwargs)
    layer = module.FastWeightsAttentionTransformerLayer(d_model=d_model, attn=attn,
                                                        feed_forward=FeedForward(d_model, D_FF, 0.0),
                                                        dropout_prob=0.0)
    return module.FastWeightsAttentionTransformer(layer, n_layers)


def randomise(model, seed=0):
    """Non-default LayerNorm weights and biases too, so every parameter matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if 'norm' in name and name.endswith('weight') else 0.3 * noise)
    return model



# ---- DPFP ----

def test_dpfp_hand_worked_value():
    # k = [1, −2]: r = ReLU([1, −2, −1, 2]) = [1, 0, 0, 2]; roll by 1 → [2, 1, 0, 0]; r ⊙ roll = [2, 0, 0, 0];
    # roll by 2 → [0, 2, 1, 0]; r ⊙ roll = 0. Normalised: ν=1 → [1, 0, 0, 0]; ν=2 → [1, 0, 0, 0, 0, 0, 0, 0].
    k = torch.tensor([1., -2.])
    torch.testing.assert_close(fw.DPFP(nu=1).dpfp(k), torch.tensor([2., 0., 0., 0.]))
    torch.testing.assert_close(fw.DPFP(nu=1, eps=0.)(k), torch.tensor([1., 0., 0., 0.]))
    torch.testing.assert_close(fw.DPFP(nu=2, eps=0.)(k), torch.tensor([1., 0., 0., 0., 0., 0., 0., 0.]))


@pytest.mark.parametrize('nu', [1, 2, 3])
def test_dpfp_equals_labml_nn(nu):
    k = torch.randn(5, 3, 2, 8)
    ours, theirs = fw.DPFP(nu=nu)(k), ref.DPFP(nu=nu)(k)
    assert ours.shape == (5, 3, 2, 16 * nu)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@settings(max_examples=25, deadline=None)
@given(nu=st.integers(1, 4), d_key=st.integers(4, 40), rows=st.integers(1, 70), zeros=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_fused_dpfp_is_bitwise_labml_nn_forward_and_matches_its_gradient(nu, d_key, rows, zeros, seed):
    # the fused forward/backward (`dpfp.py`) against labml-nn's autograd of the definition, on a
    # non-contiguous input, with exact zeros (where ReLU and the sign masks meet) when `zeros`
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(rows, 2 * d_key, generator=g, dtype=torch.float64)[:, ::2]
    if zeros:
        k[::3, ::2] = 0.
    k32 = k.float()
    expected = ref.DPFP(nu=nu)(k32)
    torch.testing.assert_close(fw.DPFP(nu=nu)(k32), expected, rtol=0, atol=0)
    torch.testing.assert_close(fw.DPFP(nu=nu).plain(k32), expected, rtol=0, atol=0)  # a step function's path
    ours_in, theirs_in = k.clone().requires_grad_(), k.clone().requires_grad_()
    ours, theirs = fw.DPFP(nu=nu)(ours_in), ref.DPFP(nu=nu)(theirs_in)
    grad = torch.randn(ours.shape, generator=g, dtype=torch.float64)
    ours.backward(grad)
    theirs.backward(grad)
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, rtol=1e-12, atol=1e-12)


def test_fused_dpfp_passes_gradcheck():
    k = torch.randn(4, 3, 6, dtype=torch.float64, requires_grad=True)
    for nu in (1, 3):
        assert torch.autograd.gradcheck(fw.DPFP(nu=nu), (k,))


# ---- equivalence with labml_nn ----

@pytest.mark.parametrize('nu', [1, 2, 3])
@pytest.mark.parametrize('kernel', fw.KERNELS)
def test_whole_sequence_model_equals_labml_nn(nu, kernel):
    torch.manual_seed(nu)
    theirs = randomise(build(ref, nu=nu), seed=nu)
    ours = build(fw, nu=nu, kernel=kernel, chunk_size=16)
    ours.load_state_dict(theirs.state_dict())  # same keys, strict
    x = torch.randn(40, 3, D_MODEL)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-5)
    # and back: our weights load into labml_nn's module
    theirs_again = build(ref, nu=nu)
    theirs_again.load_state_dict(ours.state_dict())
    torch.testing.assert_close(theirs_again(x), theirs(x), rtol=0, atol=0)


@pytest.mark.parametrize('nu', [1, 3])
def test_token_wise_model_equals_labml_nn(nu):
    theirs = randomise(build(ref_tw, nu=nu), seed=10 + nu)
    ours = build(fw_tw, nu=nu)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(30, 2, D_MODEL)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-5)


def test_token_wise_attention_step_equals_labml_nn():
    torch.manual_seed(3)
    theirs = ref_tw.FastWeightsAttention(HEADS, D_MODEL, 0.0, ref.DPFP(nu=2))
    ours = fw_tw.FastWeightsAttention(HEADS, D_MODEL, 0.0, fw.DPFP(nu=2))
    ours.load_state_dict(theirs.state_dict())
    w_ours = w_theirs = None
    for x in torch.randn(6, 3, D_MODEL):
        y_ours, w_ours = ours(x, w_ours)
        y_theirs, w_theirs = theirs(x, w_theirs)
        torch.testing.assert_close(y_ours, y_theirs, rtol=0, atol=1e-6)
        torch.testing.assert_close(w_ours, w_theirs, rtol=0, atol=1e-6)
    assert w_ours.shape == (3, HEADS, D_MODEL // HEADS, 2 * (D_MODEL // HEADS) * 2)


def test_fused_projection_equals_calling_the_submodules():
    # The attention projects q, k, v, β with one matmul when the projections are the standard ones; a changed
    # gate (here an extra Identity) takes the plain path through the submodules. Both must agree.
    torch.manual_seed(4)
    attn = fw.FastWeightsAttention(HEADS, D_MODEL, 0.0, fw.DPFP(nu=2))
    x = torch.randn(9, 2, D_MODEL)
    fused = attn(x)
    attn.interpolation_weight.append(nn.Identity())
    torch.testing.assert_close(attn(x), fused, rtol=0, atol=1e-6)


def test_token_wise_equals_whole_sequence_with_renamed_gate():
    tw = randomise(build(fw_tw, nu=2), seed=5)
    whole = build(fw, nu=2)
    whole.load_state_dict({k.replace('.gate.', '.interpolation_weight.'): v for k, v in tw.state_dict().items()})
    x = torch.randn(50, 2, D_MODEL)
    y_tw, s_tw = tw.forward_with_state(x)
    y_whole, s_whole = whole.forward_with_state(x)
    torch.testing.assert_close(y_whole, y_tw, rtol=0, atol=1e-5)
    for a, b in zip(s_whole, s_tw):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


# ---- the three kernels agree at the module level (outputs and every parameter's gradient) ----

def outputs_and_grads(model, x):
    model.zero_grad()
    y = model(x)
    (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(7))).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return y.detach(), grads


# The full seq_len × chunk × ν × batch product is checked at the kernel level (test_delta_rule.py); here a
# covering subset, each with every chunk size against one loop run, checks the gradient of every parameter.
MODULE_GRID = [(1, 1, 3), (7, 2, 3), (64, 3, 1), (100, 1, 3), (257, 2, 1), (257, 3, 3)]


@pytest.mark.parametrize('seq_len,nu,batch', MODULE_GRID)
def test_kernels_agree_on_outputs_and_parameter_gradients(seq_len, nu, batch):
    model = randomise(build(fw, nu=nu, n_layers=1), seed=seq_len + nu)
    x = torch.randn(seq_len, batch, D_MODEL, generator=torch.Generator().manual_seed(seq_len))
    model.set_kernel('loop')
    y_ref, g_ref = outputs_and_grads(model, x)
    assert set(g_ref) == {n for n, _ in model.named_parameters()} - {'layers.0.norm_self_attn.weight',
                                                                     'layers.0.norm_self_attn.bias'}
    runs = [('chunked', c) for c in (16, 32, 64)] + ([('step', 16)] if seq_len <= 64 else [])
    for kernel, chunk_size in runs:
        model.set_kernel(kernel, chunk_size)
        y, g = outputs_and_grads(model, x)
        run = f'{kernel}/{chunk_size}'
        torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-5, msg=lambda m, run=run: f'{run}: {m}')
        for name in g_ref:
            assert max_relative_error(g[name], g_ref[name], floor=1e-12) <= 1e-4, f'{run}: grad of {name}'


# ---- carried state ----

@settings(max_examples=10, deadline=None)
@given(cuts=st.lists(st.integers(1, 79), max_size=4, unique=True), chunk_size=st.sampled_from([4, 16, 32]))
def test_carried_state_over_segments_equals_one_pass(cuts, chunk_size):
    model = randomise(build(fw, nu=2, chunk_size=chunk_size), seed=1)
    x = torch.randn(80, 2, D_MODEL, generator=torch.Generator().manual_seed(2))
    y_full, s_full = model.forward_with_state(x)
    bounds = [0] + sorted(cuts) + [80]
    state, pieces = None, []
    for a, b in zip(bounds, bounds[1:]):
        y, state = model.forward_with_state(x[a:b], state)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces), y_full, rtol=0, atol=1e-5)
    for a, b in zip(state, s_full):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert s_full[0].shape == (2, HEADS, D_MODEL // HEADS, 2 * (D_MODEL // HEADS) * 2)


def test_generation_steps_equal_the_full_pass():
    torch.manual_seed(0)
    lm = AutoregressiveModel(11, D_MODEL, randomise(build(fw, nu=1), seed=4)).eval()
    tokens = torch.randint(0, 11, (33, 2))
    full, _ = lm(tokens)
    logits, state = lm.forward_with_state(tokens[:5])  # a prompt, then one token at a time
    stepped = [logits]
    for t in range(5, 33):
        logits, state = lm.forward_with_state(tokens[t:t + 1], state)
        stepped.append(logits)
    torch.testing.assert_close(torch.cat(stepped), full, rtol=0, atol=1e-5)
    # greedy generation with the carried state equals re-running the whole prefix
    prompt = tokens[:4, :1]
    fast = lm.generate(prompt, 12, temperature=0)
    slow = lm.generate(prompt, 12, temperature=0, use_state=False)
    assert torch.equal(fast, slow)


def test_generation_step_is_bitwise_the_module_path_and_sees_weight_updates():
    # eval mode without autograd takes a step function (no module calls, stacked projection weights);
    # with autograd on, the same call goes through the modules: the two must agree exactly
    torch.manual_seed(0)
    lm = AutoregressiveModel(11, D_MODEL, randomise(build(fw, nu=1), seed=4)).eval()
    tokens = torch.randint(0, 11, (6, 2))
    _, state = lm.forward_with_state(tokens[:5])

    def both(token, state):
        with torch.no_grad():
            lean = lm.forward_with_state(token, state)
        return lean, lm.forward_with_state(token, state)

    (lean, lean_state), (module, module_state) = both(tokens[5:], state)
    assert torch.equal(lean, module)
    assert all(torch.equal(a, b) for a, b in zip(lean_state, module_state))
    # an in-place update of a projection weight must be seen, also through `.data` (which no version counter sees)
    lm.transformer.layers[0].attn.key.linear.weight.data.mul_(-1.5)
    (lean_after, _), (module_after, _) = both(tokens[5:], state)
    assert torch.equal(lean_after, module_after)
    assert not torch.equal(lean_after, lean)


def test_step_function_is_made_only_where_it_is_the_module_path_and_checks_its_input():
    torch.manual_seed(0)
    core = randomise(build(fw, nu=2), seed=3).eval()
    x = torch.randn(1, 3, D_MODEL)
    step = core.step_function()
    with torch.no_grad():
        _, state = core.forward_with_state(torch.randn(4, 3, D_MODEL))
        y, new_state = step(x, state)
    y_module, state_module = core.forward_with_state(x, state)  # autograd on: the module path
    assert torch.equal(y, y_module) and all(torch.equal(a, b) for a, b in zip(new_state, state_module))
    with pytest.raises(ValueError, match='one token'):
        step(torch.randn(2, 3, D_MODEL), state)
    with pytest.raises(ValueError, match='state must be'):
        step(x, [w[:2] for w in state])  # a batch of 2 must not broadcast against 3
    with pytest.raises(ValueError, match='n_layers=2'):
        step(x, state[:1])
    # none in training mode (dropout would be skipped), nor for parts it does not spell out
    assert core.train().step_function() is None
    gated = fw.FastWeightsAttentionTransformerLayer(
        d_model=D_MODEL, attn=fw.FastWeightsAttention(HEADS, D_MODEL, 0.0, fw.DPFP()),
        feed_forward=FeedForward(D_MODEL, D_FF, 0.0, is_gated=True), dropout_prob=0.0)
    lm = AutoregressiveModel(11, D_MODEL, randomise(fw.FastWeightsAttentionTransformer(gated, 2), seed=5)).eval()
    assert lm.transformer.step_function() is None
    prompt = torch.randint(0, 11, (3, 2))  # generation then falls back to forward_with_state, with equal tokens
    assert torch.equal(lm.generate(prompt, 6, temperature=0), lm.generate(prompt, 6, temperature=0, use_state=False))


def one_token_paths(core, x, state):
    """(step path: eval, no autograd; module path: autograd on) for one token x, as (output, state) pairs."""
    with torch.no_grad():
        fast = core.forward_with_state(x, state)
    return fast, core.forward_with_state(x, state)


def assert_same_pair(a, b):
    assert torch.equal(a[0], b[0]) and all(torch.equal(u, v) for u, v in zip(a[1], b[1]))


@pytest.mark.parametrize('change', ['projection bias', 'hook on the FFN', 'hook on a projection',
                                    'dropout in train mode', 'loop kernel'])
def test_what_the_step_function_cannot_spell_out_takes_the_module_path(change):
    torch.manual_seed(0)
    core = randomise(build(fw, nu=2, kernel='loop' if change == 'loop kernel' else 'chunked'), seed=2).eval()
    layer = core.layers[1]
    if change == 'projection bias':
        layer.attn.value.linear = nn.Linear(D_MODEL, D_MODEL)  # not fusable
    elif change == 'hook on the FFN':
        layer.feed_forward.register_forward_hook(lambda module, args, out: out + 0.5)
    elif change == 'hook on a projection':  # a shift: a scale would be invisible, φ'(2k) = φ'(k) up to eps
        layer.attn.key.register_forward_hook(lambda module, args, out: out + 0.5)
    elif change == 'dropout in train mode':  # Monte Carlo dropout: eval model, dropout switched back on
        layer.dropout.p = 0.5
        layer.dropout.train()
    assert core.step_function() is None
    with torch.no_grad():
        _, state = core.forward_with_state(torch.randn(4, 2, D_MODEL))
    x = torch.randn(1, 2, D_MODEL)
    if change == 'dropout in train mode':
        torch.manual_seed(1)
        fast = core.forward_with_state(x, state)
        torch.manual_seed(1)
        with torch.no_grad():
            assert_same_pair(core.forward_with_state(x, state), fast)
        return
    fast, module = one_token_paths(core, x, state)
    assert_same_pair(fast, module)
    if change.startswith('hook'):  # the hook did run on the no-autograd path: without it the output differs
        for m in core.modules():
            m._forward_hooks.clear()
        with torch.no_grad():
            assert not torch.equal(core.forward_with_state(x, state)[0], fast[0])


def test_forward_runs_the_hooks_of_layers_and_attention_as_labml_nn_does():
    torch.manual_seed(0)
    theirs = randomise(build(ref), seed=6)
    ours = build(fw)
    ours.load_state_dict(theirs.state_dict())
    for model in (ours, theirs):
        model.layers[0].attn.register_forward_hook(lambda module, args, out: out * 0.5)
        model.layers[1].register_forward_hook(lambda module, args, out: out + 1.0)
    x = torch.randn(7, 2, D_MODEL)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-5)


def test_a_phi_with_per_head_parameters_equals_labml_nn():
    class PerHeadScale(nn.Module):  # φ'(k) = softmax(k ⊙ s_head): acts on [..., heads, d_k], not any vector
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.linspace(0.5, 2.0, HEADS * (D_MODEL // HEADS)).view(HEADS, -1))

        def forward(self, k):
            return torch.softmax(k * self.scale, dim=-1)

    torch.manual_seed(0)
    attn_theirs = ref.FastWeightsAttention(HEADS, D_MODEL, 0.0, PerHeadScale())
    attn_ours = fw.FastWeightsAttention(HEADS, D_MODEL, 0.0, PerHeadScale())
    attn_ours.load_state_dict(attn_theirs.state_dict())
    x = torch.randn(9, 3, D_MODEL)
    torch.testing.assert_close(attn_ours(x), attn_theirs(x), rtol=0, atol=1e-6)


def test_input_errors_and_empty_chunks_on_every_path():
    core = randomise(build(fw, nu=1), seed=1).eval()
    with torch.no_grad():
        _, state = core.forward_with_state(torch.randn(3, 2, D_MODEL))
        for bad in (torch.randn(1, D_MODEL), torch.randn(1, 2, D_MODEL + 1)):  # wrong rank; wrong d_model
            with pytest.raises(ValueError, match='d_model'):
                core.forward_with_state(bad, state)
        # an empty chunk changes nothing
        y, same = core.forward_with_state(torch.randn(0, 2, D_MODEL), state)
    assert y.shape == (0, 2, D_MODEL) and all(torch.equal(a, b) for a, b in zip(same, state))


# ---- stability ----

def test_long_sequence_has_finite_outputs_and_gradients():
    model = randomise(build(fw, nu=1, n_layers=1), seed=6)
    x = torch.randn(4096, 1, D_MODEL, generator=torch.Generator().manual_seed(6), requires_grad=True)
    y = model(x)
    y.square().mean().backward()
    assert torch.isfinite(y).all()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_bf16_autocast_error_is_bounded_and_no_worse_than_the_loop():
    # Stated tolerance, for this 2-layer model under CPU bf16 autocast: max |y_bf16 − y_fp32| ≤ 0.1 · max |y_fp32|
    # (the bf16 projections and FFN dominate), and the chunked kernel's error is at most 1.5× the token loop's
    # under the same autocast (it keeps the triangular solve and the carried state in float32).
    model = randomise(build(fw, nu=1), seed=1)
    x = torch.randn(300, 2, D_MODEL, generator=torch.Generator().manual_seed(8))
    y32 = model(x)
    errors = {}
    for kernel in ('chunked', 'loop'):
        model.set_kernel(kernel)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            y16 = model(x)
        assert torch.isfinite(y16).all()
        errors[kernel] = max_relative_error(y16.float(), y32, floor=1e-12)
    assert errors['chunked'] <= 0.1
    assert errors['chunked'] <= 1.5 * errors['loop'], errors


# ---- errors ----

def test_errors_name_the_culprit():
    with pytest.raises(ValueError, match='d_model=10.*heads=3'):
        fw.FastWeightsAttention(3, 10, 0.0, fw.DPFP())
    with pytest.raises(ValueError, match="kernel"):
        fw.FastWeightsAttention(2, 16, 0.0, fw.DPFP(), kernel='fast')
    with pytest.raises(ValueError, match='chunk_size'):
        fw.FastWeightsAttention(2, 16, 0.0, fw.DPFP(), chunk_size=0)
    with pytest.raises(ValueError, match='nu'):
        fw.DPFP(nu=0)
    model = build(fw)
    with pytest.raises(ValueError, match='n_layers=2'):
        model.forward_with_state(torch.randn(3, 1, D_MODEL), [None])
    with pytest.raises(ValueError, match='seq_len, batch_size, d_model'):
        model(torch.randn(3, D_MODEL))
