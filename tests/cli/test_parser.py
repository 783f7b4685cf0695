"""lazylab.cli: the one parser class, the key=value splitter, --version and `python -m lazylab`."""
import subprocess
import sys

import pytest

import lazylab
from lazylab import cli
from lazylab.command_line import HelpShown, Parser
from lazylab.errors import UsageError


def _sweep_like() -> Parser:
    p = Parser('sweep')
    p.add_argument('experiment')
    p.add_argument('--launcher')
    p.add_argument('--workers', type=int, default=1)
    p.add_argument('--dry-run', action='store_true')
    return p


def test_settings_are_the_key_value_tokens_after_the_positionals_and_a_flag_takes_its_value_whole():
    a, settings = _sweep_like().parse_with_settings(
        ['feedback', 'd_model=64,128', '--launcher', 'torchrun --nproc_per_node=2', 'lr=1e-3', '--dry-run',
         '--workers=2'])
    assert (a.experiment, a.launcher, a.workers, a.dry_run) == ('feedback', 'torchrun --nproc_per_node=2', 2, True)
    assert settings == ['d_model=64,128', 'lr=1e-3']


def test_a_positional_may_hold_an_equals_sign_and_a_later_bare_word_is_one_error():
    a, settings = _sweep_like().parse_with_settings(['./exp=1.py', 'a=1'])
    assert a.experiment == './exp=1.py' and settings == ['a=1']
    with pytest.raises(UsageError, match=r"^unexpected argument 'oops': give settings as key=value \(see: lazylab "
                                         r"sweep --help\)$"):
        _sweep_like().parse_with_settings(['feedback', 'oops'])


@pytest.mark.parametrize('argv, message', [
    (['feedback', '--workers', 'two'], r"argument --workers: invalid int value: 'two' \(see: lazylab sweep --help\)"),
    (['feedback', '--nope'], r"^unknown option '--nope' \(see: lazylab sweep --help\)$"),
    (['feedback', '--work', '2'], r"^unknown option '--work'"),  # no abbreviations
    (['feedback', '--work=2'], r"^unknown option '--work'"),
    ([], r'the following arguments are required: experiment'),
])
def test_argparse_mistakes_are_one_usage_error_line(argv, message):
    with pytest.raises(UsageError, match=message):
        _sweep_like().parse_with_settings(argv)


def test_help_returns_from_the_command_instead_of_exiting(capsys):
    with pytest.raises(HelpShown):
        _sweep_like().parse_with_settings(['--help'])
    assert capsys.readouterr().out.startswith('usage: lazylab sweep [-h]')


def test_one_error_prefix_for_a_command_line_mistake(capsys):
    assert cli.main(['generate', 'RUN']) == 2
    err = capsys.readouterr().err
    assert err == ('lazylab: error: the following arguments are required: --prompt, --tokens (see: lazylab generate '
                   '--help)\n')


def test_version_and_python_dash_m_lazylab(capsys):
    assert cli.main(['--version']) == 0
    assert capsys.readouterr().out == f'lazylab {lazylab.__version__}\n'
    out = subprocess.run([sys.executable, '-m', 'lazylab', '--version'], capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (0, f'lazylab {lazylab.__version__}\n')
    out = subprocess.run([sys.executable, '-m', 'lazylab.cli', 'nope'], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("lazylab: error: unknown command 'nope'")


def test_the_help_of_the_command_line_imports_no_torch():
    code = 'import sys; from lazylab import cli; cli.main(["--help"]); print("torch" in sys.modules)'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith('False')


@pytest.mark.parametrize('name', sorted(cli.COMMANDS))
def test_every_command_module_has_a_parser_named_after_it(name):
    assert cli.command(name).parser().prog == f'lazylab {name}'


def test_the_public_experiment_api_imports_torch_only_when_a_name_is_used():
    code = ('import sys, lazylab.experiments as e; before = "torch" in sys.modules; names = sorted(e.__all__); '
            'c = e.TrainerConfigs; print(before, "torch" in sys.modules, c.__module__, names)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.split(' ', 3)
    assert out[:3] == ['False', 'True', 'lazylab.experiments.trainer']
    assert out[3].strip() == str(sorted(['TrainerConfigs', 'NLPAutoRegressionConfigs', 'TextTask', 'device_of',
                                         'LABML_NN_PRESET', 'Task', 'Batch', 'BatchLoss', 'evaluate', 'main']))


def test_lazylab_help_lists_the_built_in_experiments(capsys):
    assert cli.main(['--help']) == 0
    out = capsys.readouterr().out
    assert 'lazylab new NAME [--task text|custom]' in out
    assert out.rstrip().splitlines()[-1] == ('experiments: feedback, fast_weights, transformer, retrieval, mqar, '
                                             'state_tracking (built-in); or a .py file, or a dotted module')
