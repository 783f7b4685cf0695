"""An experiment's keys for shell completion, without importing torch in the process that answers the TAB.

Listing an experiment's keys means importing its module, and an experiment imports torch (seconds). So the listing
— each dotted key with the values a command line may name for it (options, True/False, a Literal's choices) and its
help, and the presets — is written once, by a child process, to a JSON file named by a sha256 of the experiment's
file (and of the sizes and times of lazylab's own config and experiment sources, so that an edited lazylab is listed
again). Later TABs read that file: milliseconds.

    $XDG_CACHE_HOME/lazylab/keys/SHA.json   (~/.cache/lazylab/keys/ without XDG_CACHE_HOME)
    python -m lazylab.cli.key_cache EXPERIMENT CACHE_FILE      the child: import, list, write atomically

A file experiment's own neighbours are not part of the sha: a change only there is listed again when the experiment
file itself changes (or after `rm -r ~/.cache/lazylab/keys`).
"""
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any, Optional

import lazylab
from lazylab.experiments.discovery import BUILTIN, find_experiment, registered

#: how long the child may take to import an experiment and list its keys before the TAB gives up (no keys)
CHILD_TIMEOUT_S = 60.0
#: the listing's format (a new one is written beside an old one)
FORMAT = 2


def cache_dir() -> Path:
    """The folder of the key listings: `$XDG_CACHE_HOME/lazylab/keys`, or `~/.cache/lazylab/keys`."""
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return Path(base) / 'lazylab' / 'keys'


def experiment_file(written: str, cwd: Path) -> Optional[Path]:
    """The file of the experiment EXPERIMENT names, found without importing it (nor torch): a `.py` path, a
    built-in's module, an installed plugin's or a dotted module's file; None when there is none.

    Args:
        written: EXPERIMENT as typed on the command line.
        cwd: the folder the command line runs in.
    """
    if written.endswith('.py') or '/' in written:
        path = (cwd / written).expanduser()
        return path.resolve() if path.is_file() else None
    if written in BUILTIN:  # lazylab's own: beside this package, whichever way it is installed
        return Path(lazylab.__file__).parent.joinpath(*BUILTIN[written].split('.')[1:]).with_suffix('.py')
    if not written.replace('.', '').replace('_', '').isalnum():
        return None
    found = registered().get(written)
    return module_file(found.module_name if found is not None else written, cwd)


def module_file(dotted: str, cwd: Path) -> Optional[Path]:
    """The source file of module `dotted`, found as `import` would find it from `cwd`, without importing it or its
    parent packages (whose `__init__` may import torch)."""
    parts = dotted.split('.')
    try:
        spec = (PathFinder.find_spec(parts[0], [str(cwd)])
                or importlib.util.find_spec(parts[0]))  # a top-level name: nothing is imported to find it
        for part in parts[1:]:
            locations = list(spec.submodule_search_locations or []) if spec is not None else []
            spec = PathFinder.find_spec(part, locations) if locations else None
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.has_location or not spec.origin:
        return None
    return Path(spec.origin)


def fingerprint(file: Path) -> str:
    """The sha256 that names `file`'s listing: of its bytes, lazylab's version, and the name, size and time of each
    of lazylab's config and experiment sources (what an experiment's keys are declared in)."""
    h = hashlib.sha256(file.read_bytes())
    h.update(f'{FORMAT} {lazylab.__version__} {sys.version_info[:2]}'.encode())
    package = Path(lazylab.__file__).parent
    for folder in ('configs', 'configs/engine', 'experiments'):
        with os.scandir(package / folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.name.endswith('.py'):
                    st = entry.stat()
                    h.update(f'{folder}/{entry.name} {st.st_size} {st.st_mtime_ns}'.encode())
    return h.hexdigest()


def listing(written: str, cwd: Optional[Path] = None) -> Optional[dict[str, Any]]:
    """The key listing of EXPERIMENT: read from the cache, or written there first by a child process.

    Returns None when the experiment cannot be found, or its listing cannot be made (its import fails: the child's
    error is cached too, until its file changes; the command itself will say what is wrong).

    Args:
        written: EXPERIMENT as typed.
        cwd: the folder the command line runs in (default: the current one).
    """
    cwd = Path.cwd() if cwd is None else cwd
    file = experiment_file(written, cwd)
    if file is None or not file.is_file():
        return None
    path = cache_dir() / f'{fingerprint(file)}.json'
    doc = _read(path)
    if doc is None:
        target = str(file) if written.endswith('.py') or '/' in written else written
        try:
            subprocess.run([sys.executable, '-m', 'lazylab.cli.key_cache', target, str(path)], cwd=cwd,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=CHILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return None
        doc = _read(path)
    return doc if doc is not None and 'keys' in doc else None


def _read(path: Path) -> Optional[dict[str, Any]]:
    try:
        doc = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get('format') == FORMAT else None


def write_listing(written: str, path: Path) -> None:
    """The child's work: import EXPERIMENT, list its keys (`lazylab.configs.describe`) and presets, and write them to
    `path` atomically; an experiment that cannot be imported is written as `{"error": …}`, so the next TAB does not
    import it again."""
    from lazylab import runs  # start-up time: the child's only (as the engine below), not each TAB's
    from lazylab.configs import describe
    try:
        found = find_experiment(written)
        rows = describe(found.Configs)
        doc: dict[str, Any] = {
            'format': FORMAT, 'experiment': written,
            'keys': [{'name': r['name'], 'values': r['values'], 'help': r['help']} for r in rows],
            'presets': list(found.presets)}
    except Exception as e:  # noqa: BLE001 - whatever the import raises, the TAB only needs to know there are no keys
        doc = {'format': FORMAT, 'experiment': written, 'error': f'{type(e).__name__}: {e}'[:500]}
    path.parent.mkdir(parents=True, exist_ok=True)
    runs.write_json(path, doc)


if __name__ == '__main__':
    write_listing(sys.argv[1], Path(sys.argv[2]))
