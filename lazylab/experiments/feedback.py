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
from lazylab.configs.feedback import FeedbackConfigs
from lazylab.configs.types import NonNegativeInt, PositiveInt, Probability
from lazylab.experiments.nlp_autoregression import LABML_NN_PRESET, NLPAutoRegressionConfigs, device_of


class Configs(NLPAutoRegressionConfigs):
    """Feedback-transformer language model; `model=feedback_transformer_kv|feedback_transformer`. The common keys
    (d_model, heads, d_ff, n_layers, dropout) are the defaults of `feedback` (a FeedbackConfigs), whose own items
    select the rest, e.g. `feedback.ffn.glu_variant=SwiGLU`, `feedback.n_positions=1024`."""
    model: nn.Module = 'feedback_transformer_kv'
    feedback: FeedbackConfigs     # the model's parts
    batch_size: PositiveInt = 64  # a wide batch: the memory makes each step sequential over seq_len
    # one CPU thread: the per-token steps are too small to share, and two stall when anything else runs
    threads: NonNegativeInt = 1
    heads: PositiveInt = 4        # attention heads
    d_ff: PositiveInt = 512       # feed-forward hidden width
    n_layers: PositiveInt = 4     # layers
    dropout: Probability = 0.0    # dropout probability


@option(Configs.feedback, 'FeedbackConfigs')
def _feedback_configs(c: Configs):
    conf = FeedbackConfigs()
    for key in ('n_tokens', 'd_model', 'heads', 'd_ff', 'n_layers', 'dropout'):
        conf.set_default(getattr(FeedbackConfigs, key), func=lambda key=key: getattr(c, key))
    return conf


def _build(c: Configs, variant: str):
    c.feedback._set_values({'model': variant})
    return c.feedback.model.to(device_of(c))


@option(Configs.model, 'feedback_transformer')
def _feedback_transformer(c: Configs):
    """The paper's original: every layer projects the memory to its own keys and values."""
    return _build(c, 'feedback_transformer')


@option(Configs.model, 'feedback_transformer_kv')
def _feedback_transformer_kv(c: Configs):
    """Keys and values computed once per memory vector and shared by the layers (labml_nn's faster variant)."""
    return _build(c, 'feedback_transformer_kv')


#: named settings applied before the user's (`preset=labml_nn`: labml_nn's feedback experiment)
PRESETS = {
    'labml_nn': {**LABML_NN_PRESET, 'model': 'feedback_transformer_kv'},
}


def main(argv=None) -> int:
    from lazylab.experiments.runner import experiment_main
    return experiment_main('feedback', argv)


if __name__ == '__main__':
    sys.exit(main())
