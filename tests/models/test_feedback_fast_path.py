"""The fast path of the Feedback Transformer (`feedback/sequence.py`: the whole sequence as one autograd node, with
backpropagation through time written out) against the plain loop of `feedback/reference.py`, forward and backward,
over shapes, FFN variants, memory spans and block boundaries; its gradients with dropout and with a carried-in
state against finite differences; the memory span against a masked reference written here; bfloat16 autocast
against float64."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lazylab.models import feedback as fb
from lazylab.models.feed_forward import FeedForward
from lazylab.models.feedback.reference import reference_forward
from lazylab.models.feedback.sequence import BLOCK

FFNS = {
    'relu': lambda d, f, p: FeedForward(d, f, p),
    'gelu': lambda d, f, p: FeedForward(d, f, p, activation=nn.GELU()),
    'swiglu': lambda d, f, p: FeedForward(d, f, p, activation=nn.SiLU(), is_gated=True, bias1=False, bias2=False,
                                          bias_gate=False),
    'bilinear': lambda d, f, p: FeedForward(d, f, p, activation=nn.Identity(), is_gated=True),
    # not done by hand: called as a module, with autograd, at every step
    'module': lambda d, f, p: nn.Sequential(nn.Linear(d, f), nn.Tanh(), nn.Linear(f, d)),
}


def build(kv, d_model=8, heads=2, d_ff=16, n_layers=2, dropout=0.0, ffn='relu', memory_span=0, n_positions=64,
          seed=0, dtype=torch.float64, std=0.3):
    """A model with every parameter drawn from N(0, std²), or (std=None) PyTorch's initialisation with the
    position tables and memory weights, which start at constants, drawn from N(0, 0.1²)."""
    torch.manual_seed(seed)
    attn = fb.FeedbackAttention(heads, d_model, dropout, is_kv_precomputed=kv, n_positions=n_positions)
    layer = fb.FeedbackTransformerLayer(d_model=d_model, attn=attn, feed_forward=FFNS[ffn](d_model, d_ff, dropout),
                                        dropout_prob=dropout)
    model = (fb.FeedbackTransformerKV(layer, n_layers, d_model, heads, memory_span=memory_span) if kv else
             fb.FeedbackTransformer(layer, n_layers, memory_span=memory_span))
    with torch.no_grad():  # random values everywhere (labml-nn starts the position tables at zero)
        for name, p in model.named_parameters():
            if std is not None:
                p.normal_(0, std)
            elif name == 'weights' or '_pos_' in name:
                p.normal_(0, 0.1)
    return model.to(dtype)


def all_grads(model, x, y, g):
    """∂(y·g)/∂(x, every parameter); a parameter the graph does not reach gets zeros."""
    inputs = [x, *model.parameters()]
    found = torch.autograd.grad((y * g).sum(), inputs, allow_unused=True)
    return [torch.zeros_like(t) if f is None else f for t, f in zip(inputs, found)]


def assert_all_close(model, ours, theirs, rtol):
    """Each gradient within rtol of the reference's, relative to its norm or, if that is smaller, to 1e-3 of the
    largest gradient's: a gradient that is small by cancellation (a 2-element bias summed over a few positions)
    carries the rounding of the terms that cancelled, which is relative to those terms, not to the small sum."""
    names = ['x'] + [n for n, _ in model.named_parameters()]
    floor = 1e-3 * max(b.norm().item() for b in theirs)
    for name, a, b in zip(names, ours, theirs):
        scale = max(b.norm().item(), floor)
        err = (a - b).norm().item() / scale if scale > 0 else a.norm().item()
        assert err <= rtol, f'{name}: relative error {err:.2e}'


def fast_and_reference(model, x, g):
    y_fast = model(x)
    y_ref = reference_forward(model, x)
    return y_fast, y_ref, all_grads(model, x, y_fast, g), all_grads(model, x, y_ref, g)


@settings(max_examples=25, deadline=None)
@given(kv=st.booleans(), seq_len=st.integers(1, 2 * BLOCK + 5), batch=st.integers(1, 3),
       heads=st.sampled_from([1, 2, 4]), n_layers=st.integers(1, 3), ffn=st.sampled_from(sorted(FFNS)),
       memory_span=st.sampled_from([0, 1, 3, BLOCK + 1, 100]), seed=st.integers(0, 1000))
def test_fast_path_equals_the_reference_loop_forward_and_backward_for_any_shape(
        kv, seq_len, batch, heads, n_layers, ffn, memory_span, seed):
    model = build(kv, d_model=2 * heads, heads=heads, d_ff=12, n_layers=n_layers, ffn=ffn, memory_span=memory_span,
                  seed=seed)
    draw = torch.Generator().manual_seed(seed)  # (so that a failing example replays)
    x = torch.randn(seq_len, batch, 2 * heads, dtype=torch.float64, generator=draw, requires_grad=True)
    g = torch.randn(seq_len, batch, 2 * heads, dtype=torch.float64, generator=draw)
    y_fast, y_ref, g_fast, g_ref = fast_and_reference(model, x, g)
    torch.testing.assert_close(y_fast, y_ref, rtol=1e-11, atol=1e-11)
    assert_all_close(model, g_fast, g_ref, 1e-10)


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
def test_fast_path_equals_the_reference_loop_over_several_blocks_of_the_backward(kv):
    """seq_len 3·BLOCK + 2 with four layers: several blocks of slot gradients, and layers that share groups."""
    model = build(kv, d_model=8, heads=2, n_layers=4, seed=1)
    x = torch.randn(3 * BLOCK + 2, 2, 8, dtype=torch.float64, requires_grad=True)
    g = torch.randn_like(x)
    y_fast, y_ref, g_fast, g_ref = fast_and_reference(model, x, g)
    torch.testing.assert_close(y_fast, y_ref, rtol=1e-11, atol=1e-11)
    assert_all_close(model, g_fast, g_ref, 1e-10)


def directional_derivatives(model, run, directions, eps=1e-6):
    """(analytic, central-difference) derivative of run() · g along `directions` of the parameters; run() must
    draw the same random numbers every time (it re-seeds)."""
    params = list(model.parameters())
    loss = run()
    analytic = sum((d * p).sum() for d, p in zip(directions, torch.autograd.grad(loss, params, allow_unused=True))
                   if p is not None)
    saved = [p.detach().clone() for p in params]
    values = []
    with torch.no_grad():
        for sign in (1, -1):
            for p, p0, d in zip(params, saved, directions):
                p.copy_(p0 + sign * eps * d)
            values.append(run())
        for p, p0 in zip(params, saved):
            p.copy_(p0)
    return analytic, (values[0] - values[1]) / (2 * eps)


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
@pytest.mark.parametrize('ffn', ['relu', 'swiglu', 'module'])
def test_gradients_with_dropout_equal_finite_differences(kv, ffn):
    """Dropout on the attention weights, both residual branches and the FFN hidden layer: the masks come from the
    seed, so re-seeding makes the loss a smooth function of the parameters, whose derivative the fast path's
    backward must give."""
    model = build(kv, dropout=0.25, ffn=ffn, n_layers=2, seed=3)
    model.train()
    x = torch.randn(2 * BLOCK + 3, 2, 8, dtype=torch.float64)
    g = torch.randn(2 * BLOCK + 3, 2, 8, dtype=torch.float64)

    def run():
        torch.manual_seed(11)
        return (model(x) * g).sum()

    with torch.no_grad():
        assert not torch.allclose(run(), (reference_forward(model.eval(), x) * g).sum())  # dropout does drop
    model.train()
    directions = [torch.randn_like(p) for p in model.parameters()]
    analytic, numeric = directional_derivatives(model, run, directions)
    torch.testing.assert_close(analytic, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
def test_gradients_of_a_call_after_a_carried_state_equal_finite_differences(kv):
    """A call that continues a state attends over slots it did not write (constants) and over its own; the
    gradient, with the state held fixed, equals the derivative of that function."""
    model = build(kv, n_layers=2, memory_span=BLOCK // 2, seed=4)
    prefix = torch.randn(7, 2, 8, dtype=torch.float64)
    x = torch.randn(BLOCK + 5, 2, 8, dtype=torch.float64)
    g = torch.randn(BLOCK + 5, 2, 8, dtype=torch.float64)
    with torch.no_grad():
        _, state = model.forward_with_state(prefix)
        full = model(torch.cat([prefix, x]))

    def run():
        return (model.forward_with_state(x, state)[0] * g).sum()

    with torch.no_grad():
        torch.testing.assert_close(model.forward_with_state(x, state)[0], full[7:], rtol=1e-12, atol=1e-12)
    directions = [torch.randn_like(p) for p in model.parameters()]
    analytic, numeric = directional_derivatives(model, run, directions)
    torch.testing.assert_close(analytic, numeric, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------------------------------
# memory span
# ---------------------------------------------------------------------------------------------------------------

def masked_reference(model, x_seq):
    """The memory span as a mask: every step scores the whole memory, as labml-nn does, and slots older than the
    last N get zero weight (score −∞). Written here from the layers' parts, independently of both loops."""
    span = model.memory_span
    w = torch.softmax(model.weights, dim=0)
    keys, values, outputs = [], [], []
    for t, x in enumerate(x_seq.unbind(0)):
        xs = [x]
        for layer in model.layers:
            attn = layer.attn
            if t > 0:
                if isinstance(model, fb.FeedbackTransformerKV):
                    k, v = torch.stack(keys), torch.stack(values)                    # [t, b, h, d]
                else:
                    k, v = attn.key(torch.stack(keys)), attn.value(torch.stack(values))
                q = attn.query(layer.norm_self_attn(x))                               # [b, h, d]
                scores = attn.get_scores(q, k) * attn.scale                           # [t, b, h]
                if span:
                    too_old = torch.arange(t) < t - span
                    scores = scores.masked_fill(too_old[:, None, None], -math.inf)
                a = torch.softmax(scores, dim=0)
                o = torch.einsum('jbh,jbhd->bhd', a, v).reshape(x.shape[0], -1)
                x = x + attn.output(o)
            x = x + layer.feed_forward(layer.norm_ff(x))
            xs.append(x)
        m = torch.einsum('lbd,l->bd', torch.stack(xs), w)
        if isinstance(model, fb.FeedbackTransformerKV):
            keys.append(model.key(m))
            values.append(model.value(m))
        else:
            keys.append(m)
            values.append(m)
        outputs.append(x)
    return model.norm(torch.stack(outputs))


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
@pytest.mark.parametrize('span', [1, 2, 5])
def test_a_small_memory_span_masks_the_older_memory(kv, span):
    model = build(kv, n_layers=2, memory_span=span, seed=span)
    x = torch.randn(20, 2, 8, dtype=torch.float64, requires_grad=True)
    g = torch.randn_like(x)
    y_masked = masked_reference(model, x)
    y_fast = model(x)
    torch.testing.assert_close(y_fast, y_masked, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(reference_forward(model, x), y_masked, rtol=1e-11, atol=1e-11)
    assert_all_close(model, all_grads(model, x, y_fast, g), all_grads(model, x, y_masked, g), 1e-10)
    # and it is not the full model
    model.memory_span = 0
    assert (model(x) - y_fast).abs().max() > 1e-3


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
@pytest.mark.parametrize('span', [19, 20, 1000])
def test_a_memory_span_of_at_least_seq_len_is_the_full_model(kv, span):
    """seq_len 20: the last step attends over 19 slots, so N ≥ 19 changes nothing (bit for bit)."""
    full = build(kv, n_layers=2, seed=2)
    spanned = build(kv, n_layers=2, memory_span=span, seed=2)
    x = torch.randn(20, 2, 8, dtype=torch.float64, requires_grad=True)
    g = torch.randn_like(x)
    y_full, y_span = full(x), spanned(x)
    assert torch.equal(y_full, y_span)
    for a, b in zip(all_grads(full, x, y_full, g), all_grads(spanned, x, y_span, g)):
        assert torch.equal(a, b)


def test_with_a_memory_span_n_positions_need_only_cover_the_span():
    model = build(True, memory_span=4, n_positions=4)
    x = torch.randn(30, 2, 8, dtype=torch.float64)
    torch.testing.assert_close(model(x), reference_forward(model, x), rtol=1e-11, atol=1e-11)
    _, state = model.forward_with_state(x)
    y, _ = model.forward_with_state(x, state)  # 60 steps in all
    assert y.shape == x.shape
    with pytest.raises(ValueError, match='n_positions=4'):
        build(True, memory_span=5, n_positions=4)(x)
    with pytest.raises(ValueError, match='memory_span'):
        build(True, memory_span=-1)


# ---------------------------------------------------------------------------------------------------------------
# precision
# ---------------------------------------------------------------------------------------------------------------

def relative_error(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
def test_bfloat16_autocast_forward_and_backward_are_close_to_float64(kv):
    """Under CPU bfloat16 autocast the products run in bfloat16 and the recurrence, softmax, LayerNorm and every
    gradient summed over steps in float32. Stated tolerances (measured at seq_len 64: outputs 0.2 %, gradients
    2-2.6 % on average over the parameter tensors and ≤ 6.5 % for the worst, as close as autocast over the plain
    loop gets): outputs within 2 % (relative norm), the gradients' relative errors within 6 % on average and 25 %
    for every tensor; and no worse on average than the plain loop under the same autocast, with 25 % slack."""
    model = build(kv, d_model=32, heads=4, d_ff=64, n_layers=3, seed=0, dtype=torch.float32, std=None)
    exact = build(kv, d_model=32, heads=4, d_ff=64, n_layers=3, seed=0, std=None)
    exact.load_state_dict(model.state_dict())
    x = torch.randn(64, 4, 32, requires_grad=True)
    g = torch.randn(64, 4, 32)
    x64 = x.detach().double().requires_grad_()
    y64 = exact(x64)
    g64 = all_grads(exact, x64, y64, g.double())
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = model(x)
        y_loop = reference_forward(model, x)
    assert y.dtype == torch.float32
    ours, loop = all_grads(model, x, y, g), all_grads(model, x, y_loop, g)
    errors = [relative_error(a, b) for a, b in zip(ours, g64) if b.norm() > 0]
    loop_errors = [relative_error(a, b) for a, b in zip(loop, g64) if b.norm() > 0]
    print(f'bfloat16 vs float64: outputs {relative_error(y, y64):.2e} (plain loop {relative_error(y_loop, y64):.2e}); '
          f'gradients mean {sum(errors) / len(errors):.2e} max {max(errors):.2e} '
          f'(plain loop {sum(loop_errors) / len(loop_errors):.2e}, {max(loop_errors):.2e})')
    assert relative_error(y, y64) < 0.02
    assert sum(errors) / len(errors) < 0.06 and max(errors) < 0.25
    assert sum(errors) / len(errors) < 1.25 * sum(loop_errors) / len(loop_errors)
    # backward() itself inside the autocast block works too (it failed with a dtype mismatch before)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        model(x).sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
@pytest.mark.parametrize('memory_span', [0, 3])
@pytest.mark.parametrize('ffn', ['relu', 'module'])
def test_the_step_function_equals_forward_with_state_token_by_token(kv, memory_span, ffn):
    # the generation path: weights prepared once, then one token per call, against the plain stateful call
    model = build(kv, memory_span=memory_span, ffn=ffn).eval()
    x = torch.randn(12, 3, 8, dtype=torch.float64)
    step = model.step_function()
    with torch.no_grad():
        y, state = model.forward_with_state(x[:4])          # a prompt: several steps at once
        ys, state_b = y, state
        y_ref, state_ref = model.forward_with_state(x[:4])
        for t in range(4, 12):
            y, state = step(x[t:t + 1], state)
            y_ref, state_ref = model.forward_with_state(x[t:t + 1], state_ref)
            torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
            ys = torch.cat([ys, y])
        full, _ = model.forward_with_state(x)
    torch.testing.assert_close(ys, full, rtol=1e-10, atol=1e-10)
    assert state.n == state_ref.n == 12 and state_b.n == 4
