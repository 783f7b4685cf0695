"""lazylab/labml/placeholders.py's stand-in for a name labml_nn 0.5.1 imports but lacks: ``SimpleStateModule`` of
``labml_nn.helpers.metrics``, which its Transformer-XL and Compressive Transformer experiments keep their memory in.
Checked against labml_nn's own ``Trainer``, the code that drives it in those experiments (the torchvision
placeholder is tested in test_adapter.py).
"""
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from labml import monit

from lazylab.labml import placeholders

pytestmark = pytest.mark.usefixtures('labml_state')  # labml's monitor loop prints through labml's singletons


@pytest.fixture
def fresh_labml_nn():
    """labml_nn's modules as they were before the test, after it: a test's imports of labml_nn make its config
    classes on the labml config class of the moment, and a `lazylab labml` run later in this process (the docs'
    tests run them in-process) must import labml_nn's modules afresh on lazylab's."""
    before = {name: module for name, module in sys.modules.items() if name.startswith('labml_nn')}
    yield
    for name in [name for name in sys.modules if name.startswith('labml_nn')]:
        del sys.modules[name]
    sys.modules.update(before)


@pytest.fixture
def trainer_module(fresh_labml_nn):
    """labml_nn.helpers.trainer, for the test only (see fresh_labml_nn)."""
    return importlib.import_module('labml_nn.helpers.trainer')


@pytest.fixture
def metrics(fresh_labml_nn):
    """labml_nn.helpers.metrics imported afresh with the filler in place (this process's modules are put back
    after the test, and the filler taken out)."""
    sys.modules.pop('labml_nn.helpers.metrics', None)
    placeholders.install_missing_names()
    yield importlib.import_module('labml_nn.helpers.metrics')
    placeholders.remove_placeholders()


def test_labml_nn_lacks_simple_state_module():
    """Why the stand-in exists (labml_nn 0.5.1): the experiments' import fails on labml's own engine too."""
    def source(module: str) -> str:
        return Path(importlib.util.find_spec(module).origin).read_text(encoding='utf-8')

    assert 'SimpleStateModule' not in source('labml_nn.helpers.metrics')
    for module in ('labml_nn.transformers.xl.experiment', 'labml_nn.transformers.compressive.experiment'):
        assert 'from labml_nn.helpers.metrics import SimpleStateModule' in source(module)


def test_import_adds_a_state_module_and_leaves_the_hook_out_after(metrics):
    assert issubclass(metrics.SimpleStateModule, metrics.StateModule)
    assert metrics.SimpleStateModule.__module__ == 'labml_nn.helpers.metrics'
    memory = metrics.SimpleStateModule()
    assert memory.get() is None  # usable before a trainer gives it a state
    memory.set(3)
    assert memory.get() == 3
    placeholders.remove_placeholders()
    assert not any(type(f).__name__ == '_Filler' for f in sys.meta_path)


def test_each_trainer_keeps_its_own_memory_across_inner_iterations_and_an_epoch_starts_it_empty(metrics,
                                                                                                   trainer_module):
    """What xl's and compressive's step do: read the memory, run, store the new one. labml_nn's TrainValidConfigs
    drives a training and a validation Trainer over the same state modules, each pass one inner iteration."""
    memory = metrics.SimpleStateModule()
    seen = []

    def make(name: str):
        def step(batch, batch_idx):
            before = memory.get()
            seen.append((name, int(batch), before))
            memory.set((before or ()) + (int(batch),))

        return trainer_module.Trainer(name=name, mode=trainer_module.ModeState(),
                                      data_loader=torch.utils.data.DataLoader([0, 1, 2, 3]), inner_iterations=2,
                                      state_modules=[memory], is_track_time=False, step=step)

    train, valid = make('train'), make('valid')
    for i in monit.loop(3):  # TrainValidConfigs' training loop: a pass of each, then a pass of each, then train
        train()
        if i < 2:
            valid()
    assert seen == [
        ('train', 0, None), ('train', 1, (0,)),              # epoch 1, first half
        ('valid', 0, None), ('valid', 1, (0,)),              # validation: a memory of its own
        ('train', 2, (0, 1)), ('train', 3, (0, 1, 2)),       # the training memory goes on
        ('valid', 2, (0, 1)), ('valid', 3, (0, 1, 2)),
        ('train', 0, None), ('train', 1, (0,)),              # epoch 2 starts empty
    ]
