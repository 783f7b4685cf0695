"""The diagonal-gate rules, the gated sum rule (a scalar decay per head: Mamba-2's SSD, RetNet with a learned decay)
and GLA (a decay per key channel): equal to flash-linear-attention's own pure-PyTorch references, chunked == loop ==
step forward and backward, stable under strong decay, the identities that tie them to each other and to the sum
rule, precision under bfloat16 autocast, and one-line errors.

The references are fla-core 0.6.0's `naive_recurrent_simple_gla` (scale = 1) and `naive_recurrent_gla` (which has no
scale argument and multiplies q by d_dot^-1/2: ours gets q · d_dot^-1/2, the same product), loaded from their files
(`lazylab.models.fast_weights.fla_reference`: neither fla nor triton is imported), on fla's [batch, seq_len, heads, d]
layout with the state transposed to fla's [B, H, K, V]. They compute in float32, and cast with `.float()`; for the
float64 comparison (within 1e-10) they run with float32 read as float64 (the loader rewrites `.float()` for that),
on inputs drawn in float32 and widened. Without fla-core the comparisons skip, saying why; in CI (the environment
variable CI set) a missing fla-core fails `test_fla_core_references_are_installed_where_ci_runs`.

Inputs: g = log σ(·) (the gates of GLA and of Mamba-2 are below 1), L2-normalised keys for the float32 checks.
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
from lazylab.models.fast_weights.fla_reference import FlaMissing, load_naive, naive_file
from lazylab.models.fast_weights.gated_sum import gated_sum_chunked, gated_sum_loop, gated_sum_step
from lazylab.models.fast_weights.gla import gla_chunked, gla_loop, gla_step
from lazylab.models.fast_weights.sum_rule import sum_rule_loop
from lazylab.testing import assert_close

OPS = ('simple_gla', 'gla')

# ---- fla-core's references ----


def test_fla_core_references_are_installed_where_ci_runs():
    """CI installs fla-core (`make install`): there, its absence is a failure, not a skip."""
    try:
        paths = [naive_file(op) for op in OPS]
    except FlaMissing as e:
        if os.environ.get('CI'):
            pytest.fail(f'CI is set but the fla-core reference is missing: {e}')
        pytest.skip(f'fla-core reference not installed: {e}')
    assert [p.parent.name for p in paths] == ['simple_gla', 'gla'] and all(p.name == 'naive.py' for p in paths)


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
    reference('gla')
    code = ('import sys; from lazylab.models.fast_weights.fla_reference import load_naive; '
            'a = load_naive("simple_gla"); b = load_naive("gla", float64=True); '
            'assert callable(a.naive_recurrent_simple_gla) and callable(a.naive_chunk_simple_gla); '
            'assert callable(b.naive_recurrent_gla); '
            'print(sorted(m for m in sys.modules if m == "triton" or m.startswith("triton.") or m == "fla" '
            'or m.startswith("fla.")))')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == '[]'


def first(x):
    """[seq_len, batch, …] ↔ fla's [batch, seq_len, …]."""
    return x.transpose(0, 1)


def fla_gated_sum(q, k, v, g, state, float64=True):
    """fla's naive_recurrent_simple_gla on our sequence-first tensors: (y, state [batch, heads, d_v, d_dot])."""
    o, s = reference('simple_gla', float64).naive_recurrent_simple_gla(
        first(q), first(k), first(v), first(g), scale=1.0,
        initial_state=None if state is None else state.transpose(-1, -2).clone(), output_final_state=True)
    return first(o), s.transpose(-1, -2)


def fla_gla(q, k, v, g, state, float64=True):
    """fla's naive_recurrent_gla on our tensors (it reads q · d_dot^-1/2: compare with ours on `fla_scaled(q)`)."""
    o, s = reference('gla', float64).naive_recurrent_gla(
        first(q), first(k), first(v), first(g),
        initial_state=None if state is None else state.transpose(-1, -2).clone(), output_final_state=True)
    return first(o), s.transpose(-1, -2)


def fla_scaled(q):
    """q as fla's GLA reference reads it: q · d_dot^-1/2 (the same float product it computes)."""
    return q * q.shape[-1] ** -0.5


def test_float64_references_compute_in_float64_through_their_float_casts():
    # naive_recurrent_gla casts q, k, v, g with .float() before any arithmetic: read as float32, inputs that float32
    # cannot represent would be rounded (a relative error near 1e-8); the float64 loader reads them as float64
    q, k, v, g, state = diagonal_inputs(9, per_channel=True, seed=1)
    third = [x / 3 for x in (q, k, v)]  # not representable in float32
    y_ref, s_ref = fla_gla(*third, g / 3, state / 3)
    y, s = gla_loop(fla_scaled(third[0]), *third[1:], g / 3, state / 3)
    assert y_ref.dtype == s_ref.dtype == torch.float64
    assert_close(y, y_ref, 1e-14, 'y')
    assert_close(s, s_ref, 1e-14, 'state')
    y32, _ = fla_gla(*third, g / 3, state / 3, float64=False)
    assert y32.dtype == torch.float64 and (y32 - y_ref).abs().max() > 1e-9  # (fla's own .float() casts, as shipped)


# ---- inputs and kernels ----

def diagonal_inputs(seq_len, batch=2, heads=3, d_dot=6, d_v=4, *, per_channel, with_state=True, seed=0,
                    dtype=torch.float64, normalise=False):
    """q, k, v, g and a state, drawn in float32 and widened to `dtype` (exact); g [seq_len, batch, heads] for the
    gated sum rule, with d_dot for GLA (`per_channel`)."""
    gen = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    q, k = normal(seq_len, batch, heads, d_dot), normal(seq_len, batch, heads, d_dot)
    if normalise:
        q, k = (torch.nn.functional.normalize(x, dim=-1) for x in (q, k))
    v = normal(seq_len, batch, heads, d_v)
    g = torch.nn.functional.logsigmoid(normal(seq_len, batch, heads, *((d_dot,) if per_channel else ())) + 1)
    state = 0.5 * normal(batch, heads, d_v, d_dot) if with_state else None
    return [None if t is None else t.to(dtype) for t in (q, k, v, g, state)]


def stepped(step):
    """The token loop of a step function: (y, state) over a sequence."""
    def run(q, k, v, g, state):
        ys = []
        for i in range(q.shape[0]):
            y, state = step(q[i], k[i], v[i], g[i], state)
            ys.append(y)
        return torch.stack(ys), state
    return run


KERNELS = {
    'gated sum': {'loop': gated_sum_loop, 'step': stepped(gated_sum_step),
                  'chunked (5)': functools.partial(gated_sum_chunked, chunk_size=5),
                  'chunked (16)': functools.partial(gated_sum_chunked, chunk_size=16)},
    'gla': {'loop': gla_loop, 'step': stepped(gla_step),
            'chunked (5)': functools.partial(gla_chunked, chunk_size=5),  # (each chunk padded to 8)
            'chunked (16)': functools.partial(gla_chunked, chunk_size=16)},
}
LOOPS = {'gated sum': gated_sum_loop, 'gla': gla_loop}
CHUNKED = {'gated sum': gated_sum_chunked, 'gla': gla_chunked}


# ---- equal to fla-core's references ----

@pytest.mark.parametrize('with_state', [False, True], ids=['zero state', 'carried state'])
@pytest.mark.parametrize('seq_len', [1, 7, 33])
@pytest.mark.parametrize('kernel', KERNELS['gated sum'])
def test_gated_sum_equals_fla_naive_recurrent_simple_gla_in_float64(kernel, seq_len, with_state):
    inputs = diagonal_inputs(seq_len, per_channel=False, with_state=with_state, seed=seq_len)
    y_ref, s_ref = fla_gated_sum(*inputs)
    y, s = KERNELS['gated sum'][kernel](*inputs)
    assert y.dtype == s.dtype == torch.float64 and s.shape == s_ref.shape == (2, 3, 4, 6)
    assert_close(y, y_ref, 1e-10, f'{kernel} y')
    assert_close(s, s_ref, 1e-10, f'{kernel} state')


@pytest.mark.parametrize('with_state', [False, True], ids=['zero state', 'carried state'])
@pytest.mark.parametrize('seq_len', [1, 7, 33])
@pytest.mark.parametrize('kernel', KERNELS['gla'])
def test_gla_equals_fla_naive_recurrent_gla_in_float64(kernel, seq_len, with_state):
    q, k, v, g, state = diagonal_inputs(seq_len, per_channel=True, with_state=with_state, seed=seq_len)
    y_ref, s_ref = fla_gla(q, k, v, g, state)
    y, s = KERNELS['gla'][kernel](fla_scaled(q), k, v, g, state)
    assert y.dtype == s.dtype == torch.float64 and s.shape == s_ref.shape == (2, 3, 4, 6)
    assert_close(y, y_ref, 1e-10, f'{kernel} y')
    assert_close(s, s_ref, 1e-10, f'{kernel} state')


@settings(max_examples=10, deadline=None)
@given(seq_len=st.integers(1, 40), batch=st.integers(1, 2), heads=st.integers(1, 2), d_dot=st.integers(1, 8),
       d_v=st.integers(1, 5), with_state=st.booleans(), per_channel=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_both_rules_equal_fla_for_any_shape(seq_len, batch, heads, d_dot, d_v, with_state, per_channel, seed):
    inputs = diagonal_inputs(seq_len, batch, heads, d_dot, d_v, per_channel=per_channel, with_state=with_state,
                             seed=seed)
    if per_channel:
        y_ref, s_ref = fla_gla(*inputs)
        inputs[0] = fla_scaled(inputs[0])
    else:
        y_ref, s_ref = fla_gated_sum(*inputs)
    rule = 'gla' if per_channel else 'gated sum'
    for kernel in (LOOPS[rule], functools.partial(CHUNKED[rule], chunk_size=8)):
        y, s = kernel(*inputs)
        assert_close(y, y_ref, 1e-10, f'{rule} y')
        assert_close(s, s_ref, 1e-10, f'{rule} state')


def test_fla_chunked_simple_gla_reference_agrees_with_ours():
    # the reference that benchmarks/diagonal_gates.py times: fla's own chunked form, equal to our kernels too
    q, k, v, g, state = diagonal_inputs(45, per_channel=False, seed=3)
    o, s_ref = reference('simple_gla').naive_chunk_simple_gla(
        first(q), first(k), first(v), first(g), initial_state=state.transpose(-1, -2).clone(),
        output_final_state=True, chunk_size=16, scale=1.0)
    y, s = gated_sum_chunked(q, k, v, g, state, chunk_size=8)
    assert_close(y, first(o), 1e-10, 'y')
    assert_close(s, s_ref.transpose(-1, -2), 1e-10, 'state')


def test_both_rules_equal_fla_in_float32_too():
    # fla's references as they are (float32 throughout) against ours on float32 inputs
    inputs = diagonal_inputs(40, per_channel=False, dtype=torch.float32, normalise=True)
    y_ref, s_ref = fla_gated_sum(*inputs, float64=False)
    assert y_ref.dtype == torch.float32
    for kernel in ('loop', 'chunked (16)'):
        y, s = KERNELS['gated sum'][kernel](*inputs)
        assert_close(y, y_ref, 1e-5, f'gated sum {kernel} y')
        assert_close(s, s_ref, 1e-5, f'gated sum {kernel} state')
    q, k, v, g, state = diagonal_inputs(40, per_channel=True, dtype=torch.float32, normalise=True)
    y_ref, s_ref = fla_gla(q, k, v, g, state, float64=False)
    for kernel in ('loop', 'chunked (16)'):
        y, s = KERNELS['gla'][kernel](fla_scaled(q), k, v, g, state)
        assert_close(y, y_ref, 1e-5, f'gla {kernel} y')
        assert_close(s, s_ref, 1e-5, f'gla {kernel} state')


# ---- chunked == loop, forward and backward ----

def outputs_and_grads(fn, inputs, seed=1):
    """y, the final state and the gradients of a fixed random loss w.r.t. every input that is not None (zeros where
    autograd gives None); the loss's weights are drawn in float64 whatever the dtype, so that float32 and float64
    runs differentiate the same loss."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    y, s = fn(*leaves)
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.dtype) for x in (y, s)]
    loss = (y * weights[0]).sum() + (s * weights[1]).sum()
    loss.backward()
    return y.detach(), s.detach(), [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves if t is not None]


@settings(max_examples=20, deadline=None)
@given(seq_len=st.integers(0, 40), chunk_size=st.integers(1, 20), batch=st.integers(1, 2), heads=st.integers(1, 2),
       d_dot=st.integers(1, 8), d_v=st.integers(1, 5), with_state=st.booleans(), per_channel=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_chunked_and_step_equal_the_loop_forward_and_backward_for_any_shape(seq_len, chunk_size, batch, heads, d_dot,
                                                                            d_v, with_state, per_channel, seed):
    # per_channel: GLA, else the gated sum rule; chunk sizes that are not powers of two pad GLA's chunks
    rule = 'gla' if per_channel else 'gated sum'
    inputs = diagonal_inputs(seq_len, batch, heads, d_dot, d_v, per_channel=per_channel, with_state=with_state,
                             seed=seed)
    chunked = functools.partial(CHUNKED[rule], chunk_size=chunk_size)
    if not seq_len:
        y, s = LOOPS[rule](*inputs)
        assert y.shape == (0, batch, heads, d_v) and s.shape == (batch, heads, d_v, d_dot)
        y_c, s_c = chunked(*inputs)
        assert y_c.shape == y.shape and torch.equal(s_c, s)
        return
    y_ref, s_ref, g_ref = outputs_and_grads(LOOPS[rule], inputs)
    for fn in (chunked, KERNELS[rule]['step']):
        y, s, grads = outputs_and_grads(fn, inputs)
        assert_close(y, y_ref, 1e-10, 'y')
        assert_close(s, s_ref, 1e-10, 'state')
        for name, a, b in zip('q k v g state'.split(), grads, g_ref):
            assert_close(a, b, 1e-9, f'grad {name}')


@pytest.mark.parametrize('chunk_size', [3, 4])
@pytest.mark.parametrize('rule', ['gated sum', 'gla'])
def test_chunked_kernels_pass_gradcheck(rule, chunk_size):
    # 7 tokens in chunks of 3 (GLA: padded to 4) or 4: several chunks, a padded last one; g's gradient included
    inputs = diagonal_inputs(7, 1, 2, 3, 2, per_channel=rule == 'gla', seed=4)
    leaves = [t.requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(functools.partial(CHUNKED[rule], chunk_size=chunk_size), leaves)


@pytest.mark.parametrize('rule', ['gated sum', 'gla'])
def test_a_strong_decay_neither_overflows_nor_loses_the_loop(rule):
    # g down to −60 per token: Γ spans about −1000 within a chunk of 32, beyond float64's exp range (±709), so
    # exp(Γ) and exp(−Γ) taken apart would give 0 · inf; only sums of g over consecutive tokens are exponentiated
    inputs = diagonal_inputs(50, per_channel=rule == 'gla', seed=7)
    inputs[3] = -60 * torch.rand(inputs[3].shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    y_ref, s_ref, g_ref = outputs_and_grads(LOOPS[rule], inputs)
    y, s, grads = outputs_and_grads(functools.partial(CHUNKED[rule], chunk_size=32), inputs)
    assert torch.isfinite(y).all() and torch.isfinite(s).all() and all(torch.isfinite(t).all() for t in grads)
    assert_close(y, y_ref, 1e-10, 'y')
    assert_close(s, s_ref, 1e-10, 'state')
    for name, a, b in zip('q k v g state'.split(), grads, g_ref):
        assert_close(a, b, 1e-9, f'grad {name}')


@pytest.mark.parametrize('rule', ['gated sum', 'gla'])
def test_a_strong_decay_in_float32_stays_finite_and_close_to_float64(rule):
    # g down to −20 per token in float32 (exp overflows at 88.7): Γ reaches about −640 in a chunk of 64
    inputs = diagonal_inputs(150, per_channel=rule == 'gla', seed=9, dtype=torch.float32, normalise=True)
    inputs[3] = -20 * torch.rand(inputs[3].shape, generator=torch.Generator().manual_seed(10))
    y_ref, s_ref, g_ref = outputs_and_grads(LOOPS[rule], [t.double() for t in inputs])
    y, s, grads = outputs_and_grads(functools.partial(CHUNKED[rule], chunk_size=64), inputs)
    assert torch.isfinite(y).all() and torch.isfinite(s).all() and all(torch.isfinite(t).all() for t in grads)
    assert_close(y.double(), y_ref, 1e-5, 'y')
    assert_close(s.double(), s_ref, 1e-5, 'state')
    for name, a, b in zip('q k v g state'.split(), grads, g_ref):
        assert_close(a.double(), b, 1e-4, f'grad {name}')


# ---- identities ----

@pytest.mark.parametrize('kernel', ['loop', 'chunked (5)', 'step'])
@pytest.mark.parametrize('rule', ['gated sum', 'gla'])
def test_with_g_zero_both_are_the_sum_rule(rule, kernel):
    q, k, v, g, state = diagonal_inputs(23, per_channel=rule == 'gla', seed=11)
    y, s = KERNELS[rule][kernel](q, k, v, torch.zeros_like(g), state)
    y_ref, s_ref = sum_rule_loop(q, k, v, state)
    assert_close(y, y_ref, 1e-12, 'y')
    assert_close(s, s_ref, 1e-12, 'state')


@pytest.mark.parametrize('kernel', ['loop', 'chunked (5)', 'chunked (16)', 'step'])
def test_gla_with_one_decay_for_all_channels_is_the_gated_sum_rule(kernel):
    # forward, and g's gradient: GLA's per-channel gradients sum to the gated sum rule's per-head one
    q, k, v, g, state = diagonal_inputs(29, per_channel=False, seed=12)
    y_ref, s_ref, grads_ref = outputs_and_grads(KERNELS['gated sum'][kernel], [q, k, v, g, state])
    broadcast = lambda q, k, v, g, s: KERNELS['gla'][kernel](q, k, v, g.unsqueeze(-1).expand(q.shape), s)  # noqa: E731
    y, s, grads = outputs_and_grads(broadcast, [q, k, v, g, state])
    assert_close(y, y_ref, 1e-12, 'y')
    assert_close(s, s_ref, 1e-12, 'state')
    for name, a, b in zip('q k v g state'.split(), grads, grads_ref):
        assert_close(a, b, 1e-11, f'grad {name}')


@pytest.mark.parametrize('rule', ['gated sum', 'gla'])
def test_zero_writes_leave_the_state_decayed_by_exactly_the_gates(rule):
    # k = v = 0: W₆ = W₀ · exp(g₁ + … + g₆) (per key channel for GLA, here halves and quarters), yᵢ = Wᵢ qᵢ
    q, k, v, _, state = diagonal_inputs(6, per_channel=True, seed=13)
    k, v = torch.zeros_like(k), torch.zeros_like(v)
    if rule == 'gla':
        channel = torch.tensor([0.5, 0.25, 1.0, 0.5, 0.25, 1.0], dtype=q.dtype)  # the decay of each key channel
        g = channel.log().expand(q.shape)
    else:
        channel = torch.full((6,), 0.5, dtype=q.dtype)
        g = torch.full(q.shape[:-1], 0.5, dtype=q.dtype).log()
    for name, fn in KERNELS[rule].items():
        y, s = fn(q, k, v, g, state)
        assert_close(s, state * channel ** 6, 1e-14, f'{name} state')
        powers = channel ** torch.arange(1, 7, dtype=q.dtype).view(6, 1, 1, 1, 1)  # [token, 1, 1, 1, channel]
        assert_close(y, torch.einsum('tbhvd,tbhd->tbhv', state * powers, q), 1e-14, f'{name} y')


# ---- precision under bfloat16 autocast ----

@functools.cache
def bf16_case(rule):
    """bf16 inputs at seq_len 1024 and the float64 loop on the same numbers: output, state and input gradients, with
    the cotangents."""
    inputs = diagonal_inputs(1024, 1, 2, 16, 8, per_channel=rule == 'gla', with_state=False, seed=14,
                             dtype=torch.float32, normalise=True)[:4]
    low = [t.bfloat16() for t in inputs]
    ref_inputs = [t.double().requires_grad_() for t in low]
    y_ref, s_ref = LOOPS[rule](*ref_inputs)
    gen = torch.Generator().manual_seed(15)
    cot_y = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
    cot_s = torch.randn(s_ref.shape, generator=gen, dtype=torch.float64)
    ((y_ref * cot_y).sum() + (s_ref * cot_s).sum()).backward()
    return low, (y_ref.detach(), s_ref.detach(), [t.grad for t in ref_inputs]), (cot_y, cot_s)


@pytest.mark.parametrize('kernel', ['chunked (16)', 'loop', 'step'])
@pytest.mark.parametrize('rule', ['gated sum', 'gla'])
def test_kernels_in_bf16_autocast_keep_float32_state_and_match_float64(rule, kernel):
    # Inputs as autocast hands them over (bf16); the reference is the float64 loop on the same (bf16-rounded)
    # numbers. Stated tolerances, relative to the largest value: the state (float32 throughout) within 1e-4; y and
    # the input gradients, which come back in bf16, within 1e-2 (bf16 rounding is 2⁻⁸).
    low, (y_ref, s_ref, g_ref), (cot_y, cot_s) = bf16_case(rule)
    inputs = [t.clone().requires_grad_() for t in low]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y, s = KERNELS[rule][kernel](*inputs, None)
        assert s.dtype == torch.float32 and y.dtype == torch.bfloat16
        ((y.float() * cot_y.float()).sum() + (s * cot_s.float()).sum()).backward()  # backward() inside autocast
    assert_close(s.detach().double(), s_ref, 1e-4, 'state')
    assert_close(y.detach().double(), y_ref, 1e-2, 'y')
    for name, a, b in zip(['q', 'k', 'v', 'g'], inputs, g_ref):
        assert a.grad.dtype == torch.bfloat16
        assert_close(a.grad.double(), b, 1e-2, f'grad {name}')


# ---- exports and errors ----

def test_the_package_exports_the_kernels():
    assert (fw.gated_sum_step, fw.gated_sum_loop, fw.gated_sum_chunked) == (gated_sum_step, gated_sum_loop,
                                                                            gated_sum_chunked)
    assert (fw.gla_step, fw.gla_loop, fw.gla_chunked) == (gla_step, gla_loop, gla_chunked)
    assert {'gated_sum_chunked', 'gla_chunked', 'gla_loop', 'gated_sum_loop'} <= set(fw.__all__)


def test_bad_shapes_are_one_line_errors_naming_them():
    q, k, v, g, state = diagonal_inputs(5, per_channel=False)
    _, _, _, g_c, _ = diagonal_inputs(5, per_channel=True)
    cases = [
        (lambda: gated_sum_chunked(q, k, v, g[:, :1], state), r'gated sum rule: g must have shape \(5, 2, 3\); got '
                                                               r'\(5, 1, 3\)'),
        (lambda: gated_sum_loop(q, k, v, g_c, state), r'g must have shape \(5, 2, 3\); got \(5, 2, 3, 6\)'),
        (lambda: gated_sum_step(q[0], k[0], v[0], g[0], state[:1]), r'state must be .* got \(1, 3, 4, 6\)'),
        (lambda: gated_sum_chunked(q, k, v, g, state, chunk_size=0), 'gated_sum_chunked: chunk_size must be >= 1'),
        (lambda: gla_chunked(q, k, v, g, state), r'GLA: g must have shape \(5, 2, 3, 6\); got \(5, 2, 3\)'),
        (lambda: gla_loop(q, k[..., :5], v, g_c, state), 'GLA: q and k must have equal shapes'),
        (lambda: gla_step(q[0], k[0], v[0], g_c[0, :, :, :2], state), r'g must have shape \(2, 3, 6\)'),
        (lambda: gla_chunked(q, k, v, g_c, state, chunk_size=0), 'gla_chunked: chunk_size must be >= 1'),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as error:
            call()
        assert '\n' not in str(error.value)
