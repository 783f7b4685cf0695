"""flock-based locks that keep one process on a run or a sweep's trials (torch-free, a leaf of the package).

A lock is an exclusive `flock`, which the kernel drops when the process ends, even by SIGKILL, so a lock that is
held names a live process: `exclusive_lock` (one process trains a run; one sweep process owns its trials),
`hold_lock` (a sweep owner's lock file, for the life of the process) and `lock_is_held` (is that process still
alive?). Which folders and files are locked is `lazylab.runs`' and `lazylab.sweeps`' business. Where there is no
flock (Windows) they lock nothing and say so in their docstrings: a second process is not refused there.
"""
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from lazylab.errors import UsageError

try:  # POSIX; the one place lazylab asks whether there is a flock
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ['HAS_FLOCK', 'Locked', 'exclusive_lock', 'HeldLock', 'hold_lock', 'lock_is_held']

#: whether locks lock anything here (False without flock: Windows)
HAS_FLOCK = fcntl is not None


class Locked(UsageError):
    """Another live process holds the lock (`exclusive_lock`); the message says who, when the caller knows."""


@contextlib.contextmanager
def exclusive_lock(path: Path, busy: str = '', *, wait: bool = False) -> Iterator[None]:
    """While the block runs, this process holds an exclusive flock on `path` (a folder or an existing file; nothing
    is written into it). The kernel drops it when the process ends, even by SIGKILL. `wait`: wait for another
    process to let go instead of raising `Locked`. Without flock (Windows) this locks nothing.

    Raises:
        Locked: another process holds it; `busy` is the message (e.g. 'RUN is still being trained by process 12').
        FileNotFoundError: there is no `path`.
    """
    fd = _hold(path, busy, wait)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # and with it the lock


@dataclass
class HeldLock:
    """An exclusive flock held for as long as the object is not `release`d (a sweep owner's lock file, for the
    life of the process: see `hold_lock`)."""
    path: Path
    fd: Optional[int] = field(default=None, repr=False)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def hold_lock(path: Path, busy: str, *, create: bool = False) -> HeldLock:
    """An exclusive flock on `path` (made empty first when `create`), held until `.release()` or the process ends.

    Raises:
        Locked: another process holds it (`busy` is the message); FileNotFoundError: no such file (not `create`).
    """
    if create:
        Path(path).touch(exist_ok=True)
    return HeldLock(Path(path), _hold(path, busy))


def _hold(path: Path, busy: str, wait: bool = False) -> Optional[int]:
    if fcntl is None:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Locked(busy) from None
    return fd


def lock_is_held(path: Path, *, unreadable: bool = True) -> bool:
    """Whether a live process holds an exclusive flock on `path` (see `exclusive_lock`). A path that cannot be opened
    here counts as `unreadable` says: held by default (another machine's lock file, on a folder this one cannot
    read); without flock, False."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return unreadable
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
