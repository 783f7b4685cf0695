"""`lazylab options EXPERIMENT`: every key with its type, default, rule, options and help, then the presets."""
from lazylab.command_line import Parser


def parser() -> Parser:
    p = Parser('options', description='Every key of EXPERIMENT with its type, default, rule, options and help (the '
                                      'comment beside its declaration), then its presets.')
    p.add_argument('experiment', metavar='EXPERIMENT',
                   help='a built-in or installed experiment, a .py file or a dotted module')
    return p


def run(argv: list[str]) -> None:
    a = parser().parse(argv)
    from lazylab.experiments.listing import options_text  # torch: the listing builds the experiment's parts
    print(options_text(a.experiment))
