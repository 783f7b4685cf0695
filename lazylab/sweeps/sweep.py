"""`lazylab sweep`: run many configurations of one experiment, each trial an ordinary run in its own process.

    lazylab sweep NAME [key=value | key=SWEEP …] [--config FILE] [--workers N] [--trials N]
                  [--sampler grid|random|tpe] [--zip KEY,KEY…] [--metric loss.valid] [--direction minimize|maximize]
                  [--prune none|median|halving] [--storage URL_OR_FILE] [--study NAME] [--seed N]
                  [--launcher COMMAND]
    lazylab sweep --resume SWEEP_DIR [--workers N] [--storage URL]

Everything is checked before anything is written (the grammar, every key and value against the experiment's
declarations, the whole configuration of every grid point — of each swept value for a sampler —, the flags); a
mistake is one line `lazylab: error: …` (naming the point), exit code 2. Then:

    RUNS_DIR/NAME/sweep-STUDY/     (STUDY: --study, or the start time and 4 random hex digits)
        sweep.yaml                 the command, the space, sampler, metric, storage, versions
        study.journal              Optuna's journal (the default storage)
        config.yaml                a copy of --config FILE, which the trials read
        trial-NNNN/                one ordinary run per trial (NNNN: the Optuna trial number): configs.yaml,
                                   run.json, metrics.jsonl, samples.txt, checkpoint.pt, labml/; output.log (what the
                                   trial printed) and trial.json (params, state, value, error, times)

The first line printed names the sweep directory; then one line as each trial starts and ends (trial, params,
metric, status, seconds); at the end the `lazylab compare` table of the sweep. Exit code 0 when every trial
completed or was pruned, 1 when some failed or did not finish (run `lazylab sweep --resume SWEEP_DIR`); stopped,
the running trials are stopped (to be resumed) and it prints `lazylab: interrupted; lazylab sweep --resume
SWEEP_DIR finishes the sweep` and exits with 130 on Ctrl-C, `lazylab: killed (SIGTERM); …` and 143 on SIGTERM.

Workers: `--workers N` runs up to N trials at once, each in its own process (`python -m lazylab.sweeps.trial`,
or `--launcher COMMAND -m lazylab.sweeps.trial …`, e.g. --launcher 'torchrun --standalone --nproc_per_node=2' for
trials that are torchrun jobs). A worker takes the next trial from the study as soon as its last one ends, so
nothing waits for the slowest trial of a batch. Each trial gets `threads=cores // N` (cores // (N × processes) for
a torchrun launcher) unless the command sets `threads`; on a machine with GPUs, worker i gets GPU i mod n_gpus
(CUDA_VISIBLE_DEVICES) unless the command sets `device`.

Resume, and many processes on one study: several `lazylab sweep` commands with the same --study (and --storage)
share the study and split its trials (see lazylab.sweeps.study: each trial is claimed by one process). Each process
holds a lock file SWEEP_DIR/.owners/TOKEN while it lives, and tags the trials it runs with TOKEN; a trial still
RUNNING whose owner's lock is free (its process was killed, or the machine lost power) is taken over by the next
process that runs on that sweep directory — `lazylab sweep --resume SWEEP_DIR` runs the recorded command again for
that — and continues from its checkpoint (or starts again without one; its status says which). Completed trials
are never run again, and their files are not touched. A lock file goes when no RUNNING trial is tagged with its
token any more: its process removes it at the end (unless it leaves trials to take over), and the process that
takes over a dead owner's last trial removes that owner's; so .owners/ holds only the live and the interrupted.
"""
import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from lazylab.errors import Interrupted, UsageError, plural
from lazylab.sweeps.spec import Dimension, Fixed, Space, _plain, check_points, full_key, parse_value, type_space
from lazylab.sweeps.trial import OUTPUT, REPORT_ENV, TRIAL

#: the keys of a validation record a sweep can optimize
METRICS = ('loss.valid', 'accuracy.valid', 'loss.train', 'accuracy.train', 'tokens_per_s')
SWEEP_YAML = 'sweep.yaml'
JOURNAL = 'study.journal'
CONFIG_COPY = 'config.yaml'
OWNERS = '.owners'


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f'lazylab sweep: {message}')


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog='lazylab sweep', add_help=False, allow_abbrev=False)
    p.add_argument('settings', nargs='*')
    p.add_argument('--config')
    p.add_argument('--workers', type=int, default=1)
    p.add_argument('--trials', type=int)
    p.add_argument('--sampler', choices=('grid', 'random', 'tpe'))
    p.add_argument('--zip', action='append', default=[])
    p.add_argument('--metric', default='loss.valid')
    p.add_argument('--direction', choices=('minimize', 'maximize'))
    p.add_argument('--prune', choices=('none', 'median', 'halving'), default='none')
    p.add_argument('--storage')
    p.add_argument('--study')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--launcher')
    p.add_argument('--resume')
    p.add_argument('-h', '--help', action='store_true')
    return p


@dataclass
class Plan:
    """A checked sweep: what to run and how (nothing written yet)."""
    name: str
    argv: list[str]                 # the command's arguments, as given
    fixed: list[str]                # key=value tokens for every trial
    config_file: Optional[str]
    space: Space
    sampler: str
    trials: int
    metric: str
    direction: str
    prune: str
    storage: Optional[str]          # None: the journal in the sweep directory
    study: str
    seed: int
    workers: int
    launcher: list[str]
    runs_dir: Path
    default_threads: int
    points: list[dict[str, Any]] = field(default_factory=list)

    @property
    def sweep_dir(self) -> Path:
        return self.runs_dir / self.name / f'sweep-{self.study}'

    def signature(self) -> dict[str, Any]:
        """What every process on one study must agree on (machines may differ in paths, threads, versions)."""
        config = None
        if self.config_file:
            config = hashlib.sha256(Path(self.config_file).read_bytes()).hexdigest()
        fixed = [t for t in self.fixed if not t.startswith('runs_dir=')]  # each machine has its own runs folder
        return {'experiment': self.name, 'fixed': fixed, 'config_sha256': config,
                'space': self.space.describe(), 'zip': self.space.zips, 'sampler': self.sampler,
                'trials': self.trials, 'metric': self.metric, 'direction': self.direction, 'prune': self.prune}


def make_plan(argv: list[str], *, study: Optional[str] = None, storage: Optional[str] = None) -> Plan:
    """Parse and check a `lazylab sweep` command line (see the module docstring); writes nothing.

    Raises:
        UsageError, ConfigError, DataError: the first mistake, in one line.
    """
    a = _parser().parse_intermixed_args(argv)
    if not a.settings or '=' in a.settings[0]:
        raise UsageError('usage: lazylab sweep NAME [key=value | key=SWEEP …] [--workers N] … (lazylab sweep -h)')
    name, tokens = a.settings[0], a.settings[1:]
    from lazylab.experiments.discovery import load_experiment
    module = load_experiment(name)
    defaults = module.Configs()
    fixed, dims, seen = [], [], set()
    for token in tokens:
        key, eq, text = token.partition('=')
        key = key.strip()
        if not eq or not key:
            raise UsageError(f'expected key=value or key=SWEEP, got {token!r}')
        value = parse_value(key, text)
        full = full_key(defaults, key)  # a key's unique end stands for it, as on `lazylab train`
        if full in seen:
            raise UsageError(f'{full} is given twice')
        seen.add(full)
        if isinstance(value, Fixed):
            fixed.append(f'{key}={value.text}')  # (the trial's `lazylab train` reads it as this one does)
        else:
            if full in ('runs_dir', 'preset'):
                raise UsageError(f'{full} cannot be swept (run one sweep per {full})')
            value.key = full  # what the study, the trials' records and `lazylab compare` name
            dims.append(value)
    for d in dims:
        if d.log and d.kind == 'choice' and d.int_step not in (None, 1):
            raise UsageError(f'{d.key}={d.written}: tag(log, range()) needs step 1')
    if a.metric not in METRICS:
        import difflib
        close = difflib.get_close_matches(a.metric, METRICS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ''
        raise UsageError(f'unknown --metric {a.metric!r}{hint}; metrics: {", ".join(METRICS)}')
    direction = a.direction or ('maximize' if a.metric.startswith(('accuracy', 'tokens')) else 'minimize')
    if a.workers < 1:
        raise UsageError(f'--workers must be ≥ 1, got {a.workers}')
    if a.seed < 0:
        raise UsageError(f'--seed must be ≥ 0, got {a.seed}')
    study = study or a.study
    if study is not None and not re.fullmatch(r'[A-Za-z0-9][A-Za-z0-9._-]*', study):
        raise UsageError(f'--study {study!r}: use letters, digits, ".", "_" and "-" (it names the sweep folder)')
    storage = storage or a.storage
    if storage is not None and '://' not in storage:
        storage = str(Path(storage).resolve())
        if not Path(storage).parent.is_dir():
            raise UsageError(f'--storage {a.storage}: folder {Path(storage).parent} does not exist')
    config_args = ['--config', a.config] if a.config else []
    conf = type_space(name, fixed + config_args, dims)
    zips = [[full_key(defaults, k.strip()) for k in z.split(',') if k.strip()] for z in a.zip]
    space = Space(dims, zips)
    sampler = a.sampler or ('grid' if space.discrete else 'tpe')
    if sampler == 'grid':
        if not space.discrete:
            key = next(d.key for d in dims if not d.discrete)
            raise UsageError(f'{key} is an interval: the grid needs lists or ranges (or use --sampler random|tpe '
                             f'--trials N)')
        if a.trials is not None:
            each = 'its one point' if space.size() == 1 else f'each of its {space.size()} points'
            raise UsageError(f'--trials is for --sampler random|tpe; the grid runs {each} once')
        points = space.grid()
        trials = len(points)
    else:
        if a.trials is None or a.trials < 1:
            raise UsageError(f'--sampler {sampler} draws --trials N points: give --trials (N ≥ 1)')
        if space.zips:
            raise UsageError('--zip is for the grid sampler')
        points, trials = [{}] * a.trials, a.trials
    try:
        launcher = shlex.split(a.launcher) if a.launcher is not None else [sys.executable]
    except ValueError as e:  # an unclosed quote
        raise UsageError(f'--launcher {a.launcher!r}: {e}') from None
    if not launcher:
        raise UsageError('--launcher is empty')
    import shutil
    if shutil.which(launcher[0]) is None:
        raise UsageError(f'--launcher {a.launcher!r}: no program {launcher[0]!r} (not on PATH, or not executable)')
    check_points(name, fixed + config_args, space, grid=sampler == 'grid')  # as the first point, before any file
    default_threads = defaults.threads if not any(t.startswith('threads=') for t in fixed) else -1
    return Plan(name=name, argv=list(argv), fixed=fixed, config_file=a.config, space=space, sampler=sampler,
                trials=trials, metric=a.metric, direction=direction, prune=a.prune, storage=storage,
                study=study or time.strftime('%Y%m%d-%H%M%S') + '-' + os.urandom(2).hex(), seed=a.seed,
                workers=a.workers, launcher=launcher, runs_dir=Path(conf.runs_dir), default_threads=default_threads,
                points=points)


# --- the command ------------------------------------------------------------------------------------------

def sweep_main(argv: list[str]) -> int:
    """`lazylab sweep …` (or `--resume SWEEP_DIR`); returns the exit code of the module docstring."""
    a = _parser().parse_intermixed_args(argv)
    if a.help:  # the usage lines, then the rest of the module docstring
        title, _, body = __doc__.partition('\n\n')
        print('usage: ' + body.strip() + '\n')
        return 0
    if a.resume is not None:
        return resume_main(a.resume, argv)
    plan = make_plan(argv)
    store = None
    if plan.storage is not None:
        from lazylab.sweeps.study import open_storage
        store = open_storage(plan.storage)  # a bad URL, server or journal file: an error before any file
    return Sweep(plan, store).run()


def resume_main(sweep_dir: str, argv: list[str]) -> int:
    """`lazylab sweep --resume SWEEP_DIR [--workers N] [--storage URL]`: run the recorded command again on its
    study, which finishes what is left (see the module docstring)."""
    import yaml
    a = _parser().parse_intermixed_args(argv)
    path = Path(sweep_dir)
    if a.settings or a.config or a.zip or a.trials is not None or a.sampler or a.study:
        raise UsageError('lazylab sweep --resume SWEEP_DIR takes only --workers and --storage: the rest is in '
                         f'{SWEEP_YAML}')
    if not (path / SWEEP_YAML).is_file():
        raise UsageError(f'{sweep_dir} is not a sweep directory (no {SWEEP_YAML})')
    try:
        record = yaml.safe_load((path / SWEEP_YAML).read_text(encoding='utf-8'))
    except (UnicodeDecodeError, yaml.YAMLError):
        record = None
    if not isinstance(record, dict) or not isinstance(record.get('argv'), list) or \
            not isinstance(record.get('study'), str):
        raise UsageError(f'{path / SWEEP_YAML} is damaged (no command and study recorded)')
    storage = a.storage or record.get('storage_url')
    if storage and '***' in storage:
        raise UsageError(f'{SWEEP_YAML} hides the storage password: give --storage URL (or keep the password in '
                         f'~/.pgpass, out of the URL)')
    given = argv
    argv = list(record['argv'])
    if any(x == '--workers' or x.startswith('--workers=') for x in given):
        argv = _without(argv, '--workers') + ['--workers', str(a.workers)]
    if record.get('config_copy'):
        argv = _without(argv, '--config') + ['--config', str(path / record['config_copy'])]
    plan = make_plan(argv, study=record['study'], storage=storage or None)
    if plan.sweep_dir.resolve() != path.resolve():
        # run from another folder: the sweep directory is RUNS_DIR/NAME/sweep-STUDY from here (as given, when that
        # names it); from the folder it was started in, the trials get the runs_dir the sweep gave, as written
        runs_dir = path.parent.parent if path.parent.parent.resolve() == path.resolve().parent.parent else \
            path.resolve().parent.parent
        argv = [x for x in argv if not x.startswith('runs_dir=')] + [f'runs_dir={runs_dir}']
        plan = make_plan(argv, study=record['study'], storage=storage or None)
    if plan.sweep_dir.resolve() != path.resolve():
        raise UsageError(f'{sweep_dir}: {SWEEP_YAML} describes {plan.sweep_dir} (was the folder moved? run the '
                         f'command of {SWEEP_YAML} from the folder it was started in)')
    store = None
    if plan.storage is not None:
        from lazylab.sweeps.study import open_storage
        store = open_storage(plan.storage)
    return Sweep(plan, store, resuming=True).run()


def _without(argv: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
            continue
        if x == flag:
            skip = True
            continue
        if x.startswith(flag + '='):
            continue
        out.append(x)
    return out


# --- the workers --------------------------------------------------------------------------------------------

@dataclass
class Job:
    number: int
    params: dict[str, Any]
    overrides: list[str]
    resume: bool = False


@dataclass
class Slot:
    index: int
    job: Optional[Job] = None
    proc: Optional[subprocess.Popen] = None
    started: float = 0.0
    cpu: Optional[float] = None


def _die_with_parent():
    """In a trial process (Linux): be killed when the sweep process dies, so that a killed sweep leaves no
    orphan trial behind (the next sweep on the directory resumes the trial instead)."""
    try:
        import ctypes
        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Sweep:
    """One `lazylab sweep` process: creates or joins the study, runs the workers, prints progress."""

    def __init__(self, plan: Plan, storage=None, resuming: bool = False):
        self.plan, self.storage, self.resuming = plan, storage, resuming
        self.dir = plan.sweep_dir
        self.t0 = time.monotonic()
        self.outcomes: dict[str, int] = {}

    # set-up ------------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        from lazylab.sweeps.study import Study, make_pruner, make_sampler, open_storage
        plan = self.plan
        if self.resuming and not self.dir.is_dir():
            raise UsageError(f'{self.dir} does not exist')
        made = [d for d in (self.dir, *self.dir.parents) if not d.exists()]  # deepest first
        self.dir.mkdir(parents=True, exist_ok=True)
        storage_path = plan.storage or str(self.dir / JOURNAL)
        if self.storage is None:
            self.storage = open_storage(storage_path)
        self.storage_name = storage_path if '://' not in storage_path else self._masked(storage_path)
        self.token = f'{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}'
        # the study first: a study of another sweep is refused before this process writes anything in the folder
        seed = plan.seed
        self.study = Study(self.storage, plan.study, plan.direction, make_sampler(plan.sampler, seed),
                           make_pruner(plan.prune))
        if self.study.created:
            self.study.enqueue(plan.points, plan.signature())
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
        if plan.config_file:
            copy = self.dir / CONFIG_COPY
            if not copy.exists():
                copy.write_bytes(Path(plan.config_file).read_bytes())
        self._write_sweep_yaml()
        self.owners = self.dir / OWNERS
        self.owners.mkdir(exist_ok=True)
        import fcntl
        self.owner_lock = open(self.owners / self.token, 'w')
        fcntl.flock(self.owner_lock, fcntl.LOCK_EX)

    @staticmethod
    def _masked(url: str) -> str:
        from lazylab.sweeps.study import mask_password
        return mask_password(url)

    def _write_sweep_yaml(self) -> None:
        """sweep.yaml, written once (the first process on the directory writes it)."""
        import platform

        import optuna
        import torch
        import yaml

        import lazylab
        plan = self.plan
        record = {
            'command': 'lazylab sweep ' + shlex.join(plan.argv),
            'argv': plan.argv, 'experiment': plan.name, 'fixed': plan.fixed,
            'config_copy': CONFIG_COPY if plan.config_file else None,
            'space': plan.space.describe(), 'zip': plan.space.zips, 'sampler': plan.sampler,
            'trials': plan.trials, 'metric': plan.metric, 'direction': plan.direction, 'prune': plan.prune,
            'seed': plan.seed, 'study': plan.study,
            'storage': 'journal file ' + (plan.storage or JOURNAL) if plan.storage is None or '://' not in plan.storage
            else 'database', 'storage_url': self._masked(plan.storage) if plan.storage else None,
            'workers': plan.workers, 'lazylab': lazylab.__version__, 'torch': str(torch.__version__),
            'optuna': optuna.__version__, 'python': platform.python_version(),
            'created': time.strftime('%Y-%m-%dT%H:%M:%S'),
        }
        text = ('# lazylab sweep; finish it after a kill with: lazylab sweep --resume THIS_FOLDER\n'
                + yaml.safe_dump(record, sort_keys=False, allow_unicode=True))
        try:
            with open(self.dir / SWEEP_YAML, 'x', encoding='utf-8') as f:
                f.write(text)
        except FileExistsError:
            pass

    def threads(self) -> int:
        """Torch threads per trial process: the command's `threads=N` (N ≥ 1), else the cores divided among the
        workers (and a torchrun launcher's processes), at most the experiment's default."""
        plan = self.plan
        given = [t.split('=', 1)[1] for t in plan.fixed if t.startswith('threads=')]
        if given and given[-1].strip().isdigit() and int(given[-1]) > 0:
            return int(given[-1])  # what every trial uses; the first line and OMP_NUM_THREADS say the same
        cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)
        per_launch = 1
        m = re.search(r'--nproc[_-]per[_-]node[= ](\d+)', ' '.join(plan.launcher))
        if m:
            per_launch = int(m.group(1))
        n = max(1, cores // (plan.workers * per_launch))
        if plan.default_threads > 0:
            n = min(n, plan.default_threads)  # the experiment's own default (feedback: 1) is a tuned upper bound
        return n

    def gpus(self) -> list[str]:
        if any(t.startswith('device=') for t in self.plan.fixed) or 'device' in self.plan.space.by_key:
            return []
        visible = os.environ.get('CUDA_VISIBLE_DEVICES')
        if visible is not None:
            return [g for g in visible.split(',') if g.strip()]
        try:
            import torch
            return [str(i) for i in range(torch.cuda.device_count())]
        except Exception:
            return []

    # the loop ------------------------------------------------------------------------------------------------
    def run(self) -> int:
        plan = self.plan
        self.prepare()
        self.n_threads, self.gpu_ids = self.threads(), self.gpus()
        where = self.storage_name if plan.storage else JOURNAL
        what = f'grid of {plan.trials}' if plan.sampler == 'grid' else plural(plan.trials, f'{plan.sampler} trial')
        keys = ' × '.join(','.join(g) if len(g) > 1 else g[0] for g in plan.space.axes()) or 'no swept keys'
        print(f'sweep {self.dir}: {what} ({keys}); {plan.workers} worker{"s" * (plan.workers > 1)} × '
              f'{self.n_threads} thread{"s" * (self.n_threads > 1)}; study {plan.study} ({where}); '
              f'{plan.metric}, {plan.direction}' + (f', pruning: {plan.prune}' if plan.prune != 'none' else ''),
              flush=True)
        slots = [Slot(i) for i in range(plan.workers)]
        self._cpu_seen = 0.0
        self._cpu_since_last()
        self.takeovers = self.stale_trials()
        # Ctrl-C and SIGTERM raise an Interrupted (SIGTERM too, so that the trials are stopped first): 'interrupted',
        # 130; 'killed (SIGTERM)', 143 (as lazylab.errors.signals_interrupt)
        self.signalled, self.holding = None, False
        previous = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.loop(slots)
        except KeyboardInterrupt as e:
            self.stop(slots)
            how = e.message if isinstance(e, Interrupted) else 'interrupted'  # or killed (SIGTERM)
            print(f'lazylab: {how}; lazylab sweep --resume {self.dir} finishes the sweep', file=sys.stderr)
            return e.exit_code if isinstance(e, Interrupted) else 130
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self.release()
        return self.summary()

    def on_signal(self, signum, frame) -> None:
        self.signalled = Interrupted(signum)
        if not self.holding:
            raise self.signalled

    @contextlib.contextmanager
    def signals_held(self) -> Iterator[None]:
        """Ctrl-C and SIGTERM wait while a trial is claimed and its process started, and are raised after: raised
        in between, one would leave a claimed trial without a process, or a process that `stop` does not know of,
        or be swallowed by the hooks of the fork (and the sweep would go on)."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.signalled is not None:
            raise self.signalled

    def release(self) -> None:
        """Let go of this process's owner lock; its file goes too unless a trial it owns is left RUNNING (then
        the next process on the directory takes the trial over through that file, and removes it)."""
        if not self.owned_running(self.token):
            (self.owners / self.token).unlink(missing_ok=True)
        self.owner_lock.close()

    def owned_running(self, owner: str) -> bool:
        """Whether a RUNNING trial of the study is tagged with `owner`."""
        from lazylab.sweeps.study import OWNER
        running = self.study.trials((self.study.optuna.trial.TrialState.RUNNING,))
        return any(t.system_attrs.get(OWNER) == owner for t in running)

    def loop(self, slots: list[Slot]) -> None:
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
        """CPU seconds (user + system) of the child processes reaped since the last call."""
        import resource
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = usage.ru_utime + usage.ru_stime
        spent, self._cpu_seen = total - self._cpu_seen, total
        return spent

    def next_job(self) -> Optional[Job]:
        if not self.takeovers:
            self.takeovers = self.stale_trials()
        if self.takeovers:
            return self.takeovers.pop(0)
        trial = self.study.claim()
        if trial is None:
            return None
        self.study.set_owner(trial.number, self.token)
        params = {d.key: self._suggest(trial, d) for d in self.plan.space.dims}
        return Job(trial.number, params, self.plan.space.overrides(params))

    def _suggest(self, trial, d: Dimension) -> Any:
        if d.discrete:
            if d.int_step is not None and self.plan.sampler != 'grid':
                return trial.suggest_int(d.key, d.low, d.high, step=d.int_step, log=d.log)
            return trial.suggest_categorical(d.key, [_plain(v) for v in d.values])
        if d.is_int:
            return trial.suggest_int(d.key, d.low, d.high, log=d.log)
        return trial.suggest_float(d.key, d.low, d.high, log=d.log)

    def stale_trials(self) -> list[Job]:
        """RUNNING trials of this sweep directory whose process is gone (its owner lock is free): taken over
        (retagged with this process's token) and returned as jobs to resume."""
        import fcntl

        from lazylab.sweeps.study import OWNER
        jobs, taken_from = [], set()
        for t in sorted(self.study.trials((self.study.optuna.trial.TrialState.RUNNING,)), key=lambda t: t.number):
            owner = t.system_attrs.get(OWNER)
            if owner is None or owner == self.token:
                continue  # not claimed by a lazylab sweep, or ours
            try:  # (opened, not created: a missing file is another machine's trial, which that machine resumes)
                fd = os.open(self.owners / owner, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its process is alive
                fresh = self.study.storage.get_trial(
                    self.study.storage.get_trial_id_from_study_id_trial_number(self.study.study_id, t.number))
                if fresh.state.name != 'RUNNING' or fresh.system_attrs.get(OWNER) != owner:
                    continue  # another process took it over first
                self.study.set_owner(t.number, self.token)
                taken_from.add(owner)
            finally:
                os.close(fd)
            trial = self.study.trial(t.number)  # its params as suggested, fixed (grid) or drawn now
            params = {d.key: self._suggest(trial, d) for d in self.plan.space.dims}
            jobs.append(Job(t.number, params, self.plan.space.overrides(params), resume=True))
        for owner in taken_from:  # its process is gone: once no trial is left to it, its lock file goes
            self.remove_dead_owner(owner)
        return jobs

    def remove_dead_owner(self, owner: str) -> None:
        """Remove the lock file of `owner`, a process that is gone (its lock is free), when no RUNNING trial is
        tagged with it."""
        import fcntl
        try:
            fd = os.open(self.owners / owner, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not self.owned_running(owner):
                (self.owners / owner).unlink(missing_ok=True)
        except BlockingIOError:
            pass  # alive after all
        finally:
            os.close(fd)

    def start(self, slot: Slot, job: Job) -> None:
        plan = self.plan
        trial_dir = self.dir / f'trial-{job.number:04d}'
        trial_dir.mkdir(exist_ok=True)
        record = _read_json(trial_dir / TRIAL) if job.resume else {}
        attempts = record.get('attempts', []) + [{'started': _now(), 'owner': self.token,
                                                  'how': 'resumed' if job.resume else 'started'}]
        record.update({'number': job.number, 'params': job.params, 'overrides': job.overrides, 'state': 'running',
                       'metric': plan.metric, 'attempts': attempts, 'sweep': str(self.dir), 'study': plan.study})
        _write_json(trial_dir / TRIAL, record)
        settings = list(plan.fixed)
        if plan.config_file:
            settings += ['--config', str(self.dir / CONFIG_COPY)]
        if plan.default_threads >= 0 and 'threads' not in plan.space.by_key:
            settings.append(f'threads={self.n_threads}')
        info = json.dumps({'dir': str(self.dir), 'study': plan.study, 'trial': job.number})
        cmd = [*plan.launcher, '-m', 'lazylab.sweeps.trial', str(trial_dir), plan.name,
               *(['--resume'] if job.resume else []), '--swept', ','.join(job.params), '--info', info,
               '--', *settings, *job.overrides]
        env = {**os.environ, 'OMP_NUM_THREADS': str(self.n_threads), 'MKL_NUM_THREADS': str(self.n_threads),
               'PYTHONUNBUFFERED': '1'}
        if self.gpu_ids:
            env['CUDA_VISIBLE_DEVICES'] = self.gpu_ids[slot.index % len(self.gpu_ids)]
        if plan.prune != 'none':
            env[REPORT_ENV] = json.dumps({'storage': plan.storage or str(self.dir / JOURNAL), 'study': plan.study,
                                          'number': job.number, 'metric': plan.metric, 'pruner': plan.prune})
        with open(trial_dir / OUTPUT, 'a', encoding='utf-8') as log:
            log.write(f'--- {_now()} {"resumed" if job.resume else "started"}: {shlex.join(cmd)}\n')
            log.flush()
            slot.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, preexec_fn=_die_with_parent if sys.platform == 'linux' else None)
        slot.job, slot.started = job, time.monotonic()
        how = 'resumed' if job.resume else 'started'
        self.say(f'trial {job.number:04d} {how:<9} {" ".join(plan.space.shown(job.params))}')

    def finish(self, slot: Slot, stopped: bool = False) -> None:
        """Record the end of the trial in `slot`; `stopped`: the sweep stopped it (any exit but 0 is then
        'interrupted', to be resumed: a trial stopped while it starts may end by a KeyboardInterrupt of its own)."""
        job, rc = slot.job, slot.proc.returncode
        seconds = time.monotonic() - slot.started
        slot.proc, slot.job = None, None
        trial_dir = self.dir / f'trial-{job.number:04d}'
        state, value, error, steps = outcome(trial_dir, rc, self.plan.metric)
        if stopped and rc != 0:
            state, value, error, steps = 'interrupted', None, None, None
        if state != 'interrupted':
            if error:
                self.study.set_user_attr(job.number, 'error', error)
            self.study.tell(job.number, state, value)
        record = _read_json(trial_dir / TRIAL)
        record.update({'state': state, 'value': value, 'error': error, 'steps': steps, 'returncode': rc,
                       'finished': _now(), 'seconds': round(seconds, 2),
                       'cpu_seconds': None if slot.cpu is None else round(slot.cpu, 2)})
        slot.cpu = None
        _write_json(trial_dir / TRIAL, record)
        self.outcomes[state] = self.outcomes.get(state, 0) + 1
        metric = f'{self.plan.metric} {value:.4f}' if value is not None else ''
        detail = error or (f'at step {steps}' if state == 'pruned' and steps else '')
        self.say(f'trial {job.number:04d} {state:<9} {metric}  {seconds:.1f} s  '
                 f'{" ".join(self.plan.space.shown(job.params))}'
                 + (f'  ({detail})' if detail else ''))

    def stop(self, slots: list[Slot]) -> None:
        """Ctrl-C or SIGTERM: pass it on to the trials, wait for them, leave them to be resumed."""
        for s in slots:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        for s in slots:
            if s.proc is not None:
                try:
                    s.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    s.proc.wait()
                self.finish(s, stopped=True)

    def summary(self) -> int:
        """Print the compare table; 1 when a trial of the study failed or is left to do (waiting, or running with
        no live process: interrupted), 0 otherwise (trials that other live processes still run are theirs)."""
        from lazylab.sweeps.compare import compare_text
        TrialState = self.study.optuna.trial.TrialState
        trials = self.study.trials()
        waiting = sum(t.state == TrialState.WAITING for t in trials)
        failed = sum(t.state == TrialState.FAIL for t in trials)
        running = [t for t in trials if t.state == TrialState.RUNNING]
        interrupted = [t for t in running if self._interrupted(t)]
        print(flush=True)
        print(compare_text([str(self.dir)], metric=self.plan.metric), flush=True)
        if waiting or interrupted:
            print(f'{plural(waiting + len(interrupted), "trial")} left: lazylab sweep --resume {self.dir}', flush=True)
        if len(running) > len(interrupted):
            others = len(running) - len(interrupted)
            print(f'{plural(others, "trial")} still running in other processes', flush=True)
        return 1 if waiting or interrupted or failed else 0

    def _interrupted(self, t) -> bool:
        """A RUNNING trial with no live process: ours (it was interrupted), or its owner's lock here is free."""
        from lazylab.sweeps.compare import lock_held
        from lazylab.sweeps.study import OWNER
        owner = t.system_attrs.get(OWNER)
        if owner is None or owner == self.token:
            return True
        return not lock_held(self.owners / owner)  # (a lock we cannot open: another machine's trial)

    def say(self, line: str) -> None:
        elapsed = int(time.monotonic() - self.t0)
        print(f'[{elapsed // 60}:{elapsed % 60:02d}] {line}', flush=True)


def outcome(trial_dir: Path, returncode: int, metric: str) -> tuple[str, Optional[float], Optional[str], Optional[int]]:
    """(state, value, error, steps) of a trial whose process ended with `returncode`.

    state: 'completed' (value: the final record's metric), 'pruned' (value: the last validation's), 'failed'
    (error: the one-line message it printed) or 'interrupted' (killed by a signal or Ctrl-C: to be resumed).
    """
    from lazylab.experiments.metrics import read_metrics
    from lazylab.runs import METRICS_JSONL as METRICS_FILE
    if returncode < 0 or returncode in (130, 143):
        return 'interrupted', None, None, None
    if returncode != 0:
        return 'failed', None, _error_line(trial_dir / OUTPUT) or f'exit code {returncode}', None
    info = _read_json(trial_dir / 'run.json')
    records = read_metrics(trial_dir / METRICS_FILE) if (trial_dir / METRICS_FILE).is_file() else []
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


def _now() -> str:
    return time.strftime('%Y-%m-%dT%H:%M:%S')


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding='utf-8'))
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + f'.tmp{os.getpid()}')
    tmp.write_text(json.dumps(record, indent=1) + '\n', encoding='utf-8')
    os.replace(tmp, path)
