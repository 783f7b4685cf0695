"""The errors a user can cause and fix, shared by the command line, the experiments and the tools (torch-free).

Each message is one line that names the culprit (the key, file, character or checkpoint); the command line prints
it as `lazylab: error: …` and exits with code 2, without a traceback (`run_cli`). Every other exception is a
programming error and keeps its traceback. This module is the leaf of the package: it imports nothing of lazylab
(and no torch), and every other module's user errors derive from `LazylabError`, configuration mistakes included.

    LazylabError
    ├── ConfigError         (lazylab.configs) a configuration mistake: an unknown key, a bad value, an unknown option
    ├── WrapsUserError      an error raised on behalf of another (lazylab.configs.CalculatorError): when its cause is
    │                       a user error, the user sees that one (`cause_for_user`)
    ├── UsageError          a command-line mistake: unknown experiment, missing run directory, bad flag
    │   └── DashboardError      a dashboard URL, flag or port (also a ValueError)
    ├── DataError           the user's text or prompt (also a ValueError)
    ├── DistributedError    the torchrun environment or the device does not allow a distributed run
    └── TrainingError       a run cannot go on
        ├── CheckpointError     a checkpoint is missing, truncated or not a lazylab checkpoint
        └── NonFiniteLossError  the loss became NaN or infinite

Not an error: `Interrupted` (a KeyboardInterrupt) is what Ctrl-C (SIGINT) and SIGTERM raise while a run trains
(`signals_interrupt`), so the run records where it stopped before the process ends with 130 or 143.
"""
import contextlib
import os
import reprlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, Callable, Optional

__all__ = ['LazylabError', 'WrapsUserError', 'UsageError', 'DashboardError', 'DataError', 'DistributedError',
           'TrainingError', 'CheckpointError', 'NonFiniteLossError', 'Interrupted', 'signals_interrupt',
           'signals_deferred', 'signals_polled', 'user_error_message', 'run_cli', 'plural', 'shown']


def plural(n: float, noun: str, nouns: Optional[str] = None) -> str:
    """`n` and the noun in the number it takes, for messages: plural(1, 'step') → '1 step', plural(1200, 'step')
    → '1,200 steps', plural(2, 'process', 'processes') → '2 processes'; a float as `:g` (plural(1.5, 'minute') →
    '1.5 minutes'). `nouns`: the plural when it is not `noun` + 's'."""
    count = f'{n:,}' if isinstance(n, int) else f'{n:g}'
    return f'{count} {noun if n == 1 else (nouns or noun + "s")}'


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 3, 6, 6, 6
_SHOWN.maxstring, _SHOWN.maxother = 60, 60


def shown(value: Any) -> str:
    """``repr(value)`` cut to a few dozen characters (``[1, 2, 3, 4, 5, 6, ...]``), for error messages: a message
    names the value a user gave, and must stay one line however large that value is (a 10⁹-element list from a
    YAML file is shown in the time of its first elements)."""
    text = _SHOWN.repr(value)
    return text if len(text) <= 120 else text[:117] + '...'


class LazylabError(Exception):
    """Base class of the errors a user can fix; the message is one line."""


class WrapsUserError(LazylabError):
    """A user error raised on behalf of another exception, chained as its `__cause__` (the config engine's
    CalculatorError, when an option function raised): when that cause is itself a user error (a DataError raised
    inside an option), the user is shown the cause's message rather than the wrapper's."""

    def cause_for_user(self) -> Optional[LazylabError]:
        """The chained user error the user should see instead of this one, or None (then this one is shown)."""
        cause = self.__cause__
        return cause if isinstance(cause, LazylabError) else None


class UsageError(LazylabError):
    """A command-line mistake (unknown experiment, missing run directory, bad flag)."""


class DashboardError(UsageError, ValueError):
    """A user mistake with the dashboard (bad URL or flag, port in use, missing extra). Also a ValueError, as the
    URL checks raised before. Importable as `lazylab.dashboard.DashboardError` too."""


class DataError(LazylabError, ValueError):
    """A problem with the user's text or prompt; the message names the file or character."""


class DistributedError(LazylabError, RuntimeError):
    """The torchrun environment or the device does not allow a distributed run."""


class TrainingError(LazylabError, RuntimeError):
    """A run cannot go on for a reason the user can act on (bad checkpoint, diverged loss)."""


class CheckpointError(TrainingError):
    """A checkpoint file is missing, truncated or not a lazylab checkpoint."""


class NonFiniteLossError(TrainingError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM arrived while `signals_interrupt` was active (a KeyboardInterrupt, so whatever
    handles Ctrl-C handles both).

    Attributes:
        signal_name: 'SIGINT' or 'SIGTERM'.
        exit_code: 128 + the signal's number (130, 143), what a shell reports for a process the signal ended.
        step, checkpoint_step: the trainer's step when it arrived and that of the checkpoint on disk (None: none
            yet); set by `trainer.train` on its way out.
        message: the line `run_cli` prints (the runner adds the run directory and how to resume it).
    """

    def __init__(self, signum: int):
        super().__init__()
        self.signal_name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        self.step: Optional[int] = None
        self.checkpoint_step: Optional[int] = None
        self.message = 'interrupted' if signum == signal.SIGINT else f'killed ({self.signal_name})'

    def __str__(self) -> str:
        return self.message


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM raise `Interrupted` (SIGTERM would otherwise end the process at
    once, leaving a run's run.json saying `running`); the previous handlers are restored after. Outside the main
    thread (where Python cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def signals_polled() -> Iterator[Callable[[], None]]:
    """While the block runs, SIGINT and SIGTERM are only noted; the block calls the function it is given at points
    of its own choosing (a streamed token), which raises `Interrupted` if one arrived. An exception raised by the
    signal handler itself can land anywhere, inside a finalizer or a callback that swallows it, and then the
    process goes on as if the signal never came; a raise from the block's own code cannot be lost. The previous
    handlers are restored after. Outside the main thread it notes nothing (the check never raises)."""
    arrived: list[int] = []

    def check() -> None:
        if arrived:
            raise Interrupted(arrived[0])

    if threading.current_thread() is not threading.main_thread():
        yield check
        return
    previous = {s: signal.signal(s, lambda signum, frame: arrived.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield check
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM are held back and delivered to the handlers before it once it
    ends, so a write that must finish whole (torch.save into a checkpoint) is never cut in the middle: an exception
    raised inside torch's writer becomes its `unexpected pos` RuntimeError, which would read as a failed write.
    Outside the main thread (where Python cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: arrived.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if arrived:  # now to the handler it was meant for (signals_interrupt's raises Interrupted)
            signal.raise_signal(arrived[0])


def point_at_devnull(stream) -> None:
    """Point the file descriptor of `stream` (stdout, whose reader went away) at os.devnull, so that what is still
    buffered and what is written later go nowhere instead of raising BrokenPipeError. A stream without a file
    descriptor (a test's capture) is left as it is."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def user_error_message(e: BaseException) -> Optional[str]:
    """The one-line message for an error the user caused, or None for a programming error (show the traceback).

    User errors: every `LazylabError` (`lazylab.configs.ConfigError` is one). One of ours raised while the config
    engine computed an item arrives wrapped in a `CalculatorError` (a `WrapsUserError`); the user sees the original
    message.
    """
    if isinstance(e, WrapsUserError):
        e = e.cause_for_user() or e
    if isinstance(e, LazylabError):
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


def run_cli(func: Callable[..., Any], *args) -> int:
    """Call `func(*args)`; a user error becomes `lazylab: error: …` on stderr and exit code 2.

    Returns 0 on success, 130 on Ctrl-C, 143 on SIGTERM (an `Interrupted`), 1 when stdout was closed by its reader
    (`| head`), 2 on a user error; a programming error is re-raised.
    """
    try:
        func(*args)
    except KeyboardInterrupt as e:
        print(f'\nlazylab: {e if isinstance(e, Interrupted) else "interrupted"}', file=sys.stderr)
        return e.exit_code if isinstance(e, Interrupted) else 130
    except BrokenPipeError:  # output piped into a reader that stopped (`| head`): not an error worth a traceback
        point_at_devnull(sys.stdout)
        return 1
    except Exception as e:
        message = user_error_message(e)
        if message is None:
            raise
        print(f'lazylab: error: {message}', file=sys.stderr)
        return 2
    return 0
