"""``lazylab labml MODULE [key=value …] [--config FILE] [--options] [--steps N] [--runs-dir DIR] [--dashboard URL]``.

Imports a labml experiment module (a dotted name such as ``labml_nn.transformers.feedback.experiment``, or a
``.py`` file) with ``labml.configs`` served by lazylab's engine, and runs its ``main()``; see
:mod:`lazylab.labml.session` for what happens at each of the script's labml calls. A mistake (unknown module or
key, bad value, a package the module needs that is missing) is one line ``lazylab: error: …``, exit 2, with
nothing written.
"""
import difflib
import importlib
import importlib.util
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lazylab.errors import UsageError

USAGE = ('usage: lazylab labml MODULE [key=value …] [--config FILE] [--options] [--steps N] [--runs-dir DIR] '
         '[--dashboard URL]')

HELP = """Runs a labml experiment module's main() with labml.configs served by lazylab's engine.

  MODULE           a dotted module name (labml_nn.transformers.feedback.experiment) or a .py file
  key=value        set on top of the script's experiment.configs(conf, {...}); typed and checked first
  --config FILE    a YAML mapping of settings, or a run's configs.yaml (replays it)
  --options        list the keys of the script's config class, and what its dict sets
  --steps N        end training after N optimizer updates
  --runs-dir DIR   the run directory is DIR/MODULE/RUN_ID (default runs/labml); labml's data is in DIR/data
  --dashboard URL  stream the run to a labml dashboard (lazylab dashboard)
"""

# Import names whose pip package is named differently, for the hint of a missing-package error.
_PIP_NAMES = {'PIL': 'pillow', 'sklearn': 'scikit-learn', 'cv2': 'opencv-python', 'yaml': 'PyYAML'}


def parse_args(argv: Sequence[str]) -> dict[str, Any]:
    """The command line as ``{module, tokens, config, options, steps, runs_dir, dashboard}``.

    Raises:
        UsageError: no MODULE, an unknown flag, a flag without its value, ``--steps`` not a positive integer,
            ``--runs-dir`` empty or inside a file.
    """
    args: dict[str, Any] = {'module': None, 'tokens': [], 'config': None, 'options': False, 'steps': None,
                            'runs_dir': 'runs/labml', 'dashboard': '', 'help': False}
    flags = {'--config': 'config', '--steps': 'steps', '--runs-dir': 'runs_dir', '--dashboard': 'dashboard'}
    argv, i = list(argv), 0
    while i < len(argv):
        a = argv[i]
        name, eq, value = a.partition('=')
        if a in ('-h', '--help'):
            args['help'] = True
        elif a == '--options':
            args['options'] = True
        elif name in flags:
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f'{name} needs a value ({USAGE})')
                value, i = argv[i + 1], i + 1
            args[flags[name]] = value
        elif a.startswith('-'):
            close = difflib.get_close_matches(name, [*flags, '--options'], n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ''
            raise UsageError(f'unknown flag {name!r}{hint} ({USAGE})')
        elif eq:
            args['tokens'].append(a)
        elif args['module'] is None:
            args['module'] = a
        else:
            raise UsageError(f'expected key=value, got {a!r} ({USAGE})')
        i += 1
    runs_dir = Path(args['runs_dir'])
    if not args['runs_dir']:
        raise UsageError('--runs-dir needs a folder')
    existing = next(p for p in (runs_dir, *runs_dir.parents) if p.exists())  # '.' or '/' at the latest
    if not existing.is_dir():
        raise UsageError(f'--runs-dir {args["runs_dir"]}: {existing} is a file, not a folder')
    if args['steps'] is not None:
        text = args['steps']
        args['steps'] = int(text) if text.strip().isdigit() else 0
        if args['steps'] < 1:
            raise UsageError(f'--steps must be a positive integer, got {text!r}')
    return args


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
    from lazylab.configs import describe, format_description
    from lazylab.configs.engine.declarations import spec_of
    rows = describe(type(conf))
    # sub-configs given as class defaults (labml_nn's `device: torch.device = DeviceConfigs()`), listed under key.
    for key, default in spec_of(type(conf)).defaults.items():
        if getattr(type(default), '_lazylab_is_configs', False):
            for row in describe(type(default)):
                rows.append(dict(row, name=f'{key}.{row["name"]}'))
    text = f'{module}: {type(conf).__name__} (lazylab engine)\n' + format_description(rows)
    if script_values:
        text += '\n\nset by the script (experiment.configs; key=value overrides these):\n'
        text += ''.join(f'  {k}={v!r}\n' for k, v in script_values.items())
    return text


def labml_main(argv: Sequence[str]) -> None:
    """The ``lazylab labml`` command (see the module docstring)."""
    from lazylab.experiments.configure import read_config_file
    from lazylab.labml import adapter, install
    from lazylab.labml.session import OptionsRequested, Session
    args = parse_args(argv)
    if args['help'] or args['module'] is None:
        if args['module'] is None and not args['help']:
            raise UsageError(USAGE)
        print(USAGE + '\n\n' + HELP)
        return
    from lazylab.configs import parse_overrides
    overrides = parse_overrides(args['tokens'])  # syntax only; typed against the script's class later
    file_values = read_config_file(args['config']) if args['config'] else {}
    if isinstance(file_values.get('values'), dict):  # a configs.yaml dump: its replayable values
        file_values = file_values['values']
    name = Path(args['module']).stem if args['module'].endswith('.py') else args['module']
    session = Session(name, overrides, file_values, steps=args['steps'], runs_dir=args['runs_dir'],
                      dashboard=args['dashboard'], argv=tuple(argv), options_only=args['options'])
    install()
    session.configure_lab()
    adapter.SESSION = session
    try:
        module = import_experiment(args['module'])
        main = getattr(module, 'main', None)
        if not callable(main):
            raise UsageError(f'{args["module"]} has no main() to run')
        try:
            main()
        except adapter.StepLimitReached:  # the script did not use `with experiment.start():`
            session.status = 'completed'
            session.finish()
            adapter.finish_experiment('completed')
        except ModuleNotFoundError as e:  # imported inside main() or an option: a package to install, one line
            raise _missing_package(args['module'], e) from None
    except OptionsRequested as o:
        print(options_text(name, o.conf, o.values))
        return
    except BaseException as e:
        session.abort()
        session.finish()
        session.record_end(e)  # run.json: failed with the line `lazylab: error:` prints (or interrupted)
        raise
    finally:
        session.finish()
        adapter.SESSION = None
    session.record_end()
    if not args['options']:
        print(session.summary(), flush=True)
