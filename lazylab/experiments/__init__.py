"""The public experiment API: what an experiment of your own is written with.

    import sys
    from torch import nn
    from lazylab.configs import option
    from lazylab.experiments import NLPAutoRegressionConfigs, device_of, main

    class Configs(NLPAutoRegressionConfigs):
        model: nn.Module = 'lstm'
        hidden: int = 256            # LSTM width (shown by `lazylab options char_lstm.py`)

    @option(Configs.model, 'lstm')
    def _lstm(c: Configs):
        return CharLSTM(c.n_tokens, c.d_model, c.hidden).to(device_of(c))

    if __name__ == '__main__':
        sys.exit(main(Configs))

`lazylab train char_lstm.py hidden=512`, `lazylab resume RUN`, `lazylab generate RUN …`, `lazylab sweep …`: every
command takes such a file (or a dotted module, or a name an installed package registers under the entry-point group
`lazylab.experiments`; see `lazylab.experiments.discovery`). lazylab's own six experiments (feedback, fast_weights,
transformer, retrieval, mqar, state_tracking) are written the same way, on this API alone.

The names (imported when first used, so that `import lazylab.experiments` and `lazylab --help` load no torch):

    TrainerConfigs            how to train: length, batch, validation, device; the base of every experiment
    NLPAutoRegressionConfigs  TrainerConfigs + a text, its vocabulary, an optimizer and sampling: text models
    Task                      what the training loop takes from an experiment (the protocol, in its docstring)
    TextTask                  the Task of next-character prediction on a text
    Batch, BatchLoss          a batch (x, y), and the loss of one with its accuracy counts
    evaluate                  a Task's validation helper: the mean loss and accuracy over batches, all processes
    device_of                 the torch.device a config's `device` names
    main                      `sys.exit(main(Configs))`: `python FILE key=value` as `lazylab train FILE key=value`

`lazylab.experiments.optimizers.OptimizerConfigs` (an optimizer and its schedule) and `lazylab.experiments.memory`
(`memory_needs`: the up-front memory check) are public too. The rest of the package is lazylab's machinery: the
run's life (`lifecycle`), configs from a command line (`configure`), replay checks (`replay`), `generation`,
`listing`, and the training loop `trainer.train` with its parts (`task`, `budget`, `checkpoint`, `metrics`).
"""
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and the API reference (griffe reads imports statically); at run time: lazily
    from lazylab.experiments.nlp_autoregression import LABML_NN_PRESET, NLPAutoRegressionConfigs, TextTask, device_of
    from lazylab.experiments.script import main
    from lazylab.experiments.task import Batch, BatchLoss, Task, evaluate
    from lazylab.experiments.trainer import TrainerConfigs

#: public name → the module that defines it
_PUBLIC = {
    'TrainerConfigs': 'lazylab.experiments.trainer',
    'NLPAutoRegressionConfigs': 'lazylab.experiments.nlp_autoregression',
    'TextTask': 'lazylab.experiments.nlp_autoregression',
    'device_of': 'lazylab.experiments.nlp_autoregression',
    'LABML_NN_PRESET': 'lazylab.experiments.nlp_autoregression',
    'Task': 'lazylab.experiments.task',
    'Batch': 'lazylab.experiments.task',
    'BatchLoss': 'lazylab.experiments.task',
    'evaluate': 'lazylab.experiments.task',
    'main': 'lazylab.experiments.script',
}

__all__ = ['TrainerConfigs', 'NLPAutoRegressionConfigs', 'TextTask', 'device_of', 'LABML_NN_PRESET', 'Task', 'Batch',
           'BatchLoss', 'evaluate', 'main']


def __getattr__(name: str) -> Any:
    """A public name, imported from its module when first used (PEP 562), so that importing this package (as
    `lazylab --help` does) imports no torch."""
    if name not in _PUBLIC:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
