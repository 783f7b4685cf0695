"""lazylab.experiments.discovery: what EXPERIMENT names (built-in, file, module, entry point), and its mistakes."""
import sys
import textwrap

import pytest

from lazylab.errors import UsageError
from lazylab.experiments import discovery

EXPERIMENT = textwrap.dedent('''
    from lazylab.experiments.nlp_autoregression import NLPAutoRegressionConfigs

    class Configs(NLPAutoRegressionConfigs):
        kernel: int = 5   # convolution width
''')


@pytest.fixture
def clean_modules():
    before = set(sys.modules)
    path = list(sys.path)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]
    sys.path[:] = path


def test_a_built_in_name_is_found_without_importing_it():
    e = discovery.find_experiment('feedback')
    assert (e.name, e.kind, e.module_name, e.module) == ('feedback', 'builtin', 'lazylab.experiments.feedback', None)
    assert e.source == {'kind': 'builtin', 'module': 'lazylab.experiments.feedback'}


def test_a_file_is_found_by_relative_path_imported_and_recorded_with_its_sha256(tmp_path, clean_modules):
    f = tmp_path / 'conv_lm_a1.py'
    f.write_text(EXPERIMENT)
    for written in ('conv_lm_a1.py', './conv_lm_a1.py', str(f)):
        e = discovery.find_experiment(written, cwd=tmp_path)
        assert (e.name, e.kind, e.path) == ('conv_lm_a1', 'file', f.resolve())
    assert e.Configs().kernel == 5
    import hashlib
    assert e.source == {'kind': 'file', 'module': 'conv_lm_a1', 'path': str(f.resolve()),
                        'sha256': hashlib.sha256(f.read_bytes()).hexdigest()}


def test_a_file_named_like_a_standard_module_is_imported_under_another_name(tmp_path, clean_modules):
    f = tmp_path / 'json.py'
    f.write_text(EXPERIMENT)
    e = discovery.find_experiment('json.py', cwd=tmp_path)
    assert e.name == 'json' and e.module_name.startswith('_lazylab_file_') and e.module_name.endswith('_json')
    e.load()
    import json
    assert json.dumps([1]) == '[1]'  # the standard module is untouched


def test_a_dotted_module_is_found_from_the_current_folder(tmp_path, clean_modules, monkeypatch):
    pkg = tmp_path / 'mypkg_d1' / 'exps'
    pkg.mkdir(parents=True)
    (tmp_path / 'mypkg_d1' / '__init__.py').write_text('')
    (pkg / '__init__.py').write_text('')
    (pkg / 'lstm.py').write_text(EXPERIMENT)
    monkeypatch.chdir(tmp_path)
    e = discovery.find_experiment('mypkg_d1.exps.lstm', cwd=tmp_path)
    assert (e.name, e.kind, e.module_name) == ('lstm', 'module', 'mypkg_d1.exps.lstm')
    assert e.Configs().kernel == 5


@pytest.mark.parametrize('written, message', [
    ('missing.py', 'experiment file not found: missing.py'),
    ('./nowhere/x.py', r'experiment file not found: \./nowhere/x\.py'),
    ('feedbak', "unknown experiment 'feedbak'; did you mean 'feedback'\\?"),
    ('no_such_pkg_q.lstm', "unknown experiment 'no_such_pkg_q.lstm'"),
    ('', 'the experiment is empty'),
])
def test_a_name_that_names_nothing_is_one_error(tmp_path, written, message):
    with pytest.raises(UsageError, match=message):
        discovery.find_experiment(written, cwd=tmp_path)


def test_a_built_in_name_that_is_also_a_file_here_is_refused_saying_how_to_name_each(tmp_path):
    (tmp_path / 'feedback.py').write_text(EXPERIMENT)
    with pytest.raises(UsageError, match=r"'feedback' is the builtin experiment lazylab\.experiments\.feedback, and "
                                         r"also a file here \(feedback\.py\); name the file \./feedback\.py"):
        discovery.find_experiment('feedback', cwd=tmp_path)
    assert discovery.find_experiment('./feedback.py', cwd=tmp_path).kind == 'file'


@pytest.mark.parametrize('body, message', [
    ('x = 1\n', r'has no Configs: an experiment defines `class Configs\(TrainerConfigs\)`'),
    ('class Configs:\n    pass\n', r'its Configs is not a TrainerConfigs subclass'),
    ('from lazylab.configs import BaseConfigs\nclass Configs(BaseConfigs):\n    a: int = 1\n',
     'not a TrainerConfigs subclass'),
])
def test_a_module_that_is_no_experiment_is_one_error(tmp_path, clean_modules, body, message):
    (tmp_path / 'not_exp_b2.py').write_text(body)
    with pytest.raises(UsageError, match=message):
        discovery.find_experiment('not_exp_b2.py', cwd=tmp_path).load()


def test_a_module_missing_inside_the_users_code_keeps_its_traceback(tmp_path, clean_modules):
    (tmp_path / 'needs_c3.py').write_text('import surely_not_installed_zz\n' + EXPERIMENT)
    with pytest.raises(ModuleNotFoundError, match='surely_not_installed_zz'):
        discovery.find_experiment('needs_c3.py', cwd=tmp_path).load()


def test_an_entry_point_registers_an_experiment_by_name(tmp_path, clean_modules, monkeypatch):
    site = tmp_path / 'site'
    (site / 'plugpkg_e4').mkdir(parents=True)
    (site / 'plugpkg_e4' / '__init__.py').write_text('')
    (site / 'plugpkg_e4' / 'lstm.py').write_text(EXPERIMENT)
    info = site / 'plugpkg_e4-1.2.dist-info'
    info.mkdir()
    (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: plugpkg_e4\nVersion: 1.2\n')
    (info / 'entry_points.txt').write_text('[lazylab.experiments]\nlstm_e4 = plugpkg_e4.lstm\n')
    monkeypatch.syspath_prepend(str(site))
    assert 'lstm_e4' in discovery.registered()
    e = discovery.find_experiment('lstm_e4', cwd=tmp_path)
    assert (e.name, e.kind, e.module_name, e.distribution) == ('lstm_e4', 'entry_point', 'plugpkg_e4.lstm',
                                                               'plugpkg_e4')
    assert e.source == {'kind': 'entry_point', 'module': 'plugpkg_e4.lstm', 'distribution': 'plugpkg_e4',
                        'version': '1.2'}
    assert e.Configs().kernel == 5


def test_from_source_finds_a_file_again_and_warns_once_when_it_changed(tmp_path, clean_modules):
    f = tmp_path / 'again_f5.py'
    f.write_text(EXPERIMENT)
    source = discovery.find_experiment(str(f)).source
    warned: list[str] = []
    assert discovery.from_source('again_f5', source, warn=warned.append).path == f.resolve()
    assert warned == []
    f.write_text(EXPERIMENT + '\n# edited\n')
    discovery.from_source('again_f5', source, warn=warned.append)
    assert len(warned) == 1 and 'changed since the run started' in warned[0] and str(f) in warned[0]
    f.unlink()
    with pytest.raises(UsageError, match='experiment file of this run is gone'):
        discovery.from_source('again_f5', source)
    assert discovery.from_source('feedback', None).module_name == 'lazylab.experiments.feedback'
