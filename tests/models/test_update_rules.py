"""Feature map × update rule × kernel: every combination of the fast-weight attention agrees with the token loop
(forward and backward; float64 within 1e-10, float32 within 1e-5, relative to the largest value), passes
gradcheck, carries its state over segments, and generates one step per token (bit for bit the module path); the
sum rule's kernels against each other and a hand-worked case; and the kernels in bfloat16 autocast against float64
at seq_len 4096. The combinations: every feature map × sum normalisation × attention normalisation for the delta
and sum rules, and for the gated delta rule and DeltaProduct (with and without its gate, n_h 1-3) a covering set
with L2-SiLU and the sum-normalised maps, with and without negative eigenvalues (their kernels against
flash-linear-attention's references: test_gated_rules.py).

Tolerances are relative: max |ours − reference| ≤ tol · max |reference| (for float32 gradients, at least 1 % of the
run's largest gradient stands in for a smaller max |reference|).
"""
import copy
import functools
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lazylab.models.fast_weights as fw
import lazylab.models.fast_weights.token_wise as fw_tw
from lazylab.models.autoregressive import AutoregressiveModel
from lazylab.models.fast_weights.delta_rule import delta_rule_chunked, delta_rule_loop, delta_rule_step
from lazylab.models.fast_weights.sum_rule import sum_rule_chunked, sum_rule_loop, sum_rule_step
from lazylab.models.feed_forward import FeedForward
from lazylab.testing import assert_close

D_MODEL, HEADS = 8, 2  # d_k = 4: small, so that the token loops and gradcheck stay quick
D_K = D_MODEL // HEADS

PHIS = {  # name → φ' factory (sum_normalization given)
    'dpfp1': lambda norm: fw.DPFP(nu=1, sum_normalization=norm),
    'dpfp2': lambda norm: fw.DPFP(nu=2, sum_normalization=norm),
    'linear': lambda norm: fw.LinearElu(sum_normalization=norm),
    'favor': lambda norm: fw.Favor(D_K, 3, sum_normalization=norm, generator=torch.Generator().manual_seed(4)),
    'l2': lambda norm: fw.L2NormSiLU(),  # (L2-normalised: sum normalisation does not apply)
}
#: the options beside the rule, by the name a combination's id shows
OPTIONS = {'': {}, 'neg': {'negative_eigenvalues': True}, 'nh1': {'householder_steps': 1},
           'nh2': {'householder_steps': 2}, 'nh3-neg': {'householder_steps': 3, 'negative_eigenvalues': True},
           'gated-nh2': {'householder_steps': 2, 'gated': True},
           'gated-nh2-neg': {'householder_steps': 2, 'gated': True, 'negative_eigenvalues': True},
           'gated-nh3': {'householder_steps': 3, 'gated': True}}
# feature map × sum normalisation × update rule × attention normalisation × options: every one of the paper's
# rules, and a covering set of the successors'
COMBOS = list(itertools.product(['dpfp1', 'dpfp2', 'linear', 'favor'], [True, False], ['delta', 'sum'],
                                [False, True], ['']))
COMBOS += [('l2', True, 'delta', False, 'neg'), ('l2', True, 'sum', False, ''),
           ('l2', True, 'gated_delta', False, ''), ('l2', True, 'gated_delta', False, 'neg'),
           ('dpfp1', True, 'gated_delta', False, ''), ('favor', True, 'gated_delta', False, 'neg'),
           ('l2', True, 'delta_product', False, 'nh1'), ('l2', True, 'delta_product', False, 'nh3-neg'),
           ('dpfp1', True, 'delta_product', False, 'nh2'), ('l2', True, 'delta_product', False, 'gated-nh2-neg'),
           ('linear', True, 'delta_product', False, 'gated-nh2'), ('l2', True, 'delta_product', False, 'gated-nh3')]
COMBO_IDS = [f"{phi}-{'sumnorm' if s else 'raw'}-{rule}{'-attnnorm' if a else ''}{'-' + o if o else ''}"
             for phi, s, rule, a, o in COMBOS]


def attention(combo, dtype=torch.float64, seed=0, **kwargs):
    phi, sum_norm, rule, attn_norm, options = combo
    torch.manual_seed(seed)
    module = fw.FastWeightsAttention(HEADS, D_MODEL, 0.0, PHIS[phi](sum_norm), update_rule=rule,
                                     attention_normalization=attn_norm, **OPTIONS[options], **kwargs)
    with torch.no_grad():  # weights of a size that keeps raw (un-normalised) features and the delta rule tame
        for p in module.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + p.numel())))
    return module.to(dtype)


def state_rows(combo):
    return D_K + 1 if combo[3] else D_K


def initial_state(combo, module, batch, dtype, seed=1):
    """A plausible carried state: what the module leaves after a short random prefix."""
    x = 0.5 * torch.randn(5, batch, D_MODEL, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    with torch.no_grad():
        return module.forward_with_state(x)[1]


def run(module, x, state):
    """Output, final state and the gradients of a fixed random loss w.r.t. x, the state and every parameter."""
    module.zero_grad()
    x = x.detach().clone().requires_grad_()
    state = state.detach().clone().requires_grad_()
    y, new_state = module.forward_with_state(x, state)
    g = torch.Generator().manual_seed(11)  # (drawn in float64 for every dtype: the same numbers)
    loss = (y * torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.dtype)).sum() + \
        (new_state * torch.randn(new_state.shape, generator=g, dtype=torch.float64).to(new_state.dtype)).sum()
    loss.backward()
    grads = {'x': x.grad, 'state': state.grad}
    grads.update({name: p.grad for name, p in module.named_parameters()})
    return y.detach(), new_state.detach(), grads



@functools.cache
def loop_reference(combo, seq_len, dtype):
    module = attention(combo, dtype, kernel='loop')
    x = 0.5 * torch.randn(seq_len, 2, D_MODEL, generator=torch.Generator().manual_seed(seq_len), dtype=dtype)
    state = initial_state(combo, module, 2, dtype)
    return x, state, run(module, x, state)


TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def expansive(combo):
    """The delta rule on raw ELU + 1 features: ‖φ(k)‖² ≈ d_k > 2/β, so each write amplifies what is stored (the
    paper's reason for the sum normalisation, section 4.1): values grow ~2× per token and so do float32 rounding
    differences between summation orders (the chunked form's (I + A)⁻¹ sums powers of an A with entries ~d_k).
    Its float32 agreement within 1e-5 is checked over the first 7 tokens only (float64: at every length), and its
    generation over 7 tokens within 1e-4."""
    phi, sum_norm, rule, *_ = combo
    return phi == 'linear' and not sum_norm and rule == 'delta'


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32], ids=['fp64', 'fp32'])
@pytest.mark.parametrize('seq_len', [1, 7, 40])
@pytest.mark.parametrize('combo', COMBOS, ids=COMBO_IDS)
def test_chunked_and_step_kernels_equal_the_loop_forward_and_backward(combo, seq_len, dtype):
    if dtype == torch.float32 and expansive(combo):
        seq_len = min(seq_len, 7)
    x, state, (y_ref, s_ref, g_ref) = loop_reference(combo, seq_len, dtype)
    assert s_ref.shape == (2, HEADS, state_rows(combo), s_ref.shape[-1]) and s_ref.dtype == dtype
    for kernel, chunk_size in [('chunked', 16), ('chunked', 3), ('step', 16)]:
        y, s, g = run(attention(combo, dtype, kernel=kernel, chunk_size=chunk_size), x, state)
        what = f'{kernel}/{chunk_size}'
        assert_close(y, y_ref, TOL[dtype], f'{what} y')
        assert_close(s, s_ref, TOL[dtype], f'{what} state')
        assert set(g) == set(g_ref)
        # a gradient that is small by cancellation carries the rounding of the large terms that cancel: in float32
        # each is measured against at least 1 % of the largest gradient of the run
        floor = 0.01 * max(float(t.abs().max()) for t in g_ref.values()) if dtype == torch.float32 else 1e-30
        for name in g_ref:
            assert_close(g[name], g_ref[name], TOL[dtype], f'{what} grad {name}', floor)


@pytest.mark.parametrize('kernel', ['chunked', 'step'])
@pytest.mark.parametrize('combo', COMBOS, ids=COMBO_IDS)
def test_every_combination_passes_gradcheck(combo, kernel):
    module = attention(combo, kernel=kernel, chunk_size=2)  # 5 tokens in chunks of 2: padding, several chunks
    x = 0.5 * torch.randn(5, 1, D_MODEL, dtype=torch.float64, requires_grad=True)
    state = initial_state(combo, module, 1, torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, s: module.forward_with_state(x, s), (x, state), fast_mode=True)


@pytest.mark.parametrize('combo', COMBOS, ids=COMBO_IDS)
def test_carried_state_over_segments_equals_one_pass(combo):
    module = attention(combo, chunk_size=4)
    x = 0.5 * torch.randn(30, 2, D_MODEL, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y_full, s_full = module.forward_with_state(x)
    state, pieces = None, []
    for a, b in [(0, 1), (1, 11), (11, 12), (12, 30)]:
        y, state = module.forward_with_state(x[a:b], state)
        pieces.append(y)
    assert_close(torch.cat(pieces), y_full, 1e-10, 'y')
    assert_close(state, s_full, 1e-10, 'state')


def language_model(combo, n_layers=2):
    phi, sum_norm, rule, attn_norm, options = combo
    torch.manual_seed(0)
    attn = fw.FastWeightsAttention(HEADS, D_MODEL, 0.0, PHIS[phi](sum_norm), update_rule=rule,
                                   attention_normalization=attn_norm, **OPTIONS[options])
    layer = fw.FastWeightsAttentionTransformerLayer(d_model=D_MODEL, attn=attn,
                                                    feed_forward=FeedForward(D_MODEL, 16, 0.0), dropout_prob=0.0)
    return AutoregressiveModel(7, D_MODEL, fw.FastWeightsAttentionTransformer(layer, n_layers)).eval()


@pytest.mark.parametrize('combo', COMBOS, ids=COMBO_IDS)
def test_generation_is_one_step_per_token_and_equals_rerunning_the_prefix(combo):
    lm = language_model(combo)
    assert lm.transformer.step_function() is not None  # every combination has a generation step function
    length = 7 if expansive(combo) else 12
    tokens = torch.randint(0, 7, (length, 2), generator=torch.Generator().manual_seed(1))
    full, _ = lm(tokens)
    logits, state = lm.forward_with_state(tokens[:4])
    stepped = [logits]
    with torch.no_grad():
        for t in range(4, length):  # the step function's path (eval, no autograd), one token at a time
            logits, state = lm.forward_with_state(tokens[t:t + 1], state)
            stepped.append(logits)
    assert_close(torch.cat(stepped), full, 1e-4 if expansive(combo) else 1e-5, 'logits')
    # the step function is bit for bit the module path (autograd on takes the modules)
    with torch.no_grad():
        lean, lean_state = lm.forward_with_state(tokens[:1], state)
    module, module_state = lm.forward_with_state(tokens[:1], state)
    assert torch.equal(lean, module) and all(torch.equal(a, b) for a, b in zip(lean_state, module_state))
    prompt = tokens[:3, :1]
    assert torch.equal(lm.generate(prompt, 8, temperature=0), lm.generate(prompt, 8, temperature=0, use_state=False))


@pytest.mark.parametrize('rule', ['delta', 'sum'])
@pytest.mark.parametrize('attn_norm', [False, True])
def test_token_wise_variant_equals_the_whole_sequence_module(rule, attn_norm):
    whole = attention(('linear', True, rule, attn_norm, ''), torch.float32)
    token_wise = fw_tw.FastWeightsAttention(HEADS, D_MODEL, 0.0, fw.LinearElu(), update_rule=rule,
                                            attention_normalization=attn_norm)
    token_wise.load_state_dict({k.replace('interpolation_weight.', 'gate.'): v for k, v in whole.state_dict().items()})
    x = torch.randn(9, 3, D_MODEL)
    y_whole, s_whole = whole.forward_with_state(x)
    state, ys = None, []
    for x_i in x:
        y, state = token_wise(x_i, state)
        ys.append(y)
    assert_close(torch.stack(ys), y_whole, 1e-5, 'y')
    assert_close(state, s_whole, 1e-5, 'state')


def test_sum_rule_has_no_beta_keeps_the_other_names_and_weights_and_loads_delta_state_dicts():
    delta = attention(('dpfp1', True, 'delta', False, ''), torch.float32)
    torch.manual_seed(0)
    summed = fw.FastWeightsAttention(HEADS, D_MODEL, 0.0, fw.DPFP(), update_rule='sum')
    torch.manual_seed(0)
    delta_same_seed = fw.FastWeightsAttention(HEADS, D_MODEL, 0.0, fw.DPFP())
    assert summed.interpolation_weight is None
    assert set(delta_same_seed.state_dict()) - set(summed.state_dict()) == {'interpolation_weight.0.linear.weight'}
    for key, value in summed.state_dict().items():  # from the same seed, the same q, k, v and output weights
        assert torch.equal(value, delta_same_seed.state_dict()[key]), key
    # a delta-rule state dict loads (β's weight is ignored, as PyTorch does for a submodule set to None)
    summed.load_state_dict(delta.state_dict())
    for key, value in summed.state_dict().items():
        assert torch.equal(value, delta.state_dict()[key]), key


# ---- the sum rule's kernels ----

def rule_inputs(seq_len, batch, heads, d_dot, d_v, dtype=torch.float64, seed=0, with_state=True):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.rand(seq_len, batch, heads, d_dot, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(seq_len, batch, heads, d_v, generator=g, dtype=dtype)
    state = torch.randn(batch, heads, d_v, d_dot, generator=g, dtype=dtype) if with_state else None
    return q, k, v, state


def sum_step_loop(q, k, v, state):
    ys = []
    for i in range(q.shape[0]):
        y, state = sum_rule_step(q[i], k[i], v[i], state)
        ys.append(y)
    return torch.stack(ys), state


def test_sum_rule_hand_worked():
    # one head, one-hot keys e₀, e₀, e₁; queries e₀: the sum rule adds (no replacing): y = 2, then 2 + 6, then 8
    e0, e1 = torch.tensor([1., 0.]), torch.tensor([0., 1.])
    k = torch.stack([e0, e0, e1]).view(3, 1, 1, 2)
    q = torch.stack([e0, e0, e0]).view(3, 1, 1, 2)
    v = torch.tensor([[2.], [6.], [100.]]).view(3, 1, 1, 1)
    for fn in (sum_rule_loop, sum_rule_chunked, sum_step_loop):
        y, w = fn(q, k, v, None)
        torch.testing.assert_close(y.view(3), torch.tensor([2., 8., 8.]))
        torch.testing.assert_close(w.view(2), torch.tensor([8., 100.]))


@settings(max_examples=25, deadline=None)
@given(seq_len=st.integers(0, 70), chunk_size=st.integers(1, 30), batch=st.integers(1, 3), heads=st.integers(1, 3),
       d_dot=st.integers(1, 12), d_v=st.integers(1, 6), with_state=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_sum_rule_chunked_and_step_equal_the_loop_for_any_shape(seq_len, chunk_size, batch, heads, d_dot, d_v,
                                                                 with_state, seed):
    inputs = rule_inputs(seq_len, batch, heads, d_dot, d_v, seed=seed, with_state=with_state)
    leaves = [t.requires_grad_() for t in inputs if t is not None]
    y_ref, s_ref = sum_rule_loop(*inputs)
    fns = [lambda *a: sum_rule_chunked(*a, chunk_size=chunk_size)] + ([sum_step_loop] if seq_len else [])
    for fn in fns:
        y, s = fn(*inputs)
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)
        if seq_len:
            cotangents = (torch.ones_like(y_ref), torch.ones_like(s_ref))
            expected = torch.autograd.grad((y_ref, s_ref), leaves, cotangents, retain_graph=True)
            got = torch.autograd.grad((y, s), leaves, cotangents, retain_graph=True)
            for a, b in zip(got, expected):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_sum_rule_chunked_passes_gradcheck():
    inputs = [t.requires_grad_() for t in rule_inputs(7, 2, 1, 3, 2, seed=5)]
    assert torch.autograd.gradcheck(lambda *a: sum_rule_chunked(*a, chunk_size=3), inputs)


def naive_normalised_sum_rule(q, k, v, state, eps):
    """yᵢ = (W₀ qᵢ + Σ_{j≤i} vⱼ (kⱼ · qᵢ)) / (z₀ · qᵢ + Σ_{j≤i} kⱼ · qᵢ + eps), written out per token; the state
    [W; z] after the last token."""
    w0, z0 = state[..., :-1, :], state[..., -1, :]
    ys = []
    for i in range(q.shape[0]):
        scores = torch.einsum('jbhd,bhd->jbh', k[:i + 1], q[i])  # kⱼ · qᵢ for j ≤ i
        numerator = torch.einsum('bhvd,bhd->bhv', w0, q[i]) + torch.einsum('jbh,jbhv->bhv', scores, v[:i + 1])
        denominator = torch.einsum('bhd,bhd->bh', z0, q[i]) + scores.sum(0) + eps
        ys.append(numerator / denominator.unsqueeze(-1))
    w = w0 + torch.einsum('jbhv,jbhd->bhvd', v, k)
    z = z0 + k.sum(0)
    return torch.stack(ys) if ys else v.new_zeros(v.shape), torch.cat([w, z.unsqueeze(-2)], dim=-2)


@settings(max_examples=25, deadline=None)
@given(seq_len=st.integers(0, 70), chunk_size=st.integers(1, 30), batch=st.integers(1, 3), heads=st.integers(1, 3),
       d_dot=st.integers(1, 12), d_v=st.integers(1, 6), seed=st.integers(0, 2 ** 16))
def test_attention_normalised_sum_rule_chunked_equals_the_formula_for_any_shape(seq_len, chunk_size, batch, heads,
                                                                                 d_dot, d_v, seed):
    q, k, v, w0 = rule_inputs(seq_len, batch, heads, d_dot, d_v, seed=seed)
    z0 = torch.rand(batch, heads, 1, d_dot, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    state = torch.cat([w0, z0], dim=-2)
    leaves = [t.requires_grad_() for t in (q, k, v, state)]
    y_ref, s_ref = naive_normalised_sum_rule(q, k, v, state, 1e-6)
    y, s = sum_rule_chunked(q, k, v, state, chunk_size, attention_normalization=True, eps=1e-6)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)
    if seq_len:
        cotangents = (torch.randn_like(y_ref), torch.randn_like(s_ref))
        expected = torch.autograd.grad((y_ref, s_ref), leaves, cotangents)
        got = torch.autograd.grad((y, s), leaves, cotangents)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_attention_normalised_sum_rule_chunked_passes_gradcheck():
    q, k, v, w0 = rule_inputs(7, 2, 1, 3, 2, seed=6)
    state = torch.cat([w0, torch.rand(2, 1, 1, 3, dtype=torch.float64)], dim=-2)
    inputs = [t.requires_grad_() for t in (q, k, v, state)]
    assert torch.autograd.gradcheck(
        lambda *a: sum_rule_chunked(*a, chunk_size=3, attention_normalization=True), inputs)
    with pytest.raises(ValueError, match=r'd_v \+ 1'):  # the state carries z as one more row
        sum_rule_chunked(q, k, v, w0, attention_normalization=True)


def test_sum_rule_bad_arguments_raise_clear_errors():
    q, k, v, state = rule_inputs(5, 2, 3, 4, 2)
    with pytest.raises(ValueError, match='q and k'):
        sum_rule_chunked(q, k[..., :3], v, state)
    with pytest.raises(ValueError, match='state must be'):
        sum_rule_loop(q, k, v, state[:1])
    with pytest.raises(ValueError, match='chunk_size'):
        sum_rule_chunked(q, k, v, state, chunk_size=0)
    with pytest.raises(ValueError, match='update_rule'):
        fw.FastWeightsAttention(HEADS, D_MODEL, 0.0, fw.DPFP(), update_rule='hebb')


# ---- precision: bfloat16 autocast against float64 at seq_len 4096 ----

def _delta(kernel):
    if kernel == 'chunked':
        return lambda q, k, v, b, s: delta_rule_chunked(q, k, v, b, s, chunk_size=64)
    if kernel == 'step':
        def steps(q, k, v, b, s):
            ys = []
            for i in range(q.shape[0]):
                y, s = delta_rule_step(q[i], k[i], v[i], b[i], s)
                ys.append(y)
            return torch.stack(ys), s
        return steps
    return delta_rule_loop


def _sum(kernel):
    if kernel == 'chunked':
        return lambda q, k, v, b, s: sum_rule_chunked(q, k, v, s, chunk_size=64)
    if kernel == 'step':
        return lambda q, k, v, b, s: sum_step_loop(q, k, v, s)
    return lambda q, k, v, b, s: sum_rule_loop(q, k, v, s)


@pytest.mark.parametrize('rule', ['delta', 'sum'])  # (the gated delta rule's and DeltaProduct's: test_gated_rules.py)
@pytest.mark.parametrize('kernel', ['chunked', 'loop', 'step'])
def test_kernels_in_bf16_autocast_keep_float32_state_and_match_float64_at_seq_len_4096(rule, kernel):
    # Inputs as autocast hands them over (bf16), sum-normalised features as DPFP gives; the reference is the
    # float64 loop on the same (bf16-rounded) numbers. Stated tolerances, relative to the largest value: the state
    # (float32 throughout) within 1e-4; y and the input gradients, which come back in bf16, within 1e-2 (bf16
    # rounding is 2⁻⁸). A bf16 state drifts by ~0.3 at this length (the measurement).
    seq_len, batch, heads, d_dot, d_v = 4096, 1, 2, 16, 8
    g = torch.Generator().manual_seed(0)
    q, k = (torch.rand(seq_len, batch, heads, d_dot, generator=g) for _ in range(2))
    q, k = (x * (torch.rand(x.shape, generator=g) < 0.5) for x in (q, k))
    q, k = (x / (x.sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    v = torch.randn(seq_len, batch, heads, d_v, generator=g)
    beta = torch.rand(seq_len, batch, heads, generator=g)
    low = [t.bfloat16() for t in (q, k, v, beta)]
    fn = (_delta if rule == 'delta' else _sum)(kernel)
    ref_inputs = [t.double().requires_grad_() for t in low]
    y_ref, s_ref = fn(*ref_inputs[:4], None) if rule == 'delta' else fn(*ref_inputs[:3], None, None)
    cot_y = torch.randn(y_ref.shape, generator=g, dtype=torch.float64)
    cot_s = torch.randn(s_ref.shape, generator=g, dtype=torch.float64)
    ((y_ref * cot_y).sum() + (s_ref * cot_s).sum()).backward()

    inputs = [t.clone().requires_grad_() for t in low]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y, s = fn(*inputs[:4], None) if rule == 'delta' else fn(*inputs[:3], None, None)
        assert s.dtype == torch.float32 and y.dtype == torch.bfloat16
        # backward() inside the autocast block
        ((y.float() * cot_y.float()).sum() + (s * cot_s.float()).sum()).backward()
    assert_close(s.double(), s_ref, 1e-4, 'state')
    assert_close(y.double(), y_ref, 1e-2, 'y')
    used = 4 if rule == 'delta' else 3
    for name, a, b in zip('qkvb', inputs[:used], ref_inputs[:used]):
        assert a.grad.dtype == torch.bfloat16
        assert_close(a.grad.double(), b.grad, 1e-2, f'grad {name}')


def norm_rel(actual, expected):
    return float((actual.detach().double() - expected.detach()).norm() / expected.detach().norm())


@pytest.mark.parametrize('phi,rule,attn_norm', [('dpfp', 'delta', False), ('dpfp', 'sum', False),
                                                ('linear', 'sum', True), ('favor', 'sum', False),
                                                ('l2', 'gated_delta', False), ('l2', 'delta_product', False)])
def test_attention_module_in_bf16_autocast_matches_float64_at_seq_len_4096(phi, rule, attn_norm):
    # The whole module (d_model 64, 2 heads, its default initialisation) under CPU bf16 autocast against the same
    # weights in float64, forward and backward (backward() inside the autocast block). Stated tolerances, as
    # ‖ours − float64‖ / ‖float64‖: output and carried state within 2e-2, the gradients of x and of W_q within
    # 1e-1. (Measured: output ≤ 6e-3, state ≤ 3e-3; gradients ≤ 1e-2, except DPFP's ≤ 6e-2: DPFP's sum
    # normalisation is scale-free, so at the rare keys whose features nearly vanish the bf16 rounding of the
    # projection decides their direction. The float32 state adds nothing that grows with the length.)
    torch.manual_seed(0)
    module = fw.FastWeightsAttention(2, 64, 0.0, fw.make_feature_map(phi, 32, features=32), update_rule=rule,
                                     attention_normalization=attn_norm)
    module64 = copy.deepcopy(module).double()
    x = torch.randn(4096, 1, 64, generator=torch.Generator().manual_seed(2))
    cotangent = torch.randn(4096, 1, 64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def forward_backward(m, x, autocast):
        x = x.clone().requires_grad_()
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            y, state = m.forward_with_state(x)
            (y * cotangent.to(y.dtype)).sum().backward()
        return y.detach(), state, x.grad, m.query.linear.weight.grad

    y_ref, s_ref, gx_ref, gq_ref = forward_backward(module64, x.double(), False)
    y, s, gx, gq = forward_backward(module, x, True)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert norm_rel(y, y_ref) <= 2e-2 and norm_rel(s, s_ref) <= 2e-2
    assert norm_rel(gx, gx_ref) <= 1e-1 and norm_rel(gq, gq_ref) <= 1e-1
