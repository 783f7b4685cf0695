"""Each feature map φ' against a naive formula written here (not our kernels): DPFP, ELU + 1, FAVOR+, with and
without sum normalisation, and L2-normalised SiLU; FAVOR+'s projection (orthogonal, seeded, kept, redrawn only when
asked) and its estimate of the softmax kernel."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lazylab.models.fast_weights.feature_maps import (
    DPFP,
    FEATURE_MAPS,
    Favor,
    L2NormSiLU,
    LinearElu,
    make_feature_map,
    orthogonal_random_features,
)


def naive_dpfp(k: torch.Tensor, nu: int) -> torch.Tensor:
    """The paper's definition element by element: r = ReLU([k, −k]), φ_{2d(i−1)+j} = r_j · r_{(j−i) mod 2d}."""
    rows = []
    for vector in k.reshape(-1, k.shape[-1]).tolist():
        r = [max(x, 0.0) for x in vector] + [max(-x, 0.0) for x in vector]
        n = len(r)
        rows.append([r[j] * r[(j - i) % n] for i in range(1, nu + 1) for j in range(n)])
    return torch.tensor(rows, dtype=k.dtype).reshape(*k.shape[:-1], -1)


def naive_elu_plus_one(k: torch.Tensor) -> torch.Tensor:
    return torch.where(k > 0, k + 1, torch.exp(k))


def naive_favor(k: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """exp(−‖x‖²/2) / √(2m) · [exp(ωᵢᵀx)]ᵢ ++ [exp(−ωᵢᵀx)]ᵢ, one vector at a time."""
    m = omega.shape[0]
    rows = []
    for x in k.reshape(-1, k.shape[-1]):
        h = math.exp(-float(x @ x) / 2) / math.sqrt(2 * m)
        rows.append([h * math.exp(float(w @ x)) for w in omega] + [h * math.exp(-float(w @ x)) for w in omega])
    return torch.tensor(rows, dtype=k.dtype).reshape(*k.shape[:-1], 2 * m)


def naive_sum_normalise(phi: torch.Tensor, eps: float) -> torch.Tensor:
    return phi / (phi.sum(-1, keepdim=True) + eps)


@settings(max_examples=20, deadline=None)
@given(nu=st.integers(1, 3), d_key=st.integers(3, 9), rows=st.integers(1, 6), seed=st.integers(0, 2 ** 16),
       normalise=st.booleans())
def test_dpfp_equals_the_definition(nu, d_key, rows, seed, normalise):
    k = torch.randn(rows, d_key, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    expected = naive_dpfp(k, nu)
    if normalise:
        expected = naive_sum_normalise(expected, 1e-6)
    phi = DPFP(nu=nu, sum_normalization=normalise)
    assert phi.out_features(d_key) == 2 * d_key * nu
    torch.testing.assert_close(phi(k), expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(d_key=st.integers(1, 9), rows=st.integers(1, 6), scale=st.floats(0.1, 5), seed=st.integers(0, 2 ** 16),
       normalise=st.booleans())
def test_linear_elu_equals_the_definition(d_key, rows, scale, seed, normalise):
    k = scale * torch.randn(rows, d_key, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    expected = naive_elu_plus_one(k)
    if normalise:
        expected = naive_sum_normalise(expected, 1e-6)
    phi = LinearElu(sum_normalization=normalise)
    assert phi.out_features(d_key) == d_key
    torch.testing.assert_close(phi(k), expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(d_key=st.integers(1, 6), features=st.integers(1, 13), rows=st.integers(1, 5), seed=st.integers(0, 2 ** 16),
       normalise=st.booleans())
def test_favor_equals_the_definition(d_key, features, rows, seed, normalise):
    g = torch.Generator().manual_seed(seed)
    phi = Favor(d_key, features, sum_normalization=normalise, generator=g)
    k = torch.randn(rows, d_key, generator=g, dtype=torch.float64)
    expected = naive_favor(k, phi.projection.double())
    if normalise:
        expected = naive_sum_normalise(expected, 1e-6)
    assert phi.out_features(d_key) == 2 * features
    torch.testing.assert_close(phi(k), expected, rtol=1e-10, atol=1e-12)


def test_favor_sum_normalised_is_finite_where_the_plain_formula_overflows():
    # ‖x‖ = 16: exp(−‖x‖²/2) = e⁻¹²⁸ underflows to 0 in float32; the normalised features
    # are taken with the largest exponent out, so they stay a probability vector
    phi = Favor(4, 8, eps=0.0, generator=torch.Generator().manual_seed(0))
    k = torch.tensor([[8., -8., 8., -8.]])
    out = phi(k)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.sum(-1), torch.ones(1))
    # and it equals the definition computed in float64, where nothing overflows
    expected = naive_sum_normalise(naive_favor(k.double(), phi.projection.double()), 0.0)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-7)


def test_favor_estimates_the_softmax_kernel():
    # E[φ(x)ᵀφ(y)] = exp(xᵀy): with many orthogonal features the estimate is within 3 %
    g = torch.Generator().manual_seed(1)
    phi = Favor(4, 8192, sum_normalization=False, generator=g)
    x, y = 0.5 * torch.randn(2, 4, generator=g, dtype=torch.float64)
    estimate = float(phi(x) @ phi(y))
    assert abs(estimate / math.exp(float(x @ y)) - 1) < 0.03


@pytest.mark.parametrize('d_key,features', [(4, 4), (4, 10), (8, 3)])
def test_favor_projection_is_block_orthogonal_with_gaussian_lengths(d_key, features):
    omega = orthogonal_random_features(d_key, features, torch.Generator().manual_seed(2), dtype=torch.float64)
    assert omega.shape == (features, d_key)
    directions = omega / omega.norm(dim=-1, keepdim=True)
    for start in range(0, features, d_key):  # within a block of d_key rows the directions are orthonormal
        block = directions[start:start + d_key]
        torch.testing.assert_close(block @ block.T, torch.eye(block.shape[0], dtype=torch.float64))
    # the lengths are those of standard normal vectors: E‖ω‖² = d_key (here over many draws)
    many = orthogonal_random_features(d_key, 4000, torch.Generator().manual_seed(3), dtype=torch.float64)
    assert abs(float(many.square().sum(-1).mean()) / d_key - 1) < 0.05


def test_favor_projection_comes_from_the_seed_is_saved_and_redrawn_only_when_asked():
    torch.manual_seed(5)
    a = Favor(6, 5)
    torch.manual_seed(5)
    b = Favor(6, 5)
    assert torch.equal(a.projection, b.projection)  # drawn from torch's generator: the run's seed
    assert 'projection' in a.state_dict()
    k = torch.randn(3, 6)
    first = a(k)
    assert torch.equal(a(k), first)  # not redrawn by a forward pass
    a.redraw(torch.Generator().manual_seed(9))
    assert not torch.equal(a.projection, b.projection)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b(k), a(k))


@pytest.mark.parametrize('name', FEATURE_MAPS)
def test_feature_maps_work_under_bf16_autocast_and_give_positive_or_unit_features(name):
    # the sum-normalised maps are positive; L2-SiLU is not (SiLU dips to −0.28) but has unit length
    phi = make_feature_map(name, 8, nu=2, features=6)
    k = torch.randn(5, 3, 8)
    expected = phi(k)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = phi(k.bfloat16())
    assert out.shape == expected.shape
    if name == 'l2':
        torch.testing.assert_close(out.float().norm(dim=-1), torch.ones(5, 3), rtol=0, atol=1e-5)
    else:
        assert (out >= 0).all()
    torch.testing.assert_close(out.float(), expected, rtol=0, atol=0.02)


@settings(max_examples=20, deadline=None)
@given(d_key=st.integers(1, 9), rows=st.integers(1, 6), scale=st.floats(0.01, 30), seed=st.integers(0, 2 ** 16))
def test_l2_silu_equals_the_definition(d_key, rows, scale, seed):
    # SiLU(x) = x / (1 + e^−x), divided by √(Σ SiLU² + eps), one vector at a time in Python floats
    k = scale * torch.randn(rows, d_key, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    expected = []
    for vector in k.tolist():
        silu = [x / (1 + math.exp(-x)) for x in vector]
        length = math.sqrt(sum(s * s for s in silu) + 1e-6)
        expected.append([s / length for s in silu])
    out = L2NormSiLU()(k)
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-14)
    assert L2NormSiLU().out_features(d_key) == d_key
    assert make_feature_map('l2', d_key, sum_normalization=False).eps == 1e-6  # (sum normalisation does not apply)


@pytest.mark.parametrize('name', FEATURE_MAPS)
def test_feature_map_gradients_pass_gradcheck(name):
    phi = make_feature_map(name, 5, nu=2, features=4).double()
    k = torch.randn(3, 2, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(phi, (k,))


@pytest.mark.parametrize('normalise', [True, False])
@pytest.mark.parametrize('name', ['linear', 'favor'])
def test_fused_feature_maps_equal_the_plain_operations_forward_and_backward(name, normalise):
    # training (autograd on) and large inputs take the fused functions; plain() is the definition's operations
    phi = make_feature_map(name, 6, features=5, sum_normalization=normalise).double()
    k = 2 * torch.randn(7, 3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grad = torch.randn(7, 3, phi.out_features(6), dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    results = []
    for fn in (phi, phi.plain):
        x = k.clone().requires_grad_()
        out = fn(x)
        out.backward(grad)
        results.append((out.detach(), x.grad))
    (fused, d_fused), (plain, d_plain) = results
    torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(d_fused, d_plain, rtol=1e-10, atol=1e-12)
    big = torch.randn(4000, 6, dtype=torch.float64)  # > 16384 values without autograd: the fused forward too
    torch.testing.assert_close(phi(big), phi.plain(big), rtol=1e-12, atol=1e-14)
    assert torch.autograd.gradcheck(phi, (k[:2].clone().requires_grad_(),))


def test_make_feature_map_names_the_choices():
    with pytest.raises(ValueError, match='dpfp, linear, favor, l2'):
        make_feature_map('softmax', 4)
    with pytest.raises(ValueError, match='features=0'):
        Favor(4, 0)
