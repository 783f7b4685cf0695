"""`lazylab new NAME [--task text|custom]`: the experiment files it writes, and the function that writes them.

    text.py     a character-level LSTM language model on NLPAutoRegressionConfigs (the text, the optimizer, the
                time budget come with it): a model of your own in about 40 lines
    custom.py   a Task of its own (sorting digits) on TrainerConfigs, with its model, optimizer and step count

Both are ordinary experiments (the tests train them as written); `EXPERIMENT_NAME` in their docstrings becomes the
name given.
"""
import contextlib
import keyword
import os
import sys
from importlib import metadata
from pathlib import Path

from lazylab.errors import UsageError, shown
from lazylab.experiments.discovery import registered

#: --task → the template file
TEMPLATES = {'text': 'text.py', 'custom': 'custom.py'}


def write_experiment(name: str, task: str = 'text', folder: Path = Path('.')) -> Path:
    """Write FOLDER/NAME.py, an experiment that trains as written (`lazylab train NAME.py`); returns its path.

    Args:
        name: the experiment's name (a Python name; NAME.py is accepted too).
        task: 'text' (a text model of your own) or 'custom' (a Task of your own).
        folder: where to write it (default: the current folder).

    Raises:
        UsageError: NAME is not a Python name, is a keyword, names a standard-library or installed module
            (torch, random: NAME.py would hide it) or a built-in or installed experiment; NAME.py exists already
            (nothing is overwritten); NAME.py is longer than the file system holds (255 bytes on most); the file
            cannot be written (a read-only folder: the reason is said).
    """
    stem = name[:-3] if name.endswith('.py') else name
    if not stem.isidentifier():
        raise UsageError(f'NAME must be a Python name (letters, digits and _, not starting with a digit), got '
                         f'{name!r}')
    if keyword.iskeyword(stem):
        raise UsageError(f'NAME {stem!r} is a Python keyword: a module cannot be named so; choose another NAME')
    taken = registered().get(stem)
    if taken is not None:
        raise UsageError(f"'{stem}' is the name of the {taken.kind.replace('_', ' ')} experiment "
                         f"{taken.module_name}; choose another NAME")
    path = Path(folder) / f'{stem}.py'
    _check_name_length(path, stem)
    try:
        exists = path.exists()
    except OSError as e:  # a path too long as a whole, a folder that cannot be searched: not a traceback
        raise UsageError(f'cannot write {shown(str(path))}: {e.strerror or e}') from None
    if exists:  # (before the module check: the file may be what makes the name importable)
        raise _exists(path)
    if stem in _installed_modules():
        # its folder goes first on sys.path when it trains, so NAME.py would be imported in that module's place
        raise UsageError(f"NAME {stem!r} is the name of the Python module {stem}, which {stem}.py would hide from "
                         f"any code that imports it; choose another NAME")
    if task not in TEMPLATES:
        raise UsageError(f"--task must be one of {', '.join(TEMPLATES)}, got {task!r}")
    text = (Path(__file__).parent / TEMPLATES[task]).read_text(encoding='utf-8').replace('EXPERIMENT_NAME', stem)
    try:
        with open(path, 'x', encoding='utf-8') as f:  # 'x': never over a file that exists, even one made just now
            f.write(text)
    except FileExistsError:
        raise _exists(path) from None
    except OSError as e:
        with contextlib.suppress(OSError):  # a half-written file (a full disk) does not stay
            os.unlink(path)
        raise UsageError(f'cannot write {path}: {e.strerror or e}') from None
    return path


def _check_name_length(path: Path, stem: str) -> None:
    """That the file system of `path`'s folder holds a file name as long as NAME.py (255 bytes on most: a Python
    name has no such limit, so NAME can be longer than any file's name).

    Raises:
        UsageError: naming the length in bytes and the file system's limit.
    """
    try:
        most = os.pathconf(path.parent, 'PC_NAME_MAX')
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows), or a limit it does not know
        most = 255
    size = len(os.fsencode(path.name))
    if size > most:
        raise UsageError(f'NAME {shown(stem)} is too long: {stem[:8]}….py would be a file name of {size} bytes, and '
                         f'the file system of {path.parent} holds at most {most}; choose a shorter NAME')


def _exists(path: Path) -> UsageError:
    return UsageError(f'{path} exists already; lazylab new does not overwrite it (choose another NAME, or remove the '
                      f'file)')


def _installed_modules() -> set[str]:
    """The top-level modules of the standard library and of the installed distributions (torch, numpy, lazylab…):
    the names a NAME.py would hide. Read from the environment, not from this process's sys.path, which an
    experiment imported earlier in the same process may have extended. (Python 3.10+; empty before.)"""
    names = set(getattr(sys, 'stdlib_module_names', ()))
    if hasattr(metadata, 'packages_distributions'):
        names.update(metadata.packages_distributions())
    return names
