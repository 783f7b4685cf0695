"""Feedback Transformer (Fan et al. 2020, "Addressing Some Limitations of Transformers with Feedback Memory") on
characters.

    lazylab train feedback [key=value …]          ≡  python -m lazylab.experiments.feedback …
    lazylab train feedback model=feedback_transformer      # the original (keys and values computed per step)

`model` picks the variant: 'feedback_transformer_kv' (default; keys and values of the memory are computed once
per step and shared by the layers, labml_nn's faster variant) or 'feedback_transformer' (the paper's original).
"""
import sys

from torch import nn

from lazylab.configs import option
from lazylab.experiments.nlp_autoregression import NLPAutoRegressionConfigs, device_of
from lazylab.models.autoregressive import AutoregressiveModel


class Configs(NLPAutoRegressionConfigs):
    """Feedback-transformer language model; `model=feedback_transformer_kv|feedback_transformer`."""
    model: nn.Module = 'feedback_transformer_kv'
    batch_size: int = 64         # a wide batch: the memory makes each step sequential over seq_len
    heads: int = 4               # attention heads
    d_ff: int = 512              # feed-forward hidden width
    n_layers: int = 4            # layers
    dropout: float = 0.0         # dropout probability


def _layer(c: Configs, kv: bool):
    from lazylab.models.feed_forward import FeedForward
    from lazylab.models.feedback import FeedbackAttention, FeedbackTransformerLayer
    return FeedbackTransformerLayer(d_model=c.d_model,
                                    attn=FeedbackAttention(c.heads, c.d_model, c.dropout, is_kv_precomputed=kv),
                                    feed_forward=FeedForward(c.d_model, c.d_ff, c.dropout), dropout_prob=c.dropout)


@option(Configs.model, 'feedback_transformer')
def _feedback_transformer(c: Configs):
    from lazylab.models.feedback import FeedbackTransformer
    core = FeedbackTransformer(_layer(c, kv=False), c.n_layers)
    return AutoregressiveModel(c.n_tokens, c.d_model, core).to(device_of(c))


@option(Configs.model, 'feedback_transformer_kv')
def _feedback_transformer_kv(c: Configs):
    from lazylab.models.feedback import FeedbackTransformerKV
    core = FeedbackTransformerKV(_layer(c, kv=True), c.n_layers, c.d_model, c.heads)
    return AutoregressiveModel(c.n_tokens, c.d_model, core).to(device_of(c))


#: named settings applied before the user's (`preset=labml_nn`: labml_nn's feedback experiment)
PRESETS = {
    'labml_nn': {'d_model': 512, 'heads': 8, 'n_layers': 6, 'd_ff': 2048, 'seq_len': 128, 'batch_size': 64,
                 'optimizer.optimizer': 'Noam', 'optimizer.learning_rate': 1.0, 'optimizer.warmup': 2000,
                 'dropout': 0.0, 'epochs': 128, 'max_steps': 0, 'max_minutes': 0, 'inner_iterations': 25,
                 'valid_interval': 0, 'model': 'feedback_transformer_kv'},
}


def main(argv=None) -> int:
    from lazylab.experiments.runner import experiment_main
    return experiment_main('feedback', argv)


if __name__ == '__main__':
    sys.exit(main())
