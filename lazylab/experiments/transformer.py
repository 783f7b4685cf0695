"""Baseline: a causal decoder-only softmax transformer on characters.

    lazylab train transformer [key=value …]          ≡  python -m lazylab.experiments.transformer …

A pre-norm transformer (Vaswani et al. 2017) under a causal mask, built from `TransformerConfigs` so that FFN
variants, relative attention and the kind of positional embedding can be compared on the same data.
"""
import sys
from typing import Any, Optional, Tuple

import torch
from torch import nn

from lazylab.configs import option
from lazylab.configs.transformer import TransformerConfigs
from lazylab.experiments.nlp_autoregression import LABML_NN_PRESET, NLPAutoRegressionConfigs, device_of
from lazylab.models.autoregressive import AutoregressiveModel


class TokenAndPositionEmbeddings(nn.Module):
    """Token embedding plus a learned embedding per position that starts as the sinusoidal encoding
    (Vaswani et al. 2017, section 3.5), without the √d_model scale of labml_nn's embeddings.

    Why: labml_nn's embeddings multiply N(0, 1) token vectors by √d_model (≈ 11 at d_model 128); in a pre-norm
    transformer that residual stream is then ~10× larger than what each layer adds, and learning is slow; and
    positions that start at zero give attention nothing to tell tokens apart by. Measured on Tiny Shakespeare
    (d_model 128, 4 layers, 250 steps of 32×64, under load): validation loss 2.43 with labml_nn's scaled
    sinusoids, 2.36 with unscaled zero-initialised learned positions, 2.10 with unscaled sinusoids.

    Args:
        d_model: width; n_vocab: vocabulary size; max_len: number of positions (the training seq_len).

    Shapes:
        x: LongTensor [seq_len, batch_size] with seq_len ≤ max_len → [seq_len, batch_size, d_model]
    """

    def __init__(self, d_model: int, n_vocab: int, max_len: int):
        super().__init__()
        from lazylab.models.transformer import get_positional_encoding
        self.linear = nn.Embedding(n_vocab, d_model)
        self.positional_encodings = nn.Parameter(get_positional_encoding(d_model, max_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.positional_encodings.shape[0]:
            raise ValueError(f'seq_len={x.shape[0]} exceeds max_len={self.positional_encodings.shape[0]}')
        return self.linear(x) + self.positional_encodings[:x.shape[0]]


class AutoregressiveTransformer(AutoregressiveModel):
    """A decoder-only transformer LM, laid out as labml_nn's `AutoregressiveTransformer` (basic experiment):
    `src_embed` (token + positional embedding), `encoder` (layers under a causal mask, final LayerNorm),
    `generator` (logits), so state dicts load both ways.

    Args:
        encoder: `lazylab.models.transformer.Encoder`, called as encoder(x, mask).
        src_embed: token ids [seq_len, batch_size] → [seq_len, batch_size, d_model] (with positions).
        generator: [seq_len, batch_size, d_model] → logits [seq_len, batch_size, n_vocab].
        max_context: generation feeds the model at most this many most recent tokens (the training seq_len,
            so positions stay within those it learned).

    Shapes:
        x: LongTensor [seq_len, batch_size] → (logits [seq_len, batch_size, n_vocab], None)
    """

    def __init__(self, encoder: nn.Module, src_embed: nn.Module, generator: nn.Module, max_context: int):
        nn.Module.__init__(self)  # not AutoregressiveModel's layout: labml_nn's names for this model
        self.src_embed = src_embed
        self.encoder = encoder
        self.generator = generator
        self.max_context = max_context

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, None]:
        from lazylab.models.mha import subsequent_mask
        mask = subsequent_mask(x.shape[0], x.device)
        return self.generator(self.encoder(self.src_embed(x), mask)), None

    @property
    def supports_state(self) -> bool:
        return False

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: Optional[int] = None, *, use_state: bool = True,
                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """As `AutoregressiveModel.generate`, re-running the last `max_context` tokens for each new one."""
        from lazylab.models.autoregressive import _sample
        squeeze = prompt_ids.dim() == 1
        ids = prompt_ids.unsqueeze(-1) if squeeze else prompt_ids
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                logits, _ = self(ids[-self.max_context:])
                ids = torch.cat([ids, _sample(logits[-1], temperature, top_k, generator)[None]], dim=0)
        finally:
            self.train(was_training)
        return ids.squeeze(-1) if squeeze else ids


class Configs(NLPAutoRegressionConfigs):
    """The causal transformer baseline. Common keys (d_model, heads, d_ff, n_layers, dropout) are copied into
    `transformer` (a TransformerConfigs), whose own options select the parts to compare, e.g.
    `transformer.ffn.glu_variant=SwiGLU`, `transformer.encoder_attn=relative`, `transformer.src_embed=fixed_pos`.
    The input embeddings default to `TokenAndPositionEmbeddings` (learned positions starting as sinusoids, no
    √d_model scale); `transformer.src_embed=fixed_pos` gives labml_nn's (the `labml_nn` preset does).
    """
    model: nn.Module = 'transformer'
    transformer: TransformerConfigs   # the parts: attention, FFN variant, embeddings
    heads: int = 4                    # attention heads
    d_ff: int = 512                   # feed-forward hidden width
    n_layers: int = 4                 # transformer layers
    dropout: float = 0.0              # dropout probability


@option(Configs.transformer, 'TransformerConfigs')
def _transformer_configs(c: Configs):
    conf = TransformerConfigs()
    conf.n_src_vocab = conf.n_tgt_vocab = c.n_tokens
    conf.d_model, conf.n_heads, conf.n_layers, conf.dropout = c.d_model, c.heads, c.n_layers, c.dropout
    conf._set_values({'ffn.d_ff': c.d_ff})  # reaches the FFN sub-config when it is created
    # unless transformer.src_embed names one of TransformerConfigs' options (fixed_pos, learned_pos, no_pos)
    conf.set_default(TransformerConfigs.src_embed,
                     func=lambda: TokenAndPositionEmbeddings(c.d_model, c.n_tokens, c.seq_len))
    return conf


@option(Configs.model, 'transformer')
def _transformer(c: Configs):
    t = c.transformer
    return AutoregressiveTransformer(t.encoder, t.src_embed, t.generator, c.seq_len).to(device_of(c))


#: named settings applied before the user's (`preset=labml_nn`)
PRESETS = {
    'labml_nn': {**LABML_NN_PRESET, 'transformer.src_embed': 'fixed_pos'},
}


def main(argv=None) -> int:
    from lazylab.experiments.runner import experiment_main
    return experiment_main('transformer', argv)


if __name__ == '__main__':
    sys.exit(main())
