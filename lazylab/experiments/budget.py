"""The time budget: a run's clock, its limit `max_minutes`, and the step count that ends the run on time.

    budget = TimeBudget(c.max_minutes, pos, fit_steps=c.max_steps == 0, max_total_steps=c.total_steps,
                        valid_every=valid_every, final_valid_ratio=task.final_valid_ratio)
    budget.out_of_time()          # the limit is reached (checked before every step)
    budget.validated(pos, secs)   # after a validation: calibrate, then fit pos.total_steps (True when it did)
    budget.refit(pos)             # every log_interval steps between validations, once calibrated

With `max_minutes` > 0 and `max_steps` = 0 the budget decides the length of the run. The step count is fitted so
that the run, final validation included, ends at `max_minutes`:

    time per step = training seconds per step since the last fit + validation seconds / valid_every
    final seconds = last validation's seconds · final_valid_ratio
    total_steps   = step + (budget − elapsed − final seconds) / time per step      (≥ step + 1, ≤ the epochs' count)

With a sequence-length warm-up the steps differ in cost: `work(a, b)` gives the cost of steps [a, b) in
full-length steps (task.SeqLenWarmup.work), the training seconds are per unit of work, and total_steps is the
largest step count whose work, with the validations' share, fits the time left.

The first fit comes at the first validation or after CALIBRATION_STEPS steps, whichever is first, timed from step
CALIBRATION_STEPS // 3 on (the first steps are slow: allocations, caches); the later ones at every validation and
every log_interval steps, so a machine that speeds up or slows down mid-run still ends on time. Under torchrun
rank 0's clock decides, so every process stops at the same step. With `max_steps` > 0 as well, `max_minutes` only
stops the run early.
"""
import math
import time
from typing import Callable, Optional

from lazylab.experiments import distributed
from lazylab.experiments.checkpoint import Position

#: steps timed before fitting the step count to `max_minutes` (when max_steps=0)
CALIBRATION_STEPS = 30


class TimeBudget:
    """The clock of one run (seconds summed over resumes) and, when it decides, the run's step count.

    Args:
        max_minutes: the time limit (0: none).
        pos: where the run starts (a resumed run: the checkpoint's position, whose `elapsed` the clock continues).
        fit_steps: fit `pos.total_steps` to the limit (max_steps = 0); else the limit only stops the run.
        max_total_steps: the fitted count never exceeds this (the count the epochs give).
        valid_every: steps between validations.
        final_valid_ratio: the final validation's duration over an interleaved one's.
        now: the wall clock, in seconds (time.time; a test gives a fake one).
        work: the cost of steps [a, b) in full-length steps (None: every step costs the same).
    """

    def __init__(self, max_minutes: float, pos: Position, *, fit_steps: bool, max_total_steps: int,
                 valid_every: int, final_valid_ratio: float, now: Callable[[], float] = time.time,
                 work: Optional[Callable[[int, int], float]] = None):
        self.seconds = min(max_minutes * 60, 1e300)  # 0: no time limit (a huge limit stays finite arithmetic)
        self.work = work
        self.fits = self.seconds > 0 and fit_steps
        self.max_total_steps, self.valid_every, self.final_valid_ratio = max_total_steps, valid_every, \
            final_valid_ratio
        self.now = now
        self.started, self.start_step, self.elapsed_before = now(), pos.step, pos.elapsed
        self.warm_step, self.warm_clock = CALIBRATION_STEPS // 3, None
        # what the next fit measures: training since (since_clock, since_step), and the last validation's seconds
        self.since_clock, self.since_step, self.valid_seconds = self.elapsed(), pos.step, 0.0

    def elapsed(self) -> float:
        """Wall-clock seconds of this run so far, over all resumes."""
        return self.elapsed_before + self.now() - self.started

    def out_of_time(self) -> bool:
        return self.seconds > 0 and self.elapsed() >= self.seconds

    def step_done(self, pos: Position) -> None:
        """After each optimizer step: the clock into `pos.elapsed`; the end of the slow first steps remembered."""
        pos.elapsed = self.elapsed()
        if pos.step == self.warm_step:
            self.warm_clock = pos.elapsed

    def calibration_due(self, pos: Position) -> bool:
        """The first fit is due now (CALIBRATION_STEPS steps taken, no validation yet): validate at this step."""
        return self.fits and not pos.calibrated and pos.step == CALIBRATION_STEPS

    def validated(self, pos: Position, seconds: float) -> bool:
        """After an interleaved validation that took `seconds`: calibrate (the first time), fit `pos.total_steps`.
        Returns whether the step count was fitted."""
        if not self.fits:
            return False
        self.valid_seconds = seconds
        if not pos.calibrated:  # the first steps are slow (allocations, caches): time from warm_step on
            self.since_clock = self.warm_clock or self.elapsed_before
            self.since_step = self.warm_step if self.warm_clock else self.start_step
            pos.calibrated = True
        fitted = self._fit(pos, just_validated=True)
        self.since_clock, self.since_step = self.elapsed(), pos.step
        return fitted

    def refit(self, pos: Position) -> bool:
        """Between validations: fit `pos.total_steps` again (once calibrated). Returns whether it did."""
        return self.fits and pos.calibrated and self._fit(pos, just_validated=False)

    def _fit(self, pos: Position, just_validated: bool) -> bool:
        steps = pos.step - self.since_step
        if steps <= 0:
            return False
        valid_seconds = self.valid_seconds
        training_seconds = self.elapsed() - self.since_clock - (valid_seconds if just_validated else 0.0)
        final_seconds = valid_seconds * self.final_valid_ratio
        left = self.seconds - self.elapsed() - final_seconds
        most = self.max_total_steps - pos.step
        if self.work is None:
            step_seconds = training_seconds / steps + valid_seconds / self.valid_every
            steps_left = left / step_seconds if step_seconds > 0 else math.inf
        else:
            steps_left = self._steps_fitting(pos.step, left, training_seconds / self.work(self.since_step, pos.step),
                                             valid_seconds / self.valid_every, most)
        steps_left = min(steps_left, most) if math.isfinite(steps_left) else most
        # every process must stop at the same step: rank 0's clock decides
        pos.total_steps = distributed.broadcast_object(min(self.max_total_steps, pos.step + max(1, int(steps_left))))
        return True

    def _steps_fitting(self, step: int, seconds: float, work_seconds: float, valid_share: float, most: int) -> int:
        """The largest k ≤ most with work(step, step + k) · work_seconds + k · valid_share ≤ seconds."""
        def cost(k: int) -> float:
            return self.work(step, step + k) * work_seconds + k * valid_share
        if cost(most) <= seconds:
            return most
        lo, hi = 0, most  # cost(lo) ≤ seconds < cost(hi); the cost grows with k
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if cost(mid) <= seconds else (lo, mid)
        return lo

    def eta(self, pos: Position) -> float:
        """Seconds to the end of the run: at this run's pace so far, and within the time limit."""
        done, left = pos.step - self.start_step, pos.total_steps - pos.step
        if self.work is not None and done > 0:  # in units of work: later steps of a warm-up cost more
            done, left = self.work(self.start_step, pos.step), self.work(pos.step, pos.total_steps)
        eta = (self.now() - self.started) / (done if done > 0 else 1) * left
        return min(eta, self.seconds - self.elapsed()) if self.seconds > 0 else eta
