"""A trial claimed but never tagged with its owner (the claimer killed between the two writes) is taken over by
`--resume` once it is known to be dead — at once when its process is gone (issue 34); a resume with nothing left says
so (issue 24).

The half-written state is made directly: a sweep process's set-up (study, trials, sweep.yaml, owner lock) is run
in this process, a trial is claimed without its owner being recorded, and the lock is let go as a kill would; or,
in a child process that claims the trial and SIGKILLs itself before it records itself.
"""
import datetime
import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lazylab import cli
from lazylab.sweeps import owners as owners_module
from lazylab.sweeps.plan import make_plan
from lazylab.sweeps.study import OWNER
from lazylab.sweeps.workers import Sweep


def half_claimed(tools, tmp_path: Path, keep_claim_record: bool) -> Path:
    """A 2-point sweep directory whose trial 0 is RUNNING with no owner, its claimer dead (its lock free; its lock
    file, saying `claiming 0`, kept or removed)."""
    plan = make_plan(['transformer', *tools.TINY, 'seed=0,1', f'runs_dir={tmp_path}', '--study', 'half'])
    sweep = Sweep(plan)
    sweep.prepare()
    trial = sweep.study.claim(before=sweep.owners.claiming)  # … and killed before `set_owner`
    assert trial.number == 0
    lock = sweep.owners.folder / sweep.token
    assert lock.read_text() == 'claiming 0\n'
    sweep.owners.lock.release()  # the kernel lets go of a killed process's lock
    if not keep_claim_record:
        lock.unlink()
    running = sweep.study.trials((sweep.study.optuna.trial.TrialState.RUNNING,))
    assert [(t.number, t.system_attrs.get(OWNER)) for t in running] == [(0, None)]
    return plan.sweep_dir


def backdate_claim(sweep_dir: Path, seconds: float) -> None:
    """Move the claim's time (the journal's record of trial 0 going RUNNING) `seconds` into the past."""
    journal = sweep_dir / 'study.journal'
    lines = journal.read_text().splitlines()
    for i, line in enumerate(lines):
        record = json.loads(line)
        if record.get('state') == 0 and record.get('datetime_start'):  # RUNNING
            then = datetime.datetime.fromisoformat(record['datetime_start']) - datetime.timedelta(seconds=seconds)
            record['datetime_start'] = then.isoformat(timespec='microseconds')
            lines[i] = json.dumps(record)
    journal.write_text('\n'.join(lines) + '\n')


def states(sweep_dir: Path) -> list[str]:
    import optuna
    from optuna.storages.journal import JournalFileBackend
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(sweep_dir / 'study.journal')))
    return [t.state.name for t in optuna.load_study(study_name='half', storage=storage).trials]


def test_a_claimed_trial_whose_dead_claimer_recorded_the_claim_is_taken_over(tools, tmp_path, capsys):
    d = half_claimed(tools, tmp_path, keep_claim_record=True)
    backdate_claim(d, owners_module.GRACE + 1)  # (a live claimer tags its trial within milliseconds)
    assert cli.main(['sweep', '--resume', str(d)]) == 0
    out = capsys.readouterr().out
    assert 'trial 0000 resumed' in out and 'trial 0001 started' in out
    assert states(d) == ['COMPLETE', 'COMPLETE']
    assert 'trial: restarting' in (d / 'trial-0000' / 'output.log').read_text()  # no checkpoint: from the start
    assert not list((d / '.owners').iterdir())  # the dead claimer's lock file went with its claim


def test_a_claimed_trial_with_no_record_of_its_claimer_is_taken_over_after_the_lease(tools, tmp_path, capsys):
    d = half_claimed(tools, tmp_path, keep_claim_record=False)
    # just claimed: its claimer may be alive on another machine; the trial is left, and the summary says until when
    assert cli.main(['sweep', '--resume', str(d)]) == 1
    out = capsys.readouterr().out
    assert 'trial 0001 started' in out and 'trial 0000' not in out.split('lazylab compare')[0]
    assert '1 trial left: lazylab sweep --resume' in out
    note = next(x for x in out.splitlines() if x.startswith('trial 0000 was claimed'))
    wait = int(note.split(' from ')[1].split()[0])
    assert note == (f'trial 0000 was claimed by a process that was killed before it recorded itself; lazylab sweep '
                    f'--resume takes it over from {wait} s from now') and 0 < wait <= owners_module.LEASE
    assert states(d) == ['RUNNING', 'COMPLETE']
    # once the lease is over, it is the resume's
    backdate_claim(d, owners_module.LEASE + 1)
    assert cli.main(['sweep', '--resume', str(d)]) == 0
    assert 'trial 0000 resumed' in capsys.readouterr().out
    assert states(d) == ['COMPLETE', 'COMPLETE']


#: a sweep process's set-up and claim of its first trial, then a SIGKILL before it tags the trial with its token
CLAIM_AND_DIE = """
import os, signal, sys
from lazylab.sweeps.plan import make_plan
from lazylab.sweeps.workers import Sweep
sweep = Sweep(make_plan(sys.argv[1:]))
sweep.prepare()
trial = sweep.study.claim(before=sweep.owners.claiming)
print(trial.number, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_resume_right_after_the_claimer_was_killed_takes_its_trial_over(tools, tmp_path, capsys, monkeypatch):
    args = ['transformer', *tools.TINY, 'seed=0,1', f'runs_dir={tmp_path}', '--study', 'half']
    killed = subprocess.run([sys.executable, '-c', CLAIM_AND_DIE, *args], env=tools.ENV, capture_output=True,
                            text=True, timeout=240)
    assert killed.returncode == -signal.SIGKILL and killed.stdout == '0\n', killed.stderr
    d = tmp_path / 'transformer' / 'sweep-half'
    assert [p.read_text() for p in (d / '.owners').iterdir()] == ['claiming 0\n']
    # the trial's age cannot be what lets it go: only its claimer being gone can
    monkeypatch.setattr(owners_module, 'GRACE', owners_module.LEASE)
    assert cli.main(['sweep', '--resume', str(d)]) == 0
    out = capsys.readouterr().out
    assert 'trial 0000 resumed' in out and 'trial 0001 started' in out and 'takes it over' not in out
    assert states(d) == ['COMPLETE', 'COMPLETE']
    assert not list((d / '.owners').iterdir())  # the dead claimer's lock file went with its claim


def test_a_claim_long_after_the_dead_process_said_it_would_claim_is_not_taken_at_once(tools, tmp_path, capsys,
                                                                                         monkeypatch):
    """The dead process wrote `claiming 0` a minute before trial 0 was claimed: that claim is another's (a process of
    another machine, which tags it within milliseconds), so it waits for the grace; the record stays for then."""
    d = half_claimed(tools, tmp_path, keep_claim_record=True)
    record = next((d / '.owners').iterdir())
    then = datetime.datetime.now().timestamp() - 60
    os.utime(record, (then, then))
    monkeypatch.setattr(owners_module, 'GRACE', 300.0)
    assert cli.main(['sweep', '--resume', str(d)]) == 1
    out = capsys.readouterr().out
    note = next(x for x in out.splitlines() if x.startswith('trial 0000 was claimed'))
    assert 'trial 0001 started' in out and 0 < int(note.split(' from ')[1].split()[0]) <= 300
    assert states(d) == ['RUNNING', 'COMPLETE'] and record.read_text() == 'claiming 0\n'


def test_a_live_process_that_says_it_is_claiming_the_trial_keeps_it_from_a_dead_ones_record(tools, tmp_path):
    d = half_claimed(tools, tmp_path, keep_claim_record=True)
    live = d / '.owners' / 'live-token'
    live.write_text('claiming 0\n')
    from lazylab.sweeps.owners import Owners
    from lazylab.sweeps.study import Study, make_pruner, make_sampler, open_storage
    study = Study(open_storage(str(d / 'study.journal')), 'half', 'minimize', make_sampler('grid', 0),
                  make_pruner('none'))
    with open(live) as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # its process lives: trial 0 may be the claim it is about to tag
        assert Owners(d / '.owners', study, 'another-token').take_over() == []
    assert Owners(d / '.owners', study, 'another-token').take_over() == [0]  # both dead: the trial is taken


def test_a_claimer_that_is_alive_keeps_its_trial(tools, tmp_path):
    d = half_claimed(tools, tmp_path, keep_claim_record=True)
    backdate_claim(d, owners_module.GRACE + 1)
    token = next((d / '.owners').iterdir())
    with open(token) as f:  # its process lives (holds the lock): the claim is its own
        fcntl.flock(f, fcntl.LOCK_EX)
        from lazylab.sweeps.owners import Owners
        from lazylab.sweeps.study import Study, make_pruner, make_sampler, open_storage
        study = Study(open_storage(str(d / 'study.journal')), 'half', 'minimize', make_sampler('grid', 0),
                      make_pruner('none'))
        assert Owners(d / '.owners', study, 'another-token').take_over() == []


@pytest.mark.parametrize('trials', [['seed=0']], ids=['a finished sweep'])
def test_resume_of_a_finished_sweep_says_nothing_to_do(tools, tmp_path, capsys, trials):
    assert cli.main(['sweep', 'transformer', *tools.TINY, *trials, f'runs_dir={tmp_path}', '--study', 'done']) == 0
    d = tmp_path / 'transformer' / 'sweep-done'
    before = {p: p.read_bytes() for p in d.rglob('*') if p.is_file() and p.name != 'study.journal'}
    capsys.readouterr()
    assert cli.main(['sweep', '--resume', str(d)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f'nothing to do: every trial of the sweep in {d} has ended (1 completed)'
    assert out[2] == f'lazylab compare {d}      (1 trial; keys that differ: 0)'
    assert {p: p.read_bytes() for p in d.rglob('*') if p.is_file() and p.name != 'study.journal'} == before
    assert not list((d / '.owners').iterdir())
