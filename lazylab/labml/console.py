"""labml's console under ``lazylab labml``: as labml draws it on a terminal, plain lines anywhere else.

labml's logger redraws its progress line in place (``'\\r'``, 100 spaces, ``'\\r'``, the line, with ANSI colours) at
every step. On a terminal that is one line that changes; written to a file or a pipe it is every version of that line
glued together (39 KB for a 30-step labml_nn run), and lazylab's summary is glued onto the last one. Off a terminal
:class:`Console` writes instead:

- labml's finished lines (those labml ends with a newline: 'Load data...[DONE]', the run's name, an epoch's end) as
  plain text, without colours or padding;
- its redrawn progress line at most once every ``every_s`` seconds (30: a long run's log gets two lines a minute),
  and the last one before lazylab's own lines (:meth:`Console.line`), so that the final losses are there.

On a terminal labml's own console draws, and :meth:`Console.line` first ends a line labml left open. Both ways,
under ``--steps N`` the time left in labml's loop line (``'  0:01m/ 16:10m'``, an estimate for the script's whole
length) is lazylab's estimate for the N steps instead (:func:`loop_time`).
"""
import time
from typing import Any, Callable, Optional, TextIO

from lazylab import labml_internals

#: seconds between two progress lines off a terminal
EVERY_S = 30.0


def loop_time(spent_s: float, left_s: float) -> str:
    """labml's loop time part, ``'  H:MMm/  H:MMm  '`` (hours and minutes spent, then left), for these seconds."""
    spent, left = int(spent_s // 60), int(left_s // 60)
    return f'{spent // 60:3d}:{spent % 60:02d}m/{left // 60:3d}:{left % 60:02d}m  '


class Console:
    """Where labml's logger writes during ``lazylab labml`` (see the module docstring).

    Args:
        stream: lazylab's output (stdout).
        plain: write plain lines (off a terminal) rather than labml's redrawn one.
        times: ``() -> (seconds spent, seconds left)`` for labml's loop time part; None keeps labml's, and
            ``times()`` returning None drops it (not known yet).
        every_s: seconds between two progress lines when plain.
        clock: the time in seconds (tests give their own).
    """

    def __init__(self, stream: TextIO, *, plain: bool, times: Optional[Callable[[], Optional[tuple[float, float]]]]
                 = None, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.stream, self.plain, self.times, self.every_s, self.clock = stream, plain, times, every_s, clock
        self._pending = ''  # plain: labml's current line, not yet written
        self._shown = ''  # plain: the version of it written last
        self._last = clock()
        self._open = False  # terminal: labml left its line without a newline
        self._restore: Optional[Callable[[], None]] = None

    def install(self) -> None:
        """Take over labml's console (until :meth:`uninstall`)."""
        if self._restore is None:
            self._restore = labml_internals.hook_console(self.on_log)

    def uninstall(self) -> None:
        self.end_line()
        if self._restore is not None:
            self._restore()
            self._restore = None

    def on_log(self, parts: list[tuple[str, Any]], is_new_line: bool, is_reset: bool,
               labml_write: Callable[[list[tuple[str, Any]], bool, bool], None]) -> None:
        """One write of labml's logger: ``parts`` (text, style), then a newline or not, over the line or after it."""
        parts = self._with_time_left(parts)
        if not self.plain:
            labml_write(parts, is_new_line, is_reset)
            self._open = not is_new_line
            return
        text = ''.join(text for text, _ in parts)
        self._pending = (text if is_reset else self._pending + text) + ('\n' if is_new_line else '')
        if '\n' in self._pending:  # labml ended the line (a newline, or a section's part that ends with one)
            done, _, self._pending = self._pending.rpartition('\n')
            lines = done.split('\n')
            if self._shown and lines[0] == self._shown:  # written already, by the clock
                lines = lines[1:]
            for line in lines:
                self._write(line)
            self._shown = ''
        elif self._pending.strip() and self.clock() - self._last >= self.every_s:
            self._write(self._pending)
            self._shown = self._pending

    def line(self, text: str) -> None:
        """One line of lazylab's own (the start, the summary), on a line of its own."""
        self.end_line()
        self.stream.write(text + '\n')
        self.stream.flush()

    def end_line(self) -> None:
        """Plain: write labml's last progress line if it was not written; terminal: end the line labml left open."""
        if self.plain:
            if self._pending.strip() and self._pending != self._shown:
                self._write(self._pending)
            self._pending = self._shown = ''
        elif self._open:
            self.stream.write('\n')
            self.stream.flush()
            self._open = False

    def _write(self, text: str) -> None:
        self.stream.write(text.rstrip() + '\n')
        self.stream.flush()
        self._last = self.clock()

    def _with_time_left(self, parts: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        if self.times is None:
            return parts
        out = []
        for text, style in parts:
            if labml_internals.LOOP_TIME.fullmatch(text):
                times = self.times()
                if times is None:
                    continue
                text = loop_time(*times)
            out.append((text, style))
        return out
