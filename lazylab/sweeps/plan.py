"""A `lazylab sweep` command line, parsed and checked: the `Plan` (nothing written yet).

`make_plan(argv)` checks everything before anything is written (the grammar, every key and value against the
experiment's declarations, the whole configuration of every grid point — of each swept value for a sampler —, the
flags); a mistake is one `UsageError` line. See lazylab.sweeps.sweep for the command itself.
"""
import argparse
import difflib
import hashlib
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from lazylab import runs, user_files
from lazylab.command_line import Parser, config_files, split_setting
from lazylab.configs import has_env_reference
from lazylab.errors import UsageError, given_twice
from lazylab.experiments import discovery
from lazylab.redaction import StorageURLError, parse_database_url, redact, redact_url
from lazylab.slurm import SlurmOptions, parse_options
from lazylab.slurm.executor import check_options
from lazylab.sweeps import scripts
from lazylab.sweeps.grammar import Dimension, Fixed, Space, parse_value

#: the keys of a validation record a sweep can optimize
METRICS = runs.METRIC_KEYS


def parser() -> Parser:
    """The parser of `lazylab sweep` (its flags are described in docs/guide/sweeps.md): the command's, and what a
    sweep's `--resume` reads its recorded command line with. -h/--help is a flag here (sweep_main prints the help)."""
    p = Parser('sweep', add_help=False)
    p.add_argument('settings', nargs='*')
    p.add_argument('--config', action='append')
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
    p.add_argument('--slurm', action='append')
    p.add_argument('--resume')
    p.add_argument('--dry-run', action='store_true')
    p.add_argument('--labml', action='store_true')
    p.add_argument('--steps', type=int)
    p.add_argument('--runs-dir')
    p.add_argument('-h', '--help', action='store_true')
    return p


@dataclass
class Plan:
    """A checked sweep: what to run and how (nothing written yet).

    Args:
        name: the experiment's name as given (NAME), or the module of a --labml script.
        argv: the command's arguments, as given.
        fixed: the key=value tokens every trial gets (keys as written).
        config_files: the --config files, in order (stacked as `lazylab train` stacks them).
        space: the swept dimensions, typed, and the --zip groups.
        sampler: 'grid', 'random' or 'tpe'.
        trials: how many trials: the grid's points, or --trials for a sampler.
        metric: the validation record's key the study optimizes (--metric, e.g. 'loss.valid').
        direction: 'minimize' or 'maximize' (--direction, else the metric's own).
        prune: --prune: 'none', 'median' or 'halving'.
        storage: the study's storage: a journal file's absolute path or a database URL; None: the journal file
            SWEEP_DIR/study.journal.
        study: the study name (--study, else a run id made of the time, `runs.new_run_id`); it names the sweep
            directory.
        seed: the sampler's seed (--seed).
        workers: as given (--workers): the sweep runs at most one per trial left.
        launcher: the words in front of `-m lazylab.sweeps.trial …` (the Python interpreter, or --launcher's).
        slurm: `--launcher slurm`'s checked --slurm options (each trial a Slurm job: lazylab.sweeps.slurm_launcher);
            None: the trials are local processes.
        runs_dir: the runs folder the sweep directory is made in (the experiment's runs_dir, or --runs-dir).
        default_threads: the experiment's default `threads`, an upper bound on each trial's threads (0: none);
            -1 when the command fixes threads= or for a --labml script (the sweep then gives no threads=).
        points: the grid's points ({key: typed value}, in grid order), or one {} per trial for a sampler.
        study_named: --study given (else a name made of the time).
        folder: the runs' folder of the experiment (RUNS_DIR/FOLDER): its STEM ('': `name`).
        labml: a labml script's sweep (--labml): its trials are `lazylab labml` runs.
        steps: --steps of a --labml sweep: each trial ends after that many optimizer updates (None: the script's).
    """
    name: str
    argv: list[str]                 # the command's arguments, as given
    fixed: list[str]                # key=value tokens for every trial
    config_files: list[str]
    space: Space
    sampler: str
    trials: int
    metric: str
    direction: str
    prune: str
    storage: Optional[str]          # None: the journal in the sweep directory
    study: str
    seed: int
    workers: int                    # as given (--workers): the sweep runs at most one per trial left
    launcher: list[str]
    runs_dir: Path
    default_threads: int
    points: list[dict[str, Any]] = field(default_factory=list)
    study_named: bool = True        # --study given (else a name made of the time)
    folder: str = ''                # the runs' folder of the experiment (RUNS_DIR/FOLDER): its STEM ('' : name)
    labml: bool = False             # a labml script's sweep (--labml): its trials are `lazylab labml` runs
    steps: Optional[int] = None     # --steps of a --labml sweep: each trial ends after that many optimizer updates
    slurm: Optional[SlurmOptions] = None  # --launcher slurm: each trial a Slurm job with these options

    @property
    def sweep_dir(self) -> Path:
        """RUNS_DIR/STEM/sweep-STUDY."""
        return self.runs_dir / (self.folder or self.name) / f'{runs.SWEEP_PREFIX}{self.study}'

    def signature(self) -> dict[str, Any]:
        """What every process on one study must agree on (machines may differ in paths, threads, versions)."""
        shas = [hashlib.sha256(user_files.read_bytes(f, 'config file')).hexdigest() for f in self.config_files]
        config = shas[0] if len(shas) == 1 else (shas or None)  # (one file: the sha256 sweeps recorded before)
        fixed = [t for t in self.fixed if not t.startswith('runs_dir=')]  # each machine has its own runs folder
        signature = {'experiment': self.name, 'fixed': fixed, 'config_sha256': config,
                     'space': self.space.describe(), 'zip': self.space.zips, 'sampler': self.sampler,
                     'trials': self.trials, 'metric': self.metric, 'direction': self.direction, 'prune': self.prune}
        if self.labml:
            signature.update(labml=True, steps=self.steps)
        return signature

    def redact(self, text: str) -> str:
        """`text` (a command line, a message) with the storage URL's credentials hidden (lazylab.redaction)."""
        return redact(text, [self.storage] if self.storage else [])

    def storage_shown(self, sweep_dir: Optional[Path] = None) -> str:
        """The storage as messages and sweep.yaml show it: the journal file, or the database URL redacted.

        Args:
            sweep_dir: the folder of the default journal file (`storage` None); None: this plan's `sweep_dir`.
        """
        if self.storage is None:
            return f'journal file {(sweep_dir or self.sweep_dir) / runs.STUDY_JOURNAL}'
        if '://' not in self.storage:
            return f'journal file {self.storage}'
        return f'database {redact_url(self.storage)}'


def make_plan(argv: list[str], *, study: Optional[str] = None, storage: Optional[str] = None,
              say: Optional[Callable[[str], None]] = None, check: bool = True) -> Plan:
    """Parse and check a `lazylab sweep` command line (see the module docstring); writes nothing.

    Args:
        argv: the arguments after `lazylab sweep`: NAME (or `--labml MODULE`), the key=value and key=SWEEP settings,
            the flags.
        study: the study name, taken before --study (`--resume` gives the one sweep.yaml records).
        storage: the study's storage (a journal file or a database URL), taken before --storage (`--resume`).
        say: where the progress lines of checking many points go (stderr by default).
        check: False: the first point only (for `--resume`, to find the sweep directory first); a --labml
            script's values are then left as text.

    Raises:
        UsageError, ConfigError, DataError: the first mistake, in one line.
    """
    a = parser().parse_intermixed_args(argv)
    if not a.settings or '=' in a.settings[0]:
        what = '--labml MODULE' if a.labml else 'NAME'
        raise UsageError(f'usage: lazylab sweep {what} [key=value | key=SWEEP …] [--workers N] … (lazylab sweep -h)')
    if a.labml:
        return _script_plan(a, argv, study, storage, check)
    for flag, value in (('--steps', a.steps), ('--runs-dir', a.runs_dir)):
        if value is not None:
            raise UsageError(f'{flag} is for --labml sweeps (an experiment is set by its keys: max_steps=, runs_dir=)')
    name, tokens = a.settings[0], a.settings[1:]
    a.config = config_files(a.config)  # one line before torch's import
    from lazylab.sweeps import typed  # torch (the points are computed): the parser and `--help` load none
    found = discovery.find_experiment(name)
    defaults = found.Configs()  # (imported, and checked to be an experiment)
    fixed, dims = _settings(tokens, lambda key: typed.full_key(defaults, key))
    metric, direction = _metric(a)
    study, storage = _study(a, study), _storage(storage or a.storage, a.storage)
    config_args = [arg for path in a.config for arg in ('--config', path)]
    checker = typed.PointChecker(name, fixed + config_args, [d.key for d in dims])
    conf = typed.type_space(name, fixed + config_args, dims, checker)
    space = Space(dims, [[typed.full_key(defaults, k.strip()) for k in z.split(',') if k.strip()] for z in a.zip])
    sampler, points, trials = _points(a, space)
    launcher, slurm = _launcher(a.launcher), _slurm(a, study, check)
    if check:
        typed.check_points(name, fixed + config_args, space, grid=sampler == 'grid', checker=checker, say=say)
    default_threads = defaults.threads if not any(t.startswith('threads=') for t in fixed) else -1
    return Plan(name=name, argv=list(argv), fixed=fixed, config_files=a.config, space=space, sampler=sampler,
                trials=trials, metric=metric, direction=direction, prune=a.prune, storage=storage,
                study=study or runs.new_run_id(), seed=a.seed,
                workers=a.workers, launcher=launcher, runs_dir=Path(conf.runs_dir), default_threads=default_threads,
                points=points, study_named=study is not None, folder=found.name, slurm=slurm)


def _script_plan(a: argparse.Namespace, argv: list[str], study: Optional[str], storage: Optional[str],
                 check: bool) -> Plan:
    """The plan of `lazylab sweep --labml MODULE …` (lazylab.sweeps.scripts): keys as written (a labml script's
    `lazylab labml` takes no short keys), typed by the script's config class (`check=False`: left as text, for
    `--resume` to find the sweep directory); no points computed."""
    name, tokens = a.settings[0], a.settings[1:]
    if a.prune != 'none':
        raise UsageError(f'--prune {a.prune} needs lazylab\'s trainer (its validation hook); a --labml script runs '
                         f'its own loop: sweep it without --prune')
    if a.steps is not None and a.steps < 1:
        raise UsageError(f'--steps must be ≥ 1, got {a.steps}')
    fixed, dims = _settings(tokens, lambda key: key)
    a.config = config_files(a.config)
    metric, direction = _metric(a, any_metric=True)
    study, storage = _study(a, study), _storage(storage or a.storage, a.storage)
    runs_dir = scripts.runs_dir(a.runs_dir)
    if check:
        scripts.check_script(name, fixed, dims, config=a.config, runs_dir=runs_dir)
    else:
        for d in dims:
            d.values = list(d.texts)
    space = Space(dims, [[k.strip() for k in z.split(',') if k.strip()] for z in a.zip])
    sampler, points, trials = _points(a, space)
    slurm = _slurm(a, study, check)
    return Plan(name=name, argv=list(argv), fixed=fixed, config_files=a.config, space=space, sampler=sampler,
                trials=trials, metric=metric, direction=direction, prune=a.prune, storage=storage,
                study=study or runs.new_run_id(), seed=a.seed, workers=a.workers, launcher=_launcher(a.launcher),
                runs_dir=Path(runs_dir), default_threads=-1, points=points, study_named=study is not None,
                folder=scripts.folder_name(name), labml=True, steps=a.steps, slurm=slurm)


def _study(a: argparse.Namespace, study: Optional[str]) -> Optional[str]:
    """The study name (given to `make_plan`, or --study), checked with --workers and --seed.

    Raises:
        UsageError: --workers < 1, --seed < 0, a study name that cannot name a folder.
    """
    if a.workers < 1:
        raise UsageError(f'--workers must be ≥ 1, got {a.workers}')
    if a.seed < 0:
        raise UsageError(f'--seed must be ≥ 0, got {a.seed}')
    study = study or a.study
    if study is not None and not re.fullmatch(r'[A-Za-z0-9][A-Za-z0-9._-]*', study):
        raise UsageError(f'--study {study!r}: use letters, digits, ".", "_" and "-" (it names the sweep folder)')
    return study


def _settings(tokens: list[str], full_key: Callable[[str], str]) -> tuple[list[str], list[Dimension]]:
    """(fixed key=value tokens, swept dimensions) of the command's settings; each swept key named in full, by
    `full_key`."""
    fixed, dims, seen = [], [], {}
    for token in tokens:
        key, text = split_setting(token, 'key=value or key=SWEEP')
        value = parse_value(key, text)
        if isinstance(value, Dimension) and has_env_reference(text):
            raise UsageError(f'{key}={text}: a swept value cannot read the environment; read it in a fixed '
                             f'key=${{env:NAME}} or in a --config file')
        full = full_key(key)  # a key's unique end stands for it, as on `lazylab train`
        if full in seen:
            raise UsageError(given_twice(full, seen[full], token))
        seen[full] = token
        if isinstance(value, Fixed):
            fixed.append(f'{key}={value.text}')  # (the trial's `lazylab train` reads it as this one does)
            continue
        if full in ('runs_dir', 'preset'):
            raise UsageError(f'{full} cannot be swept (run one sweep per {full})')
        value.key = full  # what the study, the trials' records and `lazylab compare` name
        dims.append(value)
    for d in dims:
        if d.log and d.kind == 'choice' and d.int_step not in (None, 1):
            raise UsageError(f'{d.key}={d.written}: tag(log, range()) needs step 1')
    return fixed, dims


def _metric(a: argparse.Namespace, any_metric: bool = False) -> tuple[str, str]:
    """(--metric, --direction or the metric's own); `any_metric`: a labml script's, any key it tracks.

    Raises:
        UsageError: a metric the trainer does not record (not for `any_metric`), with the nearest.
    """
    if any_metric and not a.metric.strip():
        raise UsageError('--metric is empty: give the key the script tracks (e.g. loss.valid)')
    if not any_metric and a.metric not in METRICS:
        close = difflib.get_close_matches(a.metric, METRICS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ''
        raise UsageError(f'unknown --metric {a.metric!r}{hint}; metrics: {", ".join(METRICS)}')
    return a.metric, a.direction or ('maximize' if a.metric.startswith(('accuracy', 'tokens')) else 'minimize')


def _storage(storage: Optional[str], given: Optional[str]) -> Optional[str]:
    """A journal file's absolute path (its folder must exist), or the database URL as given: one that reads one way
    only (lazylab.redaction.parse_database_url), checked before anything shows or writes it."""
    if storage is None:
        return storage
    if '://' in storage:
        try:
            parse_database_url(storage)
        except StorageURLError as e:
            raise UsageError(f'--storage: {e}') from None
        return storage
    path = Path(storage).resolve()
    if not path.parent.is_dir():
        raise UsageError(f'--storage {given}: folder {path.parent} does not exist')
    return str(path)


def _points(a: argparse.Namespace, space: Space) -> tuple[str, list[dict[str, Any]], int]:
    """(sampler, the grid's points or one {} per trial, trials)."""
    sampler = a.sampler or ('grid' if space.discrete else 'tpe')
    if sampler == 'grid':
        if not space.discrete:
            key = next(d.key for d in space.dims if not d.discrete)
            raise UsageError(f'{key} is an interval: the grid needs lists or ranges (or use --sampler random|tpe '
                             f'--trials N)')
        if a.trials is not None:
            each = 'its one point' if space.size() == 1 else f'each of its {space.size()} points'
            raise UsageError(f'--trials is for --sampler random|tpe; the grid runs {each} once')
        points = space.grid()
        return sampler, points, len(points)
    if a.trials is None or a.trials < 1:
        raise UsageError(f'--sampler {sampler} draws --trials N points: give --trials (N ≥ 1)')
    if space.zips:
        raise UsageError('--zip is for the grid sampler')
    return sampler, [{}] * a.trials, a.trials


def _slurm(a: argparse.Namespace, study: Optional[str], check: bool) -> Optional[SlurmOptions]:
    """`--launcher slurm`'s --slurm options, checked (with `check`, against the cluster: `sbatch --test-only`).

    Raises:
        UsageError: --slurm without --launcher slurm; a bad option, or one the cluster refuses.
    """
    if a.launcher != 'slurm':
        if a.slurm:
            raise UsageError('--slurm goes with --launcher slurm (each trial a Slurm job)')
        return None
    options = parse_options(a.slurm or [])
    if check:
        check_options(options, str(options.parameters.get('job_name') or f'lazylab-{study or "sweep"}'))
    return options


def _launcher(text: Optional[str]) -> list[str]:
    if text == 'slurm':  # each trial a Slurm job (the job runs this Python: lazylab.sweeps.slurm_launcher)
        return [sys.executable]
    try:
        launcher = shlex.split(text) if text is not None else [sys.executable]
    except ValueError as e:  # an unclosed quote
        raise UsageError(f'--launcher {text!r}: {e}') from None
    if not launcher:
        raise UsageError('--launcher is empty')
    if shutil.which(launcher[0]) is None:
        raise UsageError(f'--launcher {text!r}: no program {launcher[0]!r} (not on PATH, or not executable)')
    return launcher
