"""What TAB offers for each kind of argument (argcomplete completers: called with the word typed so far, `prefix`,
and the arguments parsed before it, `parsed_args`; each returns {candidate: description}).

    experiments          built-in and installed experiments by name, .py files and folders
    settings             an experiment's keys, full (`transformer.ffn.glu_variant=`) and by their unique ends
                         (`glu_variant=`), then after `=` the key's option names, True/False, a Literal's values
    run_dirs, sweep_dirs run directories (with run.json) and sweep directories (with sweep.yaml), and the folders
                         that lead to them

Nothing here imports torch: keys come from `key_cache`'s listing.
"""
import os
from pathlib import Path
from typing import Any, Optional

from lazylab.cli.key_cache import listing
from lazylab.experiments.discovery import registered

#: how deep below a folder TAB looks for a run or a sweep before offering the folder (runs/NAME/RUN_ID: 2)
SEARCH_DEPTH = 3


def experiments(prefix: str, **_: Any) -> dict[str, str]:
    """Experiment names starting with `prefix` (built-in, then installed), and the `.py` files and folders it may
    be the start of."""
    out = {name: f'{e.kind.replace("_", " ")} experiment' for name, e in registered().items()
           if name.startswith(prefix)}
    for path, is_dir in _entries(prefix):
        if is_dir:
            out[path + '/'] = 'folder'
        elif path.endswith('.py'):
            out[path] = 'experiment file'
    return out


def settings(prefix: str, parsed_args: Any = None, **_: Any) -> dict[str, str]:
    """`key=` for the keys of the experiment before `prefix` (`parsed_args.experiment`, or the first of a sweep's
    settings) that start with `prefix`; after `=`, `key=value` for the values the key may name. A sweep's first
    setting is its experiment, and a swept value is completed after each comma (`glu_variant=GLU,Sw`). Without an
    experiment, or for one that cannot be listed, nothing."""
    experiment = getattr(parsed_args, 'experiment', None)
    sweep = experiment is None
    if sweep:  # lazylab sweep EXPERIMENT key=…: the experiment is the first of the settings
        given = list(getattr(parsed_args, 'settings', None) or [])
        if not given:
            return experiments(prefix)
        experiment = given[0]
    found = listing(experiment)
    if found is None:
        return {}
    keys = {row['name']: row for row in found['keys']}
    keys['preset'] = {'name': 'preset', 'values': found.get('presets', []), 'help': 'a named set of settings'}
    key, eq, value = prefix.partition('=')
    if eq:
        row = keys.get(key) or keys.get(_full_key(key, keys) or '')
        if row is None:
            return {}
        before, comma, value = value.rpartition(',') if sweep else ('', '', value)  # a sweep's key=a,b,c
        return {f'{key}={before}{comma}{v}': row['help'] for v in row['values'] if v.startswith(value)}
    out = {f'{name}=': row['help'] for name, row in keys.items() if name.startswith(prefix)}
    if prefix:  # a unique end only once something is typed (an empty TAB lists the keys in full)
        for end, full in unique_ends(keys).items():
            if end.startswith(prefix):
                out.setdefault(f'{end}=', keys[full]['help'])
    return out


def unique_ends(keys: dict[str, Any]) -> dict[str, str]:
    """{end: full key} of the ends of dotted keys that stand for one key on a command line
    (`lazylab.configs.inspect.expand_short_keys`): `glu_variant` and `ffn.glu_variant` for
    `transformer.ffn.glu_variant` when no other key ends so and no top-level key is called `glu_variant`."""
    tops = {name.partition('.')[0] for name in keys}
    count: dict[str, list[str]] = {}
    for name in keys:
        parts = name.split('.')
        for i in range(1, len(parts)):
            count.setdefault('.'.join(parts[i:]), []).append(name)
    return {end: full[0] for end, full in count.items() if len(full) == 1 and end.partition('.')[0] not in tops}


def _full_key(end: str, keys: dict[str, Any]) -> Optional[str]:
    return unique_ends(keys).get(end)


def run_dirs(prefix: str, **_: Any) -> dict[str, str]:
    """Run directories (holding run.json) starting with `prefix`, and the folders below which one lies; sweep
    directories too for `lazylab compare` (see `paths`)."""
    return _dirs(prefix, (_runs().RUN_JSON,))


def paths(prefix: str, **_: Any) -> dict[str, str]:
    """Run and sweep directories starting with `prefix` (`lazylab compare`), and the folders that lead to them."""
    return _dirs(prefix, (_runs().RUN_JSON, _runs().SWEEP_YAML))


def sweep_dirs(prefix: str, **_: Any) -> dict[str, str]:
    """Sweep directories (holding sweep.yaml) starting with `prefix` (`lazylab sweep --resume`), and the folders
    that lead to them."""
    return _dirs(prefix, (_runs().SWEEP_YAML,))


def _runs():
    from lazylab import runs  # start-up time (a fifth of a TAB's): the file names, only when completing folders
    return runs


def _dirs(prefix: str, marks: tuple[str, ...]) -> dict[str, str]:
    out = {}
    run_json = _runs().RUN_JSON
    for path, is_dir in _entries(prefix):
        if not is_dir:
            continue
        mark = next((m for m in marks if os.path.isfile(os.path.join(path, m))), None)
        if mark is not None:
            out[path] = 'run' if mark == run_json else 'sweep'
        elif _holds(path, marks, SEARCH_DEPTH):
            out[path + '/'] = 'folder'
    return out


def _holds(folder: str, marks: tuple[str, ...], depth: int) -> bool:
    """Whether a folder at most `depth` levels below `folder` holds one of `marks` (stops at the first)."""
    if depth == 0:
        return False
    try:
        with os.scandir(folder) as entries:
            subs = [e.path for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith('.')]
    except OSError:
        return False
    return any(any(os.path.isfile(os.path.join(s, m)) for m in marks) for s in subs) or \
        any(_holds(s, marks, depth - 1) for s in subs)


def _entries(prefix: str) -> list[tuple[str, bool]]:
    """(path as the user would write it, whether it is a folder) of the entries of `prefix`'s folder whose names
    start with its last part; hidden ones only when that part starts with a dot."""
    folder, start = os.path.split(prefix)
    where = Path(os.path.expanduser(folder) or '.')
    try:
        with os.scandir(where) as entries:
            found = [(e.name, e.is_dir()) for e in entries
                     if e.name.startswith(start) and (start.startswith('.') or not e.name.startswith('.'))]
    except OSError:
        return []
    return sorted((os.path.join(folder, name), is_dir) for name, is_dir in found)
