"""`lazylab train EXPERIMENT [key=value …] [--config FILE.yaml] [--allow-changes]`: train an experiment."""
from lazylab import user_files
from lazylab.command_line import Parser, asks_help
from lazylab.errors import UsageError
from lazylab.experiments.discovery import registered  # torch-free: names and entry points only


def experiments_text() -> str:
    """'experiments: feedback, fast_weights, transformer, retrieval (built-in); lstm (installed, mypkg)': the names
    EXPERIMENT may be, besides a .py file and a dotted module (for `lazylab --help` and `lazylab train --help`)."""
    named = registered()
    text = 'experiments: ' + ', '.join(n for n, e in named.items() if e.kind == 'builtin') + ' (built-in)'
    plugins = [f'{n} ({e.distribution or e.module_name})' for n, e in named.items() if e.kind == 'entry_point']
    if plugins:
        text += '; installed: ' + ', '.join(plugins)
    return text + '; or a .py file, or a dotted module'


def parser() -> Parser:
    p = Parser('train', description='Train an experiment: check every setting (down to one forward and backward '
                                    'pass on the first batch), make RUNS_DIR/STEM/RUN_ID, train. `lazylab train '
                                    'EXPERIMENT --help` (or `lazylab options EXPERIMENT`) lists its keys.',
               epilog=experiments_text())
    p.add_argument('experiment', metavar='EXPERIMENT',
                   help='a built-in or installed experiment, a .py file (./char_lstm.py) or a dotted module')
    p.add_argument('settings', nargs='*', default=[], metavar='key=value', help='settings, typed and checked')
    p.add_argument('--config', metavar='FILE.yaml', action='append',
                   help='settings from a YAML file, or a run\'s configs.yaml; repeat it to stack files (a later '
                        'file wins, then key=value)')
    p.add_argument('--allow-changes', action='store_true',
                   help='replaying a dump: go on although a computed value now comes out differently')
    return p


def run(argv: list[str]) -> None:
    if argv and not argv[0].startswith('-') and asks_help(argv):  # `lazylab train EXPERIMENT --help`: its keys
        from lazylab.experiments.listing import options_text  # torch: only once an experiment's keys are listed
        print(f'usage: lazylab train {argv[0]} [key=value …] [--config FILE.yaml] [--allow-changes]\n\n'
              + options_text(argv[0]))
        return
    a, settings = parser().parse_with_settings(argv)
    if '' in (a.config or ()):  # `--config=` or `--config ''`: not the current folder
        raise UsageError('--config needs a YAML file')
    for path in a.config or ():  # a FIFO, /dev/zero or a huge file: one line at once, not after torch's import
        user_files.check_file(path, 'config file', user_files.CONFIG)  # (read later, bounded)
    from lazylab.experiments.lifecycle import train_main  # torch: only once a run starts
    train_main(a.experiment, settings, config=a.config, allow_changes=a.allow_changes)
