"""MultiHeadAttention and PrepareForMultiHeadAttention against labml-nn 0.5.1 (the reference)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from labml_nn.transformers import mha as ref_mha
from labml_nn.transformers.utils import subsequent_mask as ref_subsequent_mask

from lazylab.models.mha import MultiHeadAttention, PrepareForMultiHeadAttention, subsequent_mask

ATOL = 1e-6
RTOL = 1e-6  # the SDPA path sums in another order: a few float32 ulps, which for gradients of size ~5 exceed ATOL


def _pair(heads, d_model, bias=True, use_sdpa=True, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    ref = ref_mha.MultiHeadAttention(heads, d_model, dropout_prob=dropout, bias=bias)
    torch.manual_seed(seed)
    ours = MultiHeadAttention(heads, d_model, dropout_prob=dropout, bias=bias, use_sdpa=use_sdpa)
    return ref, ours


def _run(module, query, key, value, mask):
    """Forward + backward of a fixed random projection; returns output, input grads and parameter grads."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (query, key, value))
    out = module(query=q, key=k, value=v, mask=mask)
    weight = torch.linspace(-1, 1, out.numel()).view_as(out)
    torch.nan_to_num(out * weight).sum().backward()
    grads = {n: p.grad for n, p in module.named_parameters()}
    module.zero_grad()
    return out, (q.grad, k.grad, v.grad), grads


def _assert_close(a, b, exact=False):
    if exact:
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    else:
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, equal_nan=True)


def test_subsequent_mask_equals_reference():
    for n in (0, 1, 5):
        m = subsequent_mask(n)
        assert m.dtype == torch.bool and m.shape == (n, n, 1)
        assert torch.equal(m, ref_subsequent_mask(n))


@pytest.mark.parametrize('bias', [True, False])
def test_same_seed_same_weights_and_state_dict_loads_both_ways(bias):
    ref, ours = _pair(4, 32, bias=bias)
    assert list(ref.state_dict()) == list(ours.state_dict())
    for (_, a), (_, b) in zip(ref.state_dict().items(), ours.state_dict().items()):
        assert torch.equal(a, b)
    assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in ours.parameters())
    torch.manual_seed(1)
    other = MultiHeadAttention(4, 32, bias=bias)
    ref.load_state_dict(other.state_dict())
    ours.load_state_dict(ref.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), ours.state_dict().values()))


def _mask(kind, seq_q, seq_k, batch, gen):
    if kind == 'none':
        return None
    if kind == 'causal':
        return subsequent_mask(seq_q) if seq_q == seq_k else None
    first = 1 if kind == 'broadcast' else seq_q
    last = 1 if kind == 'broadcast' else batch
    mask = torch.rand(first, seq_k, last, generator=gen) < 0.7
    mask[:, 0] = True  # every query sees at least one key
    if kind == 'float':
        return mask.float()
    return mask


@settings(max_examples=25, deadline=None)
@given(seq_q=st.integers(1, 9), seq_k=st.integers(1, 9), batch=st.integers(1, 3),
       heads=st.sampled_from([1, 2, 4]), bias=st.booleans(), use_sdpa=st.booleans(),
       self_attention=st.booleans(),
       mask_kind=st.sampled_from(['none', 'causal', 'full', 'broadcast', 'float']), seed=st.integers(0, 2 ** 16))
def test_outputs_gradients_and_attention_equal_reference(seq_q, seq_k, batch, heads, bias, use_sdpa,
                                                         self_attention, mask_kind, seed):
    d_model = 8 * heads
    ref, ours = _pair(heads, d_model, bias=bias, use_sdpa=use_sdpa, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    if self_attention:
        seq_k = seq_q
    query = torch.randn(seq_q, batch, d_model, generator=gen)
    key = query if self_attention else torch.randn(seq_k, batch, d_model, generator=gen)
    value = query if self_attention else torch.randn(seq_k, batch, d_model, generator=gen)
    mask = _mask(mask_kind, seq_q, seq_k, batch, gen)

    out_r, in_grads_r, grads_r = _run(ref, query, key, value, mask)
    out_o, in_grads_o, grads_o = _run(ours, query, key, value, mask)
    exact = not use_sdpa  # the explicit path does the reference's operations in the same order
    _assert_close(out_o, out_r, exact)
    for a, b in zip(in_grads_o, in_grads_r):
        _assert_close(a, b, exact)
    assert grads_o.keys() == grads_r.keys()
    for name in grads_r:
        _assert_close(grads_o[name], grads_r[name], exact)
    assert ours.attn.shape == (seq_q, seq_k, batch, heads)
    _assert_close(ours.attn, ref.attn, exact)


def test_fully_masked_query_row_gives_nan_like_reference():
    ref, ours = _pair(2, 16)
    x = torch.randn(4, 2, 16)
    mask = torch.ones(4, 4, 2, dtype=torch.bool)
    mask[2, :, 1] = False
    out_r = ref(query=x, key=x, value=x, mask=mask)
    out_o = ours(query=x, key=x, value=x, mask=mask)
    assert torch.isnan(out_r[2, 1]).all() and torch.isnan(out_o[2, 1]).all()
    torch.testing.assert_close(out_o, out_r, rtol=0, atol=ATOL, equal_nan=True)


def test_explicit_path_reproduces_reference_dropout_from_the_same_seed():
    ref, ours = _pair(4, 32, use_sdpa=False, dropout=0.3)
    ref.train(), ours.train()
    x = torch.randn(6, 3, 32)
    torch.manual_seed(5)
    out_r = ref(query=x, key=x, value=x, mask=subsequent_mask(6))
    torch.manual_seed(5)
    out_o = ours(query=x, key=x, value=x, mask=subsequent_mask(6))
    assert torch.equal(out_o, out_r)
    assert torch.equal(ours.attn, ref.attn)


def test_sdpa_dropout_is_unbiased_dropout_on_attention_weights():
    # The output is linear in the attention weights, so averaging over many independent dropout draws (the batch
    # holds copies of one sequence) must approach the eval-mode output; and every draw must differ from it.
    torch.manual_seed(0)
    ours = MultiHeadAttention(2, 16, dropout_prob=0.5)
    x = torch.randn(5, 1, 16).expand(5, 4000, 16)
    ours.eval()
    expected = ours(query=x[:, :1], key=x[:, :1], value=x[:, :1])
    ours.train()
    torch.manual_seed(1)
    with torch.no_grad():
        out = ours(query=x, key=x, value=x)
    assert (out[:, :4] - expected).abs().min() > 0
    torch.testing.assert_close(out.mean(dim=1, keepdim=True), expected, rtol=0, atol=0.03)
    # the kept weights are the pre-dropout softmax
    assert torch.allclose(ours.attn.sum(dim=1), torch.ones(5, 4000, 2))


def test_prepare_for_multi_head_attention_equals_reference():
    torch.manual_seed(3)
    ref = ref_mha.PrepareForMultiHeadAttention(12, 3, 5, bias=True)
    torch.manual_seed(3)
    ours = PrepareForMultiHeadAttention(12, 3, 5, bias=True)
    x = torch.randn(2, 4, 7, 12)
    assert ours(x).shape == (2, 4, 7, 3, 5)
    assert torch.equal(ours(x), ref(x))
    assert list(ours.state_dict()) == ['linear.weight', 'linear.bias']


def test_d_model_not_divisible_by_heads_names_both():
    with pytest.raises(ValueError, match=r'd_model=30.*heads=4'):
        MultiHeadAttention(4, 30)


@pytest.mark.parametrize('shape', [(5, 16), (5, 2, 16, 1), (5, 2, 15)])
def test_wrong_input_shape_names_the_shape(shape):
    mha = MultiHeadAttention(2, 16)
    x = torch.randn(*shape)
    with pytest.raises(ValueError, match=r'query.*d_model=16.*' + r'\(' + ', '.join(map(str, shape))):
        mha(query=x, key=x, value=x)


@pytest.mark.parametrize('mask_shape', [(4, 4), (3, 4, 2), (4, 5, 2), (4, 4, 3)])
def test_bad_mask_shape_is_a_value_error(mask_shape):
    mha = MultiHeadAttention(2, 16)
    x = torch.randn(4, 2, 16)
    with pytest.raises(ValueError, match='mask of shape'):
        mha(query=x, key=x, value=x, mask=torch.ones(*mask_shape, dtype=torch.bool))


def test_key_value_mismatch_is_a_value_error():
    mha = MultiHeadAttention(2, 16)
    with pytest.raises(ValueError, match='key.*value'):
        mha(query=torch.randn(3, 2, 16), key=torch.randn(4, 2, 16), value=torch.randn(5, 2, 16))
