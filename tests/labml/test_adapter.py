"""lazylab/labml/adapter.py in this process: labml's experiment API taking lazylab configs, and each labml 0.5.3 gap
it fills. labml's singletons are saved and put back around every test, and `lazylab.labml.uninstall()` undoes the
patches (the `labml_state` fixture of tests/labml/conftest.py). What the adapter assumes of labml's internals is
pinned in test_labml_internals.py.
"""
import importlib.util
import json
import sys

import labml
import labml.experiment
import labml.internal.experiment as labml_experiment
import labml.internal.tracker as labml_tracker
import labml.tracker
import pytest
import torch
from labml.internal.configs.processor import ConfigProcessor, ConfigsSaver
from labml.utils.pytorch import get_modules

import lazylab.labml
from lazylab import labml_internals as internals
from lazylab.configs import BaseConfigs, UnknownItemError, option
from lazylab.labml import adapter, placeholders


class Tiny(BaseConfigs):
    a: int = 1
    b: int = 2
    net: torch.nn.Linear
    width: int = 3


@option(Tiny.net)
def _linear(c: Tiny):
    return torch.nn.Linear(c.width, 1)


pytestmark = pytest.mark.usefixtures('labml_state')


def _evaluate_experiment(tmp_path):
    """A labml experiment that records nothing (labml's `evaluate`), with the lab pointed at tmp_path."""
    adapter.configure_lab(tmp_path / 'logs', tmp_path / 'data')
    labml.experiment.evaluate()
    return labml_experiment.experiment_singleton()


class _Collect(ConfigsSaver):
    def __init__(self):
        self.saved = []

    def save(self, configs):
        self.saved.append(json.loads(json.dumps(configs)))


def test_labml_alone_refuses_lazylab_configs():
    """The reason for the adapter: labml.experiment.configs type-checks against labml's own BaseConfigs (A1)."""
    with pytest.raises(RuntimeError, match='Invalid call to calculate configs'):
        labml.experiment.configs(Tiny())


def test_configs_builds_labml_processor_over_lazylab_config(tmp_path):
    """The processor labml keeps is a ConfigProcessor whose savers get lazylab's _to_json; computing an
    item sends the configs again (the update callback); labml's own methods work on it."""
    lazylab.labml.install(engine=False)
    exp = _evaluate_experiment(tmp_path)
    conf = Tiny()
    labml.experiment.configs(conf, {'a': 5})
    processor = exp.configs_processor
    assert isinstance(processor, ConfigProcessor)
    saver = _Collect()
    processor.add_saver(saver)  # what Experiment.start() does with labml's file saver and the app's
    assert saver.saved[-1] == json.loads(json.dumps(conf._to_json()))
    assert saver.saved[-1]['a']['value'] == 5 and saver.saved[-1]['a']['is_explicitly_specified'] is True
    assert saver.saved[-1]['b']['is_explicitly_specified'] is False
    assert conf.b == 2
    assert saver.saved[-1]['b']['computed'] == 2  # sent again once b was computed
    assert processor.get_hyperparams() == {'a': 5}  # labml's method: explicitly specified items
    processor.update_configs({'width': 4})  # labml's second `experiment.configs(dict)` goes here
    assert conf.width == 4 and processor.get_value('width') == 4
    assert set(get_modules(conf)) == {'net'} and conf.net.in_features == 4


def test_configs_keeps_labml_rules_for_arguments(tmp_path):
    lazylab.labml.install(engine=False)
    _evaluate_experiment(tmp_path)
    with pytest.raises(RuntimeError, match='Invalid call'):
        labml.experiment.configs(Tiny(), {'a': 1}, 'extra')
    labml.experiment.configs(Tiny())
    with pytest.raises(RuntimeError, match='one config object'):
        labml.experiment.configs(Tiny())


def test_unknown_key_is_a_lazylab_error_and_nothing_is_applied(tmp_path):
    lazylab.labml.install(engine=False)
    _evaluate_experiment(tmp_path)
    conf = Tiny()
    with pytest.raises(UnknownItemError, match="did you mean 'width'"):
        labml.experiment.configs(conf, {'a': 7, 'widht': 2})
    assert conf.a == 1


def test_global_params_override_the_scripts_dict(tmp_path):
    """labml's own command-line overrides are merged over the script's dict."""
    lazylab.labml.install(engine=False)
    _evaluate_experiment(tmp_path)
    labml_experiment.global_params_singleton().configs = {'b': 9}
    conf = Tiny()
    labml.experiment.configs(conf, {'a': 5, 'b': 3})
    assert (conf.a, conf.b) == (5, 9)
    assert conf._to_json()['b']['is_explicitly_specified'] is True


def test_metrics_writer_gets_every_save_and_start_resets_writers(tmp_path):
    """The metrics writer gets each tracker.save() (means of the numeric indicators, text kept apart);
    Experiment.start() drops writers added before it (so the session adds it after)."""
    lazylab.labml.install(engine=False)
    tracker = labml_tracker.tracker_singleton()
    writer = adapter.metrics_writer(tmp_path / 'metrics.jsonl', tmp_path / 'samples.txt')
    labml.tracker.add('loss.train', torch.tensor(2.0))
    labml.tracker.add('loss.train', 4.0)
    labml.tracker.add('sampled', 'It is')  # a text value: labml 0.5.3 alone raises `Unknown type`
    labml.tracker.save(7)
    labml.tracker.save(8)  # nothing new: no record
    writer.close()
    assert [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()] == \
        [{'step': 7, 'loss.train': 3.0}]
    assert (tmp_path / 'samples.txt').read_text() == '--- step 7 sampled\nIt is\n'
    exp = _evaluate_experiment(tmp_path)
    exp.start()
    assert writer.labml not in tracker._Tracker__writers


def test_queue_keeps_a_moving_mean_and_images_are_dropped(tmp_path, capsys):
    """labml 0.4's set_queue / set_image, which labml_nn's MNIST, RL, GAN and diffusion experiments call."""
    assert not hasattr(labml.tracker, 'set_queue') and not hasattr(labml.tracker, 'set_image')  # labml 0.5.3
    lazylab.labml.install(engine=False)
    writer = adapter.metrics_writer(tmp_path / 'metrics.jsonl', tmp_path / 'samples.txt')
    labml.tracker.set_queue('reward', 3, True)
    labml.tracker.set_image('generated', True)
    for step, reward in enumerate([1.0, 2.0, 3.0, 10.0], 1):
        labml.tracker.add({'reward': reward, 'generated': torch.zeros(2, 2)})
        labml.tracker.save(step)
    writer.close()
    means = [r['reward'] for r in map(json.loads, (tmp_path / 'metrics.jsonl').read_text().splitlines())]
    assert means == [1.0, 1.5, 2.0, 5.0]  # the last 3 values: (2 + 3 + 10) / 3
    assert not (tmp_path / 'samples.txt').exists()
    assert capsys.readouterr().err.count("records no images; 'generated' is not recorded") == 1


def test_text_values_fail_on_plain_labml():
    """The gap: labml 0.5.3 has no text indicators (labml_nn's NLP sampling tracks a string)."""
    assert not hasattr(labml.tracker, 'set_text')
    with pytest.raises(ValueError, match='Unknown type'):
        labml_tracker.tracker_singleton().store('sampled', 'text')


def test_create_names_the_calling_script(tmp_path):
    """With the adapter's file in ignore_callers, labml records the file that called experiment.create."""
    lazylab.labml.install(engine=False)
    adapter.configure_lab(tmp_path / 'logs', tmp_path / 'data')
    labml.experiment.create(name='pinned', writers=set())
    run = adapter.experiment_run()
    assert run.python_file == __file__
    assert run.name == 'pinned'
    assert not (tmp_path / 'logs').exists()  # create writes nothing; start does


def test_gaps_are_filled_only_where_missing(monkeypatch):
    before = {name: hasattr(labml.experiment, name) for name in ('add_pytorch_models', 'save_checkpoint')}
    assert before == {'add_pytorch_models': False, 'save_checkpoint': False}  # labml 0.5.3
    monkeypatch.delattr(labml.tracker, 'debug')  # tests/conftest.py gives labml 0.5.3 one; the adapter must too
    lazylab.labml.install(engine=False)
    labml.experiment.add_pytorch_models({'model': torch.nn.Linear(2, 1)})
    assert list(adapter.MODELS) == ['model']
    assert labml.tracker.debug('attn', torch.zeros(1)) is None
    lazylab.labml.uninstall()
    assert not hasattr(labml.experiment, 'add_pytorch_models') and not hasattr(labml.tracker, 'set_text')
    assert not hasattr(labml.tracker, 'debug')
    own = labml.tracker.debug = lambda *a, **k: 'own'
    lazylab.labml.install(engine=False)
    assert labml.tracker.debug is own  # an existing function is left alone


def test_module_indicator_is_skipped_with_one_notice(capsys):
    with pytest.raises(ValueError, match='Unknown type'):  # labml 0.5.3 itself
        labml_tracker.tracker_singleton().store('model', torch.nn.Linear(2, 1))
    lazylab.labml.install(engine=False)
    labml.tracker.add('model', torch.nn.Linear(2, 1))
    labml.tracker.add({'model': torch.nn.Linear(2, 1), 'loss.x': 1.0})
    err = capsys.readouterr().err
    assert err.count('lazylab: notice:') == 1 and "tracker.add('model', <Linear>)" in err
    assert 'loss.x' in labml_tracker.tracker_singleton().indicators
    assert 'model' not in labml_tracker.tracker_singleton().indicators


def test_switch_serves_labml_configs_from_lazylab_and_uninstall_restores():
    """Code importing labml.configs under the switch declares lazylab configs, labml's class methods included."""
    import labml.configs as labml_configs_before
    lazylab.labml.install()
    assert lazylab.labml.is_installed() and labml.configs is sys.modules['labml.configs']
    source = ('from labml.configs import BaseConfigs, option, aggregate, ConfigsError\n'
              'class C(BaseConfigs):\n    x: int = 1\n    y: int\n    mode: str = "plain"\n'
              '@C.calc(C.y)\ndef _y(c): return c.x + 1\n'
              'C.aggregate(C.mode, "big", (C.x, 10))\n')
    scope: dict = {}
    exec(compile(source, '<switched>', 'exec'), scope)
    conf = scope['C']()
    conf._set_values({'mode': 'big'})
    assert getattr(type(conf), '_lazylab_is_configs', False) and (conf.x, conf.y) == (10, 11)
    assert scope['ConfigsError'] is labml_configs_before.ConfigsError  # other names: labml's own
    with pytest.raises(UnknownItemError):
        conf._set_values({'z': 1})
    lazylab.labml.uninstall()
    assert sys.modules['labml.configs'] is labml_configs_before and labml.configs is labml_configs_before


def test_placeholder_imports_and_fails_on_use():
    # `make install` has no torchvision (the registry's wheels need a CUDA torch), the case the placeholder is for
    assert importlib.util.find_spec('torchvision') is None, 'torchvision is installed here; this test expects none'
    assert placeholders.install_placeholder('torchvision')
    from torchvision import datasets, transforms
    assert isinstance(transforms.Compose, type) and repr(datasets.MNIST).startswith('<placeholder')
    import torchvision.transforms.functional as tf  # submodules at any depth import too (labml_nn.unet)
    with pytest.raises(placeholders.MissingPackageError, match='torchvision.transforms.Compose needs torchvision'):
        transforms.Compose([])
    with pytest.raises(placeholders.MissingPackageError, match='^torchvision.transforms.functional.center_crop '):
        tf.center_crop(torch.zeros(1), [1])
    placeholders.remove_placeholders()
    assert not any(name.split('.')[0] == 'torchvision' for name in sys.modules)
    with pytest.raises(ModuleNotFoundError):
        import torchvision  # noqa: F401


def test_save_checkpoint_writes_each_added_model(tmp_path):
    """labml 0.4's checkpoint layout in labml's run folder: checkpoints/GLOBAL_STEP/NAME.pth."""
    lazylab.labml.install(engine=False)
    adapter.configure_lab(tmp_path / 'logs', tmp_path / 'data')
    labml.experiment.create(name='ckpt', writers=set())
    model = torch.nn.Linear(3, 2)
    labml.experiment.add_pytorch_models(model=model)
    labml.experiment.save_checkpoint()  # not started: nothing to write into
    assert not (tmp_path / 'logs').exists()
    with labml.experiment.start():
        labml.tracker.set_global_step(12)
        labml.experiment.save_checkpoint()
    path = adapter.experiment_run().run_path / 'checkpoints' / '12' / 'model.pth'
    state = torch.load(path, weights_only=True)
    assert set(state) == {'weight', 'bias'} and torch.equal(state['weight'], model.weight.detach())


def test_lazylab_script_on_labml_experiment_api_saves_configs_in_labml_run(tmp_path):
    """Issue item 1: a script that imports lazylab.configs directly runs on labml's experiment API: configs with a
    dict, add_pytorch_models(get_modules(conf)), start(); labml's configs.yaml holds the lazylab items with the
    dict's keys marked as explicitly specified."""
    import yaml
    lazylab.labml.install(engine=False)
    adapter.configure_lab(tmp_path / 'logs', tmp_path / 'data')
    labml.experiment.create(name='ported', writers={'file'})
    conf = Tiny()
    labml.experiment.configs(conf, {'width': 5})
    labml.experiment.add_pytorch_models(get_modules(conf))
    assert adapter.MODELS['net'] is conf.net and conf.net.in_features == 5
    with labml.experiment.start():
        assert conf.a == 1
    saved = yaml.safe_load((adapter.experiment_run().run_path / 'configs.yaml').read_text())
    assert saved['width']['value'] == 5 and saved['width']['is_explicitly_specified'] is True
    assert saved['a']['computed'] == 1 and saved['a']['is_explicitly_specified'] is False
    assert saved['net']['computed'].startswith('Linear(in_features=5')


def _train(save_every: int, global_steps: bool, limit: int = 2) -> tuple[int, int, list]:
    """A labml training loop of at most 10 steps under a step limit of `limit` updates: (forward passes, updates,
    what labml's tracker wrote as (global step, means)). Each step: add_global_step, forward, backward, update,
    track the step's number as 'loss.train', and save every `save_every` steps (0: never)."""
    lazylab.labml.install(engine=False)
    written = []
    internals.add_writer(internals.tracker_writer(lambda step, means, texts: written.append((step, means))))
    model = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    forwards = 0
    step_limit = adapter.StepLimit(limit)
    try:
        with pytest.raises(adapter.StepLimitReached):
            for i in range(10):
                if global_steps:
                    labml.tracker.add_global_step()
                forwards += 1
                model(torch.ones(1, 2)).sum().backward()
                sgd.step()
                sgd.zero_grad()
                labml.tracker.add('loss.train', float(i))
                if save_every and (i + 1) % save_every == 0:
                    labml.tracker.save()
    finally:
        step_limit.remove()
    return forwards, step_limit.count, written


def test_step_limit_stops_after_the_nth_steps_save():
    """labml_nn's trainers save at the end of each step: the run ends there, after exactly N forward passes (it
    used to run the N + 1-th forward and backward pass and stop before its update)."""
    assert _train(save_every=1, global_steps=True) == (2, 2, [(1, {'loss.train': 0.0}), (2, {'loss.train': 1.0})])
    assert adapter.LIMIT is None  # removed


def test_step_limit_stops_at_the_next_steps_start_and_saves_the_steps_since_the_last_save():
    """glu_variants.simple saves every 10 steps: the run ends when step N + 1 adds its global step, and what steps
    1..N tracked is saved as one record at step N."""
    assert _train(save_every=10, global_steps=True) == (2, 2, [(2, {'loss.train': 0.5})])


def test_step_limit_stops_before_the_next_update_of_a_loop_that_neither_saves_nor_counts():
    assert _train(save_every=0, global_steps=False) == (3, 2, [(0, {'loss.train': 0.5})])


def test_writer_names_of_earlier_labml_become_labml_0_5_3_writers_with_one_warning(tmp_path, capsys):
    """labml_nn 0.5.1 asks for 'labml' (fta, value_pe), 'web_api' (deep_norm), 'sqlite' (cfr.kuhn)."""
    adapter.configure_lab(tmp_path / 'logs', tmp_path / 'data')
    with pytest.raises(ValueError, match='^Unknown writer: sqlite$'):  # labml 0.5.3 itself
        labml.experiment.create(name='old', writers={'sqlite'})
    lazylab.labml.install(engine=False)
    labml.experiment.create(name='old', writers={'screen', 'sqlite', 'web_api', 'labml'})
    assert labml_experiment.experiment_singleton().writers == {'screen', 'file', 'app'}
    err = capsys.readouterr().err
    assert err == ("lazylab: warning: labml 0.5.3 has no writer 'labml', 'sqlite', 'web_api' (a name of earlier "
                   "labml); recording with 'app', 'file' and lazylab's tracking instead\n")
    labml.experiment.create(name='new', writers={'screen'})
    assert labml_experiment.experiment_singleton().writers == {'screen'} and capsys.readouterr().err == ''
    with pytest.raises(ValueError, match='^Unknown writer: nonsense$'):  # a name labml never had: labml's error
        labml.experiment.create(name='bad', writers={'nonsense'})


DECLARED_ON_LABMLS_CLASS = '''
from labml.configs import aggregate, option
from labml.internal.configs.base import Configs


class Part(Configs):
    calc: str
    given: str

    def __init__(self):
        super().__init__(_primary='calc')


@option(Part.calc)
def _calc(c):
    return c.given + ' part'


class Whole(Configs):
    x: str = 'x'
    part: Part
    mode: str
    a: str = 'a'


@option(Whole.part)
def _part(c):
    p = Part()
    p.given = c.x
    return p


aggregate(Whole.mode, 'big', (Whole.a, 'A'))
'''


def test_classes_declared_on_labmls_internal_configs_class_are_lazylab_configs_under_the_switch():
    """labml's own tests declare config classes on labml.internal.configs.base.Configs (which labml.configs'
    BaseConfigs extends): under the switch they are lazylab configs, option, primary item and aggregate included."""
    import labml.internal.configs.base as labml_base
    labml_own = labml_base.Configs
    lazylab.labml.install()
    scope: dict = {}
    exec(compile(DECLARED_ON_LABMLS_CLASS, '<declared on labml.internal.configs.base.Configs>', 'exec'), scope)
    conf = scope['Whole']()
    conf._set_values({'x': 'y', 'mode': 'big'})
    assert getattr(type(conf), '_lazylab_is_configs', False)
    assert (conf.part, conf.a) == ('y part', 'A')  # the primary item stands for the sub-config
    with pytest.raises(UnknownItemError, match="did you mean 'x'"):
        scope['Whole']()._set_values({'xx': 'z'})
    lazylab.labml.uninstall()
    assert labml_base.Configs is labml_own
