"""Files and names a user gives, checked before lazylab reads, writes or makes anything with them (torch-free).

A path on a command line can name anything. /dev/zero never ends (a reader grows until the machine runs out of
memory), a FIFO blocks its reader until a writer comes (forever, when none does), a directory or a socket cannot
be read at all, and a 100 MB YAML file keeps PyYAML busy for minutes. So every read of a file a user names
(`--config`, the text of an experiment, a run's configs.yaml and run.json, a sweep's sweep.yaml) goes through
the one reader here:

    text = read_text(path, 'config file', CONFIG)    # a regular file of at most CONFIG's size, else one line

1. the path is `os.stat`-ed first: what is not a regular file is refused by what it is (a FIFO, a character
   device, a directory, a socket), one larger than the limit by its size, before anything is opened;
2. it is opened with O_NONBLOCK, so that a FIFO put in the file's place since the stat cannot block the open, and
   the open file is checked again (`os.fstat`): what is read is what was checked;
3. at most limit + 1 bytes are read, so a file that grows while it is read (or a /proc file, whose size stat says
   is 0) cannot make the reader hold more than the limit.

Each limit is settable by an environment variable the message names (`LAZYLAB_MAX_CONFIG_MB=50`). An output file
(`--csv`, `--plot`, `plot -o`) is checked by `check_output_file`: a FIFO would block the writer until a reader
comes, a device would swallow or refuse what is written. And the keys and paths a user gives are checked for
control characters (`control_character`, `check_path_text`): a newline in a folder's name splits every line that
shows it, and a key `d_model\\n` must not quietly mean `d_model`. A file lazylab writes itself and reads back whole
(a run's metrics.jsonl) is read with no limit (`limit=None`), as a regular file still.

Every problem is a one-line user error (`UsageError` unless the caller names another class, `DataError` for a
text): the command line prints it as `lazylab: error: …` and exits with code 2.
"""
import os
import stat
from dataclasses import dataclass
from typing import Optional, Union

from lazylab.errors import LazylabError, UsageError

__all__ = ['Limit', 'CONFIG', 'TEXT', 'check_file', 'read_bytes', 'read_text', 'check_output_file',
           'control_character', 'check_path_text', 'kind_of']

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class Limit:
    """The largest file of a kind lazylab reads whole: `default_mb` megabytes (10⁶ bytes), or the number the
    environment variable `variable` holds."""
    variable: str
    default_mb: float

    def bytes(self, error: type[LazylabError] = UsageError) -> int:
        """The limit in bytes.

        Raises:
            error: the variable is set to something other than a number > 0 (naming it).
        """
        text = os.environ.get(self.variable, '').strip()
        if not text:
            return int(self.default_mb * 1e6)
        try:
            mb = float(text)
        except ValueError:
            mb = float('nan')
        if not 0 < mb < float('inf'):
            raise error(f'{self.variable}={text!r}: expected a number of megabytes > 0')
        return max(1, int(min(mb * 1e6, 2.0**62)))  # (1e308 MB: no limit, not an OverflowError)


#: configuration files (--config, a run's configs.yaml and run.json, a sweep's sweep.yaml): a run's configs.yaml is
#: 3 to 15 kB, and PyYAML's pure-Python parser takes about two seconds a megabyte (on a loaded two-core machine),
#: so 1 MB is far beyond any real configuration, and a file above it is a mistake (or a trap) worth a line, not a
#: wait
CONFIG = Limit('LAZYLAB_MAX_CONFIG_MB', 1)
#: the text of a character-level model: enwik8 and text8, the largest usual benchmarks, are 100 MB; the text is
#: held as a string and as int64 ids (8 bytes a character, and a Python list of them while it is encoded), so
#: 256 MB of text is already some 5 GB of memory
TEXT = Limit('LAZYLAB_MAX_TEXT_MB', 256)


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, from its `st_mode`: 'a FIFO (named pipe)', 'a directory', …"""
    for test, kind in ((stat.S_ISDIR, 'a directory'), (stat.S_ISFIFO, 'a FIFO (named pipe)'),
                       (stat.S_ISCHR, 'a character device'), (stat.S_ISBLK, 'a block device'),
                       (stat.S_ISSOCK, 'a socket')):
        if test(mode):
            return kind
    return 'not a regular file'


def _shown(path: PathLike) -> str:
    """`path` for a message: as given, or quoted with its control characters escaped (a newline in a file's name
    would split the one-line message in two)."""
    text = os.fspath(path)
    return repr(text) if control_character(text) else text


def _size(n: int) -> str:
    return f'{n / 1e6:,.1f} MB' if n >= 100_000 else f'{n:,} bytes'


def _stat(path: PathLike, what: str, error: type[LazylabError]) -> os.stat_result:
    """`os.stat(path)` (following links), its failures as one line naming `what` and the path."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise error(f'{what} not found: {_shown(path)}') from None
    except OSError as e:  # permission on a parent, a name too long, a loop of links, …
        raise error(f'cannot read {what} {_shown(path)}: {e.strerror}') from None
    except ValueError:  # a path the OS cannot take (a NUL character)
        raise error(f'not a usable {what} path: {str(path)!r}') from None


def _check(st: os.stat_result, path: PathLike, what: str, limit: Optional[int], variable: str,
           error: type[LazylabError]) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise error(f'{what} {_shown(path)} is {kind_of(st.st_mode)}, not a regular file')
    if limit is not None and st.st_size > limit:
        raise error(_too_large(path, what, f'is {_size(st.st_size)}, more than', limit, variable))


def _too_large(path: PathLike, what: str, how: str, limit: int, variable: str) -> str:
    return (f'{what} {_shown(path)} {how} the {_size(limit)} lazylab reads (set {variable} to a larger number of '
            f'megabytes to read it)')


def check_file(path: PathLike, what: str, limit: Optional[Limit] = CONFIG,
               error: type[LazylabError] = UsageError) -> None:
    """`read_bytes`' checks without the read: `path` is a regular file under `limit`'s size. For a command to refuse
    a FIFO or /dev/zero before it imports torch (a second and more), and read the file, bounded, later.

    Raises:
        error: as `read_bytes`, but for what only reading shows (a file that grows; bytes that are not UTF-8).
    """
    most = None if limit is None else limit.bytes(error)
    _check(_stat(path, what, error), path, what, most, '' if limit is None else limit.variable, error)


def read_bytes(path: PathLike, what: str, limit: Optional[Limit] = CONFIG,
               error: type[LazylabError] = UsageError, offset: int = 0) -> bytes:
    """The bytes of the regular file `path`, at most `limit`'s size (None: any size; still a regular file).

    Args:
        path: the file as the user gave it (shown as given in messages).
        what: what it is, for messages: 'config file', 'text file', 'configs.yaml'.
        limit: the largest size read (see `Limit`), or None.
        error: the class of the error raised (a `LazylabError`: `UsageError`, `DataError`).
        offset: read from this byte on (a follower's next read of a file that grows; past the end: nothing).

    Raises:
        error: the file is missing, unreadable, not a regular file (a FIFO, a device, a directory, a socket: which,
            is said), or larger than the limit (its size, the limit and the variable that raises it are said).
    """
    most = None if limit is None else limit.bytes(error)
    variable = '' if limit is None else limit.variable
    _check(_stat(path, what, error), path, what, most, variable, error)
    flags = os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0) | getattr(os, 'O_NOCTTY', 0) | getattr(os, 'O_CLOEXEC', 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise error(f'cannot read {what} {_shown(path)}: {e.strerror}') from None
    try:
        st = os.fstat(fd)
        _check(st, path, what, most, variable, error)  # the file opened is the one checked
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        data = _read_at_most(fd, None if most is None else most + 1, max(st.st_size - offset, 0) + 1, path, what,
                             error)
    finally:
        os.close(fd)
    if most is not None and len(data) > most:  # it grew since the stat (or stat did not know its size)
        raise error(_too_large(path, what, 'grew, while it was read, to more than', most, variable))
    return data


def _read_at_most(fd: int, most: Optional[int], first: int, path: PathLike, what: str,
                  error: type[LazylabError]) -> bytes:
    """At most `most` bytes (None: all) of `fd`: the first read asks for `first` (the size stat gave, and one more
    to see the end), so a file is usually read by one call into one buffer; then a megabyte at a time."""
    chunks, got, ask = [], 0, first
    while most is None or got < most:
        try:
            chunk = os.read(fd, ask if most is None else min(ask, most - got))
        except OSError as e:  # EIO from a failing disk; EISDIR and EAGAIN cannot reach here (a regular file)
            raise error(f'cannot read {what} {_shown(path)}: {e.strerror}') from None
        if not chunk:
            break
        chunks.append(chunk)
        got, ask = got + len(chunk), 1 << 20
    return b''.join(chunks)  # (one chunk: that chunk itself, not a copy)


def read_text(path: PathLike, what: str, limit: Optional[Limit] = CONFIG,
              error: type[LazylabError] = UsageError) -> str:
    """`read_bytes` decoded as UTF-8.

    Raises:
        error: as `read_bytes`; the bytes are not UTF-8 (the offset of the first bad byte is said).
    """
    data = read_bytes(path, what, limit, error)
    try:
        return data.decode('utf-8')
    except UnicodeDecodeError as e:
        raise error(f'{what} {_shown(path)} is not UTF-8 text: invalid byte 0x{data[e.start]:02x} at byte offset '
                    f'{e.start}') from None


def check_output_file(path: PathLike, what: str, error: type[LazylabError] = UsageError) -> None:
    """That lazylab may write the file `path`: it does not exist yet, or it is a regular file. A FIFO would block
    the writer until a reader comes, a device swallow (or refuse) what is written, a directory cannot be written.

    Raises:
        error: `path` exists and is not a regular file (which it is, is said), or cannot be looked at; its name
            holds a control character (`check_path_text`).
    """
    check_path_text(os.fspath(path), what, error)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise error(f'cannot write {what} {_shown(path)}: {e.strerror}') from None
    except ValueError:
        raise error(f'not a usable {what} path: {str(path)!r}') from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f'{what} {_shown(path)} is {kind_of(st.st_mode)}, not a regular file: give the name of a file '
                    f'to write')


def control_character(text: str) -> Optional[str]:
    """The first control character of `text` (C0 U+0000–U+001F, DEL U+007F, C1 U+0080–U+009F: \\n, \\r, \\t, \\x1b,
    NUL, …), or None when it has none. Keys, paths and names hold none: a newline in a folder's name splits every
    line that shows it, a key 'd_model\\n' must not quietly mean 'd_model', and a NUL cuts a path short."""
    for c in text:
        if c < ' ' or '\x7f' <= c <= '\x9f':
            return c
    return None


def check_path_text(text: str, what: str, error: type[LazylabError] = UsageError) -> None:
    """That a path a user gives for lazylab to make or write (`--runs-dir`, `--csv`) holds no control character.

    Raises:
        error: `--runs-dir 'r\\nnl': a path holds no control characters, and this one holds '\\n'`.
    """
    bad = control_character(text)
    if bad is not None:
        raise error(f'{what} {text!r}: a path holds no control characters, and this one holds {bad!r}')
