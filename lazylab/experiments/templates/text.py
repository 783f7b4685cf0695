"""EXPERIMENT_NAME: a character-level LSTM language model, trained by lazylab.

    lazylab train EXPERIMENT_NAME.py                      # or: python EXPERIMENT_NAME.py
    lazylab train EXPERIMENT_NAME.py hidden=512 n_layers=2 max_minutes=5
    lazylab options EXPERIMENT_NAME.py                    # every key, the comments below as their help

NLPAutoRegressionConfigs brings the text (tiny_shakespeare, or text=FILE), its vocabulary (n_tokens), batches,
validation, samples, the optimizer and a 10-minute time budget; this file adds the model.
"""
import sys
from typing import Annotated

import torch
from annotated_types import Ge, Interval
from torch import nn

from lazylab.configs import option
from lazylab.experiments import NLPAutoRegressionConfigs, device_of, main


class CharLSTM(nn.Module):
    """Embedding → LSTM → linear: token ids [seq_len, batch] → logits [seq_len, batch, n_tokens]."""

    def __init__(self, n_tokens: int, d_model: int, hidden: int, n_layers: int):
        super().__init__()
        self.embed = nn.Embedding(n_tokens, d_model)
        self.lstm = nn.LSTM(d_model, hidden, n_layers)
        self.logits = nn.Linear(hidden, n_tokens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(x))
        return self.logits(h)


# Each key's type says what values it takes (Annotated[int, Ge(1)]: an int ≥ 1), so `hidden=0` is a one-line error
# naming the key, as for every built-in key; `lazylab options` shows the rule. lazylab.configs.types has the
# common ones by name (PositiveInt, Probability, …).
class Configs(NLPAutoRegressionConfigs):
    model: nn.Module = 'lstm'                            # the model: the option below
    hidden: Annotated[int, Ge(1)] = 256                  # LSTM width
    n_layers: Annotated[int, Interval(ge=1, le=64)] = 1  # LSTM layers


@option(Configs.model, 'lstm')
def _lstm(c: Configs):
    return CharLSTM(c.n_tokens, c.d_model, c.hidden, c.n_layers).to(device_of(c))


if __name__ == '__main__':
    sys.exit(main(Configs))
