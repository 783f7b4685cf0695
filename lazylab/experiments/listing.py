"""`lazylab options EXPERIMENT` (and `lazylab train EXPERIMENT --help`): every key of an experiment with its type,
default, rule, options and help (the comment beside its declaration) — the keys its own file declares first, then
those it inherits — then the experiment's presets; and `lazylab schema EXPERIMENT`, the JSON Schema of its config
files."""
from typing import Union

import torch

from lazylab.configs import apply_overrides, describe, format_description, inspect
from lazylab.configs.schema import json_schema
from lazylab.experiments.discovery import Experiment, find_experiment


def options_text(experiment: Union[str, Experiment]) -> str:
    """`lazylab options EXPERIMENT`: every key with type, default, options and help, the experiment's own first
    (`own_first`), then the presets.

    A sub-config's key shows the experiment's default where the experiment sets it (e.g. the feedback
    experiment's `feedback.d_model = 128 (follows d_model)`, not FeedbackConfigs' own 512): see
    `effective_defaults`.

    Args:
        experiment: EXPERIMENT as written (a built-in name, a .py file, a module) or an `Experiment`.

    Raises:
        UsageError: the experiment cannot be found, or is no experiment (`discovery`).
    """
    found = experiment if isinstance(experiment, Experiment) else find_experiment(experiment)
    configs = found.Configs
    defaults = effective_defaults(configs)
    own, inherited, bases = own_first(configs, describe(configs))
    if own and inherited:
        text = (f"{found.name}'s own keys ({configs.__name__}):\n{format_description(own, defaults)}\n\n"
                f"inherited ({', '.join(bases)}):\n{format_description(inherited, defaults)}")
    else:
        text = format_description(own + inherited, defaults)
    presets = found.presets
    if presets:
        text += '\n\npresets (preset=NAME, applied before other settings):\n'
        for p, values in presets.items():
            text += f'  {p}: ' + ' '.join(f'{k}={v}' for k, v in values.items()) + '\n'
    return text


def config_schema(experiment: Union[str, Experiment]) -> dict:
    """`lazylab schema EXPERIMENT`: the JSON Schema (draft 2020-12) of a `--config` file of the experiment
    (`lazylab.configs.schema.json_schema`), its presets included.

    Raises:
        UsageError: see `discovery.find_experiment` and `Experiment.load`.
    """
    found = experiment if isinstance(experiment, Experiment) else find_experiment(experiment)
    return json_schema(found.Configs, title=f'lazylab {found.name} --config file', presets=list(found.presets))


def own_first(configs_class: type, rows: list[dict]) -> tuple[list[dict], list[dict], list[str]]:
    """(the `describe` rows of the keys the experiment's own module declares, those of the keys it inherits, the
    names of the classes these come from): a user reading `lazylab options gru.py` sees `hidden` before the 40-odd
    keys of TrainerConfigs. A sub-config's keys go with the key that holds it (`transformer.d_model` with
    `transformer`); a key the experiment declares again (`model: nn.Module = 'lstm'`) is its own.

    Args:
        configs_class: the experiment's Configs; rows: `describe(configs_class)`.
    """
    by = inspect.declared_by(configs_class)
    own = {key for key, cls in by.items() if cls.__module__ == configs_class.__module__}
    mine = [row for row in rows if row['name'].split('.', 1)[0] in own]
    theirs = [row for row in rows if row['name'].split('.', 1)[0] not in own]
    bases = [c.__name__ for c in configs_class.__mro__ if c in {cls for key, cls in by.items() if key not in own}]
    return mine, theirs, bases


def effective_defaults(configs_class: type) -> dict[str, str]:
    """dotted key → how the experiment sets it, for the sub-config keys whose default the experiment replaces:
    `'128 (follows d_model)'` (a default that reads another key), `'4 (set by the experiment)'` (a value given by
    the experiment's option), `'(set by the experiment)'` (an object, not built here).

    Found by making the experiment's sub-configs with the defaults (on the CPU; the model is built, the text
    read; the random states are left as they were) and reading their plain items; a sub-config that cannot be
    made so keeps its class's defaults in the listing.

    Args:
        configs_class: the experiment's Configs.
    """
    conf = configs_class()
    apply_overrides(conf, {'device': 'cpu', 'threads': 0})  # no accelerator start-up for a listing
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        inspect.compute_plain(conf)
    torch.set_num_threads(threads)
    return inspect.effective_defaults(conf)
