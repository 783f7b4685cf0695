"""`lazylab options EXPERIMENT`: every key with its type, default, rule, options and help, then the presets;
`lazylab options EXPERIMENT key=value … [--config FILE …] --resolved [--format yaml]`: every value a run would get
and who set it, without building the model; `… --graph dot|mermaid|svg`: the same configuration as a graph (items as
nodes, what each was computed from as edges, user-set keys marked)."""
from lazylab.command_line import CONFIG_HELP, Parser, add_config_flag, config_files
from lazylab.errors import UsageError


def parser() -> Parser:
    p = Parser('options', description='Every key of EXPERIMENT with its type, default, rule, options and help (the '
                                      'comment beside its declaration), its own keys first, then its presets. With '
                                      '--resolved: every value `lazylab train EXPERIMENT key=value … --config FILE` '
                                      'would run with and where it came from (the command line, FILE:LINE, a '
                                      'preset, the environment, a default, an option and what it read), checked as '
                                      'train checks it, without building the model or writing anything. With '
                                      '--graph: that configuration as a graph, each item a node and an arrow from '
                                      'each item read to the item computed from it, user-set keys filled (svg '
                                      'needs graphviz).')
    p.add_argument('experiment', metavar='EXPERIMENT',
                   help='a built-in or installed experiment, a .py file or a dotted module')
    p.add_argument('settings', nargs='*', default=[], metavar='key=value',
                   help='settings (with --resolved or --graph)')
    add_config_flag(p, 'with --resolved or --graph: ' + CONFIG_HELP)
    p.add_argument('--resolved', action='store_true',
                   help='print the values a run would get, and who set each, instead of the declarations')
    p.add_argument('--format', choices=('text', 'yaml'), default='text',
                   help='with --resolved: text (a table), or yaml (a configs.yaml that `lazylab train EXPERIMENT '
                        '--config FILE` replays)')
    p.add_argument('--graph', choices=('dot', 'mermaid', 'svg'), metavar='{dot,mermaid,svg}',
                   help="print the resolved configuration's graph: Graphviz dot, a Mermaid flowchart, or SVG (drawn "
                        "by graphviz's dot)")
    return p


def run(argv: list[str]) -> None:
    a, settings = parser().parse_with_settings(argv)
    if a.graph and (a.resolved or a.format != 'text'):
        raise UsageError(f'--graph {a.graph} and {"--resolved" if a.resolved else "--format"} are two outputs: give '
                         f'one')
    if not a.resolved and not a.graph and (settings or a.config or a.format != 'text'):
        given = 'key=value settings need' if settings else ('--config needs' if a.config else '--format needs')
        raise UsageError(f'{given} --resolved or --graph (lazylab options EXPERIMENT key=value … --resolved): '
                         f'without it, options lists the declarations')
    a.config = config_files(a.config)  # one line before torch's import
    if not a.resolved and not a.graph:
        from lazylab.experiments.listing import options_text  # torch: the listing builds the experiment's parts
        print(options_text(a.experiment))
        return
    from lazylab.experiments import resolved  # torch: the items computed
    if a.graph == 'svg':
        resolved.need_dot()  # graphviz missing: one line before the experiment is made
    conf, later = resolved.resolve(a.experiment, settings, a.config)
    if a.graph:
        print(resolved.graph_text(conf, later, a.graph), end='')
        return
    if a.format == 'yaml':
        print(resolved.resolved_yaml(conf), end='')
    else:
        print(resolved.resolved_text(conf, later))
