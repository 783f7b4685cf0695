"""What the models share: copies of a layer, and the size checks (one rule each, the same in every model).

`clone_module_list` is labml-nn's helper of that name (`labml_nn.utils`).
"""
import copy

from torch import nn


def clone_module_list(module: nn.Module, n: int) -> nn.ModuleList:
    """n independent deep copies of `module` (the copies share no parameters), as an `nn.ModuleList`.

    A transformer stacks copies of one layer this way, so all layers start from the given layer's weights.
    """
    return nn.ModuleList([copy.deepcopy(module) for _ in range(n)])


def check_n_layers(n_layers: int, who: str):
    """The rule for a stack of layers: n_layers ≥ 1 (a model with no layer is a mistake, not an identity).

    Raises:
        ValueError: n_layers < 1, naming `who` and the value.
    """
    if n_layers < 1:
        raise ValueError(f"{who} needs n_layers >= 1, got n_layers={n_layers}")


def check_heads(d_model: int, heads: int, who: str):
    """The rule for multi-head attention: d_model ≥ 1, heads ≥ 1 and d_model divisible by heads
    (each head gets d_k = d_model / heads features).

    Raises:
        ValueError: a size < 1, or d_model % heads != 0; the message names `who`, d_model and heads.
    """
    if heads <= 0 or d_model <= 0:
        raise ValueError(f"{who} needs positive sizes, got d_model={d_model}, heads={heads}")
    if d_model % heads != 0:
        raise ValueError(f"{who}: d_model={d_model} is not divisible by heads={heads}")


class PreNormLayer(nn.Module):
    """The parts of a pre-norm transformer layer as labml_nn's feedback and fast-weights layers name them (so their
    state_dict keys are labml_nn's): `attn`, `feed_forward`, `dropout`, `norm_self_attn`, `norm_ff`, and `size`
    (d_model). Subclasses write `forward`: x + dropout(attn(norm_self_attn(x))), then the same with the FFN.
    """

    def __init__(self, *, d_model: int, attn: nn.Module, feed_forward: nn.Module, dropout_prob: float):
        super().__init__()
        self.size = d_model
        self.attn = attn
        self.feed_forward = feed_forward
        self.dropout = nn.Dropout(dropout_prob)
        self.norm_self_attn = nn.LayerNorm([d_model])
        self.norm_ff = nn.LayerNorm([d_model])
