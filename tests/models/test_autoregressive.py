"""AutoregressiveModel: labml_nn-compatible layout and incremental generation equal to re-running the prefix;
AutoregressiveTransformer; the sampling functions."""
import math

import pytest
import torch
from torch import nn

from lazylab.models.autoregressive import (
    AutoregressiveModel,
    AutoregressiveTransformer,
    LanguageModel,
    TokenAndPositionEmbeddings,
)
from lazylab.models.sampling import check_generate_arguments, sample_next


class CausalMean(nn.Module):
    """A tiny causal core: y_t = tanh(W · mean(x_1..x_t)); its state is (running sum, count)."""

    def __init__(self, d_model):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        return self.forward_with_state(x)[0]

    def forward_with_state(self, x, state=None):
        total, count = state if state is not None else (torch.zeros_like(x[0]), 0)
        sums = total + torch.cumsum(x, dim=0)
        counts = count + torch.arange(1, x.shape[0] + 1, dtype=x.dtype).view(-1, 1, 1)
        return torch.tanh(self.proj(sums / counts)), (sums[-1], count + x.shape[0])


class StatelessCore(CausalMean):
    forward_with_state = None  # hides the protocol: generate must fall back to re-running the prefix

    def forward(self, x):
        sums = torch.cumsum(x, dim=0)
        counts = torch.arange(1, x.shape[0] + 1, dtype=x.dtype).view(-1, 1, 1)
        return torch.tanh(self.proj(sums / counts))


def _model(core=CausalMean, n_vocab=11, d_model=8):
    torch.manual_seed(0)
    return AutoregressiveModel(n_vocab, d_model, core(d_model))


def test_state_dict_keys_match_labml_nn_autoregressive_model():
    # labml_nn's experiment modules import torchvision, so the layout is checked by name: src_embed, transformer,
    # generator, in that order, as in labml_nn.transformers.{feedback,fast_weights}.experiment.AutoregressiveModel.
    assert list(_model().state_dict()) == ['src_embed.weight', 'transformer.proj.weight', 'transformer.proj.bias',
                                           'generator.weight', 'generator.bias']


def test_chunked_state_equals_full_pass():
    model = _model()
    x = torch.randint(0, 11, (9, 3))
    full, none = model(x)
    assert none is None and full.shape == (9, 3, 11)
    first, state = model.forward_with_state(x[:4])
    second, _ = model.forward_with_state(x[4:], state)
    torch.testing.assert_close(torch.cat([first, second]), full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('temperature,top_k', [(0.0, None), (1.0, None), (0.7, 3)])
def test_generate_with_state_equals_rerunning_prefix(temperature, top_k):
    stateful, stateless = _model(), _model(StatelessCore)
    stateless.load_state_dict(stateful.state_dict())
    prompt = torch.tensor([[1, 2], [3, 4], [5, 6]])
    a = stateful.generate(prompt, 12, temperature, top_k, generator=torch.Generator().manual_seed(3))
    b = stateless.generate(prompt, 12, temperature, top_k, generator=torch.Generator().manual_seed(3))
    c = stateful.generate(prompt, 12, temperature, top_k, use_state=False,
                          generator=torch.Generator().manual_seed(3))
    assert a.shape == (15, 2)
    assert torch.equal(a[:3], prompt)
    assert torch.equal(a, b) and torch.equal(a, c)


def test_generate_greedy_picks_argmax_of_full_pass():
    model = _model()
    out = model.generate(torch.tensor([4, 7]), 5, temperature=0)
    assert out.shape == (7,)
    for t in range(2, 7):
        logits, _ = model(out[:t].unsqueeze(-1))
        assert out[t].item() == logits[-1, 0].argmax().item()


def test_top_k_one_is_greedy():
    model = _model()
    prompt = torch.tensor([1, 2, 3])
    assert torch.equal(model.generate(prompt, 6, temperature=1.0, top_k=1), model.generate(prompt, 6, 0.0))


def test_generate_restores_training_mode():
    model = _model()
    model.train()
    model.generate(torch.tensor([1]), 2)
    assert model.training


@pytest.mark.parametrize('kwargs,message', [
    (dict(prompt_ids=torch.zeros(0, dtype=torch.long), max_new_tokens=1), 'prompt_len'),
    (dict(prompt_ids=torch.tensor([1]), max_new_tokens=-1), 'max_new_tokens'),
    (dict(prompt_ids=torch.tensor([1]), max_new_tokens=1, temperature=-1.0), 'temperature'),
    (dict(prompt_ids=torch.tensor([1]), max_new_tokens=1, top_k=0), 'top_k'),
])
def test_generate_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _model().generate(**kwargs)


def test_forward_with_state_without_protocol_is_a_type_error():
    with pytest.raises(TypeError, match='StatelessCore has no forward_with_state'):
        _model(StatelessCore).forward_with_state(torch.tensor([[1]]))


# --- sampling (lazylab.models.sampling) -------------------------------------------------------------------------

def test_sample_next_at_temperature_zero_is_the_argmax_of_each_row():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 2.9, 0.0]])
    assert sample_next(logits, 0.0).tolist() == [1, 0]


def test_sample_next_top_k_draws_only_among_the_k_largest_and_reaches_each_of_them():
    # row 0: the two largest are tokens 2 and 0; row 1: a tie with the 2nd largest keeps all three tied tokens
    logits = torch.tensor([[1.0, -5.0, 1.5, 0.0], [0.0, 1.0, 1.0, 1.0]]).repeat(500, 1)
    draws = sample_next(logits, 1.0, top_k=2, generator=torch.Generator().manual_seed(0)).view(500, 2)
    assert set(draws[:, 0].tolist()) == {0, 2}
    assert set(draws[:, 1].tolist()) == {1, 2, 3}


def test_sample_next_follows_the_softmax_of_logits_over_temperature():
    # p = softmax([ln 3, 0] / 1) = (3/4, 1/4); at T = 0.5, softmax([2 ln 3, 0]) = (9/10, 1/10)
    g = torch.Generator().manual_seed(1)
    logits = torch.tensor([[math.log(3.0), 0.0]]).repeat(20_000, 1)
    assert (sample_next(logits, 1.0, generator=g) == 0).float().mean().item() == pytest.approx(0.75, abs=0.015)
    assert (sample_next(logits, 0.5, generator=g) == 0).float().mean().item() == pytest.approx(0.9, abs=0.01)


def test_generate_argument_checks_name_the_caller_s_arguments():
    with pytest.raises(ValueError, match=r'^--tokens must be ≥ 0, got -2$'):
        check_generate_arguments(-2, 1.0, None, names=('--tokens', '--temperature', '--top-k'))
    with pytest.raises(ValueError, match=r'^--top-k must be ≥ 1, got 0$'):
        check_generate_arguments(3, 1.0, 0, names=('--tokens', '--temperature', '--top-k'))
    check_generate_arguments(0, 0.0, 1)  # the edges are allowed


# --- AutoregressiveTransformer ----------------------------------------------------------------------------------

def _transformer(max_context=4, n_vocab=7, d=8):
    from lazylab.models.feed_forward import FeedForward
    from lazylab.models.mha import MultiHeadAttention
    from lazylab.models.transformer import Encoder, Generator, TransformerLayer
    torch.manual_seed(0)
    layer = TransformerLayer(d_model=d, self_attn=MultiHeadAttention(2, d, 0.0), feed_forward=FeedForward(d, 16, 0.0),
                             dropout_prob=0.0)
    return AutoregressiveTransformer(Encoder(layer, 1), TokenAndPositionEmbeddings(d, n_vocab, max_context),
                                     Generator(n_vocab, d), max_context)


def test_autoregressive_transformer_has_labml_nn_s_layout_and_the_shared_generate():
    model = _transformer()
    assert isinstance(model, LanguageModel) and not isinstance(model, AutoregressiveModel)
    keys = list(model.state_dict())
    assert keys[:2] == ['src_embed.positional_encodings', 'src_embed.linear.weight']
    assert keys[2].startswith('encoder.layers.0.') and keys[-2:] == ['generator.projection.weight',
                                                                    'generator.projection.bias']
    assert {k.split('.')[0] for k in keys} == {'src_embed', 'encoder', 'generator'}
    assert not model.supports_state and model.incremental_step() is None


def test_autoregressive_transformer_generates_from_the_last_max_context_tokens():
    model = _transformer(max_context=4)
    prompt = torch.tensor([1, 2, 3, 4, 5, 6])  # longer than the context: positions stay within the 4 learned
    out = model.generate(prompt, 5, temperature=0)
    ids = prompt.tolist()
    with torch.no_grad():
        for _ in range(5):
            logits, _ = model(torch.tensor(ids[-4:])[:, None])
            ids.append(int(logits[-1, 0].argmax()))
    assert out.tolist() == ids
    with pytest.raises(ValueError, match='top_k'):
        model.generate(prompt, 1, top_k=0)
