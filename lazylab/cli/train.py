"""`lazylab train EXPERIMENT [key=value …] [--config FILE.yaml] [--allow-changes]`: train an experiment."""
from lazylab.cli.parser import Parser, asks_help
from lazylab.errors import UsageError

USAGE = 'usage: lazylab train NAME [key=value …] [--config FILE.yaml]'


def parser() -> Parser:
    p = Parser('train', description='Train an experiment: check every setting (down to one forward and backward '
                                    'pass on the first batch), make RUNS_DIR/NAME/RUN_ID, train. `lazylab train '
                                    'NAME --help` (or `lazylab options NAME`) lists its keys.')
    p.add_argument('experiment', metavar='NAME', help='a built-in experiment, a .py file or a module')
    p.add_argument('settings', nargs='*', metavar='key=value', help='settings, typed and checked')
    p.add_argument('--config', metavar='FILE.yaml', help='settings from a YAML file, or a run\'s configs.yaml')
    p.add_argument('--allow-changes', action='store_true',
                   help='replaying a dump: go on although a computed value now comes out differently')
    return p


def run(argv: list[str]) -> None:
    from lazylab.experiments import EXPERIMENTS  # torch-free
    from lazylab.experiments.runner import train_main  # torch: only when a run starts
    if not argv or argv[0].startswith('-'):
        if asks_help(argv):
            print(f'{USAGE}\n\nTrain experiment NAME ({", ".join(EXPERIMENTS)}); `lazylab train NAME --help` '
                  f'(or `lazylab options NAME`) lists its keys.')
            return
        raise UsageError(USAGE)
    train_main(argv[0], argv[1:])
