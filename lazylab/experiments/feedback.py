"""Feedback Transformer (Fan et al. 2020, "Addressing Some Limitations of Transformers with Feedback Memory") on
characters.

    lazylab train feedback [key=value …]          ≡  python -m lazylab.experiments.feedback …
    lazylab train feedback model=feedback_transformer      # the original (keys and values computed per step)
    lazylab train feedback feedback.memory_span=64         # attend to the last 64 memory vectors only

`model` picks the variant: 'feedback_transformer_kv' (default; keys and values of the memory are computed once
per step and shared by the layers, labml_nn's faster variant) or 'feedback_transformer' (the paper's original).
"""
import sys

from torch import nn

from lazylab.configs import option
from lazylab.configs.feedback import FeedbackConfigs
from lazylab.configs.types import PositiveInt, Probability, ThreadCount
from lazylab.errors import UsageError, plural
from lazylab.experiments import LABML_NN_PRESET, NLPAutoRegressionConfigs, device_of, main
from lazylab.experiments.memory import FLOAT, Need, language_model_needs, named


class Configs(NLPAutoRegressionConfigs):
    """Feedback-transformer language model; `model=feedback_transformer_kv|feedback_transformer`. The common keys
    (d_model, heads, d_ff, n_layers, dropout) are the defaults of `feedback` (a FeedbackConfigs), whose own items
    select the rest, e.g. `feedback.ffn.glu_variant=SwiGLU`, `feedback.n_positions=1024`,
    `feedback.memory_span=64`."""
    model: nn.Module = 'feedback_transformer_kv'
    feedback: FeedbackConfigs     # the model's parts
    batch_size: PositiveInt = 64  # a wide batch: the memory makes each step sequential over seq_len
    # one CPU thread: the per-token steps are too small to share, and two stall when anything else runs
    threads: ThreadCount = 1
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


def check_n_positions(c: Configs):
    """The relative-position tables must cover the longest memory a step attends over: in training (seq_len
    steps) and in the samples at each validation (the prompt, then sample_tokens - 1 fed back): steps - 1, or the
    memory span if smaller.

    Raises:
        UsageError: feedback.n_positions is smaller (one line naming the keys), before anything is built.
    """
    uses = {f'seq_len={c.seq_len}': c.seq_len}
    if c.sample_tokens:
        prompt = plural(len(c.prompt), 'character')
        uses[f'the validation samples (prompt of {prompt}, sample_tokens={c.sample_tokens})'] = (
            len(c.prompt) + c.sample_tokens - 1)
    use, steps = max(uses.items(), key=lambda item: item[1])
    needed = steps - 1
    span = c.feedback.memory_span
    if span:
        needed = min(needed, span)
    if c.feedback.n_positions < needed:
        raise UsageError(f"feedback.n_positions={c.feedback.n_positions} is too small for {use}: a step attends "
                         f"over up to {plural(needed, 'memory vector')}; set feedback.n_positions ≥ {needed} "
                         f"(or feedback.memory_span ≤ {c.feedback.n_positions})")


def _build(c: Configs, variant: str):
    check_n_positions(c)
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


def memory_needs(c: Configs) -> list[Need]:
    """The least memory a run takes (`lazylab.experiments.memory`), from the sizes `feedback` is built with, and
    the relative-position table (n_positions × d_model, with its gradient)."""
    f = c.feedback
    d_model = named(c, 'd_model', 'feedback.d_model', f.d_model)
    return language_model_needs(c, {'d_model': d_model, 'd_ff': named(c, 'd_ff', 'feedback.ffn.d_ff', f.ffn.d_ff),
                                    'n_layers': named(c, 'n_layers', 'feedback.n_layers', f.n_layers),
                                    'heads': named(c, 'heads', 'feedback.heads', f.heads)}) + [
        Need('relative-position tables', 2 * FLOAT * f.n_positions * f.d_model,
             (('feedback.n_positions', f.n_positions), d_model))]


#: named settings applied before the user's (`preset=labml_nn`: labml_nn's feedback experiment)
PRESETS = {
    'labml_nn': {**LABML_NN_PRESET, 'model': 'feedback_transformer_kv'},
}


if __name__ == '__main__':
    sys.exit(main(Configs))
