"""A character-level language model written the way labml-helpers 0.4.89 scripts are: a `SimpleTrainValidConfigs`
subclass, a `labml_helpers.module.Module` model, `experiment.configs(conf, {...})`, `conf.run()`.

The text is the first `n_chars` characters of Tiny Shakespeare from labml's data folder (where `lazylab labml`
puts the bundled copy), so one epoch is about 20 batches and labml-helpers' end-of-epoch `tracker.add('model', …)`
happens within a short run. Run by tests/labml/test_labml_runs.py through `lazylab labml`.
"""
import torch
from labml import experiment, lab
from labml.configs import option
from labml_helpers.module import Module
from labml_helpers.train_valid import SimpleTrainValidConfigs
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class CharGRU(Module):
    """Embedding → GRU → logits; `__call__` is the forward pass (labml_helpers' Module makes it `forward`).

    Shapes: x [batch_size, seq_len] (character ids) → [batch_size, seq_len, n_chars]
    """

    def __init__(self, n_chars: int, d_model: int):
        super().__init__()
        self.embed = nn.Embedding(n_chars, d_model)
        self.rnn = nn.GRU(d_model, d_model, batch_first=True)
        self.out = nn.Linear(d_model, n_chars)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.embed(x))
        return self.out(h)


class SequenceCrossEntropy(Module):
    """Mean cross-entropy over every position: logits [B, T, C], targets [B, T]."""

    def __init__(self):
        super().__init__()
        self.loss = nn.CrossEntropyLoss()

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Configs(SimpleTrainValidConfigs):
    model: CharGRU
    loss_func: SequenceCrossEntropy
    text: str
    vocabulary: list
    n_chars: int = 12_000  # characters of Tiny Shakespeare used; the last 10% validate
    seq_len: int = 32
    batch_size: int = 16
    d_model: int = 32


@option(Configs.text)
def tiny_shakespeare(c: Configs) -> str:
    return (lab.get_data_path() / 'tiny_shakespeare.txt').read_text(encoding='utf-8')[:c.n_chars]


@option(Configs.vocabulary)
def characters(c: Configs) -> list:
    return sorted(set(c.text))


def _windows(c: Configs, text: str) -> TensorDataset:
    ids = torch.tensor([c.vocabulary.index(ch) for ch in text])
    n = (len(ids) - 1) // c.seq_len
    x = ids[:n * c.seq_len].view(n, c.seq_len)
    y = ids[1:n * c.seq_len + 1].view(n, c.seq_len)
    return TensorDataset(x, y)


@option(Configs.train_loader)
def train_windows(c: Configs) -> DataLoader:
    return DataLoader(_windows(c, c.text[:int(len(c.text) * 0.9)]), batch_size=c.batch_size, shuffle=True)


@option(Configs.valid_loader)
def valid_windows(c: Configs) -> DataLoader:
    return DataLoader(_windows(c, c.text[int(len(c.text) * 0.9):]), batch_size=c.batch_size)


@option(Configs.loss_func)
def sequence_cross_entropy() -> SequenceCrossEntropy:
    return SequenceCrossEntropy()


@option(Configs.model)
def char_gru(c: Configs) -> CharGRU:
    return CharGRU(len(c.vocabulary), c.d_model).to(c.device)


def main():
    experiment.create(name='char_helpers', writers={'screen'})
    conf = Configs()
    experiment.configs(conf, {'optimizer.optimizer': 'Adam', 'optimizer.learning_rate': 3e-3, 'epochs': 4})
    experiment.add_pytorch_models({'model': conf.model})
    with experiment.start():
        conf.run()


if __name__ == '__main__':
    main()
