"""FeedForward against labml-nn 0.5.1 and the closed forms of Vaswani et al. / Shazeer 2020."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from labml_nn.transformers.feed_forward import FeedForward as RefFeedForward
from torch import nn

from lazylab.models.feed_forward import FeedForward

ACTIVATIONS = {'ReLU': nn.ReLU, 'GELU': nn.GELU, 'SiLU': nn.SiLU, 'Sigmoid': nn.Sigmoid, 'Identity': nn.Identity}


def _pair(seed, **kwargs):
    torch.manual_seed(seed)
    ref = RefFeedForward(**kwargs)
    torch.manual_seed(seed)
    ours = FeedForward(**kwargs)
    return ref.eval(), ours.eval()


@settings(max_examples=20, deadline=None)
@given(activation=st.sampled_from(sorted(ACTIVATIONS)), is_gated=st.booleans(), bias1=st.booleans(),
       bias2=st.booleans(), bias_gate=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_equals_reference_forward_backward_and_state_dict(activation, is_gated, bias1, bias2, bias_gate, seed):
    kwargs = dict(d_model=16, d_ff=24, dropout=0.1, activation=ACTIVATIONS[activation](), is_gated=is_gated,
                  bias1=bias1, bias2=bias2, bias_gate=bias_gate)
    ref, ours = _pair(seed, **kwargs)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for a, b in zip(ours.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)  # same seed → same weights
    # load both ways (a third set of weights, so the copy is not a no-op)
    torch.manual_seed(seed + 1)
    other = FeedForward(**kwargs)
    ref.load_state_dict(other.state_dict())
    ours.load_state_dict(ref.state_dict())

    x = torch.randn(5, 3, 16, generator=torch.Generator().manual_seed(seed))
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, yo = ref(xr), ours(xo)
    assert torch.equal(yo, yr)
    yr.pow(2).sum().backward()
    yo.pow(2).sum().backward()
    assert torch.equal(xo.grad, xr.grad)
    for (n, p), (m, q) in zip(ours.named_parameters(), ref.named_parameters()):
        assert n == m and torch.equal(p.grad, q.grad)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


def test_swiglu_closed_form():
    ffn = FeedForward(4, 6, dropout=0.0, activation=nn.SiLU(), is_gated=True, bias1=False, bias2=False,
                      bias_gate=False)
    x = torch.randn(3, 4, dtype=torch.float64)
    ffn.double()
    w1, v, w2 = ffn.layer1.weight, ffn.linear_v.weight, ffn.layer2.weight
    a = x @ w1.T
    expected = ((a * torch.sigmoid(a)) * (x @ v.T)) @ w2.T
    torch.testing.assert_close(ffn(x), expected)
    assert sorted(ffn.state_dict()) == ['layer1.weight', 'layer2.weight', 'linear_v.weight']


def test_default_is_relu_with_biases():
    ffn = FeedForward(4, 8, dropout=0.0).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    expected = torch.relu(x @ ffn.layer1.weight.T + ffn.layer1.bias) @ ffn.layer2.weight.T + ffn.layer2.bias
    torch.testing.assert_close(ffn(x), expected)
    assert isinstance(ffn.activation, nn.ReLU) and not ffn.is_gated


def test_dropout_matches_reference_from_the_same_seed():
    ref, ours = _pair(0, d_model=8, d_ff=16, dropout=0.5)
    ref.train(), ours.train()
    x = torch.randn(4, 2, 8)
    torch.manual_seed(9)
    yr = ref(x)
    torch.manual_seed(9)
    assert torch.equal(ours(x), yr)


def test_wrong_width_names_the_shape():
    with pytest.raises(ValueError, match=r'd_model=8.*\(4, 2, 7\)'):
        FeedForward(8, 16)(torch.randn(4, 2, 7))


def test_non_positive_sizes_are_value_errors():
    with pytest.raises(ValueError, match='d_model=0, d_ff=4'):
        FeedForward(0, 4)
