"""One `lazylab sweep` process at work: the sweep directory, the study, the workers (one trial each at a time).

The sweep asks the study for the next trial, has the launcher start it (lazylab.sweeps.launcher: a local
subprocess by default), polls it, and tells the study how it ended, from what the trial wrote in its folder
(`outcome`). See lazylab.sweeps.sweep for the command and what it writes; lazylab.sweeps.owners for which process
runs which trial; lazylab.sweeps.trial for a trial's own process.
"""
import contextlib
import json
import os
import platform
import resource
import shlex
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from lazylab import __version__, runs, user_files
from lazylab.errors import Interrupted, UsageError, plural
from lazylab.experiments.metrics import read_metrics
from lazylab.sweeps.compare import compare, format_table
from lazylab.sweeps.grammar import Dimension, plain
from lazylab.sweeps.launcher import Launcher, LocalLauncher, TrialProcess, TrialSpec, stop_all, workers_line
from lazylab.sweeps.owners import Owners
from lazylab.sweeps.plan import Plan
from lazylab.sweeps.slurm_launcher import SlurmLauncher
from lazylab.sweeps.study import REPORT_ENV, Study, make_pruner, make_sampler, open_storage


@dataclass
class Job:
    """A trial to run: its number, its params (as Optuna holds them) and their key=value overrides."""
    number: int
    params: dict[str, Any]
    overrides: list[str]
    resume: bool = False


@dataclass
class Slot:
    """A worker: the trial it runs now (none when idle), its process and when it started."""
    index: int
    job: Optional[Job] = None
    proc: Optional[TrialProcess] = None
    started: float = 0.0
    cpu: Optional[float] = None


class Sweep:
    """One `lazylab sweep` process: creates or joins the study, runs the workers, prints progress.

    Args:
        plan: the checked sweep.
        storage: the study's storage, opened already (None: opened by `prepare`).
        resuming: `lazylab sweep --resume` (the sweep directory must exist).
        launcher: what starts the trials (default: a `LocalLauncher` of the plan's --launcher).
    """

    def __init__(self, plan: Plan, storage=None, resuming: bool = False, launcher: Optional[Launcher] = None):
        self.plan, self.storage, self.resuming = plan, storage, resuming
        assign_gpus = not (any(t.startswith('device=') for t in plan.fixed) or 'device' in plan.space.by_key)
        if launcher is None and plan.slurm is not None:  # --launcher slurm: each trial a Slurm job
            launcher = SlurmLauncher(plan.slurm, name=f'lazylab-{plan.study}', shown=plan.redact)
        self.launcher = launcher or LocalLauncher(plan.launcher, assign_gpus=assign_gpus, shown=plan.redact)
        self.dir = plan.sweep_dir
        self.t0 = time.monotonic()
        self.outcomes: dict[str, int] = {}
        self.owners = None
        self.workers = plan.workers
        self.signalled, self.holding = None, False

    # set-up ------------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Make the sweep directory, create or join the study (its trials enqueued by the process that creates it),
        write sweep.yaml and the --config copy, and hold this process's owner lock.

        Raises:
            UsageError: a --resume of a folder that is not there; a study that holds another sweep (what this
                call made is removed again).
        """
        plan = self.plan
        if self.resuming and not self.dir.is_dir():
            raise UsageError(f'{self.dir} does not exist')
        made = [d for d in (self.dir, *self.dir.parents) if not d.exists()]  # deepest first
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.storage is None:
            self.storage = open_storage(plan.storage or str(self.dir / runs.STUDY_JOURNAL))
        self.token = f'{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}'
        # the study first: a study of another sweep is refused before this process writes anything in the folder
        seed = plan.seed
        self.study = Study(self.storage, plan.study, plan.direction, make_sampler(plan.sampler, seed),
                           make_pruner(plan.prune))
        if self.study.created:
            self.study.enqueue(plan.points, plan.signature(), say=self.note)
        else:
            theirs = self.study.wait_for_signature()
            if theirs != plan.signature():
                for d in made:  # only a --storage outside them can hold the other sweep: they are empty
                    d.rmdir()
                differ = [k for k in plan.signature() if theirs.get(k) != plan.signature()[k]]
                raise UsageError(f'study {plan.study} holds another sweep ({", ".join(differ)} differ); give '
                                 f'another --study name')
            if plan.sampler != 'grid':  # two processes drawing from one seed would draw the same points
                self.study.study.sampler = make_sampler(plan.sampler, seed + int(self.token.encode().hex()[-6:], 16))
        for i, path in enumerate(plan.config_files):  # the files as they were: the trials read these copies
            copy = self.dir / runs.sweep_config(i)
            if not copy.exists():
                copy.write_bytes(user_files.read_bytes(path, 'config file'))
        self._write_sweep_yaml()
        self.owners = Owners(self.dir / runs.OWNERS_DIR, self.study, self.token)
        self.owners.hold()

    def _write_sweep_yaml(self) -> None:
        """sweep.yaml, written once (the first process on the directory writes it); the storage's credentials are
        hidden in every field (lazylab.redaction)."""
        import torch  # loaded by the planning already; not at import, so that the sweep's parser loads no torch
        plan = self.plan
        argv = [plan.redact(a) for a in plan.argv]  # argument by argument, so that quoting cannot split a secret
        record = {
            'command': 'lazylab sweep ' + shlex.join(argv),
            'argv': argv, 'experiment': plan.name, **({'labml': True} if plan.labml else {}),
            'fixed': [plan.redact(t) for t in plan.fixed],
            'config_copy': _config_copies(plan),
            'space': plan.space.describe(), 'zip': plan.space.zips, 'sampler': plan.sampler,
            'trials': plan.trials, 'metric': plan.metric, 'direction': plan.direction, 'prune': plan.prune,
            'seed': plan.seed, 'study': plan.study,
            'storage': 'journal file ' + (plan.storage or runs.STUDY_JOURNAL)
            if plan.storage is None or '://' not in plan.storage else 'database',
            'storage_url': plan.redact(plan.storage) if plan.storage else None,
            'workers': plan.workers, 'lazylab': __version__, 'torch': str(torch.__version__),
            'optuna': self.study.optuna.__version__, 'python': platform.python_version(),
            'created': runs.timestamp(),
        }
        text = ('# lazylab sweep; finish it after a kill with: lazylab sweep --resume THIS_FOLDER\n'
                + yaml.safe_dump(record, sort_keys=False, allow_unicode=True))
        try:
            with open(self.dir / runs.SWEEP_YAML, 'x', encoding='utf-8') as f:
                f.write(text)
        except FileExistsError:
            pass

    def threads(self) -> int:
        """Torch threads per trial: the command's `threads=N` (N ≥ 1), else the launcher's cores per trial for the
        workers (a torchrun launcher's processes counted), at most the experiment's default."""
        plan = self.plan
        given = [t.split('=', 1)[1] for t in plan.fixed if t.startswith('threads=')]
        if given and given[-1].strip().isdigit() and int(given[-1]) > 0:
            return int(given[-1])  # what every trial uses; the first line and OMP_NUM_THREADS say the same
        n = self.launcher.cores_per_trial(self.workers)
        if plan.default_threads > 0:
            n = min(n, plan.default_threads)  # the experiment's own default (feedback: 1) is a tuned upper bound
        return n

    # the loop ------------------------------------------------------------------------------------------------
    def run(self) -> int:
        """Prepare, run the workers until no trial is left, print the summary; the exit code (see the command).
        Ctrl-C and SIGTERM raise an Interrupted (SIGTERM too, so that the trials are stopped first): 'interrupted',
        130; 'killed (SIGTERM)', 143 (as lazylab.errors.signals_interrupt); while the study is made and its trials
        recorded they wait until that is done (a study half-made would hold no sweep)."""
        previous = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        slots: list[Slot] = []
        try:
            with self.signals_held():
                self.prepare()
                self.takeovers = self._live_first([self._job(n, resume=True) for n in self.owners.take_over()])
            left = len(self.takeovers) + len(self.study.trials((self.study.optuna.trial.TrialState.WAITING,)))
            if self.resuming and left == 0 and not self.owners.running():
                return self.nothing_to_do()
            self.start_line(left)
            slots = [Slot(i) for i in range(self.workers)]
            self._cpu_seen = 0.0
            self._cpu_since_last()
            self.loop(slots)
        except KeyboardInterrupt as e:
            self.stop(slots)
            how = e.message if isinstance(e, Interrupted) else 'interrupted'  # or killed (SIGTERM)
            print(f'lazylab: {how}; lazylab sweep --resume {self.dir} finishes the sweep', file=sys.stderr)
            return e.exit_code if isinstance(e, Interrupted) else 130
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if self.owners is not None:
                self.owners.release()
        return self.summary()

    def _live_first(self, jobs: list[Job]) -> list[Job]:
        """Trials taken over, those whose job still runs first (a launcher whose trials outlive the sweep, Slurm's:
        reattaching to them takes the workers they hold, before a trial that must be submitted again)."""
        live = getattr(self.launcher, 'still_running', None)
        if live is None:
            return jobs
        return sorted(jobs, key=lambda j: live(self.dir / f'{runs.TRIAL_PREFIX}{j.number:04d}') is None)

    def start_line(self, left: int) -> None:
        """The first line (and a warning when more workers than cores would run); at most one worker per trial
        left (--workers 100000 on a grid of 4 starts 4)."""
        plan = self.plan
        self.workers = max(1, min(plan.workers, left))
        warning = workers_line(plan, self.workers) if getattr(self.launcher, 'local', True) else None
        if warning:
            print(warning, file=sys.stderr, flush=True)
        self.n_threads = self.threads()
        where = redact_storage(plan) if plan.storage else runs.STUDY_JOURNAL
        what = f'grid of {plan.trials}' if plan.sampler == 'grid' else plural(plan.trials, f'{plan.sampler} trial')
        keys = ' × '.join(','.join(g) if len(g) > 1 else g[0] for g in plan.space.axes()) or 'no swept keys'
        print(f'sweep {self.dir}: {what} ({keys}); {self.workers} worker{"s" * (self.workers > 1)} × '
              f'{self.n_threads} thread{"s" * (self.n_threads > 1)}; study {plan.study} ({where}); '
              f'{plan.metric}, {plan.direction}' + (f', pruning: {plan.prune}' if plan.prune != 'none' else ''),
              flush=True)

    def nothing_to_do(self) -> int:
        """`--resume` of a sweep whose every trial has ended: one line, the table, exit code 0 (as `lazylab
        resume` of a finished run)."""
        states: dict[str, int] = {}
        for t in self.study.trials():
            name = {'COMPLETE': 'completed', 'PRUNED': 'pruned', 'FAIL': 'failed'}.get(t.state.name, t.state.name)
            states[name] = states.get(name, 0) + 1
        counts = ', '.join(f'{n} {s}' for s, n in states.items())
        again = '; failed trials are not run again' if states.get('failed') else ''
        print(f'nothing to do: every trial of the sweep in {self.dir} has ended ({counts}){again}', flush=True)
        self.table()
        return 0

    def on_signal(self, signum, frame) -> None:
        """SIGINT, SIGTERM: raise an Interrupted now, or once the signals are no longer held (`signals_held`)."""
        self.signalled = Interrupted(signum)
        if not self.holding:
            raise self.signalled

    @contextlib.contextmanager
    def signals_held(self) -> Iterator[None]:
        """Ctrl-C and SIGTERM wait while the study is made, and while a trial is claimed and its process started,
        and are raised after: raised in between, one would leave a study without its trials, a claimed trial
        without a process, or a process that `stop` does not know of, or be swallowed by the hooks of the fork (and
        the sweep would go on)."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.signalled is not None:
            raise self.signalled

    def loop(self, slots: list[Slot]) -> None:
        """Until no trial is left and none runs: give each idle worker the next trial, poll the running ones, record
        each that ended."""
        exhausted = False
        while True:
            for slot in slots:
                if slot.proc is None and not exhausted:
                    with self.signals_held():
                        job = self.next_job()
                        if job is None:
                            exhausted = True
                        else:
                            self.start(slot, job)
            running = [s for s in slots if s.proc is not None]
            if not running:
                return
            time.sleep(0.05)
            for s in running:
                if s.proc.poll() is not None:
                    s.cpu = self._cpu_since_last()  # reaped just now: the CPU time of its process tree
                    self.finish(s)
                    exhausted = False  # look again: a trial may have been left by a process that died meanwhile

    def _cpu_since_last(self) -> float:
        """CPU seconds (user + system) of the child processes reaped since the last call (a local trial's process
        tree; for a launcher whose trials run elsewhere, its local client's)."""
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = usage.ru_utime + usage.ru_stime
        spent, self._cpu_seen = total - self._cpu_seen, total
        return spent

    def next_job(self) -> Optional[Job]:
        """The next trial: one taken over from a dead process, else a WAITING one claimed (None: none left)."""
        if not self.takeovers:
            self.takeovers = [self._job(n, resume=True) for n in self.owners.take_over()]
        if self.takeovers:
            return self.takeovers.pop(0)
        trial = self.study.claim(before=self.owners.claiming)
        if trial is None:
            return None
        self.study.set_owner(trial.number, self.token)
        params = {d.key: self._suggest(trial, d) for d in self.plan.space.dims}
        return Job(trial.number, params, self.plan.space.overrides(params))

    def _job(self, number: int, resume: bool) -> Job:
        trial = self.study.trial(number)  # its params as suggested, fixed (grid) or drawn now
        params = {d.key: self._suggest(trial, d) for d in self.plan.space.dims}
        return Job(number, params, self.plan.space.overrides(params), resume=resume)

    def _suggest(self, trial, d: Dimension) -> Any:
        if d.discrete:
            if d.int_step is not None and self.plan.sampler != 'grid':
                return trial.suggest_int(d.key, d.low, d.high, step=d.int_step, log=d.log)
            return trial.suggest_categorical(d.key, [plain(v) for v in d.values])
        if d.is_int:
            return trial.suggest_int(d.key, d.low, d.high, log=d.log)
        return trial.suggest_float(d.key, d.low, d.high, log=d.log)

    def start(self, slot: Slot, job: Job) -> None:
        """Record the trial's start (trial.json, the study's user attrs) and have the launcher start it."""
        plan = self.plan
        trial_dir = self.dir / f'{runs.TRIAL_PREFIX}{job.number:04d}'
        trial_dir.mkdir(exist_ok=True)
        record = (runs.read_json(trial_dir / runs.TRIAL_JSON) or {}) if job.resume else {}
        attempts = record.get('attempts', []) + [{'started': runs.timestamp(), 'owner': self.token,
                                                  'how': 'resumed' if job.resume else 'started'}]
        record.update({'number': job.number, 'params': job.params, 'overrides': job.overrides, 'state': 'running',
                       'metric': plan.metric, 'attempts': attempts, 'sweep': str(self.dir), 'study': plan.study})
        runs.write_json(trial_dir / runs.TRIAL_JSON, record)
        # the study's trial names its run directory and status (optuna-dashboard shows them: lazylab dashboard)
        self.study.set_user_attr(job.number, 'run_dir', str(trial_dir.resolve()))
        self.study.set_user_attr(job.number, 'status', 'running')
        env = {}
        if plan.prune != 'none':  # the storage in the environment, never on the command line (`ps` shows that)
            env[REPORT_ENV] = json.dumps({'storage': plan.storage or str(self.dir / runs.STUDY_JOURNAL),
                                          'study': plan.study, 'number': job.number, 'metric': plan.metric,
                                          'pruner': plan.prune})
        spec = TrialSpec(job.number, trial_dir, self.trial_args(trial_dir, job), self.n_threads, slot.index, env,
                         job.resume)
        slot.proc = self.launcher.launch(spec)
        slot.job, slot.started = job, time.monotonic()
        how = 'resumed' if job.resume else 'started'
        self.say(f'trial {job.number:04d} {how:<9} {" ".join(plan.space.shown(job.params))}')

    def trial_args(self, trial_dir: Path, job: Job) -> list[str]:
        """The arguments of the trial's process after `python -m lazylab.sweeps.trial` (see that module)."""
        plan = self.plan
        settings = list(plan.fixed)
        for i in range(len(plan.config_files)):
            settings += ['--config', str(self.dir / runs.sweep_config(i))]
        if plan.default_threads >= 0 and 'threads' not in plan.space.by_key:
            settings.append(f'threads={self.n_threads}')
        info = json.dumps({'dir': str(self.dir), 'study': plan.study, 'trial': job.number})
        script = ['--labml', '--runs-dir', str(plan.runs_dir), *(['--steps', str(plan.steps)] if plan.steps else [])] \
            if plan.labml else []
        return [str(trial_dir), plan.name, *script, *(['--resume'] if job.resume else []), '--swept',
                ','.join(job.params), '--info', info, '--', *settings, *job.overrides]

    def finish(self, slot: Slot, stopped: bool = False) -> None:
        """Record the end of the trial in `slot`; `stopped`: the sweep stopped it (any exit but 0 is then
        'interrupted', to be resumed: a trial stopped while it starts may end by a KeyboardInterrupt of its own)."""
        job, rc, slot_proc = slot.job, slot.proc.returncode, slot.proc
        seconds = time.monotonic() - slot.started
        slot.proc, slot.job = None, None
        trial_dir = self.dir / f'{runs.TRIAL_PREFIX}{job.number:04d}'
        state, value, error, steps = outcome(trial_dir, rc, self.plan.metric)
        if error is not None:
            error = self.plan.redact(error)
        if stopped and rc != 0:
            state, value, error, steps = 'interrupted', None, None, None
        # left to --resume, as the launcher names it (a Slurm job cancelled, preempted or timed out for good)
        shown = (getattr(slot_proc, 'ended_as', None) or state) if state == 'interrupted' and not stopped else state
        self.study.set_user_attr(job.number, 'status', shown)  # before `tell`: a finished trial takes no attrs
        if state != 'interrupted':
            if error:
                self.study.set_user_attr(job.number, 'error', error)
            self.study.tell(job.number, state, value)
        record = runs.read_json(trial_dir / runs.TRIAL_JSON) or {}
        record.update({'state': shown, 'value': value, 'error': error, 'steps': steps, 'returncode': rc,
                       'finished': runs.timestamp(), 'seconds': round(seconds, 2),
                       'cpu_seconds': None if slot.cpu is None else round(slot.cpu, 2)})
        slot.cpu = None
        runs.write_json(trial_dir / runs.TRIAL_JSON, record)
        self.outcomes[shown] = self.outcomes.get(shown, 0) + 1
        metric = f'{self.plan.metric} {value:.4f}' if value is not None else ''
        detail = error or (f'at step {steps}' if state == 'pruned' and steps else '')
        self.say(f'trial {job.number:04d} {shown:<9} {metric}  {seconds:.1f} s  '
                 f'{" ".join(self.plan.space.shown(job.params))}'
                 + (f'  ({detail})' if detail else ''))

    def stop(self, slots: list[Slot]) -> None:
        """Ctrl-C or SIGTERM: pass it on to the trials, wait for them, leave them to be resumed."""
        running = [s for s in slots if s.proc is not None]
        stop_all([s.proc for s in running])
        for s in running:
            self.finish(s, stopped=True)

    def summary(self) -> int:
        """Print the compare table; 1 when a trial of the study failed or is left to do (waiting, or running with
        no live process: interrupted), 0 otherwise (trials that other live processes still run are theirs)."""
        TrialState = self.study.optuna.trial.TrialState
        trials = self.study.trials()
        waiting = sum(t.state == TrialState.WAITING for t in trials)
        failed = sum(t.state == TrialState.FAIL for t in trials)
        running = [t for t in trials if t.state == TrialState.RUNNING]
        interrupted = [t for t in running if self.owners.interrupted(t)]
        self.table()
        if waiting or interrupted:
            print(f'{plural(waiting + len(interrupted), "trial")} left: lazylab sweep --resume {self.dir}', flush=True)
            for t in interrupted:
                note = self.owners.unowned_note(t)
                if note:
                    print(note, flush=True)
        if len(running) > len(interrupted):
            others = len(running) - len(interrupted)
            print(f'{plural(others, "trial")} still running in other processes', flush=True)
        return 1 if waiting or interrupted or failed else 0

    def table(self) -> None:
        """The `lazylab compare` table of the sweep (after an empty line), a warning line per damaged file first."""
        t = compare([str(self.dir)], metric=self.plan.metric)
        for warning in t.warnings:
            print(f'lazylab: warning: {warning}', file=sys.stderr, flush=True)
        print(flush=True)
        print(format_table(t), flush=True)

    def say(self, line: str) -> None:
        """A progress line on stdout, after the time since the sweep started ([M:SS])."""
        elapsed = int(time.monotonic() - self.t0)
        print(f'[{elapsed // 60}:{elapsed % 60:02d}] {line}', flush=True)

    def note(self, line: str) -> None:
        """A progress line of the set-up (stderr: stdout's first line names the sweep directory)."""
        print(line, file=sys.stderr, flush=True)


def _config_copies(plan: Plan) -> Any:
    """sweep.yaml's `config_copy`: the name of the one --config file's copy, a list of them for several, or None."""
    names = [runs.sweep_config(i) for i in range(len(plan.config_files))]
    return names[0] if len(names) == 1 else (names or None)


def redact_storage(plan: Plan) -> str:
    """The --storage as the first line shows it (a database URL's credentials hidden)."""
    return plan.redact(plan.storage) if plan.storage else runs.STUDY_JOURNAL


def outcome(trial_dir: Path, returncode: int, metric: str) -> tuple[str, Optional[float], Optional[str], Optional[int]]:
    """(state, value, error, steps) of a trial whose process ended with `returncode`.

    state: 'completed' (value: the final record's metric), 'pruned' (value: the last validation's), 'failed'
    (error: the one-line message it printed) or 'interrupted' (killed by a signal or Ctrl-C: to be resumed).
    """
    if returncode < 0 or returncode in (130, 143):
        return 'interrupted', None, None, None
    if returncode != 0:
        return 'failed', None, _error_line(trial_dir / runs.OUTPUT_LOG) or f'exit code {returncode}', None
    info = runs.read_json(trial_dir / runs.RUN_JSON) or {}
    metrics = trial_dir / runs.METRICS_JSONL
    records = read_metrics(metrics) if metrics.is_file() else []
    status = info.get('status', 'completed')
    steps = info.get('steps')
    with_metric = [r for r in records if metric in r]
    if status == 'pruned':
        return 'pruned', with_metric[-1][metric] if with_metric else None, None, steps
    if not with_metric:
        return 'failed', None, f'the run recorded no {metric}', steps
    return 'completed', float(with_metric[-1][metric]), None, steps


def _error_line(path: Path) -> Optional[str]:
    """The trial's one-line error: its `lazylab: error: …` line, or the last line of a traceback."""
    if not path.is_file():
        return None
    lines = [x.strip() for x in path.read_text(encoding='utf-8', errors='replace').splitlines() if x.strip()]
    lines = lines[next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith('--- ')), -1) + 1:]
    for x in reversed(lines):
        if x.startswith('lazylab: error: '):
            return x[len('lazylab: error: '):]
    return lines[-1] if lines else None
