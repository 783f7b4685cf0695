"""lazylab.user_files: the one reader of the files a user names, the check of the files lazylab writes, and the
control characters refused in keys and paths (in-process, no torch).

The command-line cases (`--config /dev/zero`, a FIFO, a file of 108 MB under train, sweep and labml; --text;
compare's and plot's targets) are in tests/test_named_files.py."""
import os
import re
import socket
import stat
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lazylab import user_files
from lazylab.errors import DataError, UsageError
from lazylab.user_files import (
    CONFIG,
    TEXT,
    check_file,
    check_output_file,
    control_character,
    read_bytes,
    read_text,
)


@pytest.fixture
def unix_socket(tmp_path):
    """A listening Unix socket in tmp_path (its path, short enough for AF_UNIX's 108 bytes, or the test skips)."""
    path = tmp_path / 's'
    if len(os.fsencode(path)) > 100:
        pytest.skip('tmp_path is too long for a Unix socket')
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        yield path


@pytest.mark.parametrize('kind', ['FIFO', 'character device', 'directory', 'socket'])
def test_a_file_that_is_not_a_regular_one_is_refused_by_what_it_is_before_it_is_opened(tmp_path, unix_socket, kind):
    if kind == 'FIFO':
        path = tmp_path / 'config.yaml'
        os.mkfifo(path)  # no writer: open() without O_NONBLOCK, or a read, would wait forever
        what = 'a FIFO (named pipe)'
    else:
        path, what = {'character device': ('/dev/zero', 'a character device'), 'directory': (tmp_path, 'a directory'),
                      'socket': (unix_socket, 'a socket')}[kind]
    with pytest.raises(UsageError) as e:
        read_text(path, 'config file')
    assert str(e.value) == f'config file {path} is {what}, not a regular file'


def test_a_text_is_refused_as_a_data_error_naming_it(tmp_path):
    os.mkfifo(tmp_path / 'text.txt')
    with pytest.raises(DataError, match=r'^text file .*/text.txt is a FIFO \(named pipe\), not a regular file$'):
        read_bytes(tmp_path / 'text.txt', 'text file', TEXT, DataError)


def test_a_file_over_the_limit_is_refused_by_its_size_without_being_read(tmp_path, monkeypatch):
    big = tmp_path / 'big.yaml'
    with open(big, 'wb') as f:
        f.truncate(108_000_000)  # sparse: 108 MB by its size, nothing on the disk
    monkeypatch.delenv('LAZYLAB_MAX_CONFIG_MB', raising=False)
    reads = []
    monkeypatch.setattr(os, 'read', lambda fd, n: reads.append(n) or b'')
    with pytest.raises(UsageError) as e:
        read_bytes(big, 'config file')
    assert str(e.value) == (f'config file {big} is 108.0 MB, more than the 1.0 MB lazylab reads (set '
                            f'LAZYLAB_MAX_CONFIG_MB to a larger number of megabytes to read it)')
    assert reads == []


def test_check_file_says_what_read_bytes_would_without_opening_the_file(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / 'fifo.yaml')
    with open(tmp_path / 'big.yaml', 'wb') as f:
        f.truncate(2_000_000)
    (tmp_path / 'fine.yaml').write_text('a: 1\n')
    monkeypatch.setattr(os, 'open', lambda *args: pytest.fail('check_file opened a file'))
    for name, message in (('fifo.yaml', 'is a FIFO (named pipe), not a regular file'),
                          ('big.yaml', 'is 2.0 MB, more than the 1.0 MB lazylab reads')):
        with pytest.raises(UsageError, match=f'^config file {tmp_path}/{name} {re.escape(message)}'):
            check_file(tmp_path / name, 'config file', CONFIG)
    check_file(tmp_path / 'fine.yaml', 'config file', CONFIG)


def test_the_limit_is_set_by_its_environment_variable(tmp_path, monkeypatch):
    path = tmp_path / 'two.yaml'
    path.write_bytes(b'a: 1\n' * 400_000)  # 2 MB
    monkeypatch.setenv('LAZYLAB_MAX_CONFIG_MB', '3')
    assert read_bytes(path, 'config file') == b'a: 1\n' * 400_000
    monkeypatch.setenv('LAZYLAB_MAX_CONFIG_MB', '1.5')
    with pytest.raises(UsageError, match=r'is 2\.0 MB, more than the 1\.5 MB lazylab reads'):
        read_bytes(path, 'config file')
    monkeypatch.setenv('LAZYLAB_MAX_CONFIG_MB', '1e308')  # as good as no limit
    assert len(read_bytes(path, 'config file')) == 2_000_000


@pytest.mark.parametrize('value', ['abc', '0', '-1', 'inf', 'nan'])
def test_a_limit_variable_that_is_not_a_positive_number_is_one_line_naming_it(tmp_path, monkeypatch, value):
    (tmp_path / 'c.yaml').write_text('a: 1\n')
    monkeypatch.setenv('LAZYLAB_MAX_TEXT_MB', value)
    with pytest.raises(DataError) as e:
        read_bytes(tmp_path / 'c.yaml', 'text file', TEXT, DataError)
    assert str(e.value) == f'LAZYLAB_MAX_TEXT_MB={value!r}: expected a number of megabytes > 0'


def test_the_reader_never_asks_for_more_than_the_limit_and_one_byte(monkeypatch):
    """/proc/self/maps is a regular file whose stat size is 0 and whose text is longer than a kilobyte: the reader
    stops at the limit + 1 bytes and says the file is larger, as it would of a file that grows while it is read."""
    monkeypatch.setenv('LAZYLAB_MAX_CONFIG_MB', '0.001')  # 1,000 bytes
    assert os.stat('/proc/self/maps').st_size == 0
    asked = []
    real_read = os.read
    monkeypatch.setattr(os, 'read', lambda fd, n: asked.append(n) or real_read(fd, n))
    with pytest.raises(UsageError) as e:
        read_bytes('/proc/self/maps', 'config file')
    assert str(e.value) == ('config file /proc/self/maps grew, while it was read, to more than the 1,000 bytes '
                            'lazylab reads (set LAZYLAB_MAX_CONFIG_MB to a larger number of megabytes to read it)')
    assert sum(asked) <= 1_001


def test_a_regular_file_is_read_whole_in_one_read(tmp_path, monkeypatch):
    path = tmp_path / 'c.yaml'
    path.write_text('d_model: 16\n# é\n', encoding='utf-8')
    calls = []
    real_read = os.read
    monkeypatch.setattr(os, 'read', lambda fd, n: calls.append(n) or real_read(fd, n))
    assert read_text(path, 'config file', CONFIG) == 'd_model: 16\n# é\n'
    assert len(calls) == 2 and calls[0] == path.stat().st_size + 1  # the whole file, then the end


@pytest.mark.parametrize('name, message', [
    ('missing.yaml', 'config file not found: {tmp}/missing.yaml'),
    ('new\nline.yaml', "config file not found: '{tmp}/new\\nline.yaml'"),
    ('nul\x00.yaml', "not a usable config file path: '{tmp}/nul\\x00.yaml'"),
])
def test_a_path_that_cannot_be_read_is_one_line_with_its_control_characters_escaped(tmp_path, name, message):
    with pytest.raises(UsageError) as e:
        read_text(f'{tmp_path}/{name}', 'config file')
    assert str(e.value) == message.format(tmp=tmp_path) and '\n' not in str(e.value)


def test_a_file_that_is_not_utf8_is_one_line_with_the_offset(tmp_path):
    (tmp_path / 'c.yaml').write_bytes(b'a: caf\xe9\n')
    with pytest.raises(UsageError) as e:
        read_text(tmp_path / 'c.yaml', 'config file')
    assert str(e.value) == f'config file {tmp_path}/c.yaml is not UTF-8 text: invalid byte 0xe9 at byte offset 6'


@pytest.mark.parametrize('kind', ['FIFO', 'character device', 'directory'])
def test_an_output_file_that_is_not_a_regular_one_is_refused_before_anything_opens_it(tmp_path, kind):
    path, what = {'FIFO': (tmp_path / 'table.csv', 'a FIFO (named pipe)'),
                  'character device': ('/dev/null', 'a character device'),
                  'directory': (tmp_path, 'a directory')}[kind]
    if kind == 'FIFO':
        os.mkfifo(path)
    with pytest.raises(UsageError) as e:
        check_output_file(path, '--csv')
    assert str(e.value) == f'--csv {path} is {what}, not a regular file: give the name of a file to write'
    assert kind != 'FIFO' or stat.S_ISFIFO(os.stat(path).st_mode)  # left as it was


def test_an_output_file_that_is_new_or_regular_is_accepted_and_one_with_a_newline_is_not(tmp_path):
    (tmp_path / 'old.csv').write_text('x\n')
    check_output_file(tmp_path / 'new.csv', '--csv')
    check_output_file(tmp_path / 'old.csv', '--csv')
    with pytest.raises(UsageError) as e:
        check_output_file(tmp_path / 'a\nb.csv', '--csv')
    assert str(e.value) == (f"--csv '{tmp_path}/a\\nb.csv': a path holds no control characters, and this one "
                            f"holds '\\n'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ['old.csv']


@given(st.text())
def test_control_character_finds_exactly_the_unicode_control_characters(text):
    """C0, DEL and C1 are Unicode's general category Cc: `control_character` returns the first of them, or None."""
    controls = [c for c in text if unicodedata.category(c) == 'Cc']
    assert control_character(text) == (controls[0] if controls else None)


def test_the_limits_and_their_variables():
    assert (CONFIG.variable, CONFIG.default_mb, TEXT.variable, TEXT.default_mb) == \
        ('LAZYLAB_MAX_CONFIG_MB', 1, 'LAZYLAB_MAX_TEXT_MB', 256)
    assert user_files.kind_of(stat.S_IFBLK) == 'a block device'
