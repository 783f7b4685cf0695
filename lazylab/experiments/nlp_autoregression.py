"""Character-level autoregressive language modelling: what every experiment here shares.

`NLPAutoRegressionConfigs` adds to the trainer's items the text, the model width, the optimizer and sampling.
Experiments subclass it and add `@option(Configs.model, 'name')` functions that build an
`AutoregressiveModel(n_tokens, d_model, core_transformer)` on `device_of(c)`.
"""
import torch
from torch import nn

from lazylab.configs import BaseConfigs, option

from lazylab.data import TINY_SHAKESPEARE, TextDataset
from lazylab.experiments.optimizers import OptimizerConfigs
from lazylab.experiments.trainer import TrainerConfigs, resolve_device


#: labml_nn's published experiment settings (d_model 512, 8 heads, 6 layers, Noam lr 1.0, 128 epochs); each
#: experiment's `preset=labml_nn` is this plus its own keys
LABML_NN_PRESET = {'d_model': 512, 'heads': 8, 'n_layers': 6, 'd_ff': 2048, 'seq_len': 128, 'batch_size': 64,
                   'optimizer.optimizer': 'Noam', 'optimizer.learning_rate': 1.0, 'optimizer.warmup': 2000,
                   'dropout': 0.0, 'epochs': 128, 'max_steps': 0, 'max_minutes': 0, 'inner_iterations': 25,
                   'valid_interval': 0}


class NLPAutoRegressionConfigs(TrainerConfigs):
    """Trainer items plus data, model width, optimizer and sampling.

    The defaults are a 10-minute run on a 2-core CPU: the time budget (`max_minutes`) fixes the step count after
    timing the first steps, and the learning rate warms up, then follows a cosine to a tenth of its peak.
    """
    max_minutes: float = 10.0         # training time budget in minutes (0: epochs / max_steps decide)
    epochs: int = 100                 # an upper bound; the time budget ends the default run first
    seq_len: int = 64                 # characters per sequence
    batch_size: int = 32              # sequences per step (per process)
    valid_interval: int = 250         # steps between validations (and checkpoints)
    text: str = TINY_SHAKESPEARE      # tiny_shakespeare (bundled) or the path of a UTF-8 text file
    dataset: TextDataset              # the tokenized 90% / 10% split of `text`
    n_tokens: int                     # vocabulary size (from the dataset)
    model: nn.Module                  # the autoregressive model (options per experiment)
    d_model: int = 128                # model width
    optimizer: OptimizerConfigs       # optimizer.optimizer, optimizer.learning_rate, …
    total_steps: int                  # optimizer steps this run takes (from epochs and max_steps)
    prompt: str = 'It is'             # start of the text sampled at each validation
    sample_tokens: int = 200          # characters sampled at each validation
    sample_temperature: float = 0.8   # temperature of that sampling (0: greedy)


def device_of(c: TrainerConfigs) -> torch.device:
    """The torch.device that `c.device` names ('auto' picks cuda, mps or cpu)."""
    return resolve_device(c.device)


@option(NLPAutoRegressionConfigs.dataset, 'character_split')
def _dataset(c: NLPAutoRegressionConfigs):
    data = TextDataset.load(c.text)
    data.check_seq_len(c.seq_len)
    return data


@option(NLPAutoRegressionConfigs.n_tokens, 'vocabulary_size')
def _n_tokens(c: NLPAutoRegressionConfigs):
    return c.dataset.n_tokens


@option(NLPAutoRegressionConfigs.total_steps, 'epochs_or_max_steps')
def _total_steps(c: NLPAutoRegressionConfigs):
    per_epoch = -(-((len(c.dataset.train) - 1) // c.seq_len) // c.batch_size)
    steps = c.epochs * per_epoch
    return min(steps, c.max_steps) if c.max_steps > 0 else steps


@option(NLPAutoRegressionConfigs.optimizer, 'OptimizerConfigs')
def _optimizer(c: NLPAutoRegressionConfigs):
    """OptimizerConfigs over the model's parameters (defaults: AdamW, 100 warm-up steps to 3·10⁻³, then a cosine
    to 3·10⁻⁴ over the run)."""
    conf = OptimizerConfigs()
    conf.parameters = c.model.parameters()
    conf.d_model = c.d_model
    conf.total_steps = c.total_steps
    return conf
