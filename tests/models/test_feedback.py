"""Feedback Transformer: equal to labml-nn 0.5.1 (outputs and gradients), the fast memory equal to the plain loop,
no 512-step limit, a clear error past the relative-position table, and incremental state equal to the full pass."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from labml_nn.transformers import feedback as ref
from labml_nn.transformers.feed_forward import FeedForward as RefFeedForward

from lazylab.models import feedback as ours
from lazylab.models.autoregressive import AutoregressiveModel
from lazylab.models.feed_forward import FeedForward
from lazylab.models.feedback.reference import reference_forward


def build(mod, ff_cls, kv, d_model=16, heads=4, d_ff=32, n_layers=3, dropout=0.0, **attn_kwargs):
    attn = mod.FeedbackAttention(heads, d_model, dropout, is_kv_precomputed=kv, **attn_kwargs)
    layer = mod.FeedbackTransformerLayer(d_model=d_model, attn=attn, feed_forward=ff_cls(d_model, d_ff, dropout),
                                         dropout_prob=dropout)
    if kv:
        return mod.FeedbackTransformerKV(layer, n_layers, d_model, heads)
    return mod.FeedbackTransformer(layer, n_layers)


def randomize(model, std=0.1):
    """labml-nn starts the position tables at zero; random values make every term of the score matter."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model


def pair(kv, dtype=torch.float32, seed=0, **sizes):
    torch.manual_seed(seed)
    r = randomize(build(ref, RefFeedForward, kv, **sizes)).to(dtype)
    o = build(ours, FeedForward, kv, **sizes).to(dtype)
    o.load_state_dict(r.state_dict())
    return r, o


def grads(model, y, g):
    params = list(model.parameters())
    found = torch.autograd.grad((y * g).sum(), params, allow_unused=True)  # 1 step: attention is unused
    return [torch.zeros_like(p) if d is None else d for p, d in zip(params, found)]


def assert_grads_close(names, ga, gb, rtol):
    for name, a, b in zip(names, ga, gb):
        err = ((a - b).norm() / a.norm().clamp_min(1e-30)).item() if a.norm() > 0 else b.norm().item()
        assert err <= rtol, f'{name}: relative gradient error {err:.2e}'


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
def test_state_dict_keys_equal_labml_nn(kv):
    r, o = pair(kv)
    assert list(r.state_dict()) == list(o.state_dict())
    r.load_state_dict(o.state_dict())  # and back


@settings(max_examples=4, deadline=None)
@given(kv=st.booleans(), seq_len=st.integers(1, 40), batch=st.integers(1, 3), seed=st.integers(0, 100))
def test_outputs_and_gradients_equal_labml_nn(kv, seq_len, batch, seed):
    r, o = pair(kv, seed=seed)
    x = torch.randn(seq_len, batch, 16)
    yr, yo = r(x), o(x)
    torch.testing.assert_close(yo, yr, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(yr)
    assert_grads_close([n for n, _ in r.named_parameters()], grads(r, yr, g), grads(o, yo, g), 1e-4)


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
def test_equal_labml_nn_at_seq_len_128_batch_3(kv):
    r, o = pair(kv, d_model=16, heads=4, d_ff=32, n_layers=2)
    x = torch.randn(128, 3, 16)
    yr, yo = r(x), o(x)
    torch.testing.assert_close(yo, yr, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(yr)
    assert_grads_close([n for n, _ in r.named_parameters()], grads(r, yr, g), grads(o, yo, g), 1e-4)
    if kv:
        r.free()


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
@pytest.mark.parametrize('seq_len', [600, 1100])
def test_runs_past_512_steps_forward_and_backward(kv, seq_len):
    """labml-nn's KV model stops at 512 steps; ours runs on. Outputs equal the plain loop; the gradient's
    projection on a random direction equals a central finite difference (float64), so the memory gradients
    are right all the way back."""
    torch.manual_seed(seq_len)
    o = randomize(build(ours, FeedForward, kv, d_model=8, heads=2, d_ff=16, n_layers=2)).double()
    x = torch.randn(seq_len, 1, 8, dtype=torch.float64)
    g = torch.randn(seq_len, 1, 8, dtype=torch.float64)
    params = list(o.parameters())
    directions = [torch.randn_like(p) for p in params]
    y = o(x)
    analytic = sum((d * v).sum() for d, v in zip(torch.autograd.grad((y * g).sum(), params), directions))
    # Central difference; its error is ~ eps² times a large third derivative here (measured at 600 steps:
    # 5e-4 relative at eps=1e-5, 2e-4 at 1e-6, 2e-10 at 1e-7), so eps is small and float64 is needed.
    eps = 1e-7
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        torch.testing.assert_close(y, reference_forward(o, x), rtol=1e-10, atol=1e-10)
        losses = []
        for sign in (1, -1):
            for p, p0, v in zip(params, saved, directions):
                p.copy_(p0 + sign * eps * v)
            losses.append((o(x) * g).sum())
    numeric = (losses[0] - losses[1]) / (2 * eps)
    torch.testing.assert_close(analytic, numeric, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
def test_reference_loop_equals_labml_nn_and_the_fast_path_forward_and_backward(kv):
    """The plain loop of `feedback.reference` is what the long-sequence tests trust: it equals labml-nn, and the
    fast path equals it, outputs and every parameter's gradient."""
    r, o = pair(kv, dtype=torch.float64, seed=5)
    x = torch.randn(17, 2, 16, dtype=torch.float64)
    g = torch.randn(17, 2, 16, dtype=torch.float64)
    y_ref, y_loop, y_fast = r(x), reference_forward(o, x), o(x)
    torch.testing.assert_close(y_loop, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(y_fast, y_loop, rtol=1e-10, atol=1e-10)
    names = [n for n, _ in o.named_parameters()]
    g_loop = grads(o, y_loop, g)
    assert_grads_close(names, g_loop, grads(r, y_ref, g), 1e-10)
    assert_grads_close(names, grads(o, y_fast, g), g_loop, 1e-10)


def test_labml_nn_kv_stops_at_512_steps():
    """The limit we remove (documents why the test above compares against our plain loop)."""
    _, r = None, build(ref, RefFeedForward, True, d_model=8, heads=2, d_ff=16, n_layers=1)
    with pytest.raises(Exception):  # noqa: B017 (whatever labml-nn's stack overflow raises)
        r(torch.randn(513, 1, 8))


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
def test_memory_longer_than_n_positions_raises_naming_the_key(kv):
    o = build(ours, FeedForward, kv, n_positions=8)
    o(torch.randn(9, 2, 16)).sum().backward()  # 9 steps: the last attends over 8 = P memory steps
    with pytest.raises(ValueError, match='n_positions=8'):
        o(torch.randn(10, 2, 16))
    _, state = o.forward_with_state(torch.randn(5, 2, 16))
    with pytest.raises(ValueError, match='n_positions'):
        o.forward_with_state(torch.randn(5, 2, 16), state)
    with pytest.raises(ValueError, match='n_positions'):
        o.layers[0](x=torch.randn(2, 16), key=torch.randn(9, 2, 16) if not kv else torch.randn(9, 2, 4, 4),
                    value=torch.randn(9, 2, 16) if not kv else torch.randn(9, 2, 4, 4))


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
def test_n_positions_other_than_4096_equals_plain_loop(kv):
    torch.manual_seed(3)
    o = randomize(build(ours, FeedForward, kv, n_positions=20)).double()
    x = torch.randn(21, 2, 16, dtype=torch.float64)
    torch.testing.assert_close(o(x), reference_forward(o, x))


@settings(max_examples=5, deadline=None)
@given(kv=st.booleans(), cuts=st.lists(st.integers(1, 29), max_size=4, unique=True))
def test_chunks_with_carried_state_equal_one_call(kv, cuts):
    _, o = pair(kv, dtype=torch.float64)
    x = torch.randn(30, 2, 16, dtype=torch.float64)
    full = o(x)
    bounds = [0] + sorted(cuts) + [30]
    state, parts = None, []
    for a, b in zip(bounds, bounds[1:]):
        y, state = o.forward_with_state(x[a:b], state)
        parts.append(y)
    assert len(state) == 30
    torch.testing.assert_close(torch.cat(parts), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
def test_incremental_logits_equal_full_pass_at_every_step(kv):
    torch.manual_seed(0)
    _, core = pair(kv)
    model = AutoregressiveModel(11, 16, core).eval()
    ids = torch.randint(0, 11, (24, 2))
    with torch.no_grad():
        full, _ = model(ids)
        state = None
        for i in range(24):
            step, state = model.forward_with_state(ids[i:i + 1], state)
            torch.testing.assert_close(step[0], full[i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
def test_generate_with_state_equals_rerunning_the_prefix(kv):
    torch.manual_seed(1)
    _, core = pair(kv)
    model = AutoregressiveModel(11, 16, core)
    prompt = torch.randint(0, 11, (5, 2))
    fast = model.generate(prompt, 12, temperature=0)
    slow = model.generate(prompt, 12, temperature=0, use_state=False)
    assert torch.equal(fast, slow)


def test_a_state_can_be_continued_twice():
    _, o = pair(True, dtype=torch.float64)
    a, b, c = (torch.randn(n, 2, 16, dtype=torch.float64) for n in (6, 4, 3))
    _, state = o.forward_with_state(a)
    yb, _ = o.forward_with_state(b, state)
    yc, _ = o.forward_with_state(c, state)  # continues after `a`, not after `b`
    torch.testing.assert_close(yb, o(torch.cat([a, b]))[6:])
    torch.testing.assert_close(yc, o(torch.cat([a, c]))[6:])


def test_state_batch_mismatch_raises():
    o = build(ours, FeedForward, True)
    _, state = o.forward_with_state(torch.randn(3, 2, 16))
    with pytest.raises(ValueError, match='batch_size'):
        o.forward_with_state(torch.randn(3, 4, 16), state)


@pytest.mark.parametrize('kv', [True, False], ids=['kv', 'original'])
def test_backward_twice_over_a_retained_graph_doubles_gradients(kv):
    _, o = pair(kv, dtype=torch.float64)
    x = torch.randn(12, 2, 16, dtype=torch.float64)
    y = o(x)
    w = o.layers[0].attn.query.linear.weight
    (g1,) = torch.autograd.grad(y.sum(), [w], retain_graph=True)
    (g2,) = torch.autograd.grad(y.sum(), [w], retain_graph=True)
    torch.testing.assert_close(g1, g2)
    # A pass that needed only part of the graph (w is not used at step 0) must not leave stale sums behind.
    everything = torch.autograd.grad(y.sum(), list(o.parameters()))
    y2 = o(x)
    again = torch.autograd.grad(y2.sum(), list(o.parameters()))
    for a, b in zip(everything, again):
        torch.testing.assert_close(a, b)


def test_dropout_trains_and_eval_matches_plain_loop():
    torch.manual_seed(0)
    o = randomize(build(ours, FeedForward, True, dropout=0.3))
    x = torch.randn(10, 2, 16)
    y1 = o(x)
    y1.sum().backward()
    assert not torch.allclose(y1, o(x))  # dropout is active in training
    o.eval()
    torch.testing.assert_close(o(x), reference_forward(o, x))


def test_errors_name_the_culprit():
    with pytest.raises(ValueError, match='d_model=10.*heads=4'):
        ours.FeedbackAttention(4, 10)
    with pytest.raises(ValueError, match='is_kv_precomputed=True'):
        build(ours, FeedForward, True, n_layers=1).__class__(
            ours.FeedbackTransformerLayer(d_model=16, attn=ours.FeedbackAttention(4, 16),
                                          feed_forward=FeedForward(16, 32), dropout_prob=0.0), 1, 16, 4)
    with pytest.raises(ValueError, match='is_kv_precomputed=False'):
        ours.FeedbackTransformer(
            ours.FeedbackTransformerLayer(d_model=16, attn=ours.FeedbackAttention(4, 16, is_kv_precomputed=True),
                                          feed_forward=FeedForward(16, 32), dropout_prob=0.0), 1)
    with pytest.raises(ValueError, match='d_model=16'):
        build(ours, FeedForward, True)(torch.randn(3, 2, 8))
