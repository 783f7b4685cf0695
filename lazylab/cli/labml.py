"""`lazylab labml MODULE [key=value …] [--config FILE …] [--options] [--steps N] [--runs-dir DIR] [--dashboard URL]`:
run a labml experiment module on lazylab's engine (lazylab.labml.runner)."""
from pathlib import Path
from typing import Optional

from lazylab import user_files
from lazylab.command_line import Parser, add_config_flag, asks_help, config_files
from lazylab.errors import UsageError

USAGE = ('lazylab labml MODULE [key=value …] [--config FILE …] [--options] [--steps N] [--runs-dir DIR] '
         '[--dashboard URL]')
DEFAULT_RUNS_DIR = 'runs/labml'


def parser() -> Parser:
    p = Parser('labml', usage=USAGE,
               description="Runs a labml experiment module's main() with labml.configs served by lazylab's engine.")
    p.add_argument('module', metavar='MODULE',
                   help='a dotted module name (labml_nn.transformers.feedback.experiment) or a .py file')
    p.add_argument('settings', nargs='*', metavar='key=value',
                   help="set on top of the script's experiment.configs(conf, {...}); typed and checked first")
    add_config_flag(p)
    p.add_argument('--options', action='store_true',
                   help="list the keys of the script's config class, and what its dict sets")
    p.add_argument('--steps', metavar='N', help='end training after N optimizer updates')
    p.add_argument('--runs-dir', metavar='DIR', default=DEFAULT_RUNS_DIR,
                   help=f"the run directory is DIR/MODULE/RUN_ID (default {DEFAULT_RUNS_DIR}); labml's data is in "
                        f"DIR/data")
    p.add_argument('--dashboard', metavar='URL', default='',
                   help='stream the run to a labml dashboard (lazylab dashboard)')
    return p


def run(argv: list[str]) -> None:
    if not asks_help(argv) and not any(not a.startswith('-') for a in argv):
        raise UsageError(f'usage: {USAGE}')
    args, settings = parser().parse_with_settings(argv)
    args.config = config_files(args.config)  # one line at once, not after torch's import
    from lazylab.labml.runner import run_labml  # torch and labml: only once the flags and the --config file are fine
    run_labml(args.module, settings, config=args.config, options=args.options, steps=_steps(args.steps),
              runs_dir=_runs_dir(args.runs_dir), dashboard=args.dashboard, argv=tuple(argv))


def _steps(text: Optional[str]) -> Optional[int]:
    """--steps: None, or a positive integer.

    Raises:
        UsageError: not a positive integer (naming it).
    """
    if text is None:
        return None
    steps = int(text) if text.strip().isdigit() else 0
    if steps < 1:
        raise UsageError(f'--steps must be a positive integer, got {text!r}')
    return steps


def _runs_dir(text: str) -> str:
    """--runs-dir, checked: a folder, or a path whose first existing parent is one.

    Raises:
        UsageError: empty, inside a file (naming the file), or holding a control character.
    """
    if not text:
        raise UsageError('--runs-dir needs a folder')
    user_files.check_path_text(text, '--runs-dir')  # a newline in a folder's name splits every line showing it
    runs_dir = Path(text)
    existing = next(p for p in (runs_dir, *runs_dir.parents) if p.exists())  # '.' or '/' at the latest
    if not existing.is_dir():
        raise UsageError(f'--runs-dir {text}: {existing} is a file, not a folder')
    return text
