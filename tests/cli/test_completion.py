"""TAB completion (issue 36, item 1): `lazylab completion bash|zsh|fish`, and what a TAB offers — driven through
argcomplete's protocol (COMP_LINE, COMP_POINT, _ARGCOMPLETE) in this process, and once through a real bash with the
printed script loaded."""
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lazylab.cli import COMMANDS, completion, key_cache
from lazylab.testing import lazylab_env, run_lazylab

#: a .py experiment with a key of each kind TAB completes the values of
OWN = textwrap.dedent('''
    """An experiment for the completion tests."""
    from typing import Literal

    from torch import nn

    from lazylab.configs import option
    from lazylab.experiments import NLPAutoRegressionConfigs


    class Configs(NLPAutoRegressionConfigs):
        model: nn.Module = 'lstm'
        hidden_width: int = 8               # LSTM width
        use_bias: bool = True
        cell: Literal['lstm', 'gru'] = 'lstm'


    @option(Configs.model, 'lstm')
    def _lstm(c: Configs):
        return nn.LSTM(c.hidden_width, c.hidden_width)


    @option(Configs.model, 'linear')
    def _linear(c: Configs):
        return nn.Linear(c.hidden_width, c.hidden_width)
''')


@pytest.fixture
def here(tmp_path, monkeypatch):
    """An empty folder to complete in, with its own key cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / '.cache'))
    return tmp_path


def tab(line: str, monkeypatch) -> list[str]:
    """The candidates a TAB at the end of `line` gets (as argcomplete hands them to the shell)."""
    out = io.StringIO()
    for name, value in {'COMP_LINE': line, 'COMP_POINT': str(len(line)), '_ARGCOMPLETE': '1',
                        '_ARGCOMPLETE_IFS': '\n', '_ARGCOMPLETE_SHELL': 'bash'}.items():
        monkeypatch.setenv(name, value)
    exits = []
    completion.complete(COMMANDS, output=out, exit_method=exits.append)
    assert exits == [0]
    return out.getvalue().split('\n') if out.getvalue() else []


def no_child(*args, **kwargs):
    raise AssertionError(f'a child process was started: {args}')


def test_tab_completes_commands_and_flags(here, monkeypatch):
    assert tab('lazylab ', monkeypatch) == ['train', 'options', 'resume', 'generate', 'plot', 'labml', 'sweep',
                                            'compare', 'diff', 'dashboard', 'new', 'schema', 'completion']
    assert tab('lazylab tr', monkeypatch) == ['train ']
    assert tab('lazylab train transformer --', monkeypatch) == ['--help', '--config', '--allow-changes', '--slurm',
                                                                '--wait']
    assert tab('lazylab options transformer --f', monkeypatch) == ['--format ']
    assert tab('lazylab options transformer --format ', monkeypatch) == ['text', 'yaml']
    assert tab('lazylab completion ', monkeypatch) == ['bash', 'zsh', 'fish']


def test_tab_completes_experiments_by_name_and_py_files(here, monkeypatch):
    (here / 'my_lstm.py').write_text(OWN)
    (here / 'notes.txt').write_text('')
    (here / 'exps').mkdir()
    assert tab('lazylab train ', monkeypatch) == ['feedback', 'fast_weights', 'transformer', 'retrieval', 'mqar',
                                                  'state_tracking', 'exps/', 'my_lstm.py']
    assert tab('lazylab options f', monkeypatch) == ['feedback', 'fast_weights']
    assert tab('lazylab train my', monkeypatch) == ['my_lstm.py ']
    assert tab('lazylab sweep tra', monkeypatch) == ['transformer ']


def test_tab_completes_a_builtin_experiments_keys_full_and_by_unique_ends(here, monkeypatch):
    assert tab('lazylab train transformer d_mo', monkeypatch) == ['d_model=']
    assert tab('lazylab train transformer transformer.ffn.glu', monkeypatch) == ['transformer.ffn.glu_variant=']
    assert tab('lazylab train transformer ffn.glu', monkeypatch) == ['ffn.glu_variant=']
    assert tab('lazylab train transformer glu_v', monkeypatch) == ['glu_variant=']
    assert tab('lazylab train transformer glu_variant=', monkeypatch) == [
        'glu_variant=GLU', 'glu_variant=Bilinear', 'glu_variant=ReGLU', 'glu_variant=GEGLU', 'glu_variant=SwiGLU',
        'glu_variant=none']
    assert tab('lazylab train transformer glu_variant=Sw', monkeypatch) == ['glu_variant=SwiGLU ']
    assert tab('lazylab train transformer transformer.ffn.is_gated=', monkeypatch) == [
        'transformer.ffn.is_gated=True', 'transformer.ffn.is_gated=False']
    assert tab('lazylab train transformer preset=', monkeypatch) == ['preset=labml_nn ']
    # after a flag and its value, settings are completed as before it (argparse filled them before the flag)
    assert tab('lazylab train transformer --config my.yaml d_mo', monkeypatch) == ['d_model=']
    assert tab('lazylab options transformer seed=3 d_mo', monkeypatch) == ['d_model=']
    # a sweep's first setting is its experiment; each value of a list is completed
    assert tab('lazylab sweep transformer glu_variant=GLU,Sw', monkeypatch) == ['glu_variant=GLU,SwiGLU ']
    assert tab('lazylab train nosuch d_mo', monkeypatch) == []


def test_a_py_experiments_keys_are_listed_once_by_a_child_then_read_from_the_cache(here, monkeypatch):
    (here / 'my_lstm.py').write_text(OWN)
    assert tab('lazylab train my_lstm.py hidden_w', monkeypatch) == ['hidden_width=']
    [cached] = (here / '.cache' / 'lazylab' / 'keys').iterdir()
    assert cached.name == key_cache.fingerprint(here / 'my_lstm.py') + '.json'
    keys = {k['name']: k for k in json.loads(cached.read_text())['keys']}
    assert keys['hidden_width'] == {'name': 'hidden_width', 'values': [], 'help': 'LSTM width'}
    monkeypatch.setattr(key_cache.subprocess, 'run', no_child)
    assert tab('lazylab train my_lstm.py use_bias=', monkeypatch) == ['use_bias=True', 'use_bias=False']
    assert tab('lazylab train ./my_lstm.py cell=', monkeypatch) == ['cell=lstm', 'cell=gru']
    assert tab('lazylab train my_lstm.py model=', monkeypatch) == ['model=lstm', 'model=linear']
    assert tab('lazylab train my_lstm.py optimizer.learning_r', monkeypatch) == ['optimizer.learning_rate=']

    (here / 'my_lstm.py').write_text(OWN.replace('hidden_width', 'width'))  # a new sha: listed again
    monkeypatch.undo()
    monkeypatch.chdir(here)
    monkeypatch.setenv('XDG_CACHE_HOME', str(here / '.cache'))
    assert tab('lazylab train my_lstm.py hidden_w', monkeypatch) == []
    assert tab('lazylab train my_lstm.py wid', monkeypatch) == ['width=']


def test_an_experiment_that_fails_to_import_offers_no_keys_and_is_not_imported_again(here, monkeypatch):
    (here / 'broken.py').write_text('raise RuntimeError("no")\n')
    assert tab('lazylab train broken.py d_mo', monkeypatch) == []
    [cached] = (here / '.cache' / 'lazylab' / 'keys').iterdir()
    assert json.loads(cached.read_text())['error'] == 'RuntimeError: no'
    monkeypatch.setattr(key_cache.subprocess, 'run', no_child)
    assert tab('lazylab train broken.py d_mo', monkeypatch) == []


def test_tab_completes_run_and_sweep_directories(here, monkeypatch):
    run = here / 'runs' / 'transformer' / '20260101-000000-abcd'
    run.mkdir(parents=True)
    (run / 'run.json').write_text('{}')
    sweep = here / 'runs' / 'transformer' / 'sweep-x'
    sweep.mkdir()
    (sweep / 'sweep.yaml').write_text('')
    (here / 'runs' / 'empty').mkdir()
    (here / 'other').mkdir()
    assert tab('lazylab resume ', monkeypatch) == ['runs/']
    assert tab('lazylab resume runs/', monkeypatch) == ['runs/transformer/']
    assert tab('lazylab generate runs/transformer/', monkeypatch) == ['runs/transformer/20260101-000000-abcd ']
    assert tab('lazylab diff runs/transformer/2026 runs/transformer/', monkeypatch) == [
        'runs/transformer/20260101-000000-abcd ']
    assert tab('lazylab compare runs/transformer/', monkeypatch) == [
        'runs/transformer/20260101-000000-abcd', 'runs/transformer/sweep-x']
    assert tab('lazylab sweep --resume runs/transformer/', monkeypatch) == ['runs/transformer/sweep-x ']


def test_a_cached_tab_imports_no_torch(here):
    script = textwrap.dedent('''
        import io, os, sys
        os.environ.update(COMP_LINE='lazylab train transformer d_mo', COMP_POINT='30', _ARGCOMPLETE='1',
                          _ARGCOMPLETE_IFS=' ')
        from lazylab.cli import COMMANDS, completion
        out = io.StringIO()
        completion.complete(COMMANDS, output=out, exit_method=lambda code: None)
        print(out.getvalue(), 'torch' in sys.modules)
    ''')
    env = lazylab_env(XDG_CACHE_HOME=str(here / '.cache'))
    first = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True, text=True, timeout=120)
    assert first.stdout == 'd_model= False\n', first.stderr  # (the child imported torch, not this process)
    again = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True, text=True, timeout=120)
    assert again.stdout == 'd_model= False\n', again.stderr


@pytest.mark.skipif(shutil.which('bash') is None, reason='needs bash to load the completion script into')
def test_bash_with_the_printed_script_loaded_completes_a_key(here):
    printed = run_lazylab('completion', 'bash')
    assert printed.returncode == 0, printed.stderr
    (here / 'lazylab.bash').write_text(printed.stdout)
    bin_dir = here / 'bin'  # `lazylab` as the shell finds it: this checkout's, with this interpreter
    bin_dir.mkdir()
    (bin_dir / 'lazylab').write_text(f'#!/bin/sh\nexec {sys.executable} -m lazylab.cli "$@"\n')
    (bin_dir / 'lazylab').chmod(0o755)
    script = ('source ./lazylab.bash\n'
              'COMP_LINE="lazylab train transformer d_mo"; COMP_POINT=${#COMP_LINE}\n'
              'COMP_WORDS=(lazylab train transformer d_mo); COMP_CWORD=3\n'
              '_python_argcomplete lazylab 2>/dev/null\n'
              'printf "<%s>\\n" "${COMPREPLY[@]}"\n')
    env = lazylab_env(XDG_CACHE_HOME=str(here / '.cache'), PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}')
    done = subprocess.run(['bash', '-c', script], cwd=here, env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout == '<d_model=>\n', done.stderr


@pytest.mark.parametrize('shell, where', [('bash', 'complete -o nospace -o default -o bashdefault -F '
                                                   '_python_argcomplete lazylab'),
                                          ('zsh', '#compdef lazylab'),
                                          ('fish', "complete --command lazylab -f -a '(__fish_lazylab_complete)'")])
def test_lazylab_completion_prints_each_shells_script(shell, where):
    done = run_lazylab('completion', shell)
    assert done.returncode == 0 and where in done.stdout, done.stderr


def test_lazylab_completion_of_an_unknown_shell_is_one_line():
    done = run_lazylab('completion', 'tcsh')
    assert done.returncode == 2 and done.stdout == ''
    # (argparse quotes the choices or not, by Python version)
    assert done.stderr.startswith("lazylab: error: argument shell: invalid choice: 'tcsh' (choose from ")
    assert re.search(r"fish'?\) \(see: lazylab completion --help\)\n$", done.stderr) and done.stderr.count('\n') == 1


def test_experiment_file_finds_modules_without_importing_them(tmp_path):
    assert key_cache.experiment_file('transformer', tmp_path) == \
        Path(completion.__file__).parent.parent / 'experiments' / 'transformer.py'
    assert key_cache.experiment_file('nosuch.py', tmp_path) is None
    (tmp_path / 'pkg').mkdir()
    (tmp_path / 'pkg' / '__init__.py').write_text('raise ImportError("never imported")\n')
    (tmp_path / 'pkg' / 'exp.py').write_text('')
    assert key_cache.experiment_file('pkg.exp', tmp_path) == tmp_path / 'pkg' / 'exp.py'
