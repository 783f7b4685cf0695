"""Fast Weights Transformer (Schlag, Irie & Schmidhuber 2021) on characters.

    lazylab train fast_weights [key=value …]          ≡  python -m lazylab.experiments.fast_weights …

The model comes from `FastWeightsConfigs` (sub-config `fast_weights`); the common keys (d_model, heads, d_ff,
n_layers, dropout, nu) are its defaults, and its own items select the rest, e.g. `fast_weights.kernel=loop`,
`fast_weights.transformer=token_wise`, `fast_weights.ffn.activation=GELU`, and the paper's variants:
`fast_weights.phi=linear|favor|dpfp`, `fast_weights.favor_features=128`, `fast_weights.update_rule=sum`,
`fast_weights.sum_normalization=false`, `fast_weights.attention_normalization=true`; and the delta rule's
successors: `fast_weights.update_rule=gated_delta` (Gated DeltaNet), `fast_weights.update_rule=delta_product`
with `fast_weights.householder_steps=3` and `fast_weights.gated=true` (DeltaProduct),
`fast_weights.negative_eigenvalues=true` (β ∈ (0, 2)), `fast_weights.phi=l2` (L2-normalised SiLU features).
"""
import sys

from torch import nn

from lazylab.configs import option
from lazylab.configs.fast_weights import FastWeightsConfigs
from lazylab.configs.types import PositiveInt, Probability
from lazylab.experiments import LABML_NN_PRESET, NLPAutoRegressionConfigs, device_of, main
from lazylab.experiments.memory import Need, feature_size, language_model_needs, named, selected_option


class Configs(NLPAutoRegressionConfigs):
    """Fast-weights language model; `model=fast_weights_transformer`."""
    model: nn.Module = 'fast_weights_transformer'
    fast_weights: FastWeightsConfigs  # the model's parts: kernel, chunk_size, transformer, ffn
    heads: PositiveInt = 4            # attention heads
    d_ff: PositiveInt = 512           # feed-forward hidden width
    n_layers: PositiveInt = 4         # layers
    dropout: Probability = 0.0        # dropout probability
    nu: PositiveInt = 1               # ν of the DPFP feature map


@option(Configs.fast_weights, 'FastWeightsConfigs')
def _fast_weights_configs(c: Configs):
    conf = FastWeightsConfigs()
    for key in ('n_tokens', 'd_model', 'heads', 'd_ff', 'n_layers', 'dropout', 'nu'):
        conf.set_default(getattr(FastWeightsConfigs, key), func=lambda key=key: getattr(c, key))
    return conf


@option(Configs.model, 'fast_weights_transformer')
def _fast_weights_transformer(c: Configs):
    return c.fast_weights.model.to(device_of(c))


def memory_needs(c: Configs) -> list[Need]:
    """The least memory a run takes (`lazylab.experiments.memory`), from the sizes `fast_weights` is built with,
    its feature maps' and states included."""
    f = c.fast_weights
    sizes = {'d_model': named(c, 'd_model', 'fast_weights.d_model', f.d_model),
             'd_ff': named(c, 'd_ff', 'fast_weights.ffn.d_ff', f.ffn.d_ff),
             'n_layers': named(c, 'n_layers', 'fast_weights.n_layers', f.n_layers),
             'heads': named(c, 'heads', 'fast_weights.heads', f.heads)}
    phi = selected_option(f, 'phi')
    d_key = max(1, f.d_model // f.heads)
    d_dot = d_key if phi == 'l2' else feature_size(phi, d_key, f.nu, f.favor_features)  # (L2-SiLU: d_dot = d_key)
    phi_keys = {'dpfp': (named(c, 'nu', 'fast_weights.nu', f.nu), sizes['d_model']), 'linear': (sizes['d_model'],),
                'favor': (('fast_weights.favor_features', f.favor_features), sizes['heads']),
                'l2': (sizes['d_model'],)}.get(phi, ())
    return language_model_needs(c, sizes, features=None if d_dot is None else (d_dot, phi_keys))


#: named settings applied before the user's (`preset=labml_nn`: labml_nn's fast-weights experiment)
PRESETS = {
    'labml_nn': {**LABML_NN_PRESET, 'nu': 1, 'batch_size': 16},  # labml_nn's fast-weights experiment uses 16
}


if __name__ == '__main__':
    sys.exit(main(Configs))
