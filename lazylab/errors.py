"""The errors a user can cause and fix, shared by the command line, the experiments and the tools (torch-free).

Each message is one line that names the culprit (the key, file, character or checkpoint); the command line prints
it as `lazylab: error: …` and exits with code 2, without a traceback (`run_cli`). Every other exception is a
programming error and keeps its traceback. It imports only `lazylab.redaction` (the
bottom leaf; no torch), and every other module's user errors derive from `LazylabError`, configuration mistakes
included. A message never shows a secret read from the environment (`lazylab.redaction.conceal`).

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

Not an error: `Interrupted` (a KeyboardInterrupt) is what a stop signal — Ctrl-C's SIGINT, SIGTERM, SIGUSR1 (a
cluster's warning before a preemption) — raises while a run trains (`signals_interrupt`; inside the training loop
`signals_noted` lets the trainer finish the step and write its checkpoint first), so the run records where it stopped
before the process ends with 128 + the signal (130, 143, 138).
"""
import contextlib
import os
import reprlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, Callable, Optional

from lazylab.redaction import hide_concealed

__all__ = ['LazylabError', 'WrapsUserError', 'UsageError', 'DashboardError', 'DataError', 'DistributedError',
           'TrainingError', 'CheckpointError', 'NonFiniteLossError', 'Interrupted', 'signals_interrupt',
           'signals_deferred', 'signals_polled', 'signals_noted', 'NotedSignals', 'stop_signals', 'stop_status',
           'signal_number', 'STOP_SIGNAL_ENV', 'user_error_message', 'error_line', 'run_cli', 'plural', 'shown',
           'given_twice']


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


def given_twice(key: str, first: str, second: str) -> str:
    """The one message for a key given twice on one command line (or in one file): a second value never quietly
    replaces the first. ``key`` is the item's full name, ``first`` and ``second`` the two settings as written:
    ``learning_rate is given twice: learning_rate=1e-2 and learning_rate=1e-3; give it once``."""
    return f'{key} is given twice: {shown_setting(first)} and {shown_setting(second)}; give it once'


def shown_setting(token: str) -> str:
    """A ``key=value`` setting as a message shows it: as written, cut to a few dozen characters and with control
    characters escaped (``shown`` of a string without its quotes)."""
    text = shown(token)  # repr: quoted, unless cut short ('...' at its end)
    return text[1:-1] if text[-1:] == text[:1] else text


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


#: the environment variable naming one more signal that stops a run as a preemption (`USR2`, `SIGUSR2` or its
#: number), for a cluster whose warning signal is not SIGUSR1 (`lazylab train … --slurm signal=USR2@120` sets it)
STOP_SIGNAL_ENV = 'LAZYLAB_STOP_SIGNAL'


def stop_signals() -> tuple[int, ...]:
    """The signals that stop a run with a checkpoint: SIGINT (Ctrl-C), SIGTERM, SIGUSR1 (Slurm's and Lightning's
    warning signal before a preemption or a time limit) and the one $LAZYLAB_STOP_SIGNAL names, if any.

    Raises:
        UsageError: $LAZYLAB_STOP_SIGNAL names no signal, or one that cannot be caught (SIGKILL, SIGSTOP).
    """
    found = [signal.SIGINT, signal.SIGTERM, *([signal.SIGUSR1] if hasattr(signal, 'SIGUSR1') else [])]
    named = os.environ.get(STOP_SIGNAL_ENV, '').strip()
    if named:
        extra = signal_number(named, STOP_SIGNAL_ENV)
        if extra not in found:
            found.append(extra)
    return tuple(found)


def signal_number(name: str, what: str) -> int:
    """The number of the signal `name` names ('USR2', 'SIGUSR2', '12'); `what` names where it was given.

    Raises:
        UsageError: no such signal, or SIGKILL / SIGSTOP (no process can catch those).
    """
    text = name.strip().upper()
    try:
        number = int(text) if text.isdigit() else signal.Signals[text if text.startswith('SIG') else 'SIG' + text]
        number = signal.Signals(number)
    except (KeyError, ValueError):
        raise UsageError(f'{what}={shown(name)} is not a signal (e.g. USR1, USR2, TERM)') from None
    if number in (getattr(signal, 'SIGKILL', None), getattr(signal, 'SIGSTOP', None)):
        raise UsageError(f'{what}={name}: {number.name} cannot be caught, so no run can stop cleanly on it')
    return int(number)


def stop_status(signum: int) -> str:
    """How a run that `signum` stopped is recorded (run.json's status): SIGINT `interrupted` (Ctrl-C), SIGTERM
    `killed`, any other stop signal `preempted` (a cluster's warning that it will stop the job)."""
    return {signal.SIGINT: 'interrupted', signal.SIGTERM: 'killed'}.get(signum, 'preempted')


class Interrupted(KeyboardInterrupt):
    """A stop signal (`stop_signals`: Ctrl-C's SIGINT, SIGTERM, SIGUSR1, …) arrived while `signals_interrupt` was
    active (a KeyboardInterrupt, so whatever handles Ctrl-C handles them all).

    Attributes:
        signal_name: 'SIGINT', 'SIGTERM', 'SIGUSR1', ….
        status: 'interrupted' (SIGINT), 'killed' (SIGTERM) or 'preempted' (the others): see `stop_status`.
        exit_code: 128 + the signal's number (130, 143, 138), what a shell reports for a process the signal ended.
        step, checkpoint_step: the trainer's step when it stopped and that of the checkpoint on disk (None: none
            yet); set by `trainer.train` on its way out (a stop in the training loop writes the checkpoint of the
            step it stops at, so the two are equal).
        message: the line `run_cli` prints (the runner adds the run directory and how to resume it).
    """

    def __init__(self, signum: int):
        super().__init__()
        self.signum = int(signum)
        self.signal_name = signal.Signals(signum).name
        self.status = stop_status(signum)
        self.exit_code = 128 + signum
        self.step: Optional[int] = None
        self.checkpoint_step: Optional[int] = None
        self.message = 'interrupted' if signum == signal.SIGINT else f'{self.status} ({self.signal_name})'

    def __str__(self) -> str:
        return self.message


class _StopSignals:
    """What the stop signals' handler does now: raise `Interrupted` at once, or (while a block is `noting`) only
    note the signal for that block to act on at a point of its choosing."""

    def __init__(self):
        self.noting = 0
        self.arrived: list[int] = []

    def handle(self, signum, frame) -> None:
        if self.noting:
            self.arrived.append(signum)
        else:
            raise Interrupted(signum)


_STOPS = _StopSignals()


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """While the block runs, the stop signals (`stop_signals`) raise `Interrupted` (SIGTERM would otherwise end the
    process at once, leaving a run's run.json saying `running`), or, inside a `signals_noted` block, are noted for
    it; the previous handlers are restored after. Outside the main thread (where Python cannot set handlers) it
    does nothing.

    Raises:
        UsageError: $LAZYLAB_STOP_SIGNAL names no signal that can be caught (before any handler is set).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _STOPS.handle) for s in stop_signals()}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class NotedSignals:
    """The stop signals noted while a `signals_noted` block runs (see there)."""

    def pending(self) -> Optional[int]:
        """The first stop signal noted and not yet taken, or None."""
        return _STOPS.arrived[0] if _STOPS.arrived else None

    def take(self) -> Optional[int]:
        """The first stop signal noted (None: none); all noted so far count as handled."""
        first = self.pending()
        _STOPS.arrived.clear()
        return first

    def check(self) -> None:
        """Raise `Interrupted` for the first stop signal noted, if one was.

        Raises:
            Interrupted: a stop signal arrived.
        """
        signum = self.take()
        if signum is not None:
            raise Interrupted(signum)


@contextlib.contextmanager
def signals_noted() -> Iterator[NotedSignals]:
    """Inside `signals_interrupt`: while the block runs, a stop signal is only noted, and the block acts on it where
    it chooses (the trainer: at the end of the step in progress, after writing that step's checkpoint). An exception
    raised by the signal handler itself can land anywhere, inside a finalizer, a callback that swallows it, or a
    file being written; a raise from the block's own code cannot be lost or cut anything in half. A signal the block
    has not taken when it ends is dropped: the block ended whole (the run finished, the text was generated)."""
    if not _STOPS.noting:  # a signal an earlier block left untaken is spent
        _STOPS.arrived.clear()
    _STOPS.noting += 1
    try:
        yield NotedSignals()
    finally:
        _STOPS.noting -= 1
        if not _STOPS.noting:
            _STOPS.arrived.clear()


@contextlib.contextmanager
def signals_polled() -> Iterator[Callable[[], None]]:
    """While the block runs, the stop signals are only noted; the block calls the function it is given at points of
    its own choosing (a streamed token), which raises `Interrupted` if one arrived (`signals_interrupt` with
    `signals_noted`). The previous handlers are restored after. Outside the main thread it notes nothing."""
    with signals_interrupt(), signals_noted() as noted:
        yield noted.check


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """While the block runs, the stop signals are held back and delivered to the handlers before it once it ends,
    so a write that must finish whole (torch.save into a checkpoint) is never cut in the middle: an exception
    raised inside torch's writer becomes its `unexpected pos` RuntimeError, which would read as a failed write.
    A second signal during the block is held too (the first is delivered). Outside the main thread (where Python
    cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: arrived.append(signum)) for s in _deferrable()}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if arrived:  # now to the handler it was meant for (signals_interrupt's raises or notes it)
            signal.raise_signal(arrived[0])


def _deferrable() -> tuple[int, ...]:
    """The stop signals, or the plain three when $LAZYLAB_STOP_SIGNAL is bad (a write must not fail on that)."""
    try:
        return stop_signals()
    except UsageError:
        return tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, 'SIGUSR1', None)) if s)


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
    message. A secret read from the environment (`lazylab.redaction.conceal`) is `***` in it.
    """
    if isinstance(e, WrapsUserError):
        e = e.cause_for_user() or e
    if isinstance(e, LazylabError):
        return hide_concealed(str(e).splitlines()[0]) if str(e) else type(e).__name__
    return None


def error_line(e: BaseException) -> str:
    """The one line a run's record keeps of the exception that ended it: `user_error_message(e)`, or for a
    programming error its type and first line; a secret read from the environment is `***` in it either way."""
    return user_error_message(e) or hide_concealed(f'{type(e).__name__}: {e}'.splitlines()[0])


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
