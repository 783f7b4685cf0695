"""`lazylab options EXPERIMENT`: every key with its type, default, rule, options and help, then the presets;
`lazylab options EXPERIMENT key=value … [--config FILE …] --resolved [--format yaml]`: every value a run would get
and who set it, without building the model."""
from lazylab import user_files
from lazylab.command_line import Parser
from lazylab.errors import UsageError


def parser() -> Parser:
    p = Parser('options', description='Every key of EXPERIMENT with its type, default, rule, options and help (the '
                                      'comment beside its declaration), its own keys first, then its presets. With '
                                      '--resolved: every value `lazylab train EXPERIMENT key=value … --config FILE` '
                                      'would run with and where it came from (the command line, FILE:LINE, a '
                                      'preset, the environment, a default, an option and what it read), checked as '
                                      'train checks it, without building the model or writing anything.')
    p.add_argument('experiment', metavar='EXPERIMENT',
                   help='a built-in or installed experiment, a .py file or a dotted module')
    p.add_argument('settings', nargs='*', default=[], metavar='key=value', help='settings (with --resolved)')
    p.add_argument('--config', metavar='FILE.yaml', action='append',
                   help='settings from a YAML file, as train takes them (with --resolved; repeat it: later wins)')
    p.add_argument('--resolved', action='store_true',
                   help='print the values a run would get, and who set each, instead of the declarations')
    p.add_argument('--format', choices=('text', 'yaml'), default='text',
                   help='with --resolved: text (a table), or yaml (a configs.yaml that `lazylab train EXPERIMENT '
                        '--config FILE` replays)')
    return p


def run(argv: list[str]) -> None:
    a, settings = parser().parse_with_settings(argv)
    if not a.resolved and (settings or a.config or a.format != 'text'):
        given = 'key=value settings need' if settings else ('--config needs' if a.config else '--format needs')
        raise UsageError(f'{given} --resolved (lazylab options EXPERIMENT key=value … --resolved): without it, '
                         f'options lists the declarations')
    if '' in (a.config or ()):  # `--config=` or `--config ''`: not the current folder
        raise UsageError('--config needs a YAML file')
    for path in a.config or ():  # a FIFO, /dev/zero or a huge file: one line before torch's import (read later)
        user_files.check_file(path, 'config file', user_files.CONFIG)
    if not a.resolved:
        from lazylab.experiments.listing import options_text  # torch: the listing builds the experiment's parts
        print(options_text(a.experiment))
        return
    from lazylab.experiments.resolved import resolve, resolved_text, resolved_yaml  # torch: the items computed
    conf, later = resolve(a.experiment, settings, a.config)
    print(resolved_yaml(conf) if a.format == 'yaml' else resolved_text(conf, later), end='' if a.format == 'yaml'
          else '\n')
