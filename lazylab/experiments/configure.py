"""From a command line's settings to a checked configuration: `make_configs`, then `prepare`.

    conf = make_configs('feedback', ['d_model=64', 'preset=labml_nn'], config='my.yaml')   # nothing computed yet
    prepare(conf)                # every user mistake surfaces here, before a run directory exists

`make_configs` applies, in order, the experiment's preset, the `--config` files (flat `key: value`, or one run's
configs.yaml dump; a later file wins) and the key=value settings; a key may be given by a unique end of its dotted path
(`ffn.glu_variant` for `transformer.ffn.glu_variant`, `lazylab.configs.inspect.expand_short_keys`). A dump is
checked first to be one of this experiment's (`check_dump_experiment`) and to hold only its keys (`check_dump`).
A value may read the environment, in a file or on the command line (`${env:NAME}`, `${env:NAME,default}`:
`lazylab.configs.expand_env`); it is then labelled `env NAME`, and a secret one is written as its reference in the
run's files (`lazylab.configs.note_env`). `lazylab labml` stacks its files with the same `stack_config_files`.

`prepare` computes everything a run needs, in the order its mistakes should surface: the values the declarations
cannot check (`check_values`), the memory the run needs (`check_memory_needs`), the data, the model, the step count,
the optimizer (`compute`), and last one forward and backward pass on the first batch (`trainer.check_trains`). Such
mistakes raise a `lazylab.errors.LazylabError` or a `lazylab.configs.ConfigError` whose message is one line;
`run_cli` prints it as `lazylab: error: …` and returns exit code 2.
"""
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

import torch
import yaml

from lazylab import safe_yaml, user_files
from lazylab.configs import (
    apply_overrides,
    describe,
    expand_env,
    inspect,
    label_given,
    load,
    note_env,
    parse_overrides,
    suggestion,
)
from lazylab.dashboard_client import track_url
from lazylab.errors import UsageError
from lazylab.experiments.discovery import BUILTIN, Experiment, find_experiment, load_experiment
from lazylab.experiments.memory import check_memory
from lazylab.experiments.trainer import check_trains, resolve_device
from lazylab.runs import CONFIGS_YAML, RUN_JSON, read_json


def read_config_file(path: str) -> dict[str, Any]:
    """A YAML mapping of overrides: flat `{key: value}` or a configs.yaml dump (its `values` section).

    Args:
        path: the file given to `--config`.

    Raises:
        UsageError: the file is missing, unreadable, not a regular file (a FIFO, a device, a directory), larger
            than `user_files.CONFIG` allows, not UTF-8, not YAML, not a mapping, or empty (no settings: only
            comments, `{}`, or a dump whose `values` are empty), naming the file.
    """
    return read_config(path)[0]


def read_config(path: str) -> tuple[dict[str, Any], dict[str, int]]:
    """(`read_config_file(path)`, {key: its line} of the keys it gives: the top-level ones, or a dump's `values`).

    Raises:
        UsageError: as `read_config_file`.
    """
    text = user_files.read_text(path, 'config file', user_files.CONFIG)
    try:
        doc = safe_yaml.load(text)
    except yaml.YAMLError as e:
        raise UsageError(f'cannot read config file {path}: {safe_yaml.problem(e)}') from None
    if not isinstance(doc, (dict, type(None))):
        raise UsageError(f'config file {path} must hold a mapping of key: value')
    if empty_dump(doc):
        raise UsageError(f'config file {path} is empty: it holds no settings')
    return doc, safe_yaml.key_lines(text, 'values' if isinstance(doc.get('values'), dict) else '')


def empty_dump(doc: Any) -> bool:
    """Whether a parsed --config file or configs.yaml holds no settings: nothing but comments, `{}`, or a dump
    whose `values` section is empty."""
    if doc is None:
        return True
    return isinstance(doc, dict) and (not doc or ('values' in doc and not doc['values'] and not doc.get('objects')))


def declared_keys(configs_class: type) -> set[str]:
    """Every key (dotted path) an experiment's Configs declares, sub-configs' items included."""
    return {row['name'] for row in describe(configs_class)}


def dump_experiment(path: Path, doc: dict[str, Any]) -> Optional[tuple[str, str]]:
    """The experiment that wrote the configs.yaml dump `doc` (read from `path`), as (its name, how to write it on a
    command line): the one its run.json says, when `path` is a run directory's configs.yaml, else the one built-in
    experiment that declares every key of it; None when nothing says (no experiment, or more than one, fits)."""
    record = read_json(path.parent / RUN_JSON) if path.name == CONFIGS_YAML else None
    if record is not None and isinstance(record.get('experiment'), str):
        source = record.get('source') if isinstance(record.get('source'), dict) else {}
        written = source.get('path') if source.get('kind') == 'file' else None
        if written is None and source.get('kind') == 'module':
            written = source.get('module')
        return record['experiment'], str(written or record['experiment'])
    keys = {*(doc.get('values') or {}), *(doc.get('objects') or {})}
    fits = [name for name in BUILTIN if keys <= declared_keys(load_experiment(name).Configs)]
    return (fits[0], fits[0]) if len(fits) == 1 else None


def check_dump_experiment(name: str, configs_class: type, doc: dict[str, Any], path: Path) -> None:
    """Before `--config PATH` replays a configs.yaml dump into experiment NAME: that another experiment did not
    write it (its run.json, or the keys it holds, say which did; see `dump_experiment`).

    Args:
        name: the experiment's name; configs_class: its Configs; doc: the parsed dump; path: its file.

    Raises:
        UsageError: `PATH is a dump of experiment OTHER, not NAME; …`
    """
    beside = path.name == CONFIGS_YAML and (path.parent / RUN_JSON).is_file()
    if not beside and {*(doc.get('values') or {}), *(doc.get('objects') or {})} <= declared_keys(configs_class):
        return  # every key is one of NAME's: nothing says it is another experiment's
    other = dump_experiment(path, doc)
    if other is not None and other[0] != name:
        raise UsageError(f'{path} is a dump of experiment {other[0]}, not {name}; replay it with: lazylab train '
                         f'{other[1]} --config {path}')


def check_dump(name: str, configs_class: type, doc: dict[str, Any], path: Path) -> None:
    """Before a configs.yaml dump (`doc`, read from `path`) is replayed into experiment NAME: every key it gives
    or holds a value of that lazylab did not record as computed is an item of NAME. (A key the dump records as
    computed that NAME no longer has is the replay's to report: the code changed, and --allow-changes accepts it.)
    A key that is neither was written into the file by hand, and replay would skip it without a word.

    Args:
        name: the experiment's name; configs_class: its Configs; doc: the parsed dump; path: its file.

    Raises:
        UsageError: `PATH: NAME has no config item 'KEY'; did you mean …? (also unknown: …)`
    """
    names = declared_keys(configs_class)
    recorded = set(doc.get('computed') or {}) | set(doc.get('computed_before_run') or ())
    keys = dict.fromkeys([*(doc.get('given') or {}), *(doc.get('values') or {})])
    edited = [k for k in keys if k not in names and k not in recorded]
    if edited:
        more = f' (also unknown: {", ".join(map(repr, edited[1:]))})' if len(edited) > 1 else ''
        raise UsageError(f'{path}: {name} has no config item {edited[0]!r}{suggestion(edited[0], names)}{more}')


def make_configs(experiment: Union[str, Experiment], settings: Sequence[str] = (), *,
                 config: Union[None, str, Sequence[str]] = None):
    """A fresh `Configs` of EXPERIMENT with, in order, the preset, the `--config` files and the settings applied.

    Each given value is labelled with where it came from (the dump's `given` section, `lazylab diff` and `lazylab
    options --resolved` show it): `user` (the command line), `preset NAME`, `--config FILE:LINE`, `env NAME` (a
    value that read the environment, in a file or on the command line).

    Args:
        experiment: EXPERIMENT as written (a built-in name, a .py file, a module; `discovery.find_experiment`) or
            an `Experiment` already found.
        settings: `key=value` tokens (`preset=NAME` among them picks a preset); a key may be a unique end of its
            dotted path.
        config: the `--config` file, or files in order (a later file's value wins): flat `key: value` settings,
            or a run's configs.yaml dump (one at most).

    Raises:
        UsageError, ConfigError: an experiment, setting, file or preset that is wrong (one line naming it); a
            malformed `${…}` or an unset variable without a default (naming it and the key). Nothing is computed
            yet.
    """
    found = experiment if isinstance(experiment, Experiment) else find_experiment(experiment)
    module, name = found.load(), found.name
    conf = module.Configs()
    written, env = expand_env(parse_overrides(list(settings)))
    values = inspect.expand_short_keys(conf, written)
    env = {key: env[w] for key, w in zip(values, written) if w in env and key != 'preset'}
    preset = values.pop('preset', None)
    files = [config] if isinstance(config, str) else list(config or ())
    if '' in files:  # `--config=` or `--config ''`: not the current folder
        raise UsageError('--config needs a YAML file')
    stacked = stack_config_files(files, conf, name)
    if preset is None:
        preset = stacked.preset
    if preset is not None:
        presets = getattr(module, 'PRESETS', None) or {}
        if not isinstance(preset, str) or preset not in presets:
            raise UsageError(f"unknown preset {preset!r} for {name}; presets: {', '.join(presets) or 'none'}")
        apply_overrides(conf, presets[preset])
        label_given(conf, presets[preset], f'preset {preset}')
    stacked.apply(conf)
    if values:
        apply_overrides(conf, values)
        label_given(conf, values, 'user')
    note_env(conf, env)
    return conf


class StackedFiles:
    """What the `--config` files give, stacked (`stack_config_files`): `values` (key → value, a later file's
    winning), `labels` (key → `--config FILE:LINE`), `env` (key → how the value read the environment, for the
    values that did: `lazylab.configs.EnvUse`), `preset` (the last file's `preset:`), and `dump` (the parsed
    configs.yaml dump among them, whose computed values replay checks, or None). Every value is read already:
    `${env:…}` references are resolved, and nothing reads them again."""

    def __init__(self):
        self.values: dict[str, Any] = {}
        self.labels: dict[str, str] = {}
        self.env: dict[str, Any] = {}
        self.preset: Optional[str] = None
        self.dump: Optional[dict[str, Any]] = None
        self.dump_path, self.dump_label = '', ''

    def flat(self) -> dict[str, Any]:
        """Every value the files give as one mapping (a dump's computed values too, then the flat files' values):
        what `lazylab labml` applies, without replay's checks."""
        return {**(self.dump['values'] if self.dump is not None else {}), **self.values}

    def apply(self, conf) -> None:
        """Give `conf` the stacked values (a dump's through `load`, so that replay checks its computed values), each
        labelled with its file and line, or with the variables it read (`note_env`)."""
        if self.dump is not None:
            doc = {**self.dump, 'values': {**self.dump['values'], **self.values},
                   'given': {**(self.dump.get('given') or {}), **self.labels}}
            if not isinstance(self.dump.get('given'), dict):  # a dump without `given` is applied whole
                doc['given'] = {**{k: self.dump_label for k in self.dump['values']}, **self.labels}
            load(conf, doc, label=self.dump_label, env=False)  # (the label names the file in replay's messages)
        elif self.values:
            load(conf, self.values, env=False)
        for key, label in self.labels.items():
            label_given(conf, [key], label)
        note_env(conf, self.env)


def stack_config_files(files: Sequence[str], conf=None, name: str = '') -> StackedFiles:
    """The `--config` FILES read, checked and stacked in order (see `StackedFiles`): each value's `${env:…}`
    references read (`lazylab.configs.expand_env`; a dump's given values only), each value labelled with its file
    and line. With `conf`, a fresh Configs of experiment NAME: each file's keys expanded (a unique end of a key
    stands for it), a dump checked to be NAME's (`check_dump_experiment`, `check_dump`). Without (`lazylab labml`,
    whose script makes its config object later): keys as written.

    Raises:
        UsageError: a file `read_config_file` refuses; a dump of another experiment or with keys NAME lacks; two
            dumps (a run's configuration is one dump: stack flat files on it).
        ConfigError: a malformed `${…}` or an unset variable without a default (`FILE:LINE: key: …`).
    """
    stacked = StackedFiles()
    for path in files:
        doc, lines = read_config(path)
        origins = {key: f'{path}:{line}' for key, line in lines.items()}
        if conf is not None and doc.get('preset') is not None:  # (a labml script's `preset` is one of its keys)
            stacked.preset = expand_env({'preset': doc.pop('preset')}, origins)[0]['preset']
        if isinstance(doc.get('values'), dict):  # a configs.yaml dump: its values hold the settings
            if stacked.dump is not None:
                raise UsageError(f'--config {path}: {stacked.dump_path} is a run\'s dump already; stack flat '
                                 f'key: value files on one dump')
            if conf is not None:
                check_dump_experiment(name, type(conf), doc, Path(path))  # its keys as written
            given = doc.get('given') if isinstance(doc.get('given'), dict) else doc['values']
            read, env = expand_env({k: v for k, v in doc['values'].items() if k in given}, origins)
            doc = {**doc, 'values': {**doc['values'], **read}}
            if conf is not None:
                doc = {**doc, 'values': inspect.expand_short_keys(conf, doc['values'])}
                check_dump(name, type(conf), doc, Path(path))
            stacked.dump, stacked.dump_path, stacked.dump_label = doc, path, f'--config {path}'
            for key in given:  # its given values are this file's, at their lines (a later file still wins)
                if key in doc['values']:
                    stacked.values.pop(key, None)
                    stacked.labels[key] = f'--config {path}:{lines[key]}' if key in lines else f'--config {path}'
                    _note(stacked.env, key, env.get(key))
            continue
        read, env = expand_env(doc, origins)
        expanded = inspect.expand_short_keys(conf, read) if conf is not None else read
        for (key, value), written in zip(expanded.items(), read):
            stacked.values[key] = value
            stacked.labels[key] = f'--config {path}:{lines[written]}' if written in lines else f'--config {path}'
            _note(stacked.env, key, env.get(written))
    return stacked


def _note(env: dict[str, Any], key: str, use: Any) -> None:
    """`env[key] = use`, or no entry when the value read no environment (a later file's plain value wins)."""
    if use is None:
        env.pop(key, None)
    else:
        env[key] = use


def prepare(conf) -> None:
    """Compute everything a run needs, so every user mistake surfaces before a file is written: `check_values`,
    the threads, `compute` (memory, data, model, optimizer, every plain item); last, one forward and backward pass
    on the first batch (`trainer.check_trains`) catches what the declarations cannot say (a size the model cannot
    take, a batch too big for the memory), with the model's state and the random states left as they were.

    Args:
        conf: a `make_configs` result (or any experiment's Configs with its values set).

    Raises:
        UsageError: see `check_values`; the run needs more memory than the device has (`check_memory_needs`);
            DataError, ConfigError: from the items computed here; TrainingError: the model fails on its first batch.
    """
    check_values(conf)
    if conf.threads:
        try:
            torch.set_num_threads(conf.threads)
        except (RuntimeError, ValueError) as e:  # an experiment may declare threads without its upper bound
            raise UsageError(f'threads={conf.threads}: torch cannot use that many ({e})') from None
    compute(conf)
    check_trains(conf)


#: the items the trainer reads from every experiment's Configs (see TrainerConfigs' docstring)
TRAINER_ITEMS = ('task', 'model', 'total_steps', 'optimizer')


def compute(conf, optimizer: bool = True, plain: bool = True) -> None:
    """Compute what a run is made of, in the order its mistakes should surface: the memory it needs (from the sizes
    alone, `check_memory_needs`), the data, the model, the step count, the optimizer and its schedule (not with
    `optimizer=False`: a sweep checking its points skips their cost) and every plain item (`compute_plain`; not
    with `plain=False`: a sweep calls it apart, to tell the reads of these checks from those of the listing), so
    that configs.yaml records all of them. Seeds torch first: the model's initial parameters depend only on `seed`.

    Args:
        conf: the experiment's Configs.
        optimizer: whether to build the torch optimizer and its schedule too.
        plain: whether to compute every plain item too (`compute_plain`).

    Raises:
        UsageError: an item the trainer reads has no value (a Task-based Configs without an @option for it);
            the sequence-length warm-up on a task without shorter sequences; DataError, ConfigError: as `prepare`.
    """
    check_trainer_items(conf)
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
    for row in describe(conf):
        if row['plain']:
            value = conf
            for part in row['name'].split('.'):
                value = getattr(value, part)


def check_trainer_items(conf) -> None:
    """That the experiment's Configs declares each item the trainer reads (`TRAINER_ITEMS`) and says how to make
    it: an @option (the first one is the default), a class default, or a value given. (Without one the engine would
    make the item from its type alone: an empty `nn.Module()`, a `Task()` without batches.)

    Raises:
        UsageError: `FILE: Configs has no option for 'task'; …`, naming the item and what the contract asks.
    """
    items = {item.path: item for item in inspect.items(conf)}
    defaults = inspect.class_defaults(type(conf))
    for key in TRAINER_ITEMS:
        item = items.get(key)
        named = inspect.selected_option(conf, key)  # the option its default, or its first option, names
        if item is not None and (item.computed or item.waiting or named is not None
                                 or (key in defaults and not isinstance(defaults[key], str))):
            continue
        cls = type(conf)
        where = getattr(sys.modules.get(cls.__module__), '__file__', None) or cls.__module__
        what = 'declares no item' if item is None else 'has no option for'
        raise UsageError(f'{where}: {cls.__name__} {what} {key!r}; an experiment on TrainerConfigs provides '
                         f'{", ".join(TRAINER_ITEMS)}, each declared and made by an @option(Configs.{key}) '
                         f'(see TrainerConfigs)')


def check_memory_needs(conf) -> None:
    """The least memory the run takes, `memory_needs(conf)` of its experiment's module (the first class of its MRO
    whose module defines one), against what the device has (`lazylab.experiments.memory.check_memory`).

    Raises:
        UsageError: it needs more, naming the keys that size the biggest part.
    """
    for cls in type(conf).__mro__:
        needs = getattr(sys.modules.get(cls.__module__), 'memory_needs', None)
        if needs is not None:
            check_memory(needs(conf), device(conf))
            return


def check_values(conf) -> None:
    """What the item declarations cannot say: that the device exists here, the dashboard URL can be used, and the
    sequence-length warm-up's items fit together. (Ranges and choices are declared with the items, e.g.
    `batch_size: PositiveInt`, and checked by the engine.)

    Raises:
        UsageError: the device is unknown or not available; seq_len_start > seq_len, or only one of
            seq_len_start and seq_len_warmup given; DashboardError (a UsageError): a bad dashboard URL.
    """
    device(conf)
    start, warmup, seq_len = conf.seq_len_start, conf.seq_len_warmup, conf.seq_len
    if start > seq_len:
        raise UsageError(f'seq_len_start={start} is longer than seq_len={seq_len}; the warm-up grows the length '
                         f'from seq_len_start to seq_len')
    if bool(start) != bool(warmup):
        given, missing = ('seq_len_start', 'seq_len_warmup') if start else ('seq_len_warmup', 'seq_len_start')
        raise UsageError(f'{given} needs {missing} too: the warm-up starts at seq_len_start and reaches seq_len '
                         f'after seq_len_warmup steps')
    if conf.dashboard:
        track_url(conf.dashboard)


def device(conf) -> torch.device:
    """The torch.device of `conf.device`.

    Raises:
        UsageError: it is unknown or not available here (checked again, with the rest, by `prepare`).
    """
    try:
        return resolve_device(conf.device)
    except ValueError as e:
        raise UsageError(str(e)) from None
