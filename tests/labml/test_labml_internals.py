"""Pins each assumption lazylab/labml_internals.py makes about labml's private API (L1–L17 in its docstring) to
labml 0.5.3's behaviour, in this process (labml's singletons saved and put back around each test: the
`labml_state` fixture of tests/labml/conftest.py).

If one of these fails after a labml upgrade, the assumption in its name no longer holds: the first test says which
labml version the pins were written for.
"""
import importlib.util
import inspect
import io
import json
import sys
import types
from importlib.metadata import version
from pathlib import Path

import labml.experiment
import labml.internal.experiment as labml_experiment
import labml.internal.lab as labml_lab
import labml.internal.tracker as labml_tracker
import labml.logger
import labml.tracker
import pytest
import torch
from labml.internal.configs.processor import ConfigProcessor, ConfigsSaver
from labml.internal.experiment.watcher import ExperimentWatcher
from labml.internal.monitor import monitor_singleton
from labml.internal.monitor.loop import Loop

from lazylab import labml_internals as internals
from lazylab.configs import BaseConfigs, option
from lazylab.configs import inspect as config_inspect

pytestmark = pytest.mark.usefixtures('labml_state')


class Tiny(BaseConfigs):
    a: int = 1
    b: int = 2
    net: torch.nn.Linear
    width: int = 3
    rate: object = 'dynamic'


@option(Tiny.net)
def _linear(c: Tiny):
    return torch.nn.Linear(c.width, 1)


@option(Tiny.rate, 'dynamic')
def _rate(c: Tiny):
    return internals.dynamic_hyperparam('FloatDynamicHyperParam')(0.5, (0.0, 1.0))


class _Collect(ConfigsSaver):
    def __init__(self):
        self.saved = []

    def save(self, configs):
        self.saved.append(json.loads(json.dumps(configs, default=str)))


def _created(name='pinned', writers=frozenset()):
    labml.experiment.create(name=name, writers=set(writers))
    return internals.experiment()


def test_labml_is_the_version_these_pins_were_written_for():
    assert version('labml') == internals.LABML_VERSION == '0.5.3', (
        f'lazylab.labml_internals reaches into the private API of labml {internals.LABML_VERSION}, and this is labml '
        f'{version("labml")}: check each assumption L1–L14 (the tests below) against it before changing the pin')


def test_L1_the_experiment_its_run_and_its_end(tmp_path):
    assert internals.experiment() is None or not internals.is_started()
    exp = _created()
    run = internals.run_info()
    assert exp is labml_experiment.experiment_singleton() and run is exp.run
    assert run.name == 'pinned' and run.run_path == (tmp_path / 'logs' / 'pinned' / run.uuid).resolve()
    assert (run.configs_path, run.checkpoint_path) == (run.run_path / 'configs.yaml', run.run_path / 'checkpoints')
    assert internals.configs_processor() is None and not internals.is_started()
    labml.experiment.start()
    assert internals.is_started()
    internals.finish_experiment('interrupted')
    assert not internals.is_started()
    assert json.loads((run.run_path / 'run_log.jsonl').read_text().splitlines()[-1])['status'] == 'interrupted'
    internals.finish_experiment('completed')  # a finished run: nothing more
    assert len((run.run_path / 'run_log.jsonl').read_text().splitlines()) == 1


def test_L2_a_config_processor_over_a_foreign_config():
    """labml's own methods (add_saver, get_hyperparams, update_configs) work on the processor's attributes; the
    savers get the config's _to_json whenever it reports an update; dynamic hyper-parameters are registered under
    their path."""
    _created()
    conf = Tiny()
    conf._set_values({'a': 5})
    processor = internals.config_processor(conf, {'a': 5}, config_inspect.computed)
    internals.set_configs_processor(processor)
    assert isinstance(processor, ConfigProcessor) and internals.configs_processor() is processor
    saver = _Collect()
    processor.add_saver(saver)  # what Experiment.start() does with labml's file saver and the app's
    assert saver.saved[-1] == json.loads(json.dumps(conf._to_json(), default=str))
    assert saver.saved[-1]['a']['value'] == 5 and saver.saved[-1]['a']['is_explicitly_specified'] is True
    assert conf.b == 2 and saver.saved[-1]['b']['computed'] == 2  # sent again once b was computed
    assert processor.get_hyperparams() == {'a': 5}
    processor.update_configs({'width': 4})  # labml's second `experiment.configs(dict)` goes here
    assert conf.width == 4 and processor.get_value('width') == 4
    rate = conf.rate
    assert type(rate).__name__ == 'FloatDynamicHyperParam' and rate._key == 'rate'
    assert internals.dynamic_hyperparam('IntDynamicHyperParam').__module__ == \
        'labml.internal.configs.dynamic_hyperparam'


def test_L3_labml_command_line_overrides():
    assert internals.global_configs() == {}
    labml_experiment.global_params_singleton().configs = {'b': 9}
    assert internals.global_configs() == {'b': 9}
    source = inspect.getsource(labml_experiment.Experiment.calc_configs)
    assert 'configs_override.update(global_params_singleton().configs)' in source


def test_L4_lab_settings_survive_set_path_and_absolute_paths_are_kept(tmp_path):
    internals.new_lab(tmp_path)
    internals.set_lab({'path': str(tmp_path), 'experiments_path': str(tmp_path / 'runs' / 'labml'),
                       'data_path': str(tmp_path / 'data')})
    labml_lab.lab_singleton().set_path(__file__)  # what experiment.create does with the script's file
    lab = labml_lab.lab_singleton()
    assert lab.experiments == (tmp_path / 'runs' / 'labml').resolve()
    assert lab.data_path == (tmp_path / 'data').resolve()
    assert lab.path == tmp_path.resolve()


def test_L5_a_tracker_writer_gets_every_save_and_start_resets_writers(tmp_path):
    got, finished = [], []
    writer = internals.tracker_writer(lambda step, means, texts: got.append((step, means, texts)),
                                      lambda: finished.append(True))
    internals.add_writer(writer)
    internals.add_indicator(internals.text_indicator('sampled'))
    labml.tracker.add('loss.train', torch.tensor(2.0))
    labml.tracker.add('loss.train', 4.0)
    labml.tracker.add('sampled', 'It is')
    labml.tracker.save(7)
    labml.tracker.save(8)  # nothing new
    assert got == [(7, {'loss.train': 3.0}, {'sampled': ['It is']}), (8, {}, {})]
    _created(writers={'file'})
    labml.experiment.start()
    assert writer not in labml_tracker.tracker_singleton()._Tracker__writers
    internals.add_writer(writer)
    internals.finish_experiment('completed')  # labml's finish reaches the writers' finish
    assert finished and set(finished) == {True}  # (labml 0.5.3 ends the tracker's loop twice on the way)


def test_L6_indicators_text_queue_dropped_and_lookup():
    internals.add_indicator(internals.queue_indicator('reward', 3))
    internals.add_indicator(internals.dropped_indicator('generated'))
    got = []
    internals.add_writer(internals.tracker_writer(lambda step, means, texts: got.append((means, texts))))
    for step, reward in enumerate([1.0, 2.0, 3.0, 10.0], 1):
        labml.tracker.add({'reward': reward, 'generated': 'an image'})
        labml.tracker.save(step)
    assert [m['reward'] for m, _ in got] == [1.0, 1.5, 2.0, 5.0]  # the last 3 values: (2 + 3 + 10) / 3
    assert all(texts == {} for _, texts in got)  # dropped values reach no writer
    assert internals.has_indicator('reward') and internals.has_indicator('generated')
    assert not internals.has_indicator('loss.x')
    labml.tracker.add('loss.x', 1.0)
    assert internals.has_indicator('loss.x')
    text = internals.text_indicator('s')
    text.collect_value(3)
    assert text.values == ['3'] and not text.is_empty() and type(text.copy('t')) is type(text)
    text.clear()
    assert text.is_empty()


def test_L6_values_are_unsaved_from_tracking_until_a_save():
    assert not internals.has_unsaved_values()
    labml.tracker.add('loss.x', 1.0)
    assert internals.has_unsaved_values()
    labml.tracker.save(1)
    assert not internals.has_unsaved_values()


def test_L7_watcher_statuses_and_a_stop_that_completes():
    finished = []
    exp = types.SimpleNamespace(finish=lambda status, details=None: finished.append(status))
    for exc in (None, KeyboardInterrupt, ValueError):
        ExperimentWatcher(exp).__exit__(exc, exc() if exc else None, None)
    assert finished == ['completed', 'interrupted', 'crashed']

    class Stop(BaseException):
        pass

    seen = []
    watcher = internals.Watcher(ExperimentWatcher(exp), seen.append, Stop)
    assert watcher.__exit__(Stop, Stop(), None) is True
    assert finished[-1] == 'completed' and seen == [Stop]
    assert not watcher.__exit__(ValueError, ValueError('x'), None)
    assert finished[-1] == 'crashed'
    assert 'finish_loop' in inspect.getsource(type(monitor_singleton()).finish_loop)


def test_L8_quiet_notices_drop_only_labml_yaml_and_git(capsys):
    assert 'labml_notice' in inspect.getsource(labml_lab.Lab)
    assert 'labml_notice' in inspect.getsource(labml_experiment.Experiment.__init__)
    with internals.quiet_labml_notices():
        labml_lab.labml_notice(['.labml.yaml', ' config file could not be found'])
        labml_experiment.labml_notice(['Not a valid git repository: ', ('/x', None)])
        labml_lab.labml_notice('something else')
    out = capsys.readouterr().out
    assert 'something else' in out and '.labml.yaml' not in out and 'git' not in out


def test_L9_create_names_the_script_that_called_past_the_ignored_file(tmp_path):
    helper = tmp_path / 'creating_helper.py'
    helper.write_text('import labml.experiment\nfrom lazylab import labml_internals\n'
                      'def create():\n'
                      '    labml.experiment.create(**labml_internals.ignoring_caller({"name": "x", "writers": set()},'
                      ' __file__))\n', encoding='utf-8')
    spec = importlib.util.spec_from_file_location('creating_helper', helper)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.create()
    assert internals.run_info().python_file == __file__


def test_L10_projects_removed_meanwhile_are_skipped(tmp_path, monkeypatch):
    from labml.internal.computer import configs as computer_configs
    original = computer_configs.Computer.get_projects
    assert 'self.projects_folder.iterdir()' in inspect.getsource(original)  # each run's start reads every file
    monkeypatch.setattr(computer_configs.Computer, 'get_projects', original)  # put back after the test
    internals.tolerate_concurrent_runs()
    folder = tmp_path / 'projects'
    folder.mkdir()
    (folder / 'alive.txt').write_text(str(tmp_path))
    (folder / 'twice.txt').write_text(str(tmp_path))
    (folder / 'gone.txt').write_text(str(tmp_path / 'no such folder'))

    class Vanishing(type(folder)):
        def iterdir(self):  # one file listed, then removed by another run before it is read
            yield from [*super().iterdir(), self / 'removed-meanwhile.txt']

    projects = computer_configs.Computer.get_projects(types.SimpleNamespace(projects_folder=Vanishing(folder)))
    assert projects == {str(tmp_path)}
    assert sorted(p.name for p in folder.iterdir()) in (['alive.txt'], ['twice.txt'])


def test_L11_importing_the_app_logs_module_captures_stdout():
    source = Path(importlib.util.find_spec('labml.internal.app.logs').origin).read_text(encoding='utf-8')
    assert 'sys.stdout.write = _write_stdout' in source and '\ncapture()\n' in source  # at import, once


def test_L12_upload_threads_become_daemons_and_are_collected(monkeypatch):
    import labml.internal.app as labml_client
    tracker = inspect.signature(labml_client.AppTracker.__init__).parameters
    assert list(tracker)[:3] == ['self', 'app_track_url', 'params'] and {'timeout_seconds', 'daemon'} <= set(tracker)
    assert hasattr(labml_client, '_AppTrackThread')
    monkeypatch.setattr(labml_client, 'AppTracker', labml_client.AppTracker)  # restored after the test
    sink = []
    internals.patch_client_upload_thread(sink)
    tracker = labml_client.AppTracker('http://127.0.0.1:9/api/v1/default/track?', {}, daemon=False)
    assert tracker._check() is True
    assert tracker.thread.daemon is True and not tracker.thread.is_alive()  # made, not started
    tracker._check()
    assert sink == [tracker.thread]  # once, however often labml checks


def test_L12_the_url_handler_never_opens_a_browser(monkeypatch):
    import webbrowser

    import labml.internal.app.experiment as labml_client_experiment
    assert list(inspect.signature(labml_client_experiment.AppUrlResponseHandler.__init__).parameters) == \
        ['self', 'open_browser', 'label']
    # the experiment constructs the handler through its own module's name, so replacing that name is enough
    assert 'AppUrlResponseHandler(' in inspect.getsource(labml_client_experiment.AppExperiment)
    monkeypatch.setattr(labml_client_experiment, 'AppUrlResponseHandler',
                        labml_client_experiment.AppUrlResponseHandler)  # restored after the test
    opened = []
    monkeypatch.setattr(webbrowser, 'open', opened.append)
    internals.patch_client_browser()
    handler = labml_client_experiment.AppUrlResponseHandler(True, 'Monitor experiment at ')
    handler.handle({'url': 'http://127.0.0.1:5005/run/x'})
    assert handler.notified and opened == []


def test_L13_the_console_hook_gets_every_line_and_gives_labml_its_own(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, 'stdout', out)
    got = []

    def on_log(parts, is_new_line, is_reset, labml_write):
        got.append((parts, is_new_line, is_reset))
        labml_write(parts, is_new_line, is_reset)

    restore = internals.hook_console(on_log)
    try:
        labml.logger.log([('loss', labml.logger.Text.key), ': 1.5'], is_new_line=False)
    finally:
        restore()
    labml.logger.log('after')
    assert got == [([('loss', labml.logger.Text.key), (': 1.5', None)], False, True)]
    # labml's own console: a redrawn line (100 spaces between two carriage returns), ANSI colours
    assert out.getvalue().startswith('\r' + ' ' * 100 + '\r' + labml.logger.Text.key.ansi() + 'loss')
    assert out.getvalue().endswith(': 1.5\r' + ' ' * 100 + '\rafter\n')


def test_L13_a_loops_time_part_is_one_part_spent_then_left():
    loop = Loop(range(10), monitor=monitor_singleton(), is_track=False, is_print_iteration_time=True)
    iter(loop)  # its start time
    parts = loop.log_progress()
    monitor_singleton().finish_loop()
    times = [text for text, _ in parts if internals.LOOP_TIME.fullmatch(text)]
    assert times == ['  0:00m/  0:00m  ']
    assert [text for text, _ in parts if not internals.LOOP_TIME.fullmatch(text)] == ['  ', '0ms']


def test_L14_a_created_run_moves_with_its_paths_and_starts_there(tmp_path):
    exp = _created(writers={'file'})
    old = internals.run_info().run_path
    internals.move_run(tmp_path / 'moved' / 'labml')
    run = internals.run_info()
    assert exp.experiment_path == tmp_path / 'moved' / 'labml' / 'pinned'
    assert run.run_path == tmp_path / 'moved' / 'labml' / 'pinned' / run.uuid
    paths = {k: v for k, v in vars(run).items() if isinstance(v, Path)}
    assert len(paths) >= 10 and all(run.run_path == v or run.run_path in v.parents for k, v in paths.items()
                                    if k != 'experiment_path')
    assert not old.exists() and not (tmp_path / 'logs').exists()  # create wrote nothing
    labml.experiment.start()
    internals.finish_experiment('completed')
    assert (run.run_path / 'run.yaml').is_file() and (run.run_path / 'run_log.jsonl').is_file()
    assert not (tmp_path / 'logs').exists()
    assert labml_lab.lab_singleton().experiments == tmp_path / 'moved' / 'labml'


def test_L15_a_failed_write_of_the_file_writer_is_kept_and_its_thread_still_ends(tmp_path):
    from labml.internal.tracker.writers import file as labml_file_writer
    internals.guard_file_writer()
    internals.reset_file_writer_failure()
    _created(writers={'file'})
    labml.experiment.start()
    writer, = (w for w in labml_tracker.tracker_singleton()._Tracker__writers
               if isinstance(w, labml_file_writer.Writer))
    gone = tmp_path / 'gone' / 'log.jsonl'
    writer.thread.file_path = gone  # its folder is not there: every write fails, as on a read-only disk
    labml.tracker.save(1, {'loss.train': 1.0})
    internals.finish_writers()  # what labml's finish does last, and what a failed finish left undone
    internals.wait_for_file_writer(60)
    assert not writer.thread.is_alive()  # it got its 'done' and ended: nothing keeps the process from exiting
    failure = internals.file_writer_failure()
    assert isinstance(failure, FileNotFoundError) and failure.filename == str(gone)
    internals.reset_file_writer_failure()
    assert internals.file_writer_failure() is None


def test_L16_labml_configs_class_is_the_base_modules_and_labmls_modules_keep_it_when_it_is_replaced(monkeypatch):
    base = internals.configs_base_module()
    assert sys.modules['labml.configs'].BaseConfigs.__bases__ == (base.Configs,)  # (labml's own: not installed)
    own = base.Configs
    monkeypatch.setattr(base, 'Configs', type('Other', (), {}))
    processor = sys.modules['labml.internal.configs.processor']
    # bound when they were imported: labml's isinstance checks (experiment.configs, ConfigProcessor) keep its class
    assert processor.Configs is own and labml_experiment.Configs is own
