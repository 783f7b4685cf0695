"""The gated delta rule and DeltaProduct kernels: equal to flash-linear-attention's own pure-PyTorch references,
chunked == loop == step forward and backward, the identities that tie them to the delta rule, precision under
bfloat16 autocast, and one-line errors.

The references are fla-core 0.6.0's `naive_recurrent_gated_delta_rule` and `naive_recurrent_gated_delta_product`,
loaded from their files (`lazylab.models.fast_weights.fla_reference`: neither fla nor triton is imported), with
scale = 1 (our rules do not scale q) and the state transposed to fla's [B, H, K, V]. They compute in float32; for the
float64 comparison (within 1e-10) they run with float32 read as float64, on inputs drawn in float32 (so that the
casts they keep, DeltaProduct's .float(), are exact). Without fla-core the comparisons skip, saying why; in CI
(the environment variable CI set) a missing fla-core fails `test_fla_core_is_installed_where_ci_runs`.

Inputs as Gated DeltaNet feeds them: L2-normalised keys, β ∈ (0, 1) or (0, 2) (negative eigenvalues), g = log σ(·).
Tolerances are relative to the largest value: max |ours − reference| ≤ tol · max |reference|.
"""
import functools
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lazylab.models.fast_weights as fw
from lazylab.models.fast_weights.decay import DecayGate
from lazylab.models.fast_weights.delta_product import (
    delta_product_chunked,
    delta_product_loop,
    delta_product_step,
)
from lazylab.models.fast_weights.delta_rule import delta_rule_chunked, delta_rule_loop
from lazylab.models.fast_weights.fla_reference import FlaMissing, load_naive, naive_file
from lazylab.models.fast_weights.gated_delta_rule import (
    gated_delta_rule_chunked,
    gated_delta_rule_loop,
    gated_delta_rule_step,
)
from lazylab.testing import assert_close

# ---- fla-core's references ----


def test_fla_core_is_installed_where_ci_runs():
    """CI installs fla-core (`make install`): there, its absence is a failure, not a skip."""
    try:
        paths = [naive_file(op) for op in ('gated_delta_rule', 'gated_delta_product')]
    except FlaMissing as e:
        if os.environ.get('CI'):
            pytest.fail(f'CI is set but the fla-core reference is missing: {e}')
        pytest.skip(f'fla-core reference not installed: {e}')
    assert all(p.is_file() and p.name == 'naive.py' for p in paths)


@functools.cache
def _reference(op, float64):
    return load_naive(op, float64=float64)


def reference(op, float64=True):
    """fla-core's reference module of `op`, or a skip that says why it is missing."""
    try:
        return _reference(op, float64)
    except FlaMissing as e:
        pytest.skip(f'fla-core reference not installed: {e}')


def test_loading_the_references_imports_neither_fla_nor_triton():
    reference('gated_delta_rule')
    code = ('import sys; from lazylab.models.fast_weights.fla_reference import load_naive; '
            'a = load_naive("gated_delta_rule"); b = load_naive("gated_delta_product", float64=True); '
            'assert callable(a.naive_recurrent_gated_delta_rule) and callable(a.naive_chunk_gated_delta_rule); '
            'assert callable(b.naive_recurrent_gated_delta_product); '
            'print(sorted(m for m in sys.modules if m == "triton" or m.startswith("triton.") or m == "fla" '
            'or m.startswith("fla.")))')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == '[]'
    assert 'triton' not in sys.modules and 'fla' not in sys.modules  # (and in this process)


def fla_gated_delta_rule(q, k, v, beta, g, state, float64=True):
    """fla's naive_recurrent_gated_delta_rule on our sequence-first tensors: (y, state [batch, heads, d_v, d_dot])."""
    first = lambda x: x.transpose(0, 1)  # noqa: E731  ([seq_len, batch, …] ↔ fla's [batch, seq_len, …])
    o, s = reference('gated_delta_rule', float64).naive_recurrent_gated_delta_rule(
        first(q), first(k), first(v), first(beta), first(g), scale=1.0,
        initial_state=None if state is None else state.transpose(-1, -2).clone(), output_final_state=True)
    return first(o), s.transpose(-1, -2)


def fla_delta_product(q, k, v, beta, g, state, float64=True):
    """fla's naive_recurrent_gated_delta_product on our tensors (k, v, beta with the n_h axis after seq_len)."""
    seq_len, n_h, batch = k.shape[:3]
    first = lambda x: x.transpose(0, 1)  # noqa: E731
    steps = lambda x: x.movedim(2, 0).reshape(batch, seq_len * n_h, *x.shape[3:])  # noqa: E731  (step i·n_h + j)
    o, s = reference('gated_delta_product', float64).naive_recurrent_gated_delta_product(
        first(q), steps(k), steps(v), None if g is None else first(g), steps(beta), scale=1.0,
        initial_state=None if state is None else state.transpose(-1, -2).clone(), output_final_state=True,
        num_householder=n_h)
    return first(o), s.transpose(-1, -2)


# ---- inputs ----

def gated_inputs(seq_len, batch=2, heads=3, d_dot=6, d_v=4, *, with_state=True, negative=False, seed=0,
                 dtype=torch.float64, n_h=None, gated=True):
    """q, k, v, β, g and a state, drawn in float32 and widened to `dtype` (exact); with n_h, DeltaProduct's k, v, β
    with the step axis; g None unless `gated`."""
    gen = torch.Generator().manual_seed(seed)
    steps = () if n_h is None else (n_h,)
    normal = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    q = normal(seq_len, batch, heads, d_dot)
    k = torch.nn.functional.normalize(normal(seq_len, *steps, batch, heads, d_dot), dim=-1)
    v = normal(seq_len, *steps, batch, heads, d_v)
    beta = (2 if negative else 1) * torch.sigmoid(normal(seq_len, *steps, batch, heads))
    g = torch.nn.functional.logsigmoid(normal(seq_len, batch, heads) + 1) if gated else None
    state = 0.5 * normal(batch, heads, d_v, d_dot) if with_state else None
    return [None if t is None else t.to(dtype) for t in (q, k, v, beta, g, state)]



def gated_step_loop(q, k, v, beta, g, state):
    ys = []
    for i in range(q.shape[0]):
        y, state = gated_delta_rule_step(q[i], k[i], v[i], beta[i], g[i], state)
        ys.append(y)
    return torch.stack(ys), state


def product_step_loop(q, k, v, beta, g, state):
    ys = []
    for i in range(q.shape[0]):
        y, state = delta_product_step(q[i], k[i], v[i], beta[i], None if g is None else g[i], state)
        ys.append(y)
    return torch.stack(ys), state


GATED_KERNELS = {'loop': gated_delta_rule_loop, 'step': gated_step_loop,
                 'chunked (5)': functools.partial(gated_delta_rule_chunked, chunk_size=5),
                 'chunked (16)': functools.partial(gated_delta_rule_chunked, chunk_size=16)}
PRODUCT_KERNELS = {'loop': delta_product_loop, 'step': product_step_loop,
                   'chunked (5)': functools.partial(delta_product_chunked, chunk_size=5),
                   'chunked (16)': functools.partial(delta_product_chunked, chunk_size=16)}


# ---- equal to fla-core's references ----

@pytest.mark.parametrize('with_state', [False, True], ids=['zero state', 'carried state'])
@pytest.mark.parametrize('negative', [False, True], ids=['beta<1', 'beta<2'])
@pytest.mark.parametrize('seq_len', [1, 7, 33])
@pytest.mark.parametrize('kernel', GATED_KERNELS)
def test_gated_delta_rule_equals_fla_naive_recurrent_in_float64(kernel, seq_len, negative, with_state):
    inputs = gated_inputs(seq_len, negative=negative, with_state=with_state, seed=seq_len)
    y_ref, s_ref = fla_gated_delta_rule(*inputs)
    y, s = GATED_KERNELS[kernel](*inputs)
    assert y.dtype == s.dtype == torch.float64 and s.shape == s_ref.shape == (2, 3, 4, 6)
    assert_close(y, y_ref, 1e-10, f'{kernel} y')
    assert_close(s, s_ref, 1e-10, f'{kernel} state')


@pytest.mark.parametrize('with_state', [False, True], ids=['zero state', 'carried state'])
@pytest.mark.parametrize('gated', [False, True], ids=['ungated', 'gated'])
@pytest.mark.parametrize('n_h', [1, 2, 3])
@pytest.mark.parametrize('seq_len', [1, 7, 33])
@pytest.mark.parametrize('kernel', PRODUCT_KERNELS)
def test_delta_product_equals_fla_naive_recurrent_in_float64(kernel, seq_len, n_h, gated, with_state):
    inputs = gated_inputs(seq_len, negative=True, with_state=with_state, seed=seq_len + n_h, n_h=n_h, gated=gated)
    y_ref, s_ref = fla_delta_product(*inputs)
    y, s = PRODUCT_KERNELS[kernel](*inputs)
    assert y.shape == y_ref.shape == (seq_len, 2, 3, 4)
    assert_close(y, y_ref, 1e-10, f'{kernel} y')
    assert_close(s, s_ref, 1e-10, f'{kernel} state')


def test_both_rules_equal_fla_in_float32_too():
    # fla's references as they are (float32 throughout) against ours on float32 inputs
    inputs = gated_inputs(40, negative=True, dtype=torch.float32)
    y_ref, s_ref = fla_gated_delta_rule(*inputs, float64=False)
    assert y_ref.dtype == torch.float32
    for kernel in ('loop', 'chunked (16)'):
        y, s = GATED_KERNELS[kernel](*inputs)
        assert_close(y, y_ref, 1e-5, f'gated {kernel} y')
        assert_close(s, s_ref, 1e-5, f'gated {kernel} state')
    inputs = gated_inputs(40, negative=True, dtype=torch.float32, n_h=2)
    y_ref, s_ref = fla_delta_product(*inputs, float64=False)
    for kernel in ('loop', 'chunked (16)'):
        y, s = PRODUCT_KERNELS[kernel](*inputs)
        assert_close(y, y_ref, 1e-5, f'product {kernel} y')
        assert_close(s, s_ref, 1e-5, f'product {kernel} state')


# ---- chunked == loop, forward and backward ----

def outputs_and_grads(fn, inputs, seed=1):
    """y, the final state and the gradients of a fixed random loss w.r.t. every input that is not None (zeros where
    autograd gives None: a kernel may skip a gradient that is zero, e.g. of the first token's gate over a zero
    state)."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    y, s = fn(*leaves)
    gen = torch.Generator().manual_seed(seed)
    loss = (y * torch.randn(y.shape, generator=gen, dtype=y.dtype)).sum() + \
        (s * torch.randn(s.shape, generator=gen, dtype=s.dtype)).sum()
    loss.backward()
    return y.detach(), s.detach(), [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves if t is not None]


@settings(max_examples=30, deadline=None)
@given(seq_len=st.integers(0, 40), chunk_size=st.integers(1, 20), batch=st.integers(1, 2), heads=st.integers(1, 2),
       d_dot=st.integers(1, 8), d_v=st.integers(1, 5), with_state=st.booleans(), negative=st.booleans(),
       n_h=st.sampled_from([None, 1, 2, 3]), gated=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_chunked_and_step_equal_the_loop_forward_and_backward_for_any_shape(seq_len, chunk_size, batch, heads, d_dot,
                                                                            d_v, with_state, negative, n_h, gated,
                                                                            seed):
    # n_h None: the gated delta rule (always gated); else DeltaProduct with n_h steps, gated or not
    inputs = gated_inputs(seq_len, batch, heads, d_dot, d_v, with_state=with_state, negative=negative, seed=seed,
                          n_h=n_h, gated=gated or n_h is None)
    loop, step, chunked = ((gated_delta_rule_loop, gated_step_loop, gated_delta_rule_chunked) if n_h is None else
                           (delta_product_loop, product_step_loop, delta_product_chunked))
    kernels = [functools.partial(chunked, chunk_size=chunk_size)] + ([step] if seq_len else [])
    if not seq_len:
        y, s = loop(*inputs)
        assert y.shape == (0, batch, heads, d_v) and s.shape == (batch, heads, d_v, d_dot)
        y_c, s_c = kernels[0](*inputs)
        assert y_c.shape == y.shape and torch.equal(s_c, s)
        return
    y_ref, s_ref, g_ref = outputs_and_grads(loop, inputs)
    for fn in kernels:
        y, s, grads = outputs_and_grads(fn, inputs)
        assert_close(y, y_ref, 1e-10, 'y')
        assert_close(s, s_ref, 1e-10, 'state')
        for name, a, b in zip('q k v beta g state'.split(), grads, g_ref):
            assert_close(a, b, 1e-9, f'grad {name}')


@pytest.mark.parametrize('rule', ['gated delta', 'product', 'gated product'])
def test_chunked_kernels_pass_gradcheck(rule):
    # 7 tokens in chunks of 3 (DeltaProduct: 14 or 21 writes in chunks of 4): several chunks, a padded last one
    if rule == 'gated delta':
        inputs = gated_inputs(7, 1, 2, 3, 2, negative=True, seed=4)
        fn = functools.partial(gated_delta_rule_chunked, chunk_size=3)
    else:
        inputs = gated_inputs(7, 1, 2, 3, 2, negative=True, seed=5, n_h=3 if rule == 'product' else 2,
                              gated=rule == 'gated product')
        fn = functools.partial(delta_product_chunked, chunk_size=4)
    leaves = [t.requires_grad_() for t in inputs if t is not None]
    if rule == 'product':
        assert torch.autograd.gradcheck(lambda q, k, v, b, s: fn(q, k, v, b, None, s), leaves)
    else:
        assert torch.autograd.gradcheck(fn, leaves)


def test_a_strong_decay_neither_overflows_nor_loses_the_loop():
    # g down to −60 per token: Γ spans −1000 within a chunk; only differences Γᵢ − Γⱼ ≤ 0 are exponentiated
    inputs = gated_inputs(50, seed=7)
    inputs[4] = -60 * torch.rand(inputs[4].shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    y_ref, s_ref, g_ref = outputs_and_grads(gated_delta_rule_loop, inputs)
    y, s, grads = outputs_and_grads(functools.partial(gated_delta_rule_chunked, chunk_size=32), inputs)
    assert torch.isfinite(y).all() and all(torch.isfinite(t).all() for t in grads)
    assert_close(y, y_ref, 1e-10, 'y')
    assert_close(s, s_ref, 1e-10, 'state')
    for a, b in zip(grads, g_ref):
        assert_close(a, b, 1e-9, 'grads')


# ---- identities ----

@pytest.mark.parametrize('kernel', ['loop', 'chunked (5)', 'step'])
def test_gated_delta_rule_with_g_zero_is_the_delta_rule(kernel):
    q, k, v, beta, g, state = gated_inputs(23, seed=9)
    y, s = GATED_KERNELS[kernel](q, k, v, beta, torch.zeros_like(g), state)
    y_ref, s_ref = delta_rule_loop(q, k, v, beta, state)
    assert_close(y, y_ref, 1e-12, 'y')
    assert_close(s, s_ref, 1e-12, 'state')


@pytest.mark.parametrize('kernel', ['loop', 'chunked (5)', 'step'])
def test_delta_product_with_one_step_is_the_delta_rule_and_with_the_gate_the_gated_delta_rule(kernel):
    q, k, v, beta, g, state = gated_inputs(23, seed=10, n_h=1)
    y, s = PRODUCT_KERNELS[kernel](q, k, v, beta, None, state)
    y_ref, s_ref = delta_rule_chunked(q, k[:, 0], v[:, 0], beta[:, 0], state, chunk_size=4)
    assert_close(y, y_ref, 1e-12, 'y')
    assert_close(s, s_ref, 1e-12, 'state')
    y, s = PRODUCT_KERNELS[kernel](q, k, v, beta, g, state)
    y_ref, s_ref = gated_delta_rule_loop(q, k[:, 0], v[:, 0], beta[:, 0], g, state)
    assert_close(y, y_ref, 1e-12, 'y')
    assert_close(s, s_ref, 1e-12, 'state')


def test_delta_product_steps_are_delta_rule_tokens():
    # n_h steps of one token = n_h tokens of the delta rule, the read after the last of them
    q, k, v, beta, _, state = gated_inputs(9, seed=11, n_h=3, gated=False)
    y, s = delta_product_loop(q, k, v, beta, None, state)
    flat = lambda x: x.reshape(27, *x.shape[2:])  # noqa: E731
    queries = torch.zeros(9, 3, *q.shape[1:], dtype=q.dtype)
    queries[:, -1] = q
    y_ref, s_ref = delta_rule_loop(flat(queries), flat(k), flat(v), flat(beta), state)
    assert_close(y, y_ref.view(9, 3, *y.shape[1:])[:, -1], 1e-12, 'y')
    assert_close(s, s_ref, 1e-12, 'state')


@pytest.mark.parametrize('rule', ['gated', 'product'])
def test_beta_zero_leaves_the_state_but_for_the_decay(rule):
    # β = 0 writes nothing: W stays W₀ (g = 0), or W₀ · exp(Σ g) with the decay; here g = log ½ for 6 tokens
    if rule == 'gated':
        q, k, v, beta, _, state = gated_inputs(6, seed=12)
        kernels = GATED_KERNELS
    else:
        q, k, v, beta, _, state = gated_inputs(6, seed=12, n_h=2)
        kernels = PRODUCT_KERNELS
    half = torch.full(q.shape[:-1], 0.5, dtype=q.dtype).log()
    for name, fn in kernels.items():
        y, s = fn(q, k, v, torch.zeros_like(beta), torch.zeros_like(half), state)
        assert_close(s, state, 1e-15, f'{name} state with g = 0')
        assert_close(y, torch.einsum('bhvd,tbhd->tbhv', state, q), 1e-14, f'{name} y with g = 0')
        y, s = fn(q, k, v, torch.zeros_like(beta), half, state)
        assert_close(s, state / 64, 1e-14, f'{name} state halved six times')
        halves = 0.5 ** torch.arange(1, 7, dtype=q.dtype).view(6, 1, 1, 1)
        assert_close(y, halves * torch.einsum('bhvd,tbhd->tbhv', state, q), 1e-14, f'{name} y')
    # and the gradients there are the loop's (finite: β = 0 is also what pads the last chunk)
    inputs = [q, k, v, torch.zeros_like(beta), half, state]
    _, _, expected = outputs_and_grads(kernels['loop'], inputs)
    _, _, grads = outputs_and_grads(kernels['chunked (5)'], inputs)
    for a, b in zip(grads, expected):
        assert torch.isfinite(a).all()
        assert_close(a, b, 1e-10, 'grads at β = 0')


def test_decay_gate_is_gated_deltanets_formula_and_initialisation():
    torch.manual_seed(0)
    gate = DecayGate(5, 64)
    a = torch.exp(gate.A_log.detach())
    dt = torch.nn.functional.softplus(gate.dt_bias.detach())  # softplus(dt_bias) is the initial dt
    assert (a > 0).all() and (a < 16).all() and a.max() > 8  # A ~ U(0, 16)
    assert (dt >= 1e-3 * (1 - 1e-5)).all() and (dt <= 0.1 * (1 + 1e-5)).all()  # log-uniform in [0.001, 0.1]
    x = torch.randn(7, 5)
    expected = -a * torch.log1p(torch.exp(x @ gate.projection.weight.detach().T + gate.dt_bias.detach()))
    torch.testing.assert_close(gate(x).detach(), expected, rtol=1e-6, atol=1e-7)
    assert (gate(x) <= 0).all()
    assert sorted(n for n, _ in gate.named_parameters()) == ['A_log', 'dt_bias', 'projection.weight']


# ---- precision under bfloat16 autocast ----

@functools.cache
def bf16_case(rule):
    """bf16 inputs at seq_len 4096 (DeltaProduct n_h 2: 2048 tokens, 4096 writes) and the float64 loop on the same
    numbers: output, state and input gradients, with the cotangents."""
    n_h, seq_len = (None, 4096) if rule == 'gated' else (2, 2048)
    inputs = gated_inputs(seq_len, 1, 2, 16, 8, with_state=False, negative=True, seed=13, n_h=n_h,
                          dtype=torch.float32)[:5]
    low = [t.bfloat16() for t in inputs]
    loop = gated_delta_rule_loop if rule == 'gated' else delta_product_loop
    ref_inputs = [t.double().requires_grad_() for t in low]
    y_ref, s_ref = loop(*ref_inputs)
    gen = torch.Generator().manual_seed(14)
    cot_y = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
    cot_s = torch.randn(s_ref.shape, generator=gen, dtype=torch.float64)
    ((y_ref * cot_y).sum() + (s_ref * cot_s).sum()).backward()
    return low, (y_ref.detach(), s_ref.detach(), [t.grad for t in ref_inputs]), (cot_y, cot_s)


@pytest.mark.parametrize('kernel', ['chunked (16)', 'loop', 'step'])
@pytest.mark.parametrize('rule', ['gated', 'product'])
def test_kernels_in_bf16_autocast_keep_float32_state_and_match_float64(rule, kernel):
    # Inputs as autocast hands them over (bf16); the reference is the float64 loop on the same (bf16-rounded)
    # numbers. Stated tolerances, relative to the largest value: the state (float32 throughout) within 1e-4; y and
    # the input gradients (q, k, v, β and the log decay g), which come back in bf16, within 1e-2 (bf16 rounding is
    # 2⁻⁸).
    low, (y_ref, s_ref, g_ref), (cot_y, cot_s) = bf16_case(rule)
    fn = (GATED_KERNELS if rule == 'gated' else PRODUCT_KERNELS)[kernel]
    inputs = [t.clone().requires_grad_() for t in low]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y, s = fn(*inputs, None)
        assert s.dtype == torch.float32 and y.dtype == torch.bfloat16
        ((y.float() * cot_y.float()).sum() + (s * cot_s.float()).sum()).backward()  # backward() inside autocast
    assert_close(s.double(), s_ref, 1e-4, 'state')
    assert_close(y.double(), y_ref, 1e-2, 'y')
    for name, a, b in zip(['q', 'k', 'v', 'beta', 'g'], inputs, g_ref):
        assert a.grad.dtype == torch.bfloat16
        assert_close(a.grad.double(), b, 1e-2, f'grad {name}')


# ---- errors ----

def test_bad_shapes_are_one_line_errors_naming_them():
    q, k, v, beta, g, state = gated_inputs(5)
    qp, kp, vp, bp, gp, sp = gated_inputs(5, n_h=2)  # DeltaProduct's
    cases = [
        (lambda: gated_delta_rule_chunked(q, k, v, beta, g[:, :1], state),
         r'g must have shape \(5, 2, 3\); got \(5, 1, 3\)'),
        (lambda: gated_delta_rule_loop(q, k, v, beta[:4], g, state), r'beta must have shape \(5, 2, 3\)'),
        (lambda: gated_delta_rule_step(q[0], k[0], v[0], beta[0], g[0], state[:1]),
         r'state must be .* got \(1, 3, 4, 6\)'),
        (lambda: gated_delta_rule_chunked(q, k[..., :5], v, beta, g, state), 'q and k must have equal shapes'),
        (lambda: gated_delta_rule_chunked(q, k, v, beta, g, state, chunk_size=0), 'chunk_size must be >= 1'),
        (lambda: delta_product_chunked(qp, kp[:, 0], vp, bp, gp, sp), r'k \[seq_len, n_h, batch, heads, d_dot\]'),
        (lambda: delta_product_loop(qp, kp, vp[:, :1], bp, gp, sp), 'k must be q.s shape with n_h inserted'),
        (lambda: delta_product_loop(qp, kp, vp, bp[:, :1], gp, sp), r'beta must have shape \(5, 2, 2, 3\)'),
        (lambda: delta_product_step(qp[0], kp[0], vp[0], bp[0], gp[0, :1], sp), r'g must have shape \(2, 3\)'),
        (lambda: delta_product_chunked(qp, kp[:, :0], vp[:, :0], bp[:, :0], gp, sp), 'householder_steps >= 1'),
        (lambda: fw.FastWeightsAttention(2, 8, 0.0, fw.L2NormSiLU(), update_rule='delta_product',
                                         householder_steps=0), 'householder_steps >= 1, got householder_steps=0'),
        (lambda: fw.FastWeightsAttention(2, 8, 0.0, fw.DPFP(), gated=True), "gated=True is DeltaProduct's"),
        (lambda: fw.FastWeightsAttention(2, 8, 0.0, fw.DPFP(), update_rule='sum', negative_eigenvalues=True),
         'the sum rule does not have'),
        (lambda: fw.FastWeightsAttention(2, 8, 0.0, fw.DPFP(), update_rule='gated_delta',
                                         attention_normalization=True), 'for the delta and sum rules only'),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as error:
            call()
        assert '\n' not in str(error.value)
