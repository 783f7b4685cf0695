"""What a run reports as it trains: metrics.jsonl records, the labml run, the progress line and samples.txt.

    metrics = RunningMetrics()                        # sums of the training steps since the last record
    metrics.add(loss, correct, count, tokens, seconds, lr)      # after every optimizer step
    record = metrics.record(pos, batches_per_epoch, valid)      # → a metrics.jsonl record; the sums start again
    log.write(record, pos, eta)                       # metrics.jsonl, labml, progress line (rank 0)

A record (one JSON object per line of metrics.jsonl):

    step, tokens, epoch, lr, time              always: optimizer steps, training tokens seen (all processes),
                                               epochs (fractional), the learning rate of the last update,
                                               wall-clock seconds over all resumes
    loss.train, accuracy.train, tokens_per_s   when steps were taken since the last record: the mean loss of
                                               those steps, the fraction of right predictions, their speed
    mfu                                        with tokens_per_s, once the run's FLOPs per token are counted
                                               (flops.py): flops_per_token · tokens_per_s / peak_flops, a
                                               fraction (0.031 is shown as MFU 3.1%)
    loss.valid, accuracy.valid                 on validation records, with any metric of the task's own
                                               (`Task.evaluate`'s keys with a dot, e.g. accuracy.valid_2x)

Torch-free, so that `lazylab plot` reads metrics.jsonl without loading torch.
"""
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from lazylab import user_files
from lazylab.errors import LazylabError, TrainingError, point_at_devnull
from lazylab.runs import METRICS_JSONL, RUN_JSON, SAMPLES_TXT, mfu, update_record, write_text


class RunningMetrics:
    """Sums of the training steps since the last record, turned into a record (and reset) by `record`.

    The sums (loss, correct, count, steps, tokens, seconds) are saved in every checkpoint (`state()`), so a resumed
    run's first record is that of the uninterrupted run.
    """

    def __init__(self, sums: Optional[dict[str, Any]] = None):
        self.sums = dict(sums) if sums else self._zeros()
        self.lr: Optional[float] = None  # the learning rate of the last update

    @staticmethod
    def _zeros() -> dict[str, Any]:
        return {'loss': 0.0, 'correct': 0, 'count': 0, 'steps': 0, 'tokens': 0, 'seconds': 0.0}

    def add(self, loss: float, correct: int, count: int, tokens: int, seconds: float, lr: float) -> None:
        """One optimizer step: its mean loss (over all processes), right predictions out of `count`, training
        tokens, seconds it took, and the learning rate it used."""
        s = self.sums
        s['loss'] += loss
        s['correct'] += int(correct)
        s['count'] += int(count)
        s['steps'] += 1
        s['tokens'] += int(tokens)
        s['seconds'] += seconds
        self.lr = lr

    def record(self, pos, batches_per_epoch: int, valid: Optional[dict[str, float]] = None) -> dict[str, Any]:
        """The record of step `pos.step` (a checkpoint.Position), with the validation's loss and accuracy if given
        (and the task's own validation metrics, the keys of `valid` with a dot, under those names); the sums start
        again from zero."""
        s = self.sums
        r = {'step': pos.step, 'tokens': pos.tokens, 'epoch': round(pos.epoch + pos.batch / batches_per_epoch, 4),
             'lr': self.lr, 'time': round(pos.elapsed, 3)}
        if s['count']:
            r['loss.train'] = s['loss'] / s['steps']
            r['accuracy.train'] = s['correct'] / s['count']
            r['tokens_per_s'] = s['tokens'] / max(s['seconds'], 1e-9)
        if valid is not None:
            r['loss.valid'], r['accuracy.valid'] = valid['loss'], valid['accuracy']
            r.update({k: v for k, v in valid.items() if '.' in k})  # a task's own, by their names (accuracy.valid_2x)
        self.sums = self._zeros()
        return r

    def state(self) -> dict[str, Any]:
        """The sums, for the checkpoint."""
        return dict(self.sums)


class MetricsLog:
    """metrics.jsonl: one JSON object per line, flushed per record."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        append_whole(self.path, json.dumps(record) + '\n')

    def drop_after(self, step: int) -> None:
        """Keep only records up to `step` (a resumed run re-logs the steps after its checkpoint)."""
        if self.path.exists():
            kept = [r for r in read_metrics(self.path) if r['step'] <= step]
            write_text(self.path, ''.join(json.dumps(r) + '\n' for r in kept))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file (a torn last line from a killed process, or any other line that is not
    a JSON object, is skipped).

    Raises:
        UsageError: the file is not a regular file (a FIFO in a run directory would block the reader), or unreadable.
    """
    records = []
    for line in user_files.read_bytes(path, 'metrics file', None).decode('utf-8', 'replace').splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


#: seconds between progress lines when stdout is not a terminal (a log file, a notebook, CI)
PROGRESS_EVERY_S = 15.0


class Progress:
    """The live progress line: redrawn in place on a terminal; otherwise (a log file, a notebook, CI) one line per
    validation and, between validations, a line at a steady pace: the first record after each `every_s` seconds.

    Under a time budget that fits the step count (`estimated`), the total is shown as the estimate it is: nothing
    until the first steps are timed, then `step 120/≈640`, rounded to two significant digits and redrawn only when
    the fitted count moves by more than ESTIMATE_TOLERANCE of the shown one (it is fitted again every few steps).

    Args:
        total_steps: the run's step count (shown; updated by RunLog).
        stream: where to write (default sys.stdout).
        every_s: seconds between lines when `stream` is not a terminal.
        clock: seconds (time.monotonic; a test gives a fake one).
        estimated: the time budget fits `total_steps` as the run goes.
    """

    def __init__(self, total_steps: int, stream=None, every_s: float = PROGRESS_EVERY_S, clock=time.monotonic,
                 estimated: bool = False):
        self.total_steps, self.estimated = total_steps, estimated
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.every_s, self.clock = every_s, clock
        self.last_line = clock()
        self.shown_total: Optional[int] = None  # the estimate on the line, while it stays close to the fitted one

    def total(self, pos) -> str:
        """'/1,200', or under a fitted time budget '/≈640' (see the class docstring), or ' (timing the steps)'."""
        if not self.estimated:
            return f'/{self.total_steps:,}'
        if not pos.calibrated:
            return ' (timing the steps for the time budget)'
        shown = self.shown_total
        if shown is None or abs(self.total_steps - shown) > ESTIMATE_TOLERANCE * shown:
            self.shown_total = shown = readable_estimate(self.total_steps)
        return f'/≈{shown:,}'

    def show(self, pos, record: dict[str, Any], eta: float, newline: bool) -> None:
        if not (self.tty or newline):
            if self.clock() - self.last_line < self.every_s:
                return
        self.last_line = self.clock()
        utilization = [f'MFU {percent(record["mfu"])}'] if 'mfu' in record else []  # once the FLOPs are counted
        parts = [f'epoch {pos.epoch + (pos.batch > 0)} step {pos.step:,}{self.total(pos)}',
                 f'{record.get("tokens_per_s", 0):,.0f} tok/s', *utilization, f'ETA {_minutes(eta)}']
        if 'loss.train' in record:
            parts.append(f'train loss {record["loss.train"]:.3f} acc {record["accuracy.train"]:.3f}')
        if 'loss.valid' in record:
            parts.append(f'valid loss {record["loss.valid"]:.3f} acc {record["accuracy.valid"]:.3f}')
        line = ' | '.join(parts)
        if self.tty:
            self.stream.write('\r\033[K' + line + ('\n' if newline else ''))
        else:
            self.stream.write(line + '\n')
        self.stream.flush()

    def text(self, line: str) -> None:
        self.stream.write(('\r\033[K' if self.tty else '') + line + '\n')
        self.stream.flush()


def percent(fraction: float) -> str:
    """A fraction as the progress line, the done line and `lazylab compare` show MFU: 0.0314 → '3.1%'."""
    return f'{100 * fraction:.1f}%'


#: how far (a fraction of the shown estimate) the fitted step count may move before the progress line shows it
ESTIMATE_TOLERANCE = 0.1


def readable_estimate(steps: int) -> int:
    """A step count rounded to two significant digits (636 → 640, 24,613 → 25,000; below 100 as it is)."""
    if steps < 100:
        return steps
    scale = 10 ** (len(str(steps)) - 2)
    return (steps + scale // 2) // scale * scale  # half up: 1,050 → 1,100


def _minutes(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f'{seconds // 60}:{seconds % 60:02d}'


class RunLog:
    """Where a run's records and samples go: metrics.jsonl, the labml run (if any) and the progress line;
    samples.txt and a 'sample: …' line. Only rank 0 writes and prints; on the other processes it does nothing.

    Args:
        run_dir: the run directory.
        total_steps: the run's step count, for the progress line (updated with every record).
        labml_run: anything with `log(step, values)` (a tracking.LabmlRun, a notebook's live plot) or None.
        resumed_at: the step of the checkpoint a resumed run starts from: the records after it are dropped.
        enabled: False on the processes other than rank 0.
        estimated: the time budget fits the step count (the progress line shows it as an estimate).
    """

    def __init__(self, run_dir: Path, total_steps: int, labml_run=None, *, resumed_at: Optional[int] = None,
                 enabled: bool = True, estimated: bool = False):
        self.run_dir, self.labml_run, self.enabled = Path(run_dir), labml_run, enabled
        self.metrics = MetricsLog(self.run_dir / METRICS_JSONL)
        self.progress = Progress(total_steps, estimated=estimated)
        self.counted: Optional[tuple[float, float]] = None  # (flops_per_token, peak_flops), once counted
        if enabled and resumed_at is not None:
            self.metrics.drop_after(resumed_at)
            drop_samples_after(self.run_dir / SAMPLES_TXT, resumed_at)

    def write(self, record: dict[str, Any], pos, eta: float) -> dict[str, Any]:
        """Append `record` to metrics.jsonl, send its metrics to labml, show it (with `eta` seconds to go) on the
        progress line, which gets a line of its own when the record holds a validation. Returns `record` (with its
        `mfu`, once the FLOPs are counted)."""
        if self.enabled:
            if self.counted is not None and 'tokens_per_s' in record:
                flops_per_token, peak = self.counted
                items = list(record.items())
                at = list(record).index('tokens_per_s') + 1  # beside the speed it is computed from
                record = dict([*items[:at], ('mfu', mfu(flops_per_token, record['tokens_per_s'], peak)), *items[at:]])
            self.metrics.write(record)
            if self.labml_run is not None:
                self.labml_run.log(record['step'], {k: v for k, v in record.items()
                                                    if '.' in k or k in ('lr', 'tokens_per_s', 'mfu')})
            self.progress.total_steps = pos.total_steps
            self.progress.show(pos, record, eta=eta, newline='loss.valid' in record)
        return record

    def utilization(self, flops_per_token: float, peak_flops: float) -> None:
        """The run's FLOPs per token (of a training step) and the peak FLOP/s of its devices: from now on every record
        with a speed has its `mfu`, and run.json both numbers (when the run directory has a run.json; a run.json that
        cannot be written now only lacks them)."""
        self.counted = (flops_per_token, peak_flops)
        if self.enabled and (self.run_dir / RUN_JSON).is_file():
            with contextlib.suppress(OSError, LazylabError):
                update_record(self.run_dir, flops_per_token=flops_per_token, peak_flops=peak_flops)

    def sample(self, pos, text: Optional[str]) -> None:
        """Print a sampled text on one line ('⏎' for newlines) and append it to samples.txt (None: nothing)."""
        if self.enabled and text is not None:
            self.progress.text('sample: ' + text.replace('\n', ' ⏎ '))
            append_whole(self.run_dir / SAMPLES_TXT, f'--- step {pos.step}, {pos.tokens:,} tokens\n{text}\n')


#: the line that opens each sample of samples.txt: `--- step 250, 512,000 tokens`
SAMPLE_HEADER = re.compile(r'^--- step (\d+), ', re.MULTILINE)


def drop_samples_after(path: Path, step: int) -> None:
    """Keep only the samples of samples.txt taken up to `step` (a resumed run samples the steps after its checkpoint
    again: a run killed between a validation's sample and its checkpoint would show that sample twice)."""
    if not path.is_file():
        return
    text = path.read_text(encoding='utf-8', errors='replace')
    cut = next((m.start() for m in SAMPLE_HEADER.finditer(text) if int(m.group(1)) > step), None)
    if cut is not None:
        write_text(path, text[:cut])


def append_whole(path: Path, text: str) -> None:
    """Append `text` to `path` whole or not at all: a write that fails (a full disk) cuts the file back to its
    length before, so no half line stays for a reader.

    Raises:
        TrainingError: `cannot write PATH: REASON` (the operating system's reason, e.g. No space left on device).
    """
    data = memoryview(text.encode('utf-8'))
    try:
        with open(path, 'ab', buffering=0) as f:  # unbuffered: nothing left to flush (and fail again) at close
            size = f.seek(0, os.SEEK_END)
            try:
                while data:
                    data = data[f.write(data):]
            except OSError:
                os.ftruncate(f.fileno(), size)
                raise
    except OSError as e:
        raise TrainingError(f'cannot write {path}: {e.strerror or e}') from None


@contextlib.contextmanager
def stdout_may_close() -> Iterator[None]:
    """While the block runs, a write to stdout after its reader went away (`lazylab train … | head -1`) sends
    stdout to os.devnull, once, instead of raising BrokenPipeError: the run's output is dropped from there on, and
    the run goes on to its end (checkpoint, status) as if nobody had stopped reading."""
    original = sys.stdout
    sys.stdout = _DropWhenClosed(original)
    try:
        yield
    finally:
        sys.stdout = original


class _DropWhenClosed:
    """A text stream that passes everything on to `stream` until a write or flush finds the pipe closed; then the
    stream's file descriptor is pointed at os.devnull (what is still buffered goes there too)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        point_at_devnull(self._stream)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, …: the stream's own
        return getattr(self._stream, name)
