"""`lazylab train EXPERIMENT [key=value …] [--config FILE.yaml …] [--allow-changes] [--slurm KEY=VALUE,… [--wait]]`:
train an experiment, here or as a Slurm job."""
from lazylab.command_line import Parser, add_config_flag, asks_help, config_files
from lazylab.errors import UsageError
from lazylab.experiments.discovery import registered  # torch-free: names and entry points only
from lazylab.slurm import parse_options  # torch-free; submitit is imported only when --slurm is given


def experiments_text() -> str:
    """'experiments: feedback, fast_weights, …, state_tracking (built-in); lstm (installed, mypkg)': the names
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
    add_config_flag(p)
    p.add_argument('--allow-changes', action='store_true',
                   help='replaying a dump: go on although a computed value now comes out differently')
    add_slurm_flags(p, 'the run')
    return p


def add_slurm_flags(p: Parser, what: str) -> None:
    """--slurm and --wait (train and resume)."""
    p.add_argument('--slurm', action='append', metavar='KEY=VALUE,…',
                   help=f'submit {what} as a Slurm job with these sbatch options (partition=gpu,time=4:00:00,'
                        f'gpus_per_node=1,…; signal=USR1@90, the warning it checkpoints and requeues at); prints the '
                        f'job id and run directory at once (docs: Clusters (Slurm))')
    p.add_argument('--wait', action='store_true',
                   help='with --slurm: print the job\'s output as it comes and exit with its code once it has ended')


def slurm_options(a):
    """The checked --slurm options of parsed flags `a` (None without --slurm).

    Raises:
        UsageError: --wait without --slurm; a bad option (lazylab.slurm.options).
    """
    if a.slurm is None:
        if a.wait:
            raise UsageError('--wait goes with --slurm (a run here is followed anyway)')
        return None
    return parse_options(a.slurm)


def run(argv: list[str]) -> int:
    if argv and not argv[0].startswith('-') and asks_help(argv):  # `lazylab train EXPERIMENT --help`: its keys
        from lazylab.experiments.listing import options_text  # torch: only once an experiment's keys are listed
        print(f'usage: lazylab train {argv[0]} [key=value …] [--config FILE.yaml …] [--allow-changes] '
              f'[--slurm KEY=VALUE,… [--wait]]\n\n' + options_text(argv[0]))
        return 0
    a, settings = parser().parse_with_settings(argv)
    a.config = config_files(a.config)  # one line at once, not after torch's import
    options = slurm_options(a)
    if options is not None:
        from lazylab.slurm.jobs import submit_train  # submitit and Slurm's commands: only for --slurm
        return submit_train(a.experiment, settings, options=options, config=a.config, allow_changes=a.allow_changes,
                            wait=a.wait)
    from lazylab.experiments.lifecycle import train_main  # torch: only once a run starts
    train_main(a.experiment, settings, config=a.config, allow_changes=a.allow_changes)
    return 0
