"""Which module an EXPERIMENT names, for every command (`train`, `options`, `resume`, `generate`, `sweep`, …).

EXPERIMENT is one of:

    feedback                     a built-in name (lazylab's own six, registered as entry points like any plugin)
    ./char_lstm.py, char_lstm.py the path of a .py file (its folder goes on sys.path, so it may import its neighbours)
    mypkg.experiments.lstm       a dotted module importable from the current folder or the environment
    lstm                         a name an installed package registers in the entry-point group `lazylab.experiments`:
                                     [project.entry-points."lazylab.experiments"]
                                     lstm = "mypkg.lstm"

A module is an experiment when it defines `Configs`, a subclass of `lazylab.experiments.TrainerConfigs`; `PRESETS`
(named settings), `memory_needs` (the up-front memory check) and `main` are optional. Its runs go to
RUNS_DIR/STEM/RUN_ID, STEM being the built-in's or entry point's name, or the file's or module's last name.

`find_experiment` only decides what EXPERIMENT names (torch-free, quick: `lazylab --help` lists the experiments with
it); `Experiment.load` imports it. run.json records `Experiment.source`, from which `from_source` finds the same
module again (resume, a sweep's trials): a file by its absolute path, with a warning when its sha256 changed.
"""
import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from lazylab.errors import LazylabError, UsageError

#: the entry-point group an installed package registers its experiments in
ENTRY_POINT_GROUP = 'lazylab.experiments'
#: lazylab's own experiments (also its entry points; this list serves an uninstalled source tree)
BUILTIN = {'feedback': 'lazylab.experiments.feedback', 'fast_weights': 'lazylab.experiments.fast_weights',
           'transformer': 'lazylab.experiments.transformer', 'retrieval': 'lazylab.experiments.retrieval',
           'mqar': 'lazylab.experiments.mqar', 'state_tracking': 'lazylab.experiments.state_tracking'}


@dataclass
class Experiment:
    """An experiment module, found (`find_experiment`) and, once `load`ed, imported and checked.

    Attributes:
        name: the STEM of its runs' folder and of messages ('feedback', 'char_lstm').
        kind: 'builtin', 'file', 'module' or 'entry_point'.
        module_name: the module's dotted name (for a file: the name it is imported under).
        path: a file experiment's absolute path (None for the others).
        written: EXPERIMENT as the user wrote it (messages).
    """
    name: str
    kind: str
    module_name: str
    path: Optional[Path] = None
    written: str = ''
    distribution: Optional[str] = None
    module: Optional[ModuleType] = field(default=None, repr=False)

    @property
    def source(self) -> dict[str, Any]:
        """Where the experiment came from, as run.json records it (`lazylab.runs.RunRecord.source`)."""
        out: dict[str, Any] = {'kind': self.kind, 'module': self.module_name}
        if self.path is not None:
            out.update(path=str(self.path), sha256=file_sha256(self.path))
        if self.distribution is not None:
            out.update(distribution=self.distribution, version=_dist_version(self.distribution))
        return out

    @property
    def Configs(self) -> type:  # noqa: N802 - the module's class, by its name
        return self.load().Configs

    @property
    def presets(self) -> dict[str, dict[str, Any]]:
        return dict(getattr(self.load(), 'PRESETS', None) or {})

    def raised_in_its_code(self, error: BaseException) -> bool:
        """Whether `error` was raised in this experiment's own code: a frame of its traceback in a file of the
        experiment module's folder (its file, or a module beside it it imports), not an installed package's. Never
        for lazylab's own experiments, whose failures are lazylab's to word.

        Args:
            error: an exception (with its traceback).
        """
        if self.kind == 'builtin' or self.module is None or not getattr(self.module, '__file__', None):
            return False
        folder = Path(self.module.__file__).resolve().parent
        for frame, _ in traceback.walk_tb(error.__traceback__):
            file = Path(frame.f_code.co_filename)
            if file.is_absolute() and 'site-packages' not in file.parts and folder in file.resolve().parents:
                return True
        return False

    def load(self) -> ModuleType:
        """The module, imported (once) and checked to be an experiment.

        Raises:
            UsageError: the module cannot be found, has a syntax error (file, line and what), or defines no
                `Configs` subclass of TrainerConfigs (the message says what an experiment needs). An exception raised
                by the module's own code while it is imported is the user's bug: one `lazylab: error:` line naming
                it, then the exception with its traceback.
        """
        if self.module is None:
            with _import_errors(self.written or self.module_name):
                module = _import_file(self) if self.kind == 'file' else _import_module(self)
            check_experiment_module(module, self.written or self.name)
            self.module = module
        return self.module


def find_experiment(written: str, *, cwd: Optional[Path] = None) -> Experiment:
    """The experiment EXPERIMENT names (see the module docstring), not yet imported.

    Raises:
        UsageError: a file that does not exist; a name that is both a built-in (or an installed plugin) and a file
            here; a name that is none of the four kinds (with the closest experiment, and the list).
    """
    cwd = Path.cwd() if cwd is None else cwd
    if not written or not written.strip():
        raise UsageError('the experiment is empty; give a name (feedback, …), a .py file or a module')
    if written.endswith('.py') or '/' in written or '\\' in written:
        path = (cwd / written).expanduser()
        if not path.is_file():
            what = 'is a folder, not a .py file' if path.is_dir() else 'not found'
            raise UsageError(f'experiment file {what}: {written}')
        stem = path.stem
        return Experiment(stem, 'file', _file_module_name(path.resolve()), path.resolve(), written)
    named = registered()
    if written in named:
        if (cwd / f'{written}.py').is_file():
            raise UsageError(f"'{written}' is the {named[written].kind.replace('_', ' ')} experiment "
                             f"{named[written].module_name}, and also a file here ({written}.py); name the file "
                             f"./{written}.py, or the {named[written].kind.replace('_', '-')} one "
                             f"{named[written].module_name}")
        found = named[written]
        return Experiment(found.name, found.kind, found.module_name, None, written, found.distribution)
    if _is_dotted_name(written) and _module_exists(written, cwd):
        return Experiment(written.rsplit('.', 1)[-1], 'module', written, None, written, _distribution_of(written))
    close = difflib.get_close_matches(written, list(named), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ''
    raise UsageError(f"unknown experiment {written!r}{hint} (experiments: {', '.join(named)}; or a .py file, or a "
                     f"module importable from here)")


def load_experiment(written: str):
    """The module EXPERIMENT names (`find_experiment`), imported and checked (`Experiment.load`).

    Args:
        written: EXPERIMENT as the user wrote it (a built-in or plugin name, a .py file, a dotted module).

    Raises:
        UsageError: see `find_experiment` and `Experiment.load`.
    """
    return find_experiment(written).load()


def registered() -> dict[str, Experiment]:
    """Every experiment known by a name: the built-in ones, then those installed packages register (entry points of
    `ENTRY_POINT_GROUP`), in name order within each. A plugin may not take a built-in's name (it is left out)."""
    out = {name: Experiment(name, 'builtin', module) for name, module in BUILTIN.items()}
    plugins = []
    for ep in _entry_points():
        dist = getattr(getattr(ep, 'dist', None), 'name', None)
        if ep.name in BUILTIN and (dist or '').lower() == 'lazylab':
            continue  # lazylab's own registrations of its built-ins
        if ep.name not in out:
            plugins.append(Experiment(ep.name, 'entry_point', ep.value.split(':')[0], None, ep.name, dist))
    out.update({e.name: e for e in sorted(plugins, key=lambda e: e.name)})
    return out


def from_source(name: str, source: Optional[dict[str, Any]], *, warn=print) -> Experiment:
    """The experiment a run recorded (run.json's `experiment` and `source`), to import again: a file from its path,
    a module by its name; an older run without `source` by its name. A file that changed since is one warning
    (`warn`, a function taking the line); the replay checks of the configuration still apply.

    Raises:
        UsageError: the file is gone, or the module or name cannot be found any more.
    """
    if not isinstance(source, dict):
        return find_experiment(name)
    kind, module = source.get('kind'), source.get('module')
    if kind == 'file':
        path = Path(str(source.get('path', '')))
        if not path.is_file():
            raise UsageError(f'the experiment file of this run is gone: {path}')
        found = Experiment(path.stem, 'file', _file_module_name(path), path, str(path))
        if source.get('sha256') and file_sha256(path) != source['sha256']:
            warn(f'lazylab: warning: {path} changed since the run started (its sha256 differs); the configuration '
                 f'is still checked against the run\'s')
        return found
    if isinstance(module, str) and _is_dotted_name(module):
        if kind == 'builtin' and name in BUILTIN:
            return Experiment(name, 'builtin', BUILTIN[name])
        if not _module_exists(module, Path.cwd()):
            raise UsageError(f'the experiment module of this run cannot be found any more: {module}')
        return Experiment(name, str(kind or 'module'), module, None, module, source.get('distribution'))
    return find_experiment(name)


def check_experiment_module(module: ModuleType, written: str) -> None:
    """That `module` defines `Configs`, a subclass of TrainerConfigs.

    Raises:
        UsageError: it does not, saying what an experiment module needs.
    """
    from lazylab.experiments.trainer import TrainerConfigs  # torch: only once an experiment is imported
    need = ('an experiment defines `class Configs(TrainerConfigs)` (from lazylab.experiments import TrainerConfigs, '
            'or NLPAutoRegressionConfigs for a text model)')
    configs = getattr(module, 'Configs', None)
    if configs is None:
        raise UsageError(f'{written} has no Configs: {need}')
    if not (isinstance(configs, type) and issubclass(configs, TrainerConfigs)):
        raise UsageError(f'{written}: its Configs is not a TrainerConfigs subclass; {need}')


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _file_module_name(path: Path) -> str:
    """The name a file experiment is imported under: its stem, unless that names another module (an imported one,
    or one Python would find first, such as `json` for a json.py); then the stem with a digest of the path."""
    stem = path.stem
    if stem.isidentifier():
        taken = sys.modules.get(stem)
        if taken is not None:
            if getattr(taken, '__file__', None) == str(path):
                return stem
        elif _spec_file(stem) in (None, path):
            return stem
    return f'_lazylab_file_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}_{stem}'


def _spec_file(name: str) -> Optional[Path]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).resolve() if spec is not None and spec.origin else None


@contextlib.contextmanager
def _import_errors(written: str) -> Iterator[None]:
    """While an experiment is imported: a syntax error (in it or a module it imports) becomes one error line, as a
    compiler would say it; any other exception its code raises is its bug, announced by one line naming the
    experiment and then shown with its traceback (as `lifecycle.their_bugs` does for a failing option)."""
    try:
        yield
    except SyntaxError as err:
        where = err.filename or written
        line = f', line {err.lineno}' if err.lineno else ''
        raise UsageError(f'{where}{line}: {type(err).__name__}: {err.msg} (the experiment {written} cannot be '
                         f'imported)') from None
    except LazylabError:
        raise
    except Exception as err:
        print(f"lazylab: error: importing {written} raised {type(err).__name__}: {_first_line(err)} (a bug in its "
              f"code: its traceback follows)", file=sys.stderr, flush=True)
        raise


def _first_line(err: BaseException) -> str:
    """The first line of an exception's message, cut to 200 characters."""
    text = str(err).splitlines()[0] if str(err) else ''
    return text if len(text) <= 200 else text[:197] + '...'


def _import_file(e: Experiment) -> ModuleType:
    assert e.path is not None
    if e.module_name in sys.modules and getattr(sys.modules[e.module_name], '__file__', None) == str(e.path):
        return sys.modules[e.module_name]
    folder = str(e.path.parent)
    if folder not in sys.path:  # the file may import modules beside it, as `python FILE` would let it
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(e.module_name, e.path)
    if spec is None or spec.loader is None:
        raise UsageError(f'cannot import {e.written}: not a Python file')
    module = importlib.util.module_from_spec(spec)
    sys.modules[e.module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(e.module_name, None)
        raise
    return module


def _import_module(e: Experiment) -> ModuleType:
    try:
        return importlib.import_module(e.module_name)
    except ModuleNotFoundError as err:
        # the module itself (or a package above it) is missing: the user's mistake; a module it imports is missing:
        # their experiment's bug, with its traceback
        if err.name is not None and (e.module_name == err.name or e.module_name.startswith(err.name + '.')):
            raise UsageError(f'experiment module not found: {e.module_name} (no module named {err.name!r})') from None
        raise


def _is_dotted_name(text: str) -> bool:
    return all(part.isidentifier() for part in text.split('.'))


def _module_exists(name: str, cwd: Path) -> bool:
    """Whether `name` can be imported from `cwd` or the environment, without importing it (its parent packages
    are imported, as Python must to find it)."""
    if str(cwd) not in sys.path and '' not in sys.path:
        sys.path.insert(0, str(cwd))  # `python -m` would look here too
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _entry_points() -> list:
    from importlib import metadata  # start-up time (a tenth of TAB completion's): only where entry points are read
    try:
        eps = metadata.entry_points()
    except Exception:  # noqa: BLE001 - a broken installed distribution must not break the command line
        return []
    if hasattr(eps, 'select'):
        return list(eps.select(group=ENTRY_POINT_GROUP))
    return list(eps.get(ENTRY_POINT_GROUP, ()))  # Python 3.9's dict of groups


def _distribution_of(module: str) -> Optional[str]:
    from importlib import metadata  # start-up time: see _entry_points
    top = module.split('.')[0]
    try:
        names = metadata.packages_distributions().get(top)
    except AttributeError:  # Python 3.9
        return None
    return names[0] if names else None


def _dist_version(distribution: str) -> Optional[str]:
    from importlib import metadata  # start-up time: see _entry_points
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
