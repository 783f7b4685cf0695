"""`lazylab labml MODULE …` end to end, each run a subprocess on the CPU with tiny sizes and offline data:

- labml_nn 0.5.1's feedback and fast-weights experiments train 30 steps and their training loss falls;
- the configs lazylab computes equal, item by item, those labml's own engine computes for the same script and
  overrides (labml's configs.yaml of each run; `labml_reference.py` runs the reference);
- a labml-helpers-style script (char_helpers_experiment.py) trains the same way;
- configs.yaml replays; mistakes are one line and exit 2 with nothing written; `--options` lists the keys;
- a run streams to `lazylab dashboard` with its configs, the items the user set marked as such.
"""
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
HELPERS_SCRIPT = HERE / 'char_helpers_experiment.py'
STEPS = 30
NN_MODULES = ['labml_nn.transformers.feedback.experiment', 'labml_nn.transformers.fast_weights.experiment']
# The keys both scripts' configs name, made tiny; Adam at a fixed rate (the scripts' Noam warms up for 4000 steps).
TINY_NN = {'d_model': 16, 'heads': 2, 'd_ff': 32, 'n_layers': 1, 'seq_len': 32, 'batch_size': 4,
           'optimizer.optimizer': 'Adam', 'optimizer.learning_rate': 0.003}
TINY_HELPERS = {'d_model': 24}


def _env():
    # one torch thread: these models are tiny, and on a shared 2-core machine a second thread mostly waits (the
    # feedback reference run takes about half the time with one)
    return dict(os.environ, LABML_DISABLE_GIT='1', PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1',
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get('PYTHONPATH', '')]))


def _tokens(values: dict) -> list[str]:
    return [f'{k}={v}' for k, v in values.items()]


def lazylab_labml(cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'lazylab.cli', 'labml', *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def _only_run(runs: Path, name: str) -> Path:
    run_dir, = (runs / name).iterdir()
    return run_dir


def _metrics(run_dir: Path, key: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / 'metrics.jsonl').read_text().splitlines()]
    return [r for r in rows if key in r]


def _loss_falls(train: list[dict]) -> tuple[float, float]:
    first = sum(r['loss.train'] for r in train[:5]) / 5
    last = sum(r['loss.train'] for r in train[-5:]) / 5
    return first, last


class _LabmlYaml(yaml.SafeLoader):
    """labml writes its configs.yaml with yaml.dump, so tuples carry a python tag; read them as lists."""


_LabmlYaml.add_constructor('tag:yaml.org,2002:python/tuple', lambda loader, node: loader.construct_sequence(node))


def _labml_configs(path: Path) -> dict:
    return yaml.load(path.read_text(encoding='utf-8'), Loader=_LabmlYaml)


def _plain(value):
    """Object addresses (`<function f at 0x7f…>`) differ between processes; nothing else may (lazylab's reports
    leave them out: `<function f>`)."""
    if isinstance(value, str):
        return re.sub(r' at 0x[0-9a-f]+', '', value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    return tmp_path_factory.mktemp('labml')


@pytest.fixture(scope='module')
def trained(work):
    """{module: (run dir, completed process)} of one 30-step run per experiment, all under work/runs."""
    out = {}
    for module, tiny in [*[(m, TINY_NN) for m in NN_MODULES], (str(HELPERS_SCRIPT), TINY_HELPERS)]:
        res = lazylab_labml(work, module, *_tokens(tiny), '--steps', str(STEPS), '--runs-dir', 'runs')
        assert res.returncode == 0, res.stderr[-3000:]
        out[module] = (_only_run(work / 'runs', Path(module).stem if module.endswith('.py') else module), res)
    return out


@pytest.mark.parametrize('module', NN_MODULES)
def test_labml_nn_experiment_trains_30_steps_and_loss_falls(trained, module):
    run_dir, res = trained[module]
    train = _metrics(run_dir, 'loss.train')
    # one record per step, at labml's global step: the tokens seen (seq_len × batch_size = 128 per step)
    assert [r['step'] for r in train] == [128 * (i + 1) for i in range(STEPS)]
    first, last = _loss_falls(train)
    assert last < first - 0.3, (first, last)
    assert all(0 <= r['accuracy.train'] <= 1 for r in train)
    info = json.loads((run_dir / 'run.json').read_text())
    assert (info['experiment'], info['source'], info['steps'], info['status']) == \
        (module, {'kind': 'labml', 'module': module}, STEPS, 'completed')
    assert 'module' not in info and info['run_id'] == run_dir.name and info['python'] and 'torch' in info
    labml_run = run_dir / info['labml_run']
    assert labml_run.name == info['uuid'] and (labml_run / 'configs.yaml').is_file()
    assert json.loads((labml_run / 'run_log.jsonl').read_text().splitlines()[-1])['status'] == 'completed'
    assert f'completed after {STEPS} optimizer steps' in res.stdout
    dumped = yaml.safe_load((run_dir / 'configs.yaml').read_text())['values']
    for key, value in TINY_NN.items():  # command-line text typed by the engine
        assert dumped[key] == value and type(dumped[key]) is type(value), key
    assert dumped['text'] == 'tiny_shakespeare' and dumped['inner_iterations'] == 25  # the script's own dict
    assert (run_dir / 'samples.txt').read_text().startswith('--- step 128 sampled\nIt is')


def test_helpers_style_script_trains_and_skips_module_indicators(trained):
    run_dir, res = trained[str(HELPERS_SCRIPT)]
    train = _metrics(run_dir, 'loss.train')
    assert len(train) == STEPS
    first, last = _loss_falls(train)
    assert last < first - 0.3, (first, last)
    # the epoch (about 20 batches) ended inside the run: validated once, and labml-helpers' module indicator
    # (`tracker.add('model', model)`, an error on labml 0.5.3) was skipped with one notice
    assert len(_metrics(run_dir, 'loss.valid')) == 1
    assert res.stderr.count('lazylab: notice:') == 1 and "tracker.add('model', <CharGRU>)" in res.stderr
    dumped = yaml.safe_load((run_dir / 'configs.yaml').read_text())['values']
    assert dumped['d_model'] == 24 and dumped['optimizer.optimizer'] == 'Adam' and dumped['epochs'] == 4


LOOP_TIME = re.compile(r'(\d+):(\d\d)m/ *(\d+):(\d\d)m')


@pytest.mark.parametrize('module', [*NN_MODULES, str(HELPERS_SCRIPT)])
def test_console_through_a_pipe_is_plain_short_and_ends_with_the_summary_on_its_own_line(trained, module):
    """Issue 25 item 12: off a terminal, labml's redrawn progress line is not written at every step (it was 18 to
    39 KB for these 30 steps, with ANSI codes and 100-space padding), the time left is the --steps limit's, and
    lazylab's summary is a line of its own."""
    _, res = trained[module]
    out = res.stdout
    assert len(out.encode()) < 4096, len(out.encode())
    assert '\x1b[' not in out and '\r' not in out and ' ' * 20 not in out
    lines = out.splitlines()
    assert lines[-1].startswith(f'lazylab labml: completed after {STEPS} optimizer steps; loss.train ')
    assert out.endswith('\n') and sum(line.startswith('lazylab labml: ') for line in lines) == 2
    times = [LOOP_TIME.search(line) for line in lines if LOOP_TIME.search(line)]
    if module in NN_MODULES:  # labml_nn's trainer draws a loop line; its last one is at step 30 of 30
        assert times and times[-1].group(3, 4) == ('0', '00')  # labml's own estimate said 16 to 27 minutes
        assert lines[-2] == next(line for line in reversed(lines[:-1]) if LOOP_TIME.search(line))


# Items whose `type` labml reports from the base class's annotation although the script's class re-annotates
# them (labml keeps the first annotation it meets); lazylab reports the script's own, a subclass of labml's.
REANNOTATED = {NN_MODULES[0]: {'model'}, NN_MODULES[1]: {'model'}, str(HELPERS_SCRIPT): {'model', 'loss_func'}}

@pytest.mark.parametrize('module', [*NN_MODULES, str(HELPERS_SCRIPT)])
def test_configs_equal_labml_reference_item_by_item(trained, work, module):
    run_dir, _ = trained[module]
    tiny = TINY_HELPERS if module.endswith('.py') else TINY_NN
    out = work / 'reference' / Path(module).stem
    res = subprocess.run([sys.executable, str(HERE / 'labml_reference.py'), module, str(out),
                          str(work / 'runs' / 'data'), '2', json.dumps(tiny)],
                         cwd=work, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    theirs = _labml_configs(Path((out / 'configs_path.txt').read_text()))
    info = json.loads((run_dir / 'run.json').read_text())
    ours = _labml_configs(run_dir / info['labml_run'] / 'configs.yaml')
    assert sorted(ours) == sorted(theirs)
    differing_types = set()
    for key in ours:
        a, b = ours[key], theirs[key]
        for field in ('computed', 'value', 'is_explicitly_specified', 'is_hyperparam', 'is_meta', 'name'):
            assert _plain(a[field]) == _plain(b[field]), (key, field, a[field], b[field])
        assert sorted(a['options']) == sorted(b['options']), key
        if a['type'] != b['type']:
            differing_types.add(key)
    assert differing_types == REANNOTATED[module]
    for key in differing_types:
        assert ours[key]['type'] != "<class 'torch.nn.modules.module.Module'>" == theirs[key]['type']
    for key, tiny_value in tiny.items():
        assert ours[key]['value'] == tiny_value and ours[key]['is_explicitly_specified'] is True
    # the same items, computed in the same order: sub-configs a dotted key addresses (optimizer) are built when
    # the script first reads them, as labml builds them
    def order(configs):
        return sorted((k for k in configs if '.' not in k), key=lambda k: configs[k]['order'])
    assert order(ours) == order(theirs)


def test_configs_yaml_replays(trained, work):
    run_dir, _ = trained[NN_MODULES[0]]
    res = lazylab_labml(work, NN_MODULES[0], '--config', str(run_dir / 'configs.yaml'), '--steps', '1',
                        '--runs-dir', 'replays')
    assert res.returncode == 0, res.stderr[-3000:]
    replay = _only_run(work / 'replays', NN_MODULES[0])
    values = yaml.safe_load((run_dir / 'configs.yaml').read_text())['values']
    assert yaml.safe_load((replay / 'configs.yaml').read_text())['values'] == values
    assert len(_metrics(replay, 'loss.train')) == 1


def _one_error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert 'Traceback' not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith('lazylab:')]
    assert len(errors) == 1, res.stderr
    return errors[0]


def test_misspelt_override_gets_a_suggestion_and_writes_nothing(tmp_path):
    res = lazylab_labml(tmp_path, NN_MODULES[0], 'd_modle=16', '--steps', '1')
    line = _one_error_line(res)
    assert line.startswith("lazylab: error: Configs has no config item 'd_modle'; did you mean 'd_model'")
    assert list(tmp_path.iterdir()) == []


def test_unknown_key_of_a_subconfig_an_option_builds_is_refused_when_the_script_first_reads_it(tmp_path):
    """`optimizer` is built by an option when the script first reads it, as under labml (its option reads the
    model, which a script may set inside the run: ponder_net); its keys are checked then: at the first update,
    before any parameter changed. One line, and run.json says failed with it."""
    res = lazylab_labml(tmp_path, NN_MODULES[1], *_tokens(TINY_NN), 'optimizer.learnin_rate=0.1', '--steps', '1',
                        '--runs-dir', 'runs')
    line = _one_error_line(res)
    assert "'optimizer.learnin_rate'" in line and "did you mean 'learning_rate'" in line
    run_dir = _only_run(tmp_path / 'runs', NN_MODULES[1])
    info = json.loads((run_dir / 'run.json').read_text())
    assert (info['status'], info['error']) == ('failed', line.removeprefix('lazylab: error: '))
    assert not (run_dir / 'metrics.jsonl').read_text()  # no step was recorded


@pytest.mark.parametrize('args, message', [
    (['n_layers=two'], "lazylab: error: bad value for n_layers: expected int, got 'two'"),
    (['model=feedback'], "lazylab: error: unknown option 'feedback' for model (Configs); options: "
                         "feedback_transformer, feedback_transformer_kv"),
    (['--steps', '0'], "lazylab: error: --steps must be a positive integer, got '0'"),
], ids=['bad-value', 'unknown-option', 'bad-steps'])
def test_mistakes_are_one_line(tmp_path, args, message):
    res = lazylab_labml(tmp_path, NN_MODULES[0], *args)
    assert _one_error_line(res) == message
    assert list(tmp_path.iterdir()) == []


def test_a_runs_dir_inside_a_file_or_empty_and_a_module_file_that_is_not_py_are_one_line(tmp_path):
    (tmp_path / 'notes.txt').write_text('not a folder, not a module\n')
    for args, message in [
        (['--runs-dir', 'notes.txt'], 'lazylab: error: --runs-dir notes.txt: notes.txt is a file, not a folder'),
        (['--runs-dir', 'notes.txt/runs'], 'lazylab: error: --runs-dir notes.txt/runs: notes.txt is a file, not a '
                                           'folder'),
        (['--runs-dir', ''], 'lazylab: error: --runs-dir needs a folder'),
    ]:
        assert _one_error_line(lazylab_labml(tmp_path, NN_MODULES[0], *args, '--steps', '1')) == message
    res = lazylab_labml(tmp_path, './notes.txt', '--steps', '1')
    assert _one_error_line(res) == ('lazylab: error: ./notes.txt is not a .py file (MODULE is a dotted module name or '
                                    'a .py file)')
    assert [p.name for p in tmp_path.iterdir()] == ['notes.txt']


def test_unknown_module_names_the_nearest(tmp_path):
    res = lazylab_labml(tmp_path, 'labml_nn.transformers.feedbak.experiment')
    assert _one_error_line(res) == ("lazylab: error: no module named 'labml_nn.transformers.feedbak.experiment'; "
                                    "did you mean 'labml_nn.transformers.feedback'?")


NEEDS_A_PACKAGE = """
from labml import experiment
from labml.configs import BaseConfigs, option


class Configs(BaseConfigs):
    size: int = 2
    dataset: object = 'images'


@option(Configs.dataset, 'images')
def _images(c: Configs):
    import lazylab_test_missing_package  # noqa: F401
    return None


def main():
    conf = Configs()
    experiment.create(name='needs_a_package')
    experiment.configs(conf, {})
    with experiment.start():
        WHERE
"""


@pytest.mark.parametrize('where, message', [
    ('import lazylab_test_missing_package', 'needs_a_package.py imports lazylab_test_missing_package, which is not '
                                            'installed here (pip install lazylab_test_missing_package)'),
    ('print(conf.dataset)', "dataset: option 'images' failed: ModuleNotFoundError: No module named "
                            "'lazylab_test_missing_package'"),
    ("import torchvision\n        torchvision.datasets.MNIST('.')",  # lazylab's stand-in for a torchvision
     'torchvision.datasets.MNIST needs torchvision, which cannot be imported here (not installed); install a '
     'torchvision build that matches your torch, e.g. pip install torchvision'),
], ids=['in main', 'in an option', 'torchvision'])
def test_a_package_missing_after_the_start_is_one_line_and_run_json_says_failed(tmp_path, where, message):
    """The module imports, the run starts, then it needs a package that is not there (labml_nn's image
    experiments and torchvision): one line, exit 2, and run.json records the failure with that line."""
    script = tmp_path / 'needs_a_package.py'
    script.write_text(NEEDS_A_PACKAGE.replace('WHERE', where), encoding='utf-8')
    res = lazylab_labml(tmp_path, script.name, '--runs-dir', 'runs')
    assert _one_error_line(res) == f'lazylab: error: {message}'
    info = json.loads((_only_run(tmp_path / 'runs', 'needs_a_package') / 'run.json').read_text())
    assert (info['status'], info['error']) == ('failed', message)


def test_help_and_usage(capsys):
    from lazylab.cli import main
    assert main(['labml', '--help']) == 0
    out = capsys.readouterr().out
    assert out.startswith('usage: lazylab labml MODULE [key=value …] [--config FILE …] [--options] [--steps N]')
    assert re.search(r'^  --steps N +end training after N optimizer updates$', out, re.M)
    assert main(['labml']) == 2
    assert capsys.readouterr().err.startswith('lazylab: error: usage: lazylab labml MODULE')


def test_options_lists_keys_and_the_scripts_dict(tmp_path):
    res = lazylab_labml(tmp_path, NN_MODULES[1], '--options')
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert lines[0] == 'labml_nn.transformers.fast_weights.experiment: Configs (lazylab engine)'
    assert 'nu: int = 1' in lines and 'd_model: int = 512' in lines
    assert "tokenizer: Callable = 'character'  options: basic_english, character" in lines
    assert 'device.use_cuda: bool = True' in lines  # a sub-config given as a class default
    assert "  optimizer.optimizer='Noam'" in lines and '  batch_size=16' in lines
    assert list(tmp_path.iterdir()) == []


NOTEBOOK = """
import lazylab.labml
lazylab.labml.install()
from labml import experiment
from labml_nn.transformers.feedback.experiment import Configs
from labml_nn.helpers.device import DeviceConfigs
from lazylab.configs import BaseConfigs, UnknownItemError, explain
print('LAZYLAB', issubclass(Configs, BaseConfigs), issubclass(DeviceConfigs, BaseConfigs))
experiment.create(name='notebook', writers=set())
conf = Configs()
try:
    experiment.configs(conf, {'d_model': 16, 'optimizr.learning_rate': 1e-3})
except UnknownItemError as e:
    print('ERROR', e)
experiment.configs(conf, {'d_model': 16, 'heads': 2})
print('VALUES', conf.d_model, conf.heads, conf.n_layers, explain(conf)['d_model']['source'])
"""


def test_engine_switch_is_one_library_call(tmp_path):
    """Issue item 3: the switch for notebooks. labml_nn's classes imported after it are lazylab configs, and labml's
    experiment API takes them; imported before it, they stay labml's, with one warning."""
    res = subprocess.run([sys.executable, '-c', NOTEBOOK], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout.splitlines()
    assert 'LAZYLAB True True' in out
    assert "ERROR Configs has no config item 'optimizr.learning_rate'; did you mean 'optimizer'?" in out
    assert 'VALUES 16 2 6 override' in out
    late = subprocess.run([sys.executable, '-c', 'import labml_nn.helpers.device, lazylab.labml\n'
                           'lazylab.labml.install()\nimport labml_nn.helpers.device as d, labml.configs as c\n'
                           'print(issubclass(d.DeviceConfigs, c.BaseConfigs))'],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert late.returncode == 0, late.stderr[-3000:]
    assert late.stdout.split() == ['False']
    assert late.stderr.count('lazylab: warning:') == 1 and 'labml_nn' in late.stderr


# ---- the dashboard ---------------------------------------------------------------------------------------------

def test_run_appears_in_dashboard_with_its_configs(tmp_path, ports):
    port = ports.free()
    server = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', 'dashboard', '--port', str(port),
                               '--studies-port', str(ports.free()), '--store', str(tmp_path / 'store')],
                              cwd=tmp_path, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ports.wait(port, server, 'the dashboard')
        url = f'http://127.0.0.1:{port}'
        res = lazylab_labml(tmp_path, str(HELPERS_SCRIPT), 'd_model=20', '--steps', '5', '--dashboard', url)
        assert res.returncode == 0, res.stderr[-3000:]
        info = json.loads((_only_run(tmp_path / 'runs' / 'labml', 'char_helpers_experiment') / 'run.json').read_text())
        with urllib.request.urlopen(f'{url}/api/v1/run/{info["uuid"]}', timeout=30) as r:
            run = json.loads(r.read())
        assert run['name'] == 'char_helpers'
        configs = {c['key']: c for c in run['configs']}
        assert configs['d_model']['computed'] == 20 and configs['d_model']['is_explicitly_specified'] is True
        assert configs['epochs']['value'] == 4 and configs['epochs']['is_explicitly_specified'] is True  # the script's
        assert configs['seq_len']['computed'] == 32 and configs['seq_len']['is_explicitly_specified'] is False
        assert configs['optimizer.optimizer']['value'] == 'Adam'  # the script's dotted key, into a sub-config
        assert configs['optimizer.optimizer']['is_explicitly_specified'] is True
        # the dashboard follows the run's folder too (under its --runs-dir), and the folder wins: its configs.yaml
        # names the object by its option and type ('Adam'), the stream by its repr ('Adam (…)')
        assert configs['optimizer.optimizer']['computed'].startswith('Adam')
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
