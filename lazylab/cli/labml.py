"""`lazylab labml MODULE [key=value …] …`: run a labml experiment module on lazylab's engine."""
from lazylab.cli.parser import Parser


def parser() -> Parser:
    from lazylab.labml.runner import HELP
    p = Parser('labml', description=HELP.splitlines()[0])
    p.add_argument('module', metavar='MODULE', help='a dotted module name or a .py file')
    p.add_argument('settings', nargs='*', metavar='key=value')
    return p


def run(argv: list[str]) -> None:
    from lazylab.labml.runner import labml_main
    labml_main(argv)
