"""The `lazylab` command.

    lazylab train NAME [key=value …] [--config FILE.yaml]     train an experiment (feedback, fast_weights, transformer,
                                                              retrieval)
    lazylab options NAME                                      every key with type, default, options and help
    lazylab resume RUN_DIR [--allow-changes]                  continue a run from its checkpoint
    lazylab generate RUN_DIR --prompt TEXT --tokens N [--temperature T] [--top-k K] [--seed S]
    lazylab plot RUN_DIR [RUN_DIR …] -o FILE.png              loss against tokens seen, for one or several runs
    lazylab labml MODULE [key=value …] [--config FILE] [--options] [--steps N] [--runs-dir DIR] [--dashboard URL]
                                                              run a labml experiment module on lazylab's engine
    lazylab sweep NAME [key=value | key=a,b,c …] [--workers N] [--sampler grid|random|tpe] [--trials N] [--prune …]
                                                              many runs of one experiment (lazylab sweep -h)
    lazylab sweep --resume SWEEP_DIR                          finish a sweep after a kill
    lazylab compare PATH … [--sort KEY] [--metric KEY] [--csv FILE] [--plot FILE.png]
                                                              runs and sweeps side by side: the keys that differ
    lazylab diff RUN_A RUN_B                                  the keys whose values differ, and where each came from
    lazylab dashboard [--port 5005] [--store DIR] [--host H]  serve the labml dashboard (optional extra)

A mistake the user can fix (unknown key or option, bad value, missing or non-UTF-8 text, damaged checkpoint, a
diverged loss) prints one line `lazylab: error: …` on stderr and exits with code 2.
"""
import argparse
import sys
from typing import Optional

from lazylab.errors import UsageError, run_cli

USAGE = __doc__.split('\n\n')[1]


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes become one-line UsageErrors instead of a usage block, and whose -h/--help is
    answered by the command (`_asks_help`) rather than by exiting the interpreter."""

    def __init__(self, **kwargs):
        super().__init__(add_help=False, **kwargs)

    def error(self, message):
        raise UsageError(f'{self.prog}: {message}')


def _asks_help(argv: list[str]) -> bool:
    """-h or --help among the arguments (before a `--`)."""
    head = argv[:argv.index('--')] if '--' in argv else argv
    return '-h' in head or '--help' in head


def _experiments() -> str:
    from lazylab.experiments import EXPERIMENTS  # torch-free
    return ', '.join(EXPERIMENTS)


def _train(argv: list[str]) -> None:
    from lazylab.experiments.runner import train_main
    if not argv or argv[0].startswith('-'):
        if _asks_help(argv):
            print('usage: lazylab train NAME [key=value …] [--config FILE.yaml]\n\n'
                  f'Train experiment NAME ({_experiments()}); `lazylab train NAME --help` (or `lazylab options NAME`)'
                  f' lists its keys.')
            return
        raise UsageError('usage: lazylab train NAME [key=value …] [--config FILE.yaml]')
    train_main(argv[0], argv[1:])


def _options(argv: list[str]) -> None:
    from lazylab.experiments.runner import options_text
    if _asks_help(argv):
        print(f'usage: lazylab options NAME\n\nEvery key of experiment NAME ({_experiments()}) with its type, '
              f'default, rule, options and help, then its presets.')
        return
    if len(argv) != 1:
        raise UsageError('usage: lazylab options NAME')
    print(options_text(argv[0]))


def _resume(argv: list[str]) -> None:
    from lazylab.experiments.runner import ALLOW_CHANGES, resume_main
    if _asks_help(argv):
        print(f'usage: lazylab resume RUN_DIR [{ALLOW_CHANGES}]\n\nContinue the run in RUN_DIR from its checkpoint, '
              'exactly where it stopped (its configs.yaml, the same text and number of processes). '
              f'{ALLOW_CHANGES}: go on although a computed value now comes out differently.')
        return
    allow_changes = ALLOW_CHANGES in argv
    argv = [a for a in argv if a != ALLOW_CHANGES]
    if len(argv) != 1:
        raise UsageError('usage: lazylab resume RUN_DIR [--allow-changes]')
    resume_main(argv[0], allow_changes=allow_changes)


def _generate_parser() -> _Parser:
    p = _Parser(prog='lazylab generate', description='Text sampled from the latest checkpoint of RUN_DIR: the '
                                                     'prompt followed by TOKENS new characters.')
    p.add_argument('run_dir', metavar='RUN_DIR')
    p.add_argument('--prompt', required=True, help='the start of the text (characters the model knows)')
    p.add_argument('--tokens', type=int, required=True, help='characters to add (0 … 1,000,000)')
    p.add_argument('--temperature', type=float, default=1.0, help='finite, ≥ 0; 0 is greedy (default 1.0)')
    p.add_argument('--top-k', type=int, default=None, help='sample among the K most likely characters')
    p.add_argument('--seed', type=int, default=None, help='for a reproducible sample (0 … 2**64 − 1)')
    return p


def _generate(argv: list[str]) -> None:
    from lazylab.experiments.runner import generate
    p = _generate_parser()
    if _asks_help(argv):
        print(p.format_help().rstrip())
        return
    a = p.parse_args(argv)
    out = _Streamed(sys.stdout)
    try:
        generate(a.run_dir, a.prompt, a.tokens, a.temperature, a.top_k, a.seed, on_text=out.write)
    except Exception:
        if out.written:  # the error line (stderr) starts on a line of its own
            out.write('\n')
            out.flush()
        raise
    out.write('\n')  # as print(text) did before the text was streamed
    out.flush()


class _Streamed:
    """Text written to `stream` as it comes, flushed every `every` pieces (and by `flush`), so that the
    generated text shows while it is sampled and Ctrl-C or `| head` leave what came so far."""

    def __init__(self, stream, every: int = 8):
        self.stream, self.every, self.pieces, self.written = stream, every, 0, False

    def write(self, text: str) -> None:
        self.stream.write(text)
        self.written, self.pieces = True, self.pieces + 1
        if self.pieces % self.every == 0:
            self.stream.flush()

    def flush(self) -> None:
        self.stream.flush()


def _plot(argv: list[str]) -> None:
    from lazylab.experiments.plot import plot_runs
    p = _Parser(prog='lazylab plot', description='Training and validation loss against tokens seen, one colour '
                                                 'per run, saved as a PNG.')
    p.add_argument('run_dirs', nargs='+', metavar='RUN_DIR')
    p.add_argument('-o', '--output', required=True, help='the PNG file to write')
    if _asks_help(argv):
        print(p.format_help().rstrip())
        return
    a = p.parse_args(argv)
    print(f'wrote {plot_runs(a.run_dirs, a.output)}')


def _labml(argv: list[str]) -> None:
    from lazylab.labml.runner import labml_main
    labml_main(argv)


def _sweep(argv: list[str]) -> int:
    from lazylab.sweeps.sweep import sweep_main
    return sweep_main(argv)


def _compare(argv: list[str]) -> None:
    from lazylab.sweeps.compare import compare_main
    p = _Parser(prog='lazylab compare', allow_abbrev=False,
                description='Runs and sweeps side by side: one row per run, a column for each key whose value '
                            'differs between them, the final metric.')
    p.add_argument('paths', nargs='+', metavar='PATH', help='run directories and sweep directories')
    p.add_argument('--sort', metavar='KEY', help='a column to sort the rows by')
    p.add_argument('--metric', default='loss.valid', metavar='KEY', help='the metric to show (default loss.valid)')
    p.add_argument('--csv', metavar='FILE', help='also write the table as CSV')
    p.add_argument('--plot', metavar='FILE.png', help='also plot the metric against tokens seen, a line per run')
    if _asks_help(argv):
        print(p.format_help().rstrip())
        return
    a = p.parse_args(argv)
    compare_main(a.paths, a.metric, a.sort, a.csv, a.plot)


def _diff(argv: list[str]) -> None:
    from lazylab.sweeps.compare import diff_text
    if _asks_help(argv):
        print('usage: lazylab diff RUN_A RUN_B\n\nThe keys whose values differ between two runs, with where each '
              'value came from (user, preset, --config, sweep, or how it was computed).')
        return
    if len(argv) != 2 or any(a.startswith('-') for a in argv):
        raise UsageError('usage: lazylab diff RUN_A RUN_B')
    print(diff_text(argv[0], argv[1]))


COMMANDS = {'train': _train, 'options': _options, 'resume': _resume, 'generate': _generate, 'plot': _plot,
            'labml': _labml, 'sweep': _sweep, 'compare': _compare, 'diff': _diff}


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ('-h', '--help', 'help'):  # asked for: stdout, exit 0; no command: stderr, exit 2
        print('usage:\n' + USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == 'dashboard':  # the dashboard's own parser and optional dependencies, loaded only when asked
        from lazylab.dashboard import run as dashboard_run
        return run_cli(dashboard_run, rest)
    if command == 'sweep':  # its exit code also says whether every trial finished (see lazylab.sweeps.sweep)
        codes: list[int] = []
        rc = run_cli(lambda args: codes.append(_sweep(args)), rest)
        return codes[0] if rc == 0 and codes else rc
    if command not in COMMANDS:
        import difflib
        close = difflib.get_close_matches(command, list(COMMANDS) + ['dashboard'], n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ''
        return run_cli(_raise, UsageError(f"unknown command {command!r}{hint} (commands: "
                                          f"{', '.join(list(COMMANDS) + ['dashboard'])})"))
    return run_cli(COMMANDS[command], rest)


def _raise(e: Exception) -> None:
    raise e


if __name__ == '__main__':
    sys.exit(main())
