"""`lazylab plot RUN_DIR … -o FILE.png`: training and validation loss against tokens seen, one colour per run."""
from lazylab.command_line import Parser


def parser() -> Parser:
    p = Parser('plot', description='Training and validation loss against tokens seen, one colour per run, saved as '
                                   'a PNG (or .pdf, .svg, … by the suffix).')
    p.add_argument('run_dirs', nargs='+', metavar='RUN_DIR')
    p.add_argument('-o', '--output', required=True, help='the file to write')
    return p


def run(argv: list[str]) -> None:
    a = parser().parse(argv)
    from lazylab.experiments.plot import plot_runs  # matplotlib: only when a plot is made
    print(f'wrote {plot_runs(a.run_dirs, a.output)}')
