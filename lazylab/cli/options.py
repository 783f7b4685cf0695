"""`lazylab options EXPERIMENT`: every key with its type, default, rule, options and help, then the presets."""
from lazylab.cli.parser import Parser


def parser() -> Parser:
    p = Parser('options', description='Every key of experiment NAME with its type, default, rule, options and '
                                      'help, then its presets.')
    p.add_argument('experiment', metavar='NAME', help='a built-in experiment, a .py file or a module')
    return p


def run(argv: list[str]) -> None:
    a = parser().parse(argv)
    from lazylab.experiments.runner import options_text  # torch: the listing builds the experiment's parts
    print(options_text(a.experiment))
