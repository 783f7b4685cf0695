"""``lazylab labml MODULE …``: import a labml experiment module on lazylab's engine and run its ``main()``.

Imports a labml experiment module (a dotted name such as ``labml_nn.transformers.feedback.experiment``, or a
``.py`` file) with ``labml.configs`` served by lazylab's engine, and runs its ``main()``; see
:mod:`lazylab.labml.session` for what happens at each of the script's labml calls. A mistake (unknown module or
key, bad value, a package the module needs that is missing) is one line ``lazylab: error: …``, exit 2, with
nothing written. The command line is read by :mod:`lazylab.cli.labml`.
"""
import difflib
import importlib
import importlib.util
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

from lazylab.configs import describe, expand_env, format_description, inspect, parse_overrides
from lazylab.errors import UsageError
from lazylab.experiments.configure import stack_config_files
from lazylab.labml import adapter, install
from lazylab.labml.session import OptionsRequested, Session

# Import names whose pip package is named differently, for the hint of a missing-package error.
_PIP_NAMES = {'PIL': 'pillow', 'sklearn': 'scikit-learn', 'cv2': 'opencv-python', 'yaml': 'PyYAML'}


def import_experiment(spec: str):
    """The module MODULE names: a dotted module name, or a path to a ``.py`` file (imported under its stem, with
    its folder first on ``sys.path``, as ``python FILE`` would).

    Raises:
        UsageError: the module (or file) does not exist, with the nearest names; or it imports a package that is
            not installed (naming it).
    """
    if spec.endswith('.py') or '/' in spec or '\\' in spec:
        path = Path(spec)
        if not path.is_file():
            raise UsageError(f'no such file: {spec}')
        if path.suffix != '.py':
            raise UsageError(f'{spec} is not a .py file (MODULE is a dotted module name or a .py file)')
        name = path.stem
        sys.path.insert(0, str(path.resolve().parent))
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except ModuleNotFoundError as e:
            del sys.modules[name]
            raise _missing_package(spec, e) from None
        return module
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        if e.name is not None and (spec == e.name or spec.startswith(e.name + '.')):
            raise UsageError(f'no module named {spec!r}{_nearest_module(e.name)}') from None
        raise _missing_package(spec, e) from None


def _missing_package(spec: str, e: ModuleNotFoundError) -> UsageError:
    top = (e.name or str(e)).split('.')[0]
    return UsageError(f'{spec} imports {e.name}, which is not installed here (pip install {_PIP_NAMES.get(top, top)})')


def _nearest_module(missing: str) -> str:
    parent, _, leaf = missing.rpartition('.')
    try:
        siblings = [m.name for m in pkgutil.iter_modules(importlib.import_module(parent).__path__)] if parent \
            else [m.name for m in pkgutil.iter_modules()]
    except (ImportError, AttributeError):
        return ''
    close = difflib.get_close_matches(leaf, siblings, n=1)
    return f"; did you mean '{parent + '.' if parent else ''}{close[0]}'?" if close else ''


def options_text(module: str, conf: Any, script_values: dict[str, Any]) -> str:
    """``--options``: every key of the script's config class, as ``lazylab options`` lists them, then what the
    script's ``experiment.configs`` dict sets (which key=value overrides)."""
    rows = describe(type(conf))
    # sub-configs given as class defaults (labml_nn's `device: torch.device = DeviceConfigs()`), listed under key.
    for key, default in inspect.class_defaults(type(conf)).items():
        if inspect.is_configs(default):
            for row in describe(type(default)):
                rows.append(dict(row, name=f'{key}.{row["name"]}'))
    text = f'{module}: {type(conf).__name__} (lazylab engine)\n' + format_description(rows)
    if script_values:
        text += '\n\nset by the script (experiment.configs; key=value overrides these):\n'
        text += ''.join(f'  {k}={v!r}\n' for k, v in script_values.items())
    return text


def run_labml(module: str, settings: Sequence[str] = (), *, config: Union[None, str, Sequence[str]] = None,
              options: bool = False,
              steps: Optional[int] = None, runs_dir: str = 'runs/labml', dashboard: str = '',
              argv: Sequence[str] = (), run_dir: Optional[Path] = None) -> None:
    """Run labml experiment MODULE's ``main()`` with ``settings`` (``key=value``) over the script's own dict and
    ``config`` (YAML files of settings, stacked as ``lazylab train`` stacks them — a later file wins —, one of
    them may be a run's configs.yaml); ``options``: list the keys instead; ``steps``:
    end training after that many optimizer updates; the run directory goes under ``runs_dir`` (or is ``run_dir``,
    an existing folder: a sweep's trial); ``dashboard``: a labml dashboard URL to stream to; ``argv``: the command
    line, for run.json.

    Raises:
        UsageError: the module, a key, a value, the config file or a package the module needs (one line).
    """
    session = _session(module, settings, config, steps=steps, runs_dir=runs_dir, dashboard=dashboard,
                       argv=tuple(argv), options_only=options, run_dir=run_dir)
    install()
    session.configure_lab()
    session.console.install()
    adapter.SESSION = session
    try:
        session.place_data()  # before the script runs: its code may read the text before experiment.configs
        _run_main(module, session)
    except OptionsRequested as o:
        session.abort()  # --options writes nothing: the data copy goes again
        session.console.line(options_text(session.module, o.conf, o.values))
        return
    except BaseException as e:
        session.abort()
        session.finish()
        session.record_end(e)  # run.json: failed with the line `lazylab: error:` prints (or interrupted)
        raise
    finally:
        session.finish()
        adapter.SESSION = None
        session.console.uninstall()
    session.record_end()
    if not options:
        print(session.summary(), flush=True)


def script_configs(module: str, settings: Sequence[str] = (), *, config: Union[None, str, Sequence[str]] = None,
                   runs_dir: str = 'runs/labml') -> Any:
    """The config object labml experiment MODULE's ``main()`` passes to ``experiment.configs``, given the script's
    dict, ``config`` and ``settings`` as ``lazylab labml`` gives them, with nothing computed and nothing written:
    what can be known of a run before it starts (``lazylab sweep --labml`` types its values against it).

    Raises:
        UsageError, ConfigError: what ``lazylab labml MODULE settings`` raises before it writes anything; MODULE's
            ``main()`` that never calls ``experiment.configs(conf, …)``.
    """
    session = _session(module, settings, config, runs_dir=runs_dir, options_only=True)
    install()
    session.configure_lab()
    adapter.SESSION = session
    try:
        session.place_data()  # the script's code may read the text before experiment.configs (rwkv prints its model)
        _run_main(module, session)
    except OptionsRequested as o:  # (Session.apply_configs)
        conf = o.conf
        session.give(conf, o.values)
        return conf
    finally:
        adapter.SESSION = None
        session.abort()  # nothing written: the data copy goes again
    raise UsageError(f'{module} never calls experiment.configs(conf, …): it has no configs to set')


def _session(module: str, settings: Sequence[str], config: Union[None, str, Sequence[str]], **kwargs: Any
             ) -> Session:
    """The Session of MODULE with ``settings`` and the ``config`` files read (see `run_labml`): the settings' and
    the files' ``${env:…}`` references read, the files stacked (a dump's values, then each flat file's)."""
    overrides, env = expand_env(parse_overrides(list(settings)))  # syntax only; typed against the script's class later
    files = [config] if isinstance(config, str) else list(config or ())
    if '' in files:  # `--config=` or `--config ''`: not the current folder
        raise UsageError('--config needs a YAML file')
    is_file = module.endswith('.py')
    return Session(script_name(module), overrides, stack_config_files(files), env=env,
                   path=Path(module) if is_file else None, **kwargs)


def script_name(module: str) -> str:
    """The name of MODULE's runs folder (RUNS_DIR/NAME): a file's stem, else the dotted module name."""
    return Path(module).stem if module.endswith('.py') else module


def _run_main(module: str, session: Session) -> None:
    """Import MODULE and call its ``main()``; a step limit reached outside ``with experiment.start():`` completes
    the run."""
    found = import_experiment(module)
    main = getattr(found, 'main', None)
    if not callable(main):
        raise UsageError(f'{module} has no main() to run')
    try:
        main()
    except adapter.StepLimitReached:  # the script did not use `with experiment.start():`
        session.status = 'completed'
        session.finish()
        adapter.finish_experiment('completed')
    except ModuleNotFoundError as e:  # imported inside main() or an option: a package to install, one line
        raise _missing_package(module, e) from None
