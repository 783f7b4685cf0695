"""The `lazylab` command line: one module per command, one parser class, one `key=value` splitter.

    lazylab train EXPERIMENT [key=value …] [--config FILE.yaml …] [--allow-changes]   train an experiment
    lazylab options EXPERIMENT                                every key with type, default, options and help
    lazylab resume RUN_DIR [--allow-changes]                  continue a run from its checkpoint
    lazylab train|resume … --slurm KEY=VALUE,… [--wait]       the same as a Slurm job (sbatch's options; the extra)
    lazylab generate RUN_DIR --prompt TEXT --tokens N [--temperature T] [--top-k K] [--seed S]
    lazylab plot RUN_DIR [RUN_DIR …] -o FILE.png              loss against tokens seen, for one or several runs
    lazylab labml MODULE [key=value …] [--config FILE …] [--options] [--steps N] [--runs-dir DIR] [--dashboard URL]
                                                              run a labml experiment module on lazylab's engine
    lazylab sweep EXPERIMENT [key=value | key=a,b,c …] [--workers N] [--sampler grid|random|tpe] [--trials N] …
                                                              many runs of one experiment (lazylab sweep -h)
    lazylab sweep --labml MODULE [key=a,b …] [--steps N] …     many runs of a labml experiment module
    lazylab sweep … --launcher slurm --slurm KEY=VALUE,…      each trial a Slurm job
    lazylab sweep --resume SWEEP_DIR                          finish a sweep after a kill
    lazylab compare PATH … [--sort KEY] [--metric KEY] [--csv FILE] [--plot FILE.png]
                                                              runs and sweeps side by side: the keys that differ
    lazylab diff RUN_A RUN_B                                  the keys whose values differ, and where each came from
    lazylab dashboard [--port 5005] [--store DIR] [--host H] [--token T] [--max-body-mb N]
                                                              serve the labml dashboard (optional extra)
    lazylab new NAME [--task text|custom]                     write NAME.py, an experiment of your own
    lazylab schema EXPERIMENT                                 the JSON Schema of EXPERIMENT's --config files
    lazylab completion bash|zsh|fish                          the shell code for TAB completion (lazylab completion -h)

EXPERIMENT: a built-in name (feedback, fast_weights, transformer, retrieval, mqar, state_tracking), an installed
plugin's name, a .py file, or a dotted module (see lazylab.experiments.discovery). A mistake the user can fix prints
one line `lazylab: error: …` on stderr and exits with code 2.

Each command is a module `lazylab.cli.NAME` with `parser()` (its `Parser`, which the docs' CLI reference is made
from) and `run(argv) -> int | None`; they are imported only when their command runs (the start-up time of the
command line), so `lazylab --help` does not import torch.
"""
import difflib
import importlib
import os
import sys
from typing import Optional

from lazylab import __version__
from lazylab.command_line import HelpShown
from lazylab.errors import UsageError, run_cli

USAGE = __doc__.split('\n\n')[1]

#: command → its module (imported when the command runs)
COMMANDS = {name: f'lazylab.cli.{name}' for name in
            ('train', 'options', 'resume', 'generate', 'plot', 'labml', 'sweep', 'compare', 'diff', 'dashboard', 'new',
             'schema', 'completion')}


def command(name: str):
    """The module of command NAME (`parser()`, `run(argv)`)."""
    return importlib.import_module(COMMANDS[name])


def main(argv: Optional[list[str]] = None) -> int:
    """`lazylab COMMAND …`; returns the exit code (0, 1 where a command says so, 2 for a user error, 130/143 for
    Ctrl-C/SIGTERM)."""
    if argv is None and '_ARGCOMPLETE' in os.environ:  # a TAB (lazylab completion): answered, then exit
        from lazylab.cli.completion import complete  # start-up time: only a TAB imports argcomplete
        complete(COMMANDS)
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ('-h', '--help', 'help'):  # asked for: stdout, exit 0; no command: stderr, exit 2
        from lazylab.cli.train import experiments_text  # only for the help: other commands start without it
        print('usage:\n' + USAGE + '\n\n' + experiments_text(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ('--version', '-V'):
        print(f'lazylab {__version__}')
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ''
        return run_cli(_raise, UsageError(f"unknown command {name!r}{hint} (commands: {', '.join(COMMANDS)})"))
    codes: list[int] = []
    rc = run_cli(lambda: codes.append(_run(name, rest)))
    return codes[0] if rc == 0 and codes else rc


def _run(name: str, argv: list[str]) -> int:
    try:
        return command(name).run(argv) or 0
    except HelpShown:
        return 0


def _raise(e: Exception) -> None:
    raise e
