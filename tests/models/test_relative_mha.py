"""RelativeMultiHeadAttention (Transformer-XL) against labml-nn 0.5.1 and a hand-worked shift."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from labml_nn.transformers.xl import relative_mha as ref_rel

from lazylab.models.mha import subsequent_mask
from lazylab.models.relative_mha import RelativeMultiHeadAttention, shift_right


def test_shift_right_hand_worked():
    x = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    assert torch.equal(shift_right(x), torch.tensor([[1, 2, 3], [0, 4, 5], [6, 0, 7]]))


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 8), trailing=st.sampled_from([(), (2,), (2, 3)]))
def test_shift_right_equals_reference_for_any_shape(rows, cols, trailing):
    x = torch.randn(rows, cols, *trailing)
    assert torch.equal(shift_right(x), ref_rel.shift_right(x))


def _randomise(module, seed):
    # The positional parameters start at zero; give them values so the relative terms are exercised.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


@settings(max_examples=15, deadline=None)
@given(seq_q=st.integers(1, 7), mem=st.integers(0, 4), batch=st.integers(1, 3), heads=st.sampled_from([1, 2, 4]),
       masked=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_outputs_and_gradients_equal_reference(seq_q, mem, batch, heads, masked, seed):
    d_model = 4 * heads
    seq_k = seq_q + mem  # memory followed by the current segment, as in Transformer-XL
    ref = ref_rel.RelativeMultiHeadAttention(heads, d_model, dropout_prob=0.0)
    ours = RelativeMultiHeadAttention(heads, d_model, dropout_prob=0.0)
    _randomise(ref, seed)
    ours.load_state_dict(ref.state_dict())
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())

    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(seq_q, batch, d_model, generator=gen)
    kv = torch.randn(seq_k, batch, d_model, generator=gen)
    mask = None
    if masked:  # causal over the current segment, memory always visible
        mask = torch.cat([torch.ones(seq_q, mem, 1, dtype=torch.bool), subsequent_mask(seq_q)], dim=1)
    outs = []
    for module in (ref, ours):
        qq, kk = q.clone().requires_grad_(), kv.clone().requires_grad_()
        out = module(query=qq, key=kk, value=kk, mask=mask)
        out.pow(2).sum().backward()
        outs.append((out, qq.grad, kk.grad, {n: p.grad.clone() for n, p in module.named_parameters()}))
    (out_r, gq_r, gk_r, grads_r), (out_o, gq_o, gk_o, grads_o) = outs
    assert torch.equal(out_o, out_r)
    assert torch.equal(gq_o, gq_r) and torch.equal(gk_o, gk_r)
    for name in grads_r:
        assert torch.equal(grads_o[name], grads_r[name]), name
    assert torch.equal(ours.attn, ref.attn)


def test_state_dict_loads_into_reference():
    ours = RelativeMultiHeadAttention(2, 8)
    _randomise(ours, 0)
    ref = ref_rel.RelativeMultiHeadAttention(2, 8)
    ref.load_state_dict(ours.state_dict())
    assert ours.key_pos_embeddings.shape == (2 * 4096, 2, 4) and ours.key_pos_bias.shape == (2 * 4096, 2)
    assert ours.query.linear.bias is None and ours.value.linear.bias is not None


def test_sequence_longer_than_p_names_the_lengths():
    rel = RelativeMultiHeadAttention(1, 4, dropout_prob=0.0)
    q = torch.randn(2, 1, 4)
    k = torch.randn(4097, 1, 4)
    with pytest.raises(ValueError, match='P=4096.*seq_len_q=2, seq_len_k=4097'):
        rel(query=q, key=k, value=k)


def test_d_model_not_divisible_by_heads_names_both():
    with pytest.raises(ValueError, match=r'd_model=10.*heads=4'):
        RelativeMultiHeadAttention(4, 10)
