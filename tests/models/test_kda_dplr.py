"""KDA and the DPLR rule: equal to flash-linear-attention's own pure-PyTorch references, chunked == loop == step
forward and backward, stable under strong decays, the identities that tie them to the gated delta rule and to each
other, precision under bfloat16 autocast, and one-line errors.

The references are fla-core 0.6.0's `naive_recurrent_kda` (fla/ops/kda/naive.py) and `dplr_recurrence`
(fla/ops/generalized_delta_rule/dplr/naive.py), loaded from their files (`lazylab.models.fast_weights.fla_reference`:
neither fla nor triton is imported). KDA's is called with scale = 1 (our rules do not scale q) and the state
transposed to fla's [B, H, K, V]; the DPLR reference scales q by d_k^(-1/2) with no way to turn it off, so it gets
q · √d_k, and its layout is head-first, [B, H, T, D]. For the float64 comparisons (within 1e-10) they run with float32
read as float64 (`load_naive(…, float64=True)`, which also reads the DPLR reference's `.float()` casts as float64).
Without fla-core the comparisons skip, saying why; in CI (the environment variable CI set) a missing fla-core fails
`test_fla_core_has_the_kda_and_dplr_references_where_ci_runs`.

Inputs as the layers feed them: KDA with L2-normalised keys, β ∈ (0, 1) or (0, 2), g = log σ(·) per key channel;
DPLR as RWKV-7's: a = −κ̂, b = κ̂ ⊙ (a rate in (0, 1)) for a unit key κ̂, g = −e^(−1/2) σ(·).
Tolerances are relative to the largest value: max |ours − reference| ≤ tol · max |reference|.
"""
import functools
import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lazylab.models.fast_weights as fw
from lazylab.models.fast_weights.delta_rule import delta_rule_loop
from lazylab.models.fast_weights.dplr import channel_decay_mask, dplr_chunked, dplr_loop, dplr_step
from lazylab.models.fast_weights.fla_reference import FlaMissing, load_naive, naive_file
from lazylab.models.fast_weights.gated_delta_rule import gated_delta_rule_chunked, gated_delta_rule_loop
from lazylab.models.fast_weights.kda import intra_chunk, kda_chunked, kda_loop, kda_step
from lazylab.testing import assert_close

# ---- fla-core's references ----


def test_fla_core_has_the_kda_and_dplr_references_where_ci_runs():
    """CI installs fla-core (`make install`): there, its absence is a failure, not a skip."""
    try:
        paths = [naive_file(op) for op in ('kda', 'dplr')]
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


def test_loading_the_kda_and_dplr_references_imports_neither_fla_nor_triton():
    reference('kda')
    code = ('import sys; from lazylab.models.fast_weights.fla_reference import load_naive; '
            'a = load_naive("kda", float64=True); b = load_naive("dplr"); c = load_naive("dplr", float64=True); '
            'assert callable(a.naive_recurrent_kda) and callable(a.naive_chunk_kda); '
            'assert callable(b.dplr_recurrence) and callable(c.dplr_recurrence); '
            'print(sorted(m for m in sys.modules if m == "triton" or m.startswith("triton.") or m == "fla" '
            'or m.startswith("fla.")))')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == '[]'


def test_float64_loading_reads_the_dplr_references_float_casts_as_float64():
    # dplr_recurrence casts q, k, v, b, g with .float() and keeps its state in their dtype (it fails on float64 a,
    # which it leaves as it is): as loaded, float32; loaded for float64, float64, and equal to our float64 loop
    q, k, v, a, b, g, _ = dplr_inputs(9, dtype=torch.float32)
    heads_first = lambda x: x.permute(1, 2, 0, 3)  # noqa: E731
    inputs = [heads_first(t) for t in (q, k, v, a, b, g)]
    _, s = reference('dplr', float64=False).dplr_recurrence(*inputs)
    assert s.dtype == torch.float32
    _, s = reference('dplr').dplr_recurrence(*inputs)
    assert s.dtype == torch.float64
    _, s_ref = dplr_loop(*(t.double() for t in (q * math.sqrt(6), k, v, a, b, g)))
    assert_close(s.transpose(-1, -2), s_ref, 1e-12, 'state')


def fla_kda(q, k, v, beta, g, state, float64=True):
    """fla's naive_recurrent_kda on our sequence-first tensors: (y, state [batch, heads, d_v, d_k])."""
    first = lambda x: x.transpose(0, 1)  # noqa: E731  ([seq_len, batch, …] ↔ fla's [batch, seq_len, …])
    o, s = reference('kda', float64).naive_recurrent_kda(
        first(q), first(k), first(v), first(g), first(beta), scale=1.0,
        initial_state=None if state is None else state.transpose(-1, -2).clone(), output_final_state=True)
    return first(o), s.transpose(-1, -2)


def fla_dplr(q, k, v, a, b, g, state, float64=True):
    """fla's dplr_recurrence on our tensors: q · √d_k undoes its fixed scaling; its layout is [batch, heads, T, d]."""
    heads_first = lambda x: x.permute(1, 2, 0, 3)  # noqa: E731
    o, s = reference('dplr', float64).dplr_recurrence(
        heads_first(q) * math.sqrt(q.shape[-1]), heads_first(k), heads_first(v), heads_first(a), heads_first(b),
        heads_first(g), initial_state=None if state is None else state.transpose(-1, -2).clone())
    return o.permute(2, 0, 1, 3), s.transpose(-1, -2)


# ---- inputs ----

def kda_inputs(seq_len, batch=2, heads=3, d_k=6, d_v=4, *, with_state=True, negative=False, seed=0,
               dtype=torch.float64, strong=False):
    """q, k, v, β, g, state for KDA, drawn in float32 and widened to `dtype`; `strong`: g uniform in [−20, 0]."""
    gen = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    q = normal(seq_len, batch, heads, d_k)
    k = torch.nn.functional.normalize(normal(seq_len, batch, heads, d_k), dim=-1)
    v = normal(seq_len, batch, heads, d_v)
    beta = (2 if negative else 1) * torch.sigmoid(normal(seq_len, batch, heads))
    if strong:
        g = -20 * torch.rand(seq_len, batch, heads, d_k, generator=gen)
    else:
        g = torch.nn.functional.logsigmoid(normal(seq_len, batch, heads, d_k) + 1)
    state = 0.5 * normal(batch, heads, d_v, d_k) if with_state else None
    return [None if t is None else t.to(dtype) for t in (q, k, v, beta, g, state)]


def dplr_inputs(seq_len, batch=2, heads=3, d_k=6, d_v=4, *, with_state=True, seed=0, dtype=torch.float64,
                strong=False):
    """q, k, v, a, b, g, state as RWKV-7 makes them (see the module docstring); `strong`: g uniform in [−20, 0]."""
    gen = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    q, k = normal(seq_len, batch, heads, d_k), normal(seq_len, batch, heads, d_k)
    v = normal(seq_len, batch, heads, d_v)
    unit = torch.nn.functional.normalize(normal(seq_len, batch, heads, d_k), dim=-1)
    a, b = -unit, unit * torch.sigmoid(normal(seq_len, batch, heads, d_k))
    if strong:
        g = -20 * torch.rand(seq_len, batch, heads, d_k, generator=gen)
    else:
        g = -math.exp(-0.5) * torch.sigmoid(normal(seq_len, batch, heads, d_k))
    state = 0.5 * normal(batch, heads, d_v, d_k) if with_state else None
    return [None if t is None else t.to(dtype) for t in (q, k, v, a, b, g, state)]


def step_loop(step, *inputs):
    """A kernel made of `step` token by token (the last input is the state)."""
    *sequences, state = inputs
    ys = []
    for i in range(sequences[0].shape[0]):
        y, state = step(*(x[i] for x in sequences), state)
        ys.append(y)
    return torch.stack(ys), state


KDA_KERNELS = {'loop': kda_loop, 'step': functools.partial(step_loop, kda_step),
               'chunked (5)': functools.partial(kda_chunked, chunk_size=5),
               'chunked (16)': functools.partial(kda_chunked, chunk_size=16)}
DPLR_KERNELS = {'loop': dplr_loop, 'step': functools.partial(step_loop, dplr_step),
                'chunked (5)': functools.partial(dplr_chunked, chunk_size=5),
                'chunked (16)': functools.partial(dplr_chunked, chunk_size=16)}
RULES = {'kda': (KDA_KERNELS, kda_inputs), 'dplr': (DPLR_KERNELS, dplr_inputs)}


# ---- equal to fla-core's references ----

@pytest.mark.parametrize('with_state', [False, True], ids=['zero state', 'carried state'])
@pytest.mark.parametrize('negative', [False, True], ids=['beta<1', 'beta<2'])
@pytest.mark.parametrize('seq_len', [1, 7, 33])
@pytest.mark.parametrize('kernel', KDA_KERNELS)
def test_kda_equals_fla_naive_recurrent_kda_in_float64(kernel, seq_len, negative, with_state):
    inputs = kda_inputs(seq_len, negative=negative, with_state=with_state, seed=seq_len)
    y_ref, s_ref = fla_kda(*inputs)
    y, s = KDA_KERNELS[kernel](*inputs)
    assert y.dtype == s.dtype == torch.float64 and s.shape == s_ref.shape == (2, 3, 4, 6)
    assert_close(y, y_ref, 1e-10, f'{kernel} y')
    assert_close(s, s_ref, 1e-10, f'{kernel} state')


@pytest.mark.parametrize('with_state', [False, True], ids=['zero state', 'carried state'])
@pytest.mark.parametrize('seq_len', [1, 7, 33])
@pytest.mark.parametrize('kernel', DPLR_KERNELS)
def test_dplr_equals_fla_dplr_recurrence_in_float64(kernel, seq_len, with_state):
    inputs = dplr_inputs(seq_len, with_state=with_state, seed=seq_len)
    y_ref, s_ref = fla_dplr(*inputs)
    y, s = DPLR_KERNELS[kernel](*inputs)
    assert y.dtype == s.dtype == torch.float64 and s.shape == s_ref.shape == (2, 3, 4, 6)
    assert_close(y, y_ref, 1e-10, f'{kernel} y')
    assert_close(s, s_ref, 1e-10, f'{kernel} state')


def test_both_rules_equal_fla_in_float32_too():
    # fla's references as they are (float32 throughout) against ours on float32 inputs
    inputs = kda_inputs(40, negative=True, dtype=torch.float32)
    y_ref, s_ref = fla_kda(*inputs, float64=False)
    assert y_ref.dtype == torch.float32
    for kernel in ('loop', 'chunked (16)'):
        y, s = KDA_KERNELS[kernel](*inputs)
        assert_close(y, y_ref, 1e-5, f'KDA {kernel} y')
        assert_close(s, s_ref, 1e-5, f'KDA {kernel} state')
    inputs = dplr_inputs(40, dtype=torch.float32)
    y_ref, s_ref = fla_dplr(*inputs, float64=False)
    assert y_ref.dtype == torch.float32
    for kernel in ('loop', 'chunked (16)'):
        y, s = DPLR_KERNELS[kernel](*inputs)
        assert_close(y, y_ref, 1e-5, f'DPLR {kernel} y')
        assert_close(s, s_ref, 1e-5, f'DPLR {kernel} state')


# ---- chunked == loop, forward and backward ----

def outputs_and_grads(fn, inputs, seed=1):
    """y, the final state and the gradients of a fixed random loss w.r.t. every input that is not None (the loss's
    weights drawn in float64 whatever the dtype: the same loss for float32 inputs)."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    y, s = fn(*leaves)
    gen = torch.Generator().manual_seed(seed)
    loss = (y * torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.dtype)).sum() + \
        (s * torch.randn(s.shape, generator=gen, dtype=torch.float64).to(s.dtype)).sum()
    loss.backward()
    return y.detach(), s.detach(), [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves if t is not None]


@settings(max_examples=25, deadline=None)
@given(rule=st.sampled_from(['kda', 'dplr']), seq_len=st.integers(0, 40), chunk_size=st.integers(1, 20),
       batch=st.integers(1, 2), heads=st.integers(1, 2), d_k=st.integers(1, 8), d_v=st.integers(1, 5),
       with_state=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_chunked_and_step_equal_the_loop_forward_and_backward_for_any_shape(rule, seq_len, chunk_size, batch, heads,
                                                                            d_k, d_v, with_state, seed):
    kernels, make = RULES[rule]
    inputs = make(seq_len, batch, heads, d_k, d_v, with_state=with_state, seed=seed)
    loop, chunked = kernels['loop'], functools.partial(kernels['chunked (5)'].func, chunk_size=chunk_size)
    if not seq_len:
        y, s = loop(*inputs)
        assert y.shape == (0, batch, heads, d_v) and s.shape == (batch, heads, d_v, d_k)
        y_c, s_c = chunked(*inputs)
        assert y_c.shape == y.shape and torch.equal(s_c, s)
        return
    y_ref, s_ref, g_ref = outputs_and_grads(loop, inputs)
    for name, fn in (('chunked', chunked), ('step', kernels['step'])):
        y, s, grads = outputs_and_grads(fn, inputs)
        assert_close(y, y_ref, 1e-10, f'{name} y')
        assert_close(s, s_ref, 1e-10, f'{name} state')
        for i, (a, b) in enumerate(zip(grads, g_ref)):
            assert_close(a, b, 1e-9, f'{name} grad of input {i}')


@pytest.mark.parametrize('chunk_size', [3, 4])
@pytest.mark.parametrize('rule', ['kda', 'dplr'])
def test_chunked_kernels_pass_gradcheck(rule, chunk_size):
    # 7 tokens in chunks of 3 or 4: several chunks, a padded last one; every input, β and g included
    kernels, make = RULES[rule]
    inputs = make(7, 1, 2, 3, 2, seed=4)
    leaves = [t.requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(functools.partial(kernels['chunked (5)'].func, chunk_size=chunk_size), leaves)


@pytest.mark.parametrize('rule', ['kda', 'dplr'])
def test_a_strong_decay_neither_overflows_nor_loses_the_loop(rule):
    # g uniform in [−20, 0] per token, in chunks of 128: Γ reaches about −1280 within a chunk, beyond the exp of
    # float64 (e^709), and float32's (e^88) within ten tokens; only decays ≤ 1 are ever exponentiated, the entries
    # above the diagonal masked before exp
    kernels, make = RULES[rule]
    inputs = make(140, seed=7, strong=True)
    assert inputs[-2][:128].sum(0).min() < -1200
    y_ref, s_ref, g_ref = outputs_and_grads(kernels['loop'], inputs)
    chunked = functools.partial(kernels['chunked (5)'].func, chunk_size=128)
    y, s, grads = outputs_and_grads(chunked, inputs)
    assert torch.isfinite(y).all() and torch.isfinite(s).all() and all(torch.isfinite(t).all() for t in grads)
    assert_close(y, y_ref, 1e-10, 'y')
    assert_close(s, s_ref, 1e-10, 'state')
    for i, (a, b) in enumerate(zip(grads, g_ref)):
        assert_close(a, b, 1e-9, f'grad of input {i}')
    # and in float32, where exp overflows past 88: finite, and near the float64 loop (float32 rounding over products
    # of 128 × 128 and their triangular inverse: about 1e-5)
    low = [t.float() for t in inputs]
    y, s, grads = outputs_and_grads(chunked, low)
    assert torch.isfinite(y).all() and torch.isfinite(s).all() and all(torch.isfinite(t).all() for t in grads)
    assert_close(y.double(), y_ref, 1e-4, 'float32 y')
    for i, (a, b) in enumerate(zip(grads, g_ref)):
        assert_close(a.double(), b, 1e-4, f'float32 grad of input {i}')


def test_intra_chunk_matrices_are_the_masked_decays_at_any_chunk_length():
    # the recursive halving (padded to a power of two) against the [c, c, d_k] decay mask taken whole
    gen = torch.Generator().manual_seed(3)
    for c in (1, 2, 3, 8, 13, 16):
        q, k = torch.randn(5, c, 4, generator=gen, dtype=torch.float64), torch.randn(5, c, 4, generator=gen,
                                                                                      dtype=torch.float64)
        gam = (-3 * torch.rand(5, c, 4, generator=gen, dtype=torch.float64)).cumsum(1)
        mask = channel_decay_mask(gam)
        p, e, _ = intra_chunk(q, k, gam)
        assert_close(p, torch.einsum('nid,njd,nijd->nij', q, k, mask), 1e-14, f'P at c = {c}')
        assert_close(e, torch.einsum('nid,njd,nijd->nij', k, k, mask).tril(-1), 1e-14, f'E at c = {c}')


# ---- identities ----

@pytest.mark.parametrize('kernel', ['loop', 'chunked (5)', 'step'])
def test_kda_with_one_decay_for_every_channel_is_the_gated_delta_rule(kernel):
    q, k, v, beta, g, state = kda_inputs(23, seed=9)
    scalar = g[..., 0]
    y, s = KDA_KERNELS[kernel](q, k, v, beta, scalar.unsqueeze(-1).expand(g.shape), state)
    y_ref, s_ref = gated_delta_rule_loop(q, k, v, beta, scalar, state)
    assert_close(y, y_ref, 1e-12, 'y')
    assert_close(s, s_ref, 1e-12, 'state')
    y, s = KDA_KERNELS[kernel](q, k, v, beta, torch.zeros_like(g), state)
    y_ref, s_ref = delta_rule_loop(q, k, v, beta, state)
    assert_close(y, y_ref, 1e-12, 'y with g = 0')
    assert_close(s, s_ref, 1e-12, 'state with g = 0')


def test_kda_chunked_equals_the_gated_delta_rule_chunked_forward_and_backward():
    # the same gradients through both hand-written backwards (KDA's g gradient summed over the channels)
    q, k, v, beta, g, state = kda_inputs(29, seed=10)
    scalar = g[..., 0]
    y_ref, s_ref, (dq, dk, dv, dbeta, dg, ds) = outputs_and_grads(
        functools.partial(gated_delta_rule_chunked, chunk_size=8), (q, k, v, beta, scalar, state))
    y, s, grads = outputs_and_grads(
        lambda q, k, v, b, g, s: kda_chunked(q, k, v, b, g.unsqueeze(-1).expand(q.shape), s, chunk_size=8),
        (q, k, v, beta, scalar, state))
    assert_close(y, y_ref, 1e-12, 'y')
    assert_close(s, s_ref, 1e-12, 'state')
    for name, a, b in zip(['q', 'k', 'v', 'beta', 'g', 'state'], grads, (dq, dk, dv, dbeta, dg, ds)):
        assert_close(a, b, 1e-11, f'grad {name}')


@pytest.mark.parametrize('kernel', ['loop', 'chunked (5)', 'step'])
def test_kda_is_dplr_with_a_the_decayed_key_and_b_minus_beta_k(kernel):
    # (I − β k kᵀ) Diag(e^g) = Diag(e^g) + b aᵀ with a = e^g ⊙ k, b = −β k (fla's layout), writing (β k) vᵀ
    q, k, v, beta, g, state = kda_inputs(23, seed=11, negative=True)
    y_ref, s_ref = kda_loop(q, k, v, beta, g, state)
    beta_k = beta.unsqueeze(-1) * k
    y, s = DPLR_KERNELS[kernel](q, beta_k, v, g.exp() * k, -beta_k, g, state)
    assert_close(y, y_ref, 1e-12, 'y')
    assert_close(s, s_ref, 1e-12, 'state')


@pytest.mark.parametrize('rule', ['kda', 'dplr'])
def test_without_writes_the_state_only_decays_channel_by_channel(rule):
    # β = 0 (KDA) or k = v = a = b = 0 (DPLR): W_i = W₀ Diag(exp(g₁ + … + gᵢ)), y_i = W_i qᵢ, a hand-worked value
    kernels, make = RULES[rule]
    inputs = make(6, seed=12)
    q, g, state = inputs[0], inputs[-2], inputs[-1]
    inputs = [q] + [torch.zeros_like(t) for t in inputs[1:-2]] + [g, state]
    decayed = state.unsqueeze(0) * g.cumsum(0).exp().unsqueeze(-2)  # [seq_len, batch, heads, d_v, d_k]
    for name, fn in kernels.items():
        y, s = fn(*inputs)
        assert_close(s, decayed[-1], 1e-14, f'{name} state')
        assert_close(y, torch.einsum('tbhvd,tbhd->tbhv', decayed, q), 1e-14, f'{name} y')


# ---- precision under bfloat16 autocast ----

@functools.cache
def bf16_case(rule):
    """bf16 inputs at seq_len 1024 and the float64 loop on the same numbers: output, state and input gradients,
    with the cotangents."""
    kernels, make = RULES[rule]
    inputs = make(1024, 1, 2, 16, 8, with_state=False, seed=13, dtype=torch.float32)[:-1]
    low = [t.bfloat16() for t in inputs]
    ref_inputs = [t.double().requires_grad_() for t in low]
    y_ref, s_ref = kernels['loop'](*ref_inputs)
    gen = torch.Generator().manual_seed(14)
    cot_y = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
    cot_s = torch.randn(s_ref.shape, generator=gen, dtype=torch.float64)
    ((y_ref * cot_y).sum() + (s_ref * cot_s).sum()).backward()
    return low, (y_ref.detach(), s_ref.detach(), [t.grad for t in ref_inputs]), (cot_y, cot_s)


@pytest.mark.parametrize('kernel', ['chunked (16)', 'loop', 'step'])
@pytest.mark.parametrize('rule', ['kda', 'dplr'])
def test_kernels_in_bf16_autocast_keep_float32_state_and_match_float64(rule, kernel):
    # Inputs as autocast hands them over (bf16); the reference is the float64 loop on the same (bf16-rounded)
    # numbers. Stated tolerances, relative to the largest value: the state (float32 throughout) within 1e-4; y and
    # the input gradients, which come back in bf16, within 1e-2 (bf16 rounding is 2⁻⁸).
    low, (y_ref, s_ref, g_ref), (cot_y, cot_s) = bf16_case(rule)
    fn = RULES[rule][0][kernel]
    inputs = [t.clone().requires_grad_() for t in low]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y, s = fn(*inputs, None)
        assert s.dtype == torch.float32 and y.dtype == torch.bfloat16
        ((y.float() * cot_y.float()).sum() + (s * cot_s.float()).sum()).backward()  # backward() inside autocast
    assert_close(s.detach().double(), s_ref, 1e-4, 'state')
    assert_close(y.detach().double(), y_ref, 1e-2, 'y')
    for i, (a, b) in enumerate(zip(inputs, g_ref)):
        assert a.grad.dtype == torch.bfloat16
        assert_close(a.grad.double(), b, 1e-2, f'grad of input {i}')


# ---- errors ----

def test_bad_shapes_are_one_line_errors_naming_them():
    q, k, v, beta, g, state = kda_inputs(5)
    dq, dk, dv, a, b, dg, ds = dplr_inputs(5)
    cases = [
        (lambda: kda_chunked(q, k, v, beta, g[..., 0], state),
         r'KDA: g must have shape \(5, 2, 3, 6\); got \(5, 2, 3\)'),
        (lambda: kda_loop(q, k, v, beta[:4], g, state), r'KDA: beta must have shape \(5, 2, 3\)'),
        (lambda: kda_step(q[0], k[0], v[0], beta[0], g[0], state[:1]), r'KDA: state must be .* got \(1, 3, 4, 6\)'),
        (lambda: kda_chunked(q, k[..., :5], v, beta, g, state), 'KDA: q and k must have equal shapes'),
        (lambda: kda_chunked(q, k, v, beta, g, state, chunk_size=0), 'kda_chunked: chunk_size must be >= 1'),
        (lambda: dplr_loop(dq, dk, dv, a[..., :5], b, dg, ds), r'DPLR: a must have shape \(5, 2, 3, 6\)'),
        (lambda: dplr_chunked(dq, dk, dv, a, b[:4], dg, ds), r'DPLR: b must have shape \(5, 2, 3, 6\)'),
        (lambda: dplr_step(dq[0], dk[0], dv[0], a[0], b[0], dg[0, :1], ds), r'DPLR: g must have shape \(2, 3, 6\)'),
        (lambda: dplr_chunked(dq, dk, dv, a, b, dg, ds, chunk_size=0), 'dplr_chunked: chunk_size must be >= 1'),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as error:
            call()
        assert '\n' not in str(error.value)


def test_the_package_exports_the_kernels():
    assert (fw.kda_step, fw.kda_loop, fw.kda_chunked) == (kda_step, kda_loop, kda_chunked)
    assert (fw.dplr_step, fw.dplr_loop, fw.dplr_chunked) == (dplr_step, dplr_loop, dplr_chunked)
    assert {'kda_chunked', 'dplr_chunked'} <= set(fw.__all__)
