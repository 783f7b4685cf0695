"""Which process runs which trial of a sweep directory, and the take-over of trials whose process is gone.

Each `lazylab sweep` process holds an exclusive lock on SWEEP_DIR/.owners/TOKEN while it lives (the kernel drops it
when the process ends, even by SIGKILL), and tags the trials it claims with TOKEN (the trial system attr
`lazylab:owner`). A trial still RUNNING whose owner's lock is free is taken over by the next process on the
directory (retagged, under the dead owner's lock, so by one process only). A lock file goes when no RUNNING trial is
tagged with its token any more: its process removes it at the end (unless it leaves trials to take over), and the
process that takes over a dead owner's last trial removes that owner's; so .owners/ holds only the live and the
interrupted. A lock file of another machine's process is not here: its trials are that machine's to resume.

Claiming a trial and tagging it are two writes to the study, so a process killed between them leaves a RUNNING
trial with no owner. Before each claim a process writes `claiming N` into its own lock file; a trial with no owner
is taken over (under a lock on .owners/ itself, by one process only) when a dead process's lock file says it was
claiming it and either
- no live process's file here says so too, and the trial was claimed within `CLAIM_WRITES` seconds after that file
  was written (the dead process's own claim: a process elsewhere, with no file here, claiming the same trial in those
  seconds is the only other reading) — so a `--resume` right after the kill takes it over; or
- the trial is at least `GRACE` seconds old (any live claimer, here or elsewhere, tags it within milliseconds);
or, with no such file here (a process of another machine, or of a lazylab before this record), once it is `LEASE`
seconds old. A dead claimer's file stays while the trial it names is RUNNING with no owner, so a later resume still
knows whose it was. (The locks are lazylab.locks': `hold_lock`, `exclusive_lock`, `lock_is_held`.)
"""
import datetime
from pathlib import Path
from typing import Any, NamedTuple, Optional

from lazylab import locks
from lazylab.sweeps.study import OWNER

#: seconds a trial with no owner must be old before a dead claimer's record lets it be taken over whatever the rest
GRACE = 10.0
#: seconds between a process's `claiming N` and its claim of trial N, at most (two writes; a loaded machine or a
#: slow database may stall between them)
CLAIM_WRITES = 10.0
#: seconds after which a trial with no owner and no claimer's record here is taken over
LEASE = 600.0


class Claim(NamedTuple):
    """A process's record, in its lock file, of the trial it was about to claim."""
    token: str
    number: int
    written: datetime.datetime      # the file's time: when it said so (local time, as Optuna's datetime_start)
    alive: bool                     # its process holds its lock


class Owners:
    """The owner locks of one sweep directory, as process `token` sees them.

    Args:
        folder: SWEEP_DIR/.owners.
        study: the sweep's `lazylab.sweeps.study.Study`.
        token: this process's token (host-pid-random).
    """

    def __init__(self, folder: Path, study: Any, token: str):
        self.folder, self.study, self.token = folder, study, token
        self.lock: Optional[locks.HeldLock] = None

    def hold(self) -> None:
        """Create and lock this process's lock file (held until `release`)."""
        self.folder.mkdir(exist_ok=True)
        self.lock = locks.hold_lock(self.folder / self.token, f'owner lock {self.token} is held', create=True)

    def claiming(self, number: int) -> None:
        """Record, in this process's lock file, that it is about to claim trial `number` (see the module docstring)."""
        (self.folder / self.token).write_text(f'claiming {number}\n', encoding='utf-8')

    def release(self) -> None:
        """Let go of this process's lock; its file goes too unless a trial it owns is left RUNNING (then the next
        process on the directory takes the trial over through that file, and removes it)."""
        if self.lock is None:
            return
        if not self.owned_running(self.token):
            (self.folder / self.token).unlink(missing_ok=True)
        self.lock.release()
        self.lock = None

    def running(self) -> list:
        """The study's RUNNING trials (Optuna's FrozenTrials)."""
        return self.study.trials((self.study.optuna.trial.TrialState.RUNNING,))

    def owned_running(self, owner: str) -> bool:
        """Whether a RUNNING trial of the study is tagged with `owner`."""
        return any(t.system_attrs.get(OWNER) == owner for t in self.running())

    def take_over(self) -> list[int]:
        """The RUNNING trials of this directory whose process is gone, taken over (retagged with this process's
        token), by number."""
        taken, dead, left = [], set(), set()
        claims = self._claims()
        for t in sorted(self.running(), key=lambda t: t.number):
            owner = t.system_attrs.get(OWNER)
            if owner is None:
                if self._unowned_dead(t, claims) and self._retag_unowned(t.number):
                    taken.append(t.number)
                else:
                    left.add(t.number)
            elif owner != self.token and self._retag_from(owner, t.number):
                taken.append(t.number)
                dead.add(owner)
        # gone: once no trial is left to it (tagged, or named by its claim and still without an owner), its file goes
        for owner in dead | {c.token for c in claims if not c.alive and c.number not in left}:
            self.remove_dead_owner(owner)
        return taken

    def _dead_lock(self, owner: str) -> Optional[locks.HeldLock]:
        """The lock of `owner`'s file, now held by this process: None when its process is alive, or its file is not
        here (opened, not created: that is another machine's trial, which that machine resumes)."""
        try:
            return locks.hold_lock(self.folder / owner, f'owner {owner} is alive')
        except (locks.Locked, FileNotFoundError):
            return None

    def _retag_from(self, owner: str, number: int) -> bool:
        """Retag trial `number` of dead `owner` (its lock free) with this token, under that lock."""
        lock = self._dead_lock(owner)
        if lock is None:
            return False
        try:
            if self._fresh_owner(number) != (True, owner):
                return False  # another process took it over first
            self.study.set_owner(number, self.token)
            return True
        finally:
            lock.release()

    def _claims(self) -> list[Claim]:
        """What the other processes' lock files here say they were claiming (the files that say so)."""
        out = []
        for path in self.folder.iterdir() if self.folder.is_dir() else ():
            if path.name == self.token:
                continue
            try:
                written = path.stat().st_mtime
                words = path.read_bytes()[:100].decode('ascii', 'replace').split()
            except OSError:
                continue
            if len(words) == 2 and words[0] == 'claiming' and words[1].isdigit():
                alive = locks.lock_is_held(path)  # (or a file this process cannot open: taken as alive)
                out.append(Claim(path.name, int(words[1]), datetime.datetime.fromtimestamp(written), alive))
        return out

    def _unowned_dead(self, t, claims: list[Claim]) -> bool:
        """Whether the process that claimed RUNNING trial `t` (which has no owner) is gone (module docstring)."""
        age = self.age(t)
        if age is None:
            return False
        named = [c for c in claims if c.number == t.number]
        dead = [c for c in named if not c.alive]
        if dead and not any(c.alive for c in named) and any(
                -1.0 <= (t.datetime_start - c.written).total_seconds() <= CLAIM_WRITES for c in dead):
            return True  # its claimer is gone: the claim came right after that process said it would make it
        return age >= LEASE or (age >= GRACE and bool(dead))

    @staticmethod
    def age(t) -> Optional[float]:
        """Seconds since trial `t` was claimed (its start), or None."""
        if t.datetime_start is None:
            return None
        return (datetime.datetime.now() - t.datetime_start).total_seconds()

    def _retag_unowned(self, number: int) -> bool:
        """Tag trial `number`, RUNNING with no owner, with this token, under a lock on .owners/ (so one process of
        this directory does)."""
        with locks.exclusive_lock(self.folder, wait=True):
            if self._fresh_owner(number) != (True, None):
                return False
            self.study.set_owner(number, self.token)
            return True

    def _fresh_owner(self, number: int) -> tuple[bool, Optional[str]]:
        """(whether trial `number` is RUNNING, its owner) as the storage holds it now."""
        storage, study_id = self.study.storage, self.study.study_id
        fresh = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study_id, number))
        return fresh.state.name == 'RUNNING', fresh.system_attrs.get(OWNER)

    def remove_dead_owner(self, owner: str) -> None:
        """Remove the lock file of `owner`, a process that is gone (its lock is free), when no RUNNING trial is
        tagged with it."""
        lock = self._dead_lock(owner)
        if lock is None:  # alive after all (or gone already)
            return
        try:
            if not self.owned_running(owner):
                (self.folder / owner).unlink(missing_ok=True)
        finally:
            lock.release()

    def interrupted(self, t) -> bool:
        """A RUNNING trial with no live process that this directory knows of: ours (it was interrupted), one whose
        owner's lock here is free, or one with no owner (its claimer was killed before it tagged it)."""
        owner = t.system_attrs.get(OWNER)
        if owner is None or owner == self.token:
            return True
        return not locks.lock_is_held(self.folder / owner)  # (a lock we cannot open: another machine's trial)

    def unowned_note(self, t) -> Optional[str]:
        """For a RUNNING trial with no owner that `take_over` left: when a --resume will take it over."""
        if t.system_attrs.get(OWNER) is not None:
            return None
        age = self.age(t) or 0.0
        wait = (GRACE if any(c.number == t.number and not c.alive for c in self._claims()) else LEASE) - age
        return (f'trial {t.number:04d} was claimed by a process that was killed before it recorded itself; '
                f'lazylab sweep --resume takes it over from {max(1, round(wait))} s from now')
