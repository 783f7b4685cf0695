"""`lazylab options EXPERIMENT key=value … [--config FILE …] --resolved [--format yaml]`: every value a run would
get, and who set it, before the run.

    conf, later = resolve('transformer', ['d_model=64'])    # the same checks as `lazylab train`, up to the model
    print(resolved_text(conf, later))     # d_model = 64   command line …
    print(resolved_yaml(conf))            # a configs.yaml dump: `lazylab train transformer --config THIS` replays it
    print(graph_text(conf, later, 'mermaid'))   # `--graph dot|mermaid|svg`: the same items as a graph

The configuration is made as `train` makes it (`configure.make_configs`: the preset, the files, the settings) and
checked as `train` checks it before the model (`check_values`, `check_trainer_items`, the memory the sizes need);
then every plain item is computed with the engine told not to build a torch module, optimizer or schedule
(`lazylab.configs.inspect.not_built`). The text is read where an item needs it (`n_tokens` is the text's
vocabulary); the model is not built, and an item that needs it — the optimizer's sub-config takes the model's
parameters — is listed with the value it starts from, as computed when the run starts. Nothing is written.
Mistakes only the model or its first batch can show (`d_model` not divisible by `heads`) are `train`'s.
"""
from collections.abc import Sequence
from typing import Any, Optional, Union

import torch

from lazylab.configs import describe, dump, inspect
from lazylab.configs.graph import graph, to_dot, to_mermaid, to_svg
from lazylab.configs.graph import need_dot as need_dot  # for `lazylab options --graph svg`, before the experiment
from lazylab.experiments.configure import check_memory_needs, check_trainer_items, check_values, make_configs
from lazylab.experiments.discovery import Experiment, find_experiment

#: the types `--resolved` never builds: what only the run needs, and what costs memory and time to make
NOT_BUILT_TYPES = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)


def _not_built(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, NOT_BUILT_TYPES)


def resolve(experiment: Union[str, Experiment], settings: Sequence[str] = (),
            config: Union[None, str, Sequence[str]] = None) -> tuple[Any, dict[str, str]]:
    """The configuration `lazylab train EXPERIMENT SETTINGS --config …` would run, computed without its model:
    (the config object, {path: the item it waits for} of the items computed only when the run starts).

    Args:
        experiment: EXPERIMENT as written, or an `Experiment`.
        settings: `key=value` tokens.
        config: the `--config` file(s).

    Raises:
        UsageError, ConfigError, DataError: what `lazylab train` raises for the same input before it builds the
            model (one line).
    """
    found = experiment if isinstance(experiment, Experiment) else find_experiment(experiment)
    conf = make_configs(found, settings, config=config)
    check_values(conf)
    check_trainer_items(conf)
    later: dict[str, str] = {}
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]), inspect.not_built(_not_built):
        try:
            check_memory_needs(conf)
        except inspect.NotBuiltError:
            pass  # an experiment whose memory_needs reads its model: `train` checks it
        for row in describe(conf):
            if row['plain']:
                _compute(conf, row['name'], later)
        for item in inspect.items(conf):  # an object item not computed: which one it waits for, if not itself
            if not item.computed and item.path not in later:
                later[item.path] = item.path
    torch.set_num_threads(threads)
    return conf, later


def _compute(conf: Any, path: str, later: dict[str, str]) -> None:
    """Compute the item at `path`, or note in `later` the item it needs that is not built here."""
    value = conf
    try:
        for part in path.split('.'):
            value = getattr(value, part)
    except inspect.NotBuiltError as e:
        later[path] = e.path


def rows(conf: Any, later: dict[str, str]) -> list[tuple[str, str, str]]:
    """(key, value, where it came from) for every item of the resolved configuration `conf`, in `describe`'s order:
    given values by their source (`command line`, `preset NAME`, `FILE:LINE`, `env NAME`: a secret one shown as its
    `${env:NAME}` reference, never its value), computed ones by how
    (`default`, `option NAME`, `set by ITEM`, `aggregate S=O`) and from what (`← d_model, heads`), and those computed
    when the run starts by the value they start from and the item they wait for."""
    items = {item.path: item for item in inspect.items(conf)}
    given, set_by, waiting = inspect.given(conf), inspect.set_by(conf), inspect.waiting(conf)
    hidden = inspect.redacted(conf)  # secrets read from the environment: shown as their references
    waiting.update(hidden)
    out = []
    for row in describe(conf):
        path = row['name']
        item = items.get(path)
        if item is not None and item.computed:
            shown = _shown(item.value) if item.plain else item.value.__class__.__name__
            shown = _shown(hidden[path]) if path in hidden else shown
            out.append((path, shown, given_by(given[path]) if path in given else _how(item, set_by.get(path))))
            continue
        start = waiting.get(path, row['default'])
        source = given_by(given[path]) if path in given else ('default' if row['default'] is not None else '')
        if item is not None and item.waiting == 'set_default':  # (its function is not called: it may build)
            start, source = None, 'set by the experiment'
        elif item is not None and not item.plain:
            start = inspect.selected_option(item.owner, item.key) or start
        needs = later.get(path, path.rsplit('.', 1)[0] if '.' in path else path)
        when = 'built when the run starts' if needs == path else f'when the run starts: needs {needs}'
        out.append((path, '' if start is None else _shown(start), f'{source} ({when})' if source else f'({when})'))
    return out


def given_by(label: str) -> str:
    """A given value's source as `--resolved` says it: `user` is the command line; the others as recorded."""
    if label == 'user':
        return 'command line'
    return label[len('--config '):] if label.startswith('--config ') else label


def _how(item: Any, setter: Optional[str]) -> str:
    reads = [r for r in item.reads if r != item.path]
    source = {'default': 'default', 'from_type': 'constructed from its type'}.get(item.source, item.source)
    if item.source == 'option':
        source = f'option {item.detail}'
    elif item.source == 'aggregate':
        source = f'aggregate {item.detail}'
    elif setter is not None:
        source = f'set by {setter}' if setter else 'set by the experiment'
    elif item.source == 'set_default':
        source = 'computed'
    return source + (f' ← {", ".join(reads)}' if reads else '')


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def resolved_text(conf: Any, later: dict[str, str]) -> str:
    """The `--resolved` table: `key = value   source`, aligned (see `rows`)."""
    table = rows(conf, later)
    width = max(len(k) for k, _, _ in table)
    value_width = min(max(len(v) for _, v, _ in table), 24)
    return '\n'.join(f'{k:<{width}} = {v:<{value_width}}  {s}'.rstrip() for k, v, s in table)


def resolved_yaml(conf: Any) -> str:
    """The resolved configuration as a configs.yaml dump (`values`, `given` with each source, `computed` with how):
    `lazylab train EXPERIMENT --config THIS_FILE` gives the run these values (the items computed only when the run
    starts are computed then, from the given ones)."""
    return dump(conf)


def graph_text(conf: Any, later: dict[str, str], fmt: str) -> str:
    """`--graph FORMAT`: the resolved configuration's lazy graph (`lazylab.configs.graph`) as dot, mermaid or svg
    (drawn by graphviz's `dot`: a UsageError saying to install graphviz when it is missing)."""
    g = graph(conf, later)
    name = type(conf).__name__
    if fmt == 'mermaid':
        return to_mermaid(g)
    return to_svg(to_dot(g, name)) if fmt == 'svg' else to_dot(g, name)
