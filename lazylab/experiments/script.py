"""`main(Configs)`: an experiment file that runs itself, as `lazylab train` runs it.

    # char_lstm.py
    if __name__ == '__main__':
        sys.exit(main(Configs))

`python char_lstm.py key=value …` is then the same run as `lazylab train char_lstm.py key=value …`: `main` finds
where `Configs` was defined (this file's path; the module's name under `python -m`; a built-in's name) and runs
`lazylab train` on it, which imports the file again by its path (discovery), so that both runs are made from the
same module object, recorded the same way (run.json's `source`) and resumed the same way. Under torchrun every
process does the same (`torchrun --standalone --nproc_per_node=2 char_lstm.py …`).
"""
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from lazylab.experiments.discovery import BUILTIN


def main(configs: type, argv: Optional[Sequence[str]] = None) -> int:
    """Train the experiment whose Configs is `configs` with the command line `argv` (default: `sys.argv[1:]`),
    exactly as `lazylab train EXPERIMENT …` does; returns the exit code (0; 2 for a mistake, printed as one line
    `lazylab: error: …`; 130/143 for Ctrl-C/SIGTERM).

    Args:
        configs: the experiment module's `Configs` (a TrainerConfigs subclass).
        argv: `key=value …`, `--config FILE.yaml`, `--allow-changes`, `--help`, as `lazylab train` takes them.

    Raises:
        TypeError: `configs` is not a class defined in a module (main needs to know where to import it from).
    """
    # the command line is the cli layer's (its one parser and splitter): main is `lazylab train`, so it calls it.
    # Imported here, once a script runs: lazylab.cli imports the experiments only inside its commands, never at
    # import, so this is no import circle (and `import lazylab.experiments` stays free of the command line).
    from lazylab import cli
    written = experiment_of(configs)
    return cli.main(['train', written, *(sys.argv[1:] if argv is None else list(argv))])


def experiment_of(configs: type) -> str:
    """EXPERIMENT, as `lazylab train` takes it, for the module that defines `configs`: a built-in's name, the
    dotted name of a module in a package (`python -m mypkg.lstm`), else the file's absolute path (a script run as
    `python FILE`, a top-level module).

    Args:
        configs: a class defined in an experiment module.

    Raises:
        TypeError: `configs` is not a class, or its module is not loaded.
    """
    module = sys.modules.get(getattr(configs, '__module__', None) or '')
    if not isinstance(configs, type) or module is None:
        raise TypeError(f'main() takes the experiment\'s Configs class, got {configs!r}')
    name = configs.__module__
    spec = getattr(module, '__spec__', None)
    if name == '__main__' and spec is not None and spec.name not in (None, '__main__'):
        name = spec.name  # python -m PACKAGE.MODULE
    builtins = {module_name: builtin for builtin, module_name in BUILTIN.items()}
    if name in builtins:
        return builtins[name]
    file = getattr(module, '__file__', None)
    if file is not None and (name == '__main__' or '.' not in name):  # a script, or a file imported as a module
        return str(Path(file).resolve())
    return name
