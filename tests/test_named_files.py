"""Files, names and values a user gives on the command line, checked before anything reads, writes or makes them
(issue 34): a `--config` that never ends (/dev/zero), blocks (a FIFO) or is huge, under train, sweep (with and
without --dry-run) and labml; a text over its limit; a FIFO as compare's or plot's output; a run's configs.yaml over
its limit; `lazylab new` with a name no file system holds; keys and paths with control characters; an int key
given a float's spelling. Each is one line `lazylab: error: …`, exit code 2, nothing written.

The processes that would hang or grow without the checks run with a timeout and a cap on their data memory
(RLIMIT_DATA): without the checks they end by the timeout or a MemoryError traceback, never by taking the machine.
"""
import os
import resource
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazylab import cli
from lazylab.configs import OverrideSyntaxError, parse_overrides
from lazylab.errors import shown
from lazylab.testing import TINY, lazylab_argv, lazylab_env

#: the data memory (heap and anonymous maps) a checked command may take: importing torch needs a few hundred MB;
#: reading /dev/zero whole passes 2 GB within seconds
DATA_LIMIT = 2 << 30
#: a child that hangs (a FIFO opened for reading) fails the test at this timeout, not at pytest's
TIMEOUT = 120


def _capped():
    resource.setrlimit(resource.RLIMIT_DATA, (DATA_LIMIT, DATA_LIMIT))


def _lazylab(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`lazylab ARGV` in a child process in `cwd`, with its data memory capped and a timeout."""
    return subprocess.run(lazylab_argv(*argv), cwd=cwd, env=lazylab_env(**env), capture_output=True, text=True,
                          timeout=TIMEOUT, preexec_fn=_capped)


def _everything(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob('*')}


def _one_line(done: subprocess.CompletedProcess) -> str:
    """The message of the one `lazylab: error: …` line a process ended with (exit code 2, nothing on stdout)."""
    assert (done.returncode, done.stdout) == (2, ''), done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith('lazylab: error: '), done.stderr[-2000:]
    return lines[0][len('lazylab: error: '):]


CONFIG_COMMANDS = {
    'train': ['train', 'transformer', '--config', '{config}'],
    'sweep --dry-run': ['sweep', 'transformer', 'd_model=16,32', '--config', '{config}', '--dry-run'],
    'sweep': ['sweep', 'transformer', 'd_model=16,32', '--config', '{config}'],
    'labml': ['labml', 'script.py', '--config', '{config}'],
}


@pytest.mark.parametrize('command', CONFIG_COMMANDS)
@pytest.mark.parametrize('config, what', [('/dev/zero', 'a character device'), ('fifo.yaml', 'a FIFO (named pipe)')])
def test_a_config_that_never_ends_or_blocks_is_one_line_at_once_and_nothing_is_written(tmp_path, command, config,
                                                                                        what):
    """`--config /dev/zero` grew to 4.2 GB under train and 23.8 GB under sweep; `--config FIFO` blocked forever."""
    if config == 'fifo.yaml':
        os.mkfifo(tmp_path / config)  # no writer ever comes
    before = _everything(tmp_path)
    argv = [a.format(config=config) for a in CONFIG_COMMANDS[command]]
    assert _one_line(_lazylab(argv, tmp_path)) == f'config file {config} is {what}, not a regular file'
    assert _everything(tmp_path) == before


@pytest.mark.parametrize('command', ['train', 'sweep --dry-run', 'labml'])
def test_a_config_that_is_not_a_regular_file_is_refused_before_torch_is_imported(tmp_path, command):
    """Within a moment, not after torch's import (a second and more): a torch that cannot be imported shows it."""
    fake = tmp_path / 'no-torch'
    (fake / 'torch').mkdir(parents=True)
    (fake / 'torch' / '__init__.py').write_text('raise ImportError("torch was imported")\n')
    argv = [a.format(config='/dev/zero') for a in CONFIG_COMMANDS[command]]
    done = _lazylab(argv, tmp_path, PYTHONPATH=f'{fake}{os.pathsep}{lazylab_env()["PYTHONPATH"]}')
    assert _one_line(done) == 'config file /dev/zero is a character device, not a regular file'


def test_a_config_of_108_mb_is_refused_by_its_size_at_once(tmp_path):
    """A 108 MB YAML file had not been read after 240 s (1.1 GB); its size alone refuses it now."""
    with open(tmp_path / 'big.yaml', 'wb') as f:
        f.truncate(108_000_000)  # sparse: the size is what is checked, before a byte is read
    done = _lazylab(['train', 'transformer', '--config', 'big.yaml'], tmp_path)
    assert _one_line(done) == ('config file big.yaml is 108.0 MB, more than the 1.0 MB lazylab reads (set '
                               'LAZYLAB_MAX_CONFIG_MB to a larger number of megabytes to read it)')
    assert _everything(tmp_path) == {'big.yaml'}


def test_a_text_over_its_limit_is_refused_by_its_size_before_it_is_read(tmp_path):
    with open(tmp_path / 'huge.txt', 'wb') as f:
        f.truncate(300_000_000)
    done = _lazylab(['train', 'transformer', *TINY, 'text=huge.txt', 'runs_dir=runs'], tmp_path)
    assert _one_line(done) == ('text file huge.txt is 300.0 MB, more than the 256.0 MB lazylab reads (set '
                               'LAZYLAB_MAX_TEXT_MB to a larger number of megabytes to read it)')
    assert _everything(tmp_path) == {'huge.txt'}


@pytest.mark.parametrize('argv, flag', [
    (['compare', '{run}', '--csv', 'out.csv'], '--csv'),
    (['compare', '{run}', '--plot', 'out.png'], '--plot'),
    (['plot', '{run}', '-o', 'out.png'], '-o'),
])
def test_a_fifo_as_an_output_file_is_one_line_and_nothing_is_written_into_it(short_run, tmp_path, argv, flag):
    """A FIFO as --csv's, --plot's or -o's target blocked the writer until a reader came (forever)."""
    target = argv[-1]
    os.mkfifo(tmp_path / target)
    done = _lazylab([a.format(run=short_run) for a in argv], tmp_path)
    assert _one_line(done) == (f'{flag} {target} is a FIFO (named pipe), not a regular file: give the name of a file '
                               f'to write')
    assert _everything(tmp_path) == {target} and stat.S_ISFIFO(os.stat(tmp_path / target).st_mode)


@pytest.mark.parametrize('command', [['resume', '{run}'], ['generate', '{run}', '--prompt', 'a', '--tokens', '1']])
def test_a_runs_configs_yaml_over_the_limit_is_one_line_for_resume_and_generate(short_run, tmp_path, cli_error,
                                                                                command):
    import shutil
    run = tmp_path / 'run'
    shutil.copytree(short_run, run)
    with open(run / 'configs.yaml', 'r+b') as f:
        f.truncate(5_000_000)  # the dump, then 5 MB of NULs
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    assert cli_error([a.format(run=run) for a in command]) == (
        f'configs.yaml {run}/configs.yaml is 5.0 MB, more than the 1.0 MB lazylab reads (set LAZYLAB_MAX_CONFIG_MB '
        f'to a larger number of megabytes to read it)')
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before


# ---- lazylab new ---------------------------------------------------------------------------------------------------

def test_lazylab_new_refuses_a_name_longer_than_the_file_system_holds(tmp_path, monkeypatch, cli_error):
    """300 characters: `OSError: [Errno 36] File name too long` and a traceback before."""
    monkeypatch.chdir(tmp_path)
    name = 'a' * 300
    assert cli_error(['new', name]) == (f"NAME {shown(name)} is too long: aaaaaaaa….py would be a file name of 303 "
                                        f"bytes, and the file system of . holds at most 255; choose a shorter NAME")
    name = 'é' * 127  # 127 characters, 254 bytes, and 3 more for .py
    assert 'would be a file name of 257 bytes' in cli_error(['new', name])
    assert list(tmp_path.iterdir()) == []


def test_lazylab_new_in_a_folder_it_cannot_write_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, cli_error):
    """A read-only folder (EROFS: a remounted disk; as root, chmod would not stop the write, so open() says it)."""
    import errno

    from lazylab.experiments import templates

    def read_only(path, mode='r', *args, **kwargs):
        raise OSError(errno.EROFS, 'Read-only file system', str(path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(templates, 'open', read_only, raising=False)
    assert cli_error(['new', 'mine']) == 'cannot write mine.py: Read-only file system'
    assert list(tmp_path.iterdir()) == []


# ---- control characters in keys and paths --------------------------------------------------------------------------

CONTROL = st.characters(categories=['Cc'])  # C0 (\n, \r, \t, NUL, ESC, …), DEL and C1
KEYS = st.sampled_from(['d_model', 'heads', 'optimizer.learning_rate', 'ffn.glu_variant'])
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def keys_with_a_control_character(draw) -> tuple[str, str]:
    """(a key with control characters put in it, before, inside or after: 'd_model\\n'; its first one)."""
    key = draw(KEYS)
    at = draw(st.integers(0, len(key)))
    put = draw(st.text(CONTROL, min_size=1, max_size=2))
    return key[:at] + put + key[at:], put[0]


@FUZZ
@given(drawn=keys_with_a_control_character())
def test_a_key_with_a_control_character_is_refused_naming_it_escaped(tmp_path, capsys, drawn):
    """`$'d_model\\n'=16` was taken as d_model=16 (the key stripped); now every command refuses it, and so does
    the engine's parser, with the key and the character escaped."""
    key, bad = drawn
    token = f'{key}=16'
    message = f'bad key {key!r} in {shown(token)}: a key holds no control characters, and this one holds {bad!r}'
    with pytest.raises(OverrideSyntaxError) as e:
        parse_overrides([token])
    assert str(e.value) == message
    runs = tmp_path / 'runs'
    for argv in (['train', 'transformer', *TINY, f'runs_dir={runs}', token],
                 ['sweep', 'transformer', token, 'seed=1,2', '--dry-run'],
                 ['labml', 'script.py', token]):
        assert cli.main(argv) == 2
        assert capsys.readouterr().err == f'lazylab: error: {message}\n'
    assert not runs.exists()


@FUZZ
@given(key=st.sampled_from(['runs_dir', 'text']), bad=CONTROL, at=st.integers(0, 3))
def test_a_path_setting_with_a_control_character_is_refused_and_nothing_is_made(tmp_path, monkeypatch, capsys, key,
                                                                                 bad, at):
    """`runs_dir=$'r\\nnl'` made a folder whose name held a newline (and split the "run dir" line in two)."""
    monkeypatch.chdir(tmp_path)
    value = 'runs'[:at] + bad + 'runs'[at:]
    assert cli.main(['train', 'transformer', *TINY, f'{key}={value}']) == 2
    assert capsys.readouterr().err == \
        f'lazylab: error: bad value for {key}: must be free of control characters, got {shown(value)}\n'
    assert list(tmp_path.iterdir()) == []


@FUZZ
@given(bad=CONTROL)
def test_a_runs_dir_flag_with_a_control_character_is_refused(tmp_path, monkeypatch, capsys, bad):
    monkeypatch.chdir(tmp_path)
    value = f'r{bad}x'
    assert cli.main(['labml', 'script.py', '--runs-dir', value]) == 2
    assert capsys.readouterr().err == \
        f'lazylab: error: --runs-dir {value!r}: a path holds no control characters, and this one holds {bad!r}\n'
    assert list(tmp_path.iterdir()) == []


# ---- an int key given a float's spelling ---------------------------------------------------------------------------

@pytest.mark.parametrize('given_as, message', [
    ('max_steps=1e3', "bad value for max_steps: expected int, got '1e3' (write 1000)"),
    ('max_steps=2.0', "bad value for max_steps: expected int, got '2.0' (write 2)"),
    ('max_steps=1.5e3', "bad value for max_steps: expected int, got '1.5e3' (write 1500)"),
    ('max_steps=2.5', "bad value for max_steps: expected int, got '2.5'"),
    ('max_steps: 1000.0', 'bad value for max_steps: expected int, got 1000.0 (write 1000)'),  # a YAML float
    ('max_steps: 1e3', "bad value for max_steps: expected int, got '1e3' (write 1000)"),  # YAML 1.1: a string
])
def test_an_int_key_given_a_floats_spelling_is_refused_saying_what_to_write(tmp_path, cli_error, given_as, message):
    """`max_steps=1e3` was taken as 1000: an int key takes an integer's spelling only, as int() and argparse do."""
    runs = tmp_path / 'runs'
    argv = ['train', 'transformer', *TINY, f'runs_dir={runs}']
    if ': ' in given_as:
        (tmp_path / 'c.yaml').write_text(given_as + '\n')
        argv += ['--config', str(tmp_path / 'c.yaml')]
    else:
        argv.append(given_as)
    assert cli_error(argv) == message
    assert not runs.exists()
