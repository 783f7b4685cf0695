"""The three delta-rule kernels agree: chunked == loop == step, forward and backward, for any length.

Inputs are drawn like the module's: q, k are sum-normalised non-negative features (as DPFP gives), β ∈ (0, 1).
"""
import functools
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lazylab.models.fast_weights.delta_rule import (
    delta_rule_chunked,
    delta_rule_loop,
    delta_rule_step,
    unit_lower_inverse,
)
from lazylab.testing import assert_close


def make_inputs(seq_len, batch, heads, d_dot, d_v, *, with_state, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def features():
        f = torch.rand(seq_len, batch, heads, d_dot, generator=g, dtype=dtype)
        f = f * (torch.rand(f.shape, generator=g, dtype=dtype) < 0.5)  # sparse, like DPFP
        return f / (f.sum(-1, keepdim=True) + 1e-6)

    q, k = features(), features()
    v = torch.randn(seq_len, batch, heads, d_v, generator=g, dtype=dtype)
    beta = torch.rand(seq_len, batch, heads, generator=g, dtype=dtype)
    state = torch.randn(batch, heads, d_v, d_dot, generator=g, dtype=dtype) if with_state else None
    return q, k, v, beta, state


def run_with_grads(fn, inputs):
    """Output, final state, and gradients of a fixed random loss w.r.t. every input."""
    inputs = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    y, state = fn(*inputs)
    g = torch.Generator().manual_seed(1)
    loss = (y * torch.randn(y.shape, generator=g, dtype=y.dtype)).sum() + \
           (state * torch.randn(state.shape, generator=g, dtype=state.dtype)).sum()
    loss.backward()
    return y.detach(), state.detach(), [t.grad for t in inputs if t is not None]


def step_loop(q, k, v, beta, state):
    ys = []
    for i in range(q.shape[0]):
        y, state = delta_rule_step(q[i], k[i], v[i], beta[i], state)
        ys.append(y)
    return torch.stack(ys), state



# The grid: seq_len × chunk size × d_dot (= 2·d_k·ν with d_k = 8, ν ∈ {1, 2, 3}) × batch.
GRID = list(itertools.product([1, 7, 64, 100, 257], [16, 32, 64], [16, 32, 48], [1, 3]))


@functools.cache
def reference_case(seq_len, d_dot, batch):
    """Inputs and the loop's results, shared by the chunk sizes (the loop is the slow part)."""
    inputs = make_inputs(seq_len, batch, 2, d_dot, 8, with_state=(seq_len % 2 == 1), seed=seq_len + d_dot + batch)
    return inputs, run_with_grads(delta_rule_loop, inputs)


@pytest.mark.parametrize('seq_len,chunk_size,d_dot,batch', GRID)
def test_chunked_equals_loop_forward_and_backward(seq_len, chunk_size, d_dot, batch):
    inputs, (y_ref, s_ref, g_ref) = reference_case(seq_len, d_dot, batch)
    y, s, g = run_with_grads(lambda *a: delta_rule_chunked(*a, chunk_size=chunk_size), inputs)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=1e-5)
    for name, a, b in zip(['q', 'k', 'v', 'beta', 'state'], g, g_ref):
        assert_close(a, b, 1e-4, f'grad {name}', floor=1e-12)


@pytest.mark.parametrize('seq_len', [1, 7, 100])
@pytest.mark.parametrize('with_state', [False, True])
def test_step_equals_loop_forward_and_backward(seq_len, with_state):
    inputs = make_inputs(seq_len, 3, 2, 32, 8, with_state=with_state, seed=seq_len)
    y_ref, s_ref, g_ref = run_with_grads(delta_rule_loop, inputs)
    y, s, g = run_with_grads(step_loop, inputs)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=1e-5)
    for a, b in zip(g, g_ref):
        assert_close(a, b, 1e-4, 'grad', floor=1e-12)


@settings(max_examples=25, deadline=None)
@given(seq_len=st.integers(1, 90), chunk_size=st.integers(1, 40), batch=st.integers(1, 3),
       heads=st.integers(1, 3), d_dot=st.integers(1, 24), d_v=st.integers(1, 9), with_state=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_chunked_equals_loop_for_any_shape_in_float64(seq_len, chunk_size, batch, heads, d_dot, d_v, with_state,
                                                      seed):
    inputs = make_inputs(seq_len, batch, heads, d_dot, d_v, with_state=with_state, dtype=torch.float64, seed=seed)
    y_ref, s_ref, g_ref = run_with_grads(delta_rule_loop, inputs)
    y, s, g = run_with_grads(lambda *a: delta_rule_chunked(*a, chunk_size=chunk_size), inputs)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_chunked_backward_passes_gradcheck():
    # the hand-written backward against finite differences (float64; padding, several chunks, an initial state)
    q, k, v, beta, state = make_inputs(7, 2, 1, 3, 2, with_state=True, dtype=torch.float64, seed=3)
    inputs = [t.requires_grad_() for t in (q, k, v, beta, state)]
    assert torch.autograd.gradcheck(lambda *a: delta_rule_chunked(*a, chunk_size=3), inputs)


@pytest.mark.parametrize('c', [1, 2, 3, 16, 17, 64])
def test_unit_lower_inverse_equals_matrix_inverse(c):
    g = torch.Generator().manual_seed(c)
    a = torch.randn(5, c, c, generator=g, dtype=torch.float64).tril(-1) * 0.5
    expected = torch.linalg.inv(torch.eye(c, dtype=torch.float64) + a)
    torch.testing.assert_close(unit_lower_inverse(a), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('fn', [delta_rule_loop, delta_rule_chunked, step_loop])
def test_hand_worked_writes_replace_the_stored_value(fn):
    # One head, one-hot keys: writing v under e₀ with β = 1 stores it; writing v' under e₀ with β = ½ stores the
    # mix ½ v + ½ v'; a write under e₁ does not disturb what e₀ reads.
    e0, e1 = torch.tensor([1., 0.]), torch.tensor([0., 1.])
    k = torch.stack([e0, e0, e1]).view(3, 1, 1, 2)
    q = torch.stack([e0, e0, e0]).view(3, 1, 1, 2)
    v = torch.tensor([[2., -4.], [6., 0.], [100., 100.]]).view(3, 1, 1, 2)
    beta = torch.tensor([1., .5, 1.]).view(3, 1, 1)
    y, w = fn(q, k, v, beta, None)
    torch.testing.assert_close(y.view(3, 2), torch.tensor([[2., -4.], [4., -2.], [4., -2.]]))
    # W = [v̄(e₀) v̄(e₁)] as columns: [batch, heads, d_v, d_dot]
    torch.testing.assert_close(w.view(2, 2), torch.tensor([[4., 100.], [-2., 100.]]))


def test_carried_state_equals_one_pass():
    q, k, v, beta, _ = make_inputs(70, 2, 2, 16, 4, with_state=False)
    y_full, s_full = delta_rule_chunked(q, k, v, beta, None, chunk_size=16)
    y1, s1 = delta_rule_chunked(q[:23], k[:23], v[:23], beta[:23], None, chunk_size=16)
    y2, s2 = delta_rule_chunked(q[23:], k[23:], v[23:], beta[23:], s1, chunk_size=16)
    torch.testing.assert_close(torch.cat([y1, y2]), y_full, rtol=0, atol=1e-6)
    torch.testing.assert_close(s2, s_full, rtol=0, atol=1e-6)


def test_beta_with_trailing_singleton_is_accepted():
    q, k, v, beta, state = make_inputs(9, 2, 3, 8, 4, with_state=True)
    a = delta_rule_chunked(q, k, v, beta, state, chunk_size=4)
    b = delta_rule_chunked(q, k, v, beta.unsqueeze(-1), state, chunk_size=4)
    torch.testing.assert_close(a[0], b[0])


def test_chunked_in_bf16_autocast_stays_close_to_float32():
    # Stated tolerance: under bf16 autocast the outputs are within 2 % of max |y| of the float32 result.
    q, k, v, beta, state = make_inputs(300, 2, 2, 32, 8, with_state=True)
    y32, s32 = delta_rule_chunked(q, k, v, beta, state, chunk_size=32)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y16, s16 = delta_rule_chunked(q.bfloat16(), k.bfloat16(), v.bfloat16(), beta.bfloat16(), state,
                                      chunk_size=32)
    assert torch.isfinite(y16).all()
    assert_close(y16.float(), y32, 2e-2, 'bf16 output', floor=1e-12)
    assert_close(s16.float(), s32, 2e-2, 'bf16 state', floor=1e-12)


@pytest.mark.parametrize('bad,match', [
    (dict(k=torch.zeros(5, 2, 3, 7)), 'q and k'),
    (dict(beta=torch.zeros(5, 2, 4)), 'beta'),
    (dict(state=torch.zeros(2, 3, 8, 4)), 'state'),
    (dict(chunk_size=0), 'chunk_size'),
])
def test_bad_arguments_raise_clear_errors(bad, match):
    q, k, v, beta, _ = make_inputs(5, 2, 3, 8, 4, with_state=False)
    args = dict(q=q, k=k, v=v, beta=beta, state=None, chunk_size=4)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        delta_rule_chunked(**args)
