"""From a command line to a finished run: configs, validation, run directory, training, resume and generation.

    lazylab train NAME [key=value …] [--config FILE.yaml] [--allow-changes]   ≡  python -m lazylab.experiments.NAME …
    lazylab resume RUN_DIR [--allow-changes]
    lazylab generate RUN_DIR --prompt TEXT --tokens N [--temperature T] [--top-k K]
    lazylab options NAME

Everything the user can get wrong is checked before anything is written: the overrides (unknown keys, bad values,
unknown options), the device, the text file, the model's shape constraints and the optimizer are all resolved
first; only then is RUNS_DIR/NAME/RUN_ID/ created. Such mistakes raise a `lazylab.errors.LazylabError` or a
`lazylab.configs.ConfigError` whose message is one line; `run_cli` (lazylab.errors) prints it as
`lazylab: error: …` and returns exit code 2.

Replaying a dump (`--config RUN/configs.yaml`, and `lazylab resume`) applies its given values and then checks that
every value it recorded as computed comes out the same, unless the new key=value settings changed what it was
computed from (`lazylab.configs.replay_changes`); a difference is one error line naming the key and both values,
and `--allow-changes` accepts it (each is then printed as a warning and recorded in run.json). A resume also
compares the training text with the sha256 and size its checkpoint records (`check_data_changes`), refused or
accepted the same way.

run.json: experiment, run_id, uuid, argv, created; the lazylab, torch and Python versions, the device, the git
commit of the lazylab source when it is a git checkout (`git`: commit and whether the tree had changes), the
parameter count, `loss_label` (the task's loss and its unit, for plots); `status` (running, then completed,
pruned — stopped by a sweep's pruner —, failed with its one-line `error`, interrupted by Ctrl-C or killed by
SIGTERM — with `signal` and `checkpoint_step`, the step `lazylab resume` continues from), and at the end `steps`
(optimizer steps taken) and `finished`. At the end configs.yaml is written again with `total_steps` /
`optimizer.total_steps` as the run took them (the time budget fits them as it goes; the configuration's own values
move to its `computed_before_run` section).
"""
import contextlib
import difflib
import importlib
import json
import os
import sys
import time
import uuid as uuid_lib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from lazylab.configs import apply_overrides, dump, label_given, load, parse_overrides, replay_changes, to_dict
from lazylab.configs.engine.overrides import expand_short_keys
from lazylab.errors import Interrupted, UsageError, plural, run_cli, signals_interrupt, user_error_message
from lazylab.experiments import EXPERIMENTS
from lazylab.experiments.metrics import stdout_may_close


def load_experiment(name: str):
    """The module lazylab.experiments.NAME (it defines `Configs`, `PRESETS` and `main`)."""
    if name not in EXPERIMENTS:
        close = difflib.get_close_matches(name, EXPERIMENTS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ''
        raise UsageError(f"unknown experiment {name!r}{hint}; experiments: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(f'lazylab.experiments.{name}')


def split_args(argv: Sequence[str]) -> tuple[list[str], Optional[str]]:
    """key=value tokens and the `--config FILE` (or `--config=FILE`) option."""
    tokens, config_file, i = [], None, 0
    argv = list(argv)
    while i < len(argv):
        a = argv[i]
        if a == '--config':
            if i + 1 >= len(argv):
                raise UsageError('--config needs a YAML file')
            config_file, i = argv[i + 1], i + 2
            continue
        if a.startswith('--config='):
            config_file = a.split('=', 1)[1]
        elif a.startswith('-') and '=' not in a:
            raise UsageError(f'unknown option {a!r}; give settings as key=value (see: lazylab options NAME)')
        else:
            tokens.append(a)
        i += 1
    if config_file == '':  # `--config=` or `--config ''`: not the current folder
        raise UsageError('--config needs a YAML file')
    return tokens, config_file


def read_config_file(path: str) -> dict[str, Any]:
    """A YAML mapping of overrides: flat `{key: value}` or a configs.yaml dump (its `values` section).

    Raises:
        UsageError: the file is missing, unreadable, not YAML, not a mapping, or empty (no settings: only
            comments, `{}`, or a dump whose `values` are empty), naming the file.
    """
    import yaml
    try:
        text = Path(path).read_text(encoding='utf-8')
    except FileNotFoundError:
        raise UsageError(f'config file not found: {path}') from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f'cannot read config file {path}: {e}') from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, 'problem_mark', None)
        at = f' at line {where.line + 1}' if where is not None else ''
        raise UsageError(f'config file {path} is not valid YAML{at}') from None
    if not isinstance(doc, (dict, type(None))):
        raise UsageError(f'config file {path} must hold a mapping of key: value')
    if empty_dump(doc):
        raise UsageError(f'config file {path} is empty: it holds no settings')
    return doc


def empty_dump(doc: Any) -> bool:
    """Whether a parsed --config file or configs.yaml holds no settings: nothing but comments, `{}`, or a dump
    whose `values` section is empty."""
    if doc is None:
        return True
    return isinstance(doc, dict) and (not doc or ('values' in doc and not doc['values'] and not doc.get('objects')))


def declared_keys(configs_class) -> set[str]:
    """Every key (dotted path) an experiment's Configs declares, sub-configs' items included."""
    from lazylab.configs import describe
    return {row['name'] for row in describe(configs_class)}


def dump_experiment(path: Path, doc: dict[str, Any]) -> Optional[str]:
    """The experiment that wrote the configs.yaml dump `doc` (read from `path`): the one its run.json says, when
    `path` is a run directory's configs.yaml, else the one experiment that declares every key of it (None when no
    experiment, or more than one, does)."""
    if path.name == 'configs.yaml' and (path.parent / 'run.json').is_file():
        try:
            experiment = json.loads((path.parent / 'run.json').read_text(encoding='utf-8')).get('experiment')
        except (OSError, ValueError, AttributeError):
            experiment = None
        if experiment in EXPERIMENTS:
            return experiment
    keys = {*(doc.get('values') or {}), *(doc.get('objects') or {})}
    fits = [e for e in EXPERIMENTS if keys <= declared_keys(load_experiment(e).Configs)]
    return fits[0] if len(fits) == 1 else None


def check_dump_experiment(name: str, configs_class, doc: dict[str, Any], path: Path) -> None:
    """Before `--config PATH` replays a configs.yaml dump into experiment NAME: that another experiment did not
    write it (its run.json, or the keys it holds, say which did; see `dump_experiment`).

    Raises:
        UsageError: `PATH is a dump of experiment OTHER, not NAME; …`
    """
    beside = path.name == 'configs.yaml' and (path.parent / 'run.json').is_file()
    if not beside and {*(doc.get('values') or {}), *(doc.get('objects') or {})} <= declared_keys(configs_class):
        return  # every key is one of NAME's: nothing says it is another experiment's
    other = dump_experiment(path, doc)
    if other is not None and other != name:
        raise UsageError(f'{path} is a dump of experiment {other}, not {name}; replay it with: lazylab train '
                         f'{other} --config {path}')


def check_dump(name: str, configs_class, doc: dict[str, Any], path: Path) -> None:
    """Before a configs.yaml dump (`doc`, read from `path`) is replayed into experiment NAME: every key it gives
    or holds a value of that lazylab did not record as computed is an item of NAME. (A key the dump records as
    computed that NAME no longer has is the replay's to report: the code changed, and --allow-changes accepts it.)
    A key that is neither was written into the file by hand, and replay would skip it without a word.

    Raises:
        UsageError: `PATH: NAME has no config item 'KEY'; did you mean …? (also unknown: …)`
    """
    from lazylab.configs.engine.errors import suggestion
    names = declared_keys(configs_class)
    recorded = set(doc.get('computed') or {}) | set(doc.get('computed_before_run') or ())
    keys = dict.fromkeys([*(doc.get('given') or {}), *(doc.get('values') or {})])
    edited = [k for k in keys if k not in names and k not in recorded]
    if edited:
        more = f' (also unknown: {", ".join(map(repr, edited[1:]))})' if len(edited) > 1 else ''
        raise UsageError(f'{path}: {name} has no config item {edited[0]!r}{suggestion(edited[0], names)}{more}')


def make_configs(name: str, argv: Sequence[str] = ()):
    """A fresh `Configs` of experiment NAME with, in order, the preset, --config FILE and key=value applied.

    A key may be given by a unique end of its dotted path (`ffn.glu_variant` for `transformer.ffn.glu_variant`;
    see `lazylab.configs.engine.overrides.expand_short_keys`), on the command line and in a --config file.

    Raises:
        UsageError, ConfigError: see the module docstring. Nothing is computed yet.
    """
    module = load_experiment(name)
    tokens, config_file = split_args(argv)
    conf = module.Configs()
    values = expand_short_keys(conf, parse_overrides(tokens))
    preset = values.pop('preset', None)
    file_values = read_config_file(config_file) if config_file is not None else {}
    if preset is None:
        preset = file_values.pop('preset', None)
    if isinstance(file_values.get('values'), dict):  # a configs.yaml dump: its values hold the settings
        check_dump_experiment(name, module.Configs, file_values, Path(config_file))  # its keys as written
        file_values = {**file_values, 'values': expand_short_keys(conf, file_values['values'])}
        check_dump(name, module.Configs, file_values, Path(config_file))
    else:
        file_values = expand_short_keys(conf, file_values)
    if preset is not None:
        presets = getattr(module, 'PRESETS', {})
        if not isinstance(preset, str) or preset not in presets:
            raise UsageError(f"unknown preset {preset!r} for {name}; presets: {', '.join(presets) or 'none'}")
        apply_overrides(conf, presets[preset])
        label_given(conf, presets[preset], f'preset {preset}')
    if file_values:
        load(conf, file_values, label=f'--config {config_file}')  # a dump: its given values (see check_replay)
    if values:
        apply_overrides(conf, values)
        label_given(conf, values, 'user')
    return conf


ALLOW_CHANGES = '--allow-changes'


def check_replay(conf, allow_changes: bool = False) -> list[str]:
    """After `prepare`: the computed values of a replayed dump (--config RUN/configs.yaml, resume) that came out
    differently although nothing they depend on was given a new value; returns them as lines (printed as
    warnings) when `allow_changes`.

    Raises:
        UsageError: `<key> comes out <now>, <dump> has <recorded> (…); --allow-changes accepts it`.
    """
    lines = [str(change) for change in replay_changes(conf)]
    if lines and not allow_changes:
        more = f' (and {len(lines) - 1} more)' if len(lines) > 1 else ''
        them = 'them' if more else 'it'
        raise UsageError(f'{lines[0]}{more}: the code or data computes {them} differently now, or the file was '
                         f'edited by hand (give a new setting as key=value instead); {ALLOW_CHANGES} accepts '
                         f'{them}')
    for line in lines:
        print(f'lazylab: warning: {line} (accepted: {ALLOW_CHANGES})', file=sys.stderr, flush=True)
    return lines


def check_data_changes(lines: list[str], allow_changes: bool = False) -> list[str]:
    """The changes of a resumed run's data since its checkpoint (`trainer.check_resume`'s lines, e.g. a text that
    changed but kept its characters): refused, or with `allow_changes` printed as warnings and returned.

    Raises:
        CheckpointError: `text FILE changed since the checkpoint: sha256 … → …, size … → … bytes; …`.
    """
    from lazylab.errors import CheckpointError
    if lines and not allow_changes:
        more = f' (and {len(lines) - 1} more)' if len(lines) > 1 else ''
        raise CheckpointError(f'{lines[0]}{more}; resume on the data it was trained on, or {ALLOW_CHANGES} to go '
                              f'on with this')
    for line in lines:
        print(f'lazylab: warning: {line} (accepted: {ALLOW_CHANGES})', file=sys.stderr, flush=True)
    return list(lines)


def run_environment(conf) -> dict[str, Any]:
    """What run.json records about the software and machine: versions, device, git commit of the lazylab source."""
    import platform

    import torch

    import lazylab
    from lazylab.experiments.trainer import resolve_device
    device = resolve_device(conf.device)
    info: dict[str, Any] = {'lazylab': getattr(lazylab, '__version__', None) or _package_version(),
                            'torch': torch.__version__, 'python': platform.python_version(), 'device': str(device)}
    if device.type == 'cuda':
        info['device_name'] = torch.cuda.get_device_name(device)
    git = git_commit(Path(lazylab.__file__).resolve().parent)
    if git is not None:
        info['git'] = git
    return info


def _package_version() -> Optional[str]:
    from importlib import metadata
    try:
        return metadata.version('lazylab')
    except metadata.PackageNotFoundError:
        return None


def git_commit(folder: Path) -> Optional[dict[str, Any]]:
    """{'commit': sha, 'dirty': bool} of the git checkout holding `folder`, or None (not a checkout, no git)."""
    import subprocess
    try:
        sha = subprocess.run(['git', '-C', str(folder), 'rev-parse', 'HEAD'], capture_output=True, text=True,
                             timeout=10)
        if sha.returncode != 0:
            return None
        status = subprocess.run(['git', '-C', str(folder), 'status', '--porcelain', '--untracked-files=no'],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {'commit': sha.stdout.strip(), 'dirty': bool(status.stdout.strip())}


def write_run_json(run_dir: Path, info: dict[str, Any]) -> None:
    """run.json through a temporary file and a rename (a reader never sees half of it); a write that fails (a full
    disk) leaves the previous run.json as it was and no temporary file.

    Raises:
        OSError: the file cannot be written.
    """
    tmp = run_dir / f'run.json.tmp{os.getpid()}'
    try:
        tmp.write_text(json.dumps(info, indent=1) + '\n', encoding='utf-8')
        os.replace(tmp, run_dir / 'run.json')
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def update_run_json(run_dir: Path, **values: Any) -> None:
    info = json.loads((run_dir / 'run.json').read_text(encoding='utf-8'))
    info.update(values)
    write_run_json(run_dir, info)


class _StopRequest:
    """Wraps the trainer's `on_validation` hook and remembers the reason it gave for stopping (→ run.json status)."""

    def __init__(self, hook):
        self.hook, self.reason = hook, None

    def __call__(self, step: int, record: dict[str, Any]) -> Optional[str]:
        answer = self.hook(step, record)
        if answer:
            self.reason = answer if isinstance(answer, str) else 'stopped'
        return answer


def _run_values(conf, last: dict[str, Any]) -> dict[str, Any]:
    """total_steps and optimizer.total_steps as the run took them: steps taken, and the length the learning-rate
    schedule spanned at the end (the time budget fits both as the run goes)."""
    values = {'total_steps': int(last['step'])}
    schedules = getattr(conf.optimizer.scheduler, 'lr_lambdas', None) or [None]
    length = getattr(schedules[0], 'total_steps', None)
    if isinstance(length, int):
        values['optimizer.total_steps'] = length
    return values


def finish_run(conf, run_dir: Path, status: str, last: dict[str, Any], error: Optional[str] = None,
               **more: Any) -> None:
    """Record the end of a run: run.json's status, steps and finish time (and `more`); configs.yaml with the steps
    taken (only when `last`, the final record, is given: a run stopped midway keeps its configs.yaml, which its
    resume replays)."""
    extra: dict[str, Any] = {'status': status, 'finished': time.strftime('%Y-%m-%dT%H:%M:%S'), **more}
    if last.get('step') is not None:
        extra['steps'] = int(last['step'])
        dump(conf, run_dir / 'configs.yaml', run_values=_run_values(conf, last))
    if error is not None:
        extra['error'] = error
    update_run_json(run_dir, **extra)


def record_failure(conf, run_dir: Path, e: BaseException) -> None:
    """run.json of a run that `e` ended: status `failed`, `error` the one line `run_cli` prints for a user's error
    (else the exception's type and first line). When run.json itself cannot be written (a disk still full, a
    read-only folder) a warning line says so, and `e` is what the caller goes on raising."""
    message = user_error_message(e) or f'{type(e).__name__}: {e}'.splitlines()[0]
    try:
        finish_run(conf, run_dir, 'failed', {}, message)
    except OSError as written:
        print(f'lazylab: warning: cannot record the failure in {run_dir / "run.json"}: '
              f'{written.strerror or written}', file=sys.stderr, flush=True)


#: run.json's fields about how a run ended; a resume removes them (the run is running again)
END_FIELDS = ('finished', 'error', 'signal', 'checkpoint_step')


def record_interrupt(conf, run_dir: Path, e: KeyboardInterrupt) -> None:
    """run.json of a run that Ctrl-C or SIGTERM stopped (see `trainer.train`, which sets `e.step` and
    `e.checkpoint_step`): status `interrupted` (SIGINT) or `killed` (SIGTERM), `signal`, `steps` (the steps it
    took) and `checkpoint_step` (where `lazylab resume` continues; None: no checkpoint yet). The checkpoint is left
    as it is. An `Interrupted`'s message (what `run_cli` prints) then names the step and the resume command."""
    name = getattr(e, 'signal_name', 'SIGINT')
    step, saved = getattr(e, 'step', None), getattr(e, 'checkpoint_step', None)
    status = 'interrupted' if name == 'SIGINT' else 'killed'
    more: dict[str, Any] = {'signal': name, 'checkpoint_step': saved}
    if step is not None:
        more['steps'] = step
    finish_run(conf, run_dir, status, {}, **more)
    if isinstance(e, Interrupted):
        at = f' at step {step:,}' if step is not None else ''
        then = f'lazylab resume {run_dir} continues from the checkpoint of step {saved:,}' if saved is not None \
            else f'no checkpoint was written yet (lazylab resume {run_dir} cannot continue it)'
        e.message = f'{status} ({name}){at}; {then}'


def prepare(conf) -> None:
    """Compute everything a run needs, so every user mistake surfaces before a file is written: `check_values`,
    the threads, `compute` (memory, data, model, optimizer, every plain item); last, one forward and backward pass
    on the first batch (`trainer.check_trains`) catches what the declarations cannot say (a size the model cannot
    take, a batch too big for the memory), with the model's state and the random states left as they were.

    Raises:
        UsageError: see `check_values`; the run needs more memory than the device has (`check_memory_needs`);
            DataError, ConfigError: from the items computed here; TrainingError: the model fails on its first batch.
    """
    import torch

    from lazylab.experiments.trainer import check_trains
    check_values(conf)
    if conf.threads:
        try:
            torch.set_num_threads(conf.threads)
        except (RuntimeError, ValueError) as e:  # an experiment may declare threads without its upper bound
            raise UsageError(f'threads={conf.threads}: torch cannot use that many ({e})') from None
    compute(conf)
    check_trains(conf)


def compute(conf, optimizer: bool = True, plain: bool = True) -> None:
    """Compute what a run is made of, in the order its mistakes should surface: the memory it needs (from the sizes
    alone, `check_memory_needs`), the data, the model, the step count, the optimizer and its schedule (not with
    `optimizer=False`: a sweep checking its points skips their cost) and every plain item (`compute_plain`; not
    with `plain=False`: a sweep calls it apart, to tell the reads of these checks from those of the listing), so
    that configs.yaml records all of them. Seeds torch first: the model's initial parameters depend only on `seed`.

    Raises:
        UsageError, DataError, ConfigError: as `prepare`.
    """
    import torch
    check_memory_needs(conf)  # nothing is allocated yet
    torch.manual_seed(conf.seed)
    _ = conf.task  # the data: DataError if the text is too short or the prompt has characters outside it
    if conf.seq_len_start and conf.seq_len_start < conf.seq_len and not conf.task.shorter_sequences:
        raise UsageError(f'seq_len_start: the task of this experiment ({type(conf.task).__name__}) has no shorter '
                         f'sequences, so it cannot warm up the sequence length; leave seq_len_start out')
    _ = conf.model, conf.total_steps
    if optimizer:
        _ = conf.optimizer.optimizer, conf.optimizer.scheduler
    if plain:
        compute_plain(conf)


def compute_plain(conf) -> None:
    """Compute the plain items (numbers, strings, flags) of `conf` and of its sub-configs; unused component options
    (say, a decoder the causal model never builds) stay unbuilt.

    Raises:
        ConfigError: an item that cannot be computed, or whose computed value breaks its constraints.
    """
    from lazylab.configs import describe
    for row in describe(conf):
        if row['plain']:
            value = conf
            for part in row['name'].split('.'):
                value = getattr(value, part)


def check_memory_needs(conf) -> None:
    """The least memory the run takes, `memory_needs(conf)` of its experiment's module (the first class of its MRO
    whose module defines one), against what the device has (`lazylab.experiments.memory.check_memory`).

    Raises:
        UsageError: it needs more, naming the keys that size the biggest part.
    """
    from lazylab.experiments.memory import check_memory
    for cls in type(conf).__mro__:
        needs = getattr(sys.modules.get(cls.__module__), 'memory_needs', None)
        if needs is not None:
            check_memory(needs(conf), _device(conf))
            return


def check_values(conf) -> None:
    """What the item declarations cannot say: that the device exists here, the dashboard URL can be used, and the
    sequence-length warm-up's items fit together. (Ranges and choices are declared with the items, e.g.
    `batch_size: PositiveInt`, and checked by the engine.)

    Raises:
        UsageError: the device is unknown or not available; seq_len_start > seq_len, or only one of
            seq_len_start and seq_len_warmup given; DashboardError (a UsageError): a bad dashboard URL.
    """
    from lazylab.experiments.trainer import resolve_device
    try:
        resolve_device(conf.device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    start, warmup, seq_len = conf.seq_len_start, conf.seq_len_warmup, conf.seq_len
    if start > seq_len:
        raise UsageError(f'seq_len_start={start} is longer than seq_len={seq_len}; the warm-up grows the length '
                         f'from seq_len_start to seq_len')
    if bool(start) != bool(warmup):
        given, missing = ('seq_len_start', 'seq_len_warmup') if start else ('seq_len_warmup', 'seq_len_start')
        raise UsageError(f'{given} needs {missing} too: the warm-up starts at seq_len_start and reaches seq_len '
                         f'after seq_len_warmup steps')
    if conf.dashboard:
        from lazylab.dashboard import track_url
        track_url(conf.dashboard)


#: how many run ids `new_run_dir` tries before it gives up (a clash needs the same second and 4 hex digits)
RUN_ID_ATTEMPTS = 100


def new_run_id() -> str:
    """A run id: the start time and 4 random hex digits (`20261201-143005-9f3a`), so runs sort by time."""
    return time.strftime('%Y%m%d-%H%M%S') + '-' + os.urandom(2).hex()


def new_run_dir(conf, name: str, made: Optional[list] = None) -> Path:
    """Create RUNS_DIR/NAME/RUN_ID (see `new_run_id`), safely while other processes start runs in the same
    RUNS_DIR: a parent folder another process makes at the same moment is used as it is, and the run's own folder
    is made exclusively (mkdir fails when it exists), with a new id after a clash, so two runs never share one.

    `made`: a list to which the folders this call makes are added, outermost first (to remove them again if
    writing the run's first files fails, see `remove_made`).

    Raises:
        UsageError: the folder cannot be made (runs_dir is a file, not writable, …); the folders this call made
            before it failed are removed again.
    """
    root = Path(conf.runs_dir).expanduser() / name
    made = [] if made is None else made
    try:
        for folder in reversed([root, *root.parents]):
            if folder.is_dir():
                continue
            if folder.exists():
                raise NotADirectoryError(20, f'{folder} is a file, not a folder')
            try:
                folder.mkdir()
            except FileExistsError:
                if folder.is_dir():  # another run starting at the same time made it first
                    continue
                raise
            made.append(folder)
        for _ in range(RUN_ID_ATTEMPTS):
            run_dir = root / new_run_id()
            try:
                run_dir.mkdir()
            except FileExistsError:  # another run took this id
                continue
            made.append(run_dir)
            return run_dir
        raise FileExistsError(17, f'{RUN_ID_ATTEMPTS} new run ids in a row were taken in {root}')
    except (OSError, ValueError) as e:
        remove_made(made)
        why = getattr(e, 'strerror', None) or str(e)
        raise UsageError(f'cannot create a run directory in runs_dir={conf.runs_dir!r}: {why}') from None


def remove_made(folders: Sequence[Path], run_dir: Optional[Path] = None) -> None:
    """Remove `folders` (made in this order, each inside the one before), deepest first: `run_dir` (when one of
    them) with what is in it, the others only when empty (a run another process started at the same moment may be
    in them by now)."""
    import shutil
    for folder in reversed(list(folders)):
        if run_dir is not None and folder == run_dir:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                folder.rmdir()


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def execute(name: str, conf, run_dir: Path, *, resume: bool, checkpoint: Optional[dict[str, Any]] = None,
            on_validation=None) -> dict[str, Any]:
    """Train inside a labml experiment and print the summary; returns the last metrics record.

    `checkpoint`: the run's checkpoint, already loaded (resume=True), so that it is read once.
    `on_validation`: the trainer's hook (see trainer.train); the reason it gives for stopping becomes run.json's
    status (a sweep's pruner says 'pruned'). run.json and configs.yaml record the end (see `finish_run`)."""
    from lazylab.experiments import distributed
    from lazylab.experiments.nlp_autoregression import device_of
    from lazylab.experiments.tracking import LabmlRun
    from lazylab.experiments.trainer import train
    is_main, world_size = distributed.is_main_process(), distributed.get_world_size()
    if is_main:
        n_params = parameter_count(conf.model)
        length = plural(conf.total_steps, 'step')
        if conf.max_minutes > 0 and conf.max_steps == 0:  # the time budget decides the step count
            length = f'{plural(conf.max_minutes, "minute")} (at most {plural(conf.total_steps, "step")})'
        elif conf.max_minutes > 0:
            length += f' (at most {plural(conf.max_minutes, "minute")})'
        batch = f'{conf.batch_size}×{conf.seq_len} {conf.task.position_unit}'
        if world_size > 1:
            batch += f' per process, {world_size} processes (effective batch {conf.batch_size * world_size})'
        print(f'{name}: {n_params:,} parameters, {length} of {batch} on {device_of(conf)} → {run_dir}', flush=True)
    labml_run = contextlib.nullcontext()
    if is_main:  # only rank 0 records the run in labml
        info = json.loads((run_dir / 'run.json').read_text(encoding='utf-8'))
        from lazylab.configs import explain
        flat = dict(to_dict(conf)['values'])
        explicit = [k for k, row in explain(conf).items() if row['source'] == 'override']
        labml_run = LabmlRun(run_dir, name, info['uuid'], flat, conf.dashboard, explicit)
    stop = _StopRequest(on_validation) if on_validation is not None else None
    try:
        with labml_run as tracker:
            last = train(conf, run_dir, resume=resume, checkpoint=checkpoint, labml_run=tracker, on_validation=stop)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (see train_main's signals_interrupt)
        if is_main:
            record_interrupt(conf, run_dir, e)
        raise
    except BaseException as e:
        if is_main:
            record_failure(conf, run_dir, e)
        raise
    if is_main and last:
        finish_run(conf, run_dir, (stop.reason if stop is not None else None) or 'completed', last)
    if is_main and not last:
        print(f'nothing to do: the run in {run_dir} has already finished', flush=True)
    if is_main and 'loss.valid' in last:
        print(f'done: step {last["step"]:,}, valid loss {last["loss.valid"]:.4f} {conf.task.loss_unit}, '
              f'accuracy {last["accuracy.valid"]:.3f}, '
              f'{last.get("tokens_per_s_avg", last.get("tokens_per_s", 0)):,.0f} tokens/s (the run\'s average); '
              f'run dir {run_dir}', flush=True)
    return last


def train_main(name: str, argv: Sequence[str], *, run_dir: Optional[Path] = None, on_validation=None,
               labels: Optional[dict[str, Sequence[str]]] = None, info: Optional[dict[str, Any]] = None
               ) -> Optional[Path]:
    """`lazylab train NAME …`: validate, create the run directory, write configs.yaml and run.json, train.
    With -h/--help: print the experiment's keys (as `lazylab options NAME`) instead.

    For a caller that runs the run (a sweep's trial): `run_dir` is the folder to use (created if needed; it must
    not hold a run yet), `on_validation` the trainer's hook, `labels` {label: keys} relabels given keys in the
    dump (e.g. {'sweep': ['d_model']}), `info` is added to run.json.

    Ctrl-C and SIGTERM raise `lazylab.errors.Interrupted` while it runs (`signals_interrupt`): before the run
    directory exists nothing is written; after, run.json records the stop (see `record_interrupt`)."""
    if '-h' in argv or '--help' in argv:
        print(f'usage: lazylab train {name} [key=value …] [--config FILE.yaml] [{ALLOW_CHANGES}]\n\n'
              + options_text(name))
        return None
    from lazylab.experiments import distributed
    allow_changes = ALLOW_CHANGES in argv
    argv = [a for a in argv if a != ALLOW_CHANGES]
    conf = make_configs(name, argv)
    for label, keys in (labels or {}).items():
        label_given(conf, keys, label)
    with signals_interrupt(), distributed.process_group(_device(conf)):  # under torchrun: join the job
        prepare(conf)
        changes = check_replay(conf, allow_changes)
        given_dir, run_dir = run_dir, None
        if distributed.is_main_process():  # rank 0 creates the run directory; the others learn its name
            run_dir = start_run(conf, name, argv, run_dir=given_dir, changes=changes, info=info)
        run_dir = Path(distributed.broadcast_object(str(run_dir) if run_dir else None))
        with training_lock(run_dir, distributed.is_main_process()), stdout_may_close():  # see those two
            execute(name, conf, run_dir, resume=False, on_validation=on_validation)
    return run_dir


def start_run(conf, name: str, argv: Sequence[str], *, run_dir: Optional[Path] = None,
              changes: Optional[list] = None, info: Optional[dict[str, Any]] = None) -> Path:
    """Make a new run's directory (RUNS_DIR/NAME/RUN_ID, or `run_dir`) with its configs.yaml and run.json, as
    `lazylab train` does, for a prepared `conf` (see `prepare`); returns the directory. `argv`: the overrides the
    configuration was made from (recorded); `changes`: the replay's accepted changes; `info`: more for run.json.
    A notebook that runs `trainer.train` itself starts its run with this.

    Raises:
        UsageError: the folder cannot be made or written (what this call made is removed again).
    """
    made: list[Path] = []
    run_dir = new_run_dir(conf, name, made) if run_dir is None else _use_run_dir(Path(run_dir))
    try:
        dump(conf, run_dir / 'configs.yaml')
        record = {'experiment': name, 'run_id': run_dir.name, 'uuid': uuid_lib.uuid4().hex,
                  'argv': list(argv), 'created': time.strftime('%Y-%m-%dT%H:%M:%S'),
                  **run_environment(conf), 'parameters': parameter_count(conf.model),
                  'loss_label': conf.task.loss_label, 'status': 'running'}
        if changes:
            record['replay_changes'] = changes
        record.update(info or {})
        write_run_json(run_dir, record)
    except OSError as e:  # e.g. a full disk: no half-written run directory stays
        remove_made(made, run_dir)
        raise UsageError(f'cannot write the run directory {run_dir}: {e.strerror or e}') from None
    return run_dir


def _use_run_dir(path: Path) -> Path:
    """A run directory chosen by the caller: created if needed, and not holding a run already."""
    if (path / 'run.json').exists():
        raise UsageError(f'{path} already holds a run (run.json); resume it with: lazylab resume {path}')
    path.mkdir(parents=True, exist_ok=True)
    return path


def _device(conf):
    """The torch.device of `conf.device`, or a UsageError (checked again, with the rest, by `prepare`)."""
    from lazylab.experiments.trainer import resolve_device
    try:
        return resolve_device(conf.device)
    except ValueError as e:
        raise UsageError(str(e)) from None


def open_run(run_dir: str) -> tuple[str, Any, Path]:
    """(experiment name, Configs replayed from configs.yaml, run dir) of an existing run directory."""
    path = Path(run_dir)
    if not (path / 'run.json').is_file() or not (path / 'configs.yaml').is_file():
        raise UsageError(f'{run_dir} is not a lazylab run directory (no run.json and configs.yaml)')
    try:
        info = json.loads((path / 'run.json').read_text(encoding='utf-8'))
        if isinstance(info, dict) and 'experiment' not in info and isinstance(info.get('module'), str):
            raise UsageError(f'{run_dir} is a run of lazylab labml {info["module"]}; lazylab resume and generate '
                             f'take runs of lazylab train')
        name = info['experiment']
    except (ValueError, KeyError, TypeError):
        raise UsageError(f'{path / "run.json"} is damaged') from None
    if not isinstance(name, str):
        raise UsageError(f'{path / "run.json"} is damaged')
    conf = load_experiment(name).Configs()
    doc = _parsed_yaml(path / 'configs.yaml')
    if empty_dump(doc):
        raise UsageError(f'{path / "configs.yaml"} is empty: the run\'s configuration is not in it any more')
    if isinstance(doc, dict) and isinstance(doc.get('values'), dict):
        check_dump(name, type(conf), doc, path / 'configs.yaml')
    load(conf, path / 'configs.yaml')
    return name, conf, path


def _parsed_yaml(path: Path) -> Any:
    """The YAML document in `path`; the text itself when it cannot be parsed (`load` then says what is wrong)."""
    import yaml
    try:
        return yaml.safe_load(path.read_text(encoding='utf-8'))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return path


def resume_main(run_dir: str, *, allow_changes: bool = False, on_validation=None) -> Path:
    """`lazylab resume RUN_DIR`: rebuild the run's configs (checked as any replay, see `check_replay`) and
    continue from its checkpoint; `on_validation` is the trainer's hook (a sweep's trial passes its pruner).
    A run that was interrupted or killed goes on from the checkpoint it kept (Ctrl-C and SIGTERM are handled
    as in `train_main`)."""
    from lazylab.experiments import distributed
    from lazylab.experiments.checkpoint import CHECKPOINT, load_checkpoint
    from lazylab.experiments.trainer import check_resume
    name, conf, path = open_run(run_dir)
    with contextlib.ExitStack() as stack:
        # rank 0 (torchrun's RANK; the process group is not up yet) refuses a run another process still trains,
        # before it reads the checkpoint that process may not have written yet
        stack.enter_context(training_lock(path, distributed.environment().rank == 0))
        checkpoint = load_checkpoint(path / CHECKPOINT)  # CheckpointError before anything else happens
        stack.enter_context(signals_interrupt())
        stack.enter_context(distributed.process_group(_device(conf)))
        prepare(conf)
        # first the checkpoint (another text says which characters differ), then the replay's computed values
        data_changes = check_resume(conf, path / CHECKPOINT, checkpoint)  # vocabulary, text, model shapes, processes
        changes = check_data_changes(data_changes, allow_changes) + check_replay(conf, allow_changes)
        position = checkpoint.get('position', {})
        if position.get('step', 0) >= position.get('total_steps', 0):  # training would return at once
            if distributed.is_main_process():
                print(f'nothing to do: the run in {path} has already finished', flush=True)
            return path
        if distributed.is_main_process():
            info = json.loads((path / 'run.json').read_text(encoding='utf-8'))
            info = {k: v for k, v in info.items() if k not in END_FIELDS}  # how it ended before: no longer true
            write_run_json(path, {**info, 'status': 'running', **({'replay_changes': changes} if changes else {})})
        stack.enter_context(stdout_may_close())  # `| head`: the run goes on without its output
        execute(name, conf, path, resume=True, checkpoint=checkpoint, on_validation=on_validation)
    return path


@contextlib.contextmanager
def training_lock(run_dir: Path, take: bool = True) -> Iterator[None]:
    """While the block runs, this process holds an exclusive lock on the run directory (flock on the folder
    itself, so nothing is written into it; the kernel drops it when the process ends, even by SIGKILL). A second
    process (`lazylab resume` while `lazylab train` or another resume still trains the run) is refused before it
    prints or writes anything. `take=False` (a torchrun rank other than 0): no lock. Where there is no flock
    (Windows), no lock either; labml's run.pid still stops a second process, later.

    Raises:
        UsageError: `RUN is still being trained by process PID; wait for it to finish or stop it first`.
    """
    try:
        import fcntl
    except ImportError:
        fcntl = None
    if not take or fcntl is None:
        yield
        return
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _training_pid(run_dir)
            by = f'process {pid}' if pid is not None else 'another process'
            raise UsageError(f'{run_dir} is still being trained by {by}; wait for it to finish or stop it '
                             f'first') from None
        yield
    finally:
        os.close(fd)  # and with it the lock


def _training_pid(run_dir: Path) -> Optional[int]:
    """The process id in labml's run.pid of the run (written while it trains), or None (not yet, or unreadable)."""
    try:
        uuid = json.loads((run_dir / 'run.json').read_text(encoding='utf-8'))['uuid']
        return int((run_dir / 'labml').glob(f'*/{uuid}/run.pid').__next__().read_text().strip())
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None


def generate(run_dir: str, prompt: str, tokens: int, temperature: float = 1.0, top_k: Optional[int] = None,
             seed: Optional[int] = None, on_text: Optional[Callable[[str], None]] = None) -> str:
    """Text sampled from the run's latest checkpoint: the prompt followed by `tokens` new characters.

    The model and vocabulary come from the checkpoint (the training text is not needed); the core transformer's
    incremental state is used when it has one, so each new character costs one step. `on_text` is called with the
    prompt once the checks are done, then with each new character as it is sampled (their concatenation is the
    text returned).
    """
    import torch

    from lazylab.data import CharTokenizer
    from lazylab.errors import CheckpointError, TrainingError
    from lazylab.experiments.checkpoint import CHECKPOINT, load_checkpoint
    from lazylab.experiments.nlp_autoregression import NLPAutoRegressionConfigs
    from lazylab.models.sampling import NonFiniteLogitsError, check_generate_arguments
    try:
        check_generate_arguments(tokens, temperature, top_k, names=('--tokens', '--temperature', '--top-k'))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if seed is not None and not 0 <= seed < 2**64:
        raise UsageError(f'--seed must be in 0 … 2**64 − 1, got {seed}')
    if not prompt:
        raise UsageError('--prompt must not be empty')
    name, conf, path = open_run(run_dir)
    ck = load_checkpoint(path / CHECKPOINT)
    if 'vocabulary' not in ck and not isinstance(conf, NLPAutoRegressionConfigs):  # retrieval: no text
        raise UsageError(f'{run_dir} is a {name} run, which does not generate text; lazylab generate takes a run '
                         f'of a language model (feedback, fast_weights, transformer)')
    try:
        tokenizer = CharTokenizer(ck['vocabulary'])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f'{path / CHECKPOINT} has no usable vocabulary') from None
    ids = tokenizer.encode(prompt)
    apply_overrides(conf, {'n_tokens': tokenizer.n_tokens})
    model = conf.model
    try:
        model.load_state_dict(ck['model'])
    except RuntimeError:
        raise UsageError(f'{path / CHECKPOINT} does not match the model in configs.yaml') from None
    device = next(model.parameters()).device
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), 'little'))
    stream = None
    if on_text is not None:
        on_text(tokenizer.decode(ids))
        stream = lambda token: on_text(tokenizer.decode(token.cpu()))  # noqa: E731
    try:
        out = model.generate(ids.to(device), tokens, temperature=temperature, top_k=top_k, generator=g,
                             on_token=stream)
    except NonFiniteLogitsError as e:
        raise TrainingError(f'{path / CHECKPOINT}: {e}') from None
    return tokenizer.decode(out.cpu())


def options_text(name: str) -> str:
    """`lazylab options NAME`: every key with type, default, options and help, then the presets.

    A sub-config's key shows the experiment's default where the experiment sets it (e.g. the feedback
    experiment's `feedback.d_model = 128 (follows d_model)`, not FeedbackConfigs' own 512): see
    `effective_defaults`.
    """
    from lazylab.configs import describe, format_description
    module = load_experiment(name)
    text = format_description(describe(module.Configs), effective_defaults(module.Configs))
    presets = getattr(module, 'PRESETS', {})
    if presets:
        text += '\n\npresets (preset=NAME, applied before other settings):\n'
        for p, values in presets.items():
            text += f'  {p}: ' + ' '.join(f'{k}={v}' for k, v in values.items()) + '\n'
    return text


def effective_defaults(configs_class) -> dict[str, str]:
    """dotted key → how the experiment sets it, for the sub-config keys whose default the experiment replaces:
    `'128 (follows d_model)'` (a default that reads another key), `'4 (set by the experiment)'` (a value given by
    the experiment's option), `'(set by the experiment)'` (an object, not built here).

    Found by making the experiment's sub-configs with the defaults (on the CPU; the model is built, the text
    read; the random states are left as they were) and reading their plain items; a sub-config that cannot be
    made so keeps its class's defaults in the listing.
    """
    import torch

    from lazylab.configs.engine.listing import is_plain
    from lazylab.configs.engine.resolver import is_configs
    from lazylab.configs.engine.state import state_of
    conf = configs_class()
    apply_overrides(conf, {'device': 'cpu', 'threads': 0})  # no accelerator start-up for a listing
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        _compute_plain(conf, is_plain, is_configs, state_of)
    torch.set_num_threads(threads)
    out: dict[str, str] = {}
    for path, st, key in _walk_states(state_of(conf)):
        p = st.provenance.get(key)
        if key in st.cache and p is not None and p.source in ('set_default', 'assigned', 'override'):
            value = st.cache[key]
            shown = repr(value) if is_plain(st.spec.types[key]) else type(value).__name__
            reads = [r for r in p.reads if r != path]
            how = f'follows {reads[0]}' if p.source == 'set_default' and p.detail == 'func' and len(reads) == 1 \
                else 'set by the experiment'
            out[path] = f'{shown} ({how})'
        elif key not in st.cache and (key in st.defaults or key in st.assigned or key in st.overrides):
            out[path] = '(set by the experiment)'  # an object the experiment gives, not built for the listing
    return out


def _compute_plain(conf, is_plain, is_configs, state_of) -> None:
    """Read every plain item of `conf` and of the sub-configs its items make (each failure skipped)."""
    st = state_of(conf)
    for key in list(st.spec.annotations):
        kind = st.spec.types[key]
        if is_plain(kind) or (isinstance(kind, type) and getattr(kind, '_lazylab_is_configs', False)):
            try:
                value = getattr(conf, key)
            except Exception:  # noqa: BLE001 - a listing shows the class default instead
                continue
            if is_configs(value):
                _compute_plain(value, is_plain, is_configs, state_of)
    for child in list(st.children.values()):
        if not state_of(child).cache:
            _compute_plain(child, is_plain, is_configs, state_of)


def _walk_states(st, prefix: str = ''):
    from lazylab.configs.engine.state import state_of
    if prefix:
        for key in st.spec.annotations:
            yield prefix + key, st, key
    for key, child in st.children.items():
        yield from _walk_states(state_of(child), f'{prefix}{key}.')


def experiment_main(name: str, argv: Optional[Sequence[str]] = None) -> int:
    """The body of `python -m lazylab.experiments.NAME key=value …`."""
    argv = sys.argv[1:] if argv is None else argv
    return run_cli(train_main, name, argv)
