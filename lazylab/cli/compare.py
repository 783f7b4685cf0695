"""`lazylab compare PATH … [--sort KEY] [--metric KEY] [--csv FILE] [--plot FILE.png]`: runs side by side."""
from lazylab.command_line import Parser
from lazylab.sweeps.compare import compare_main  # torch-free: the command starts fast


def parser() -> Parser:
    p = Parser('compare', description='Runs and sweeps side by side: one row per run, a column for each key whose '
                                      'value differs between them, the final metric.')
    p.add_argument('paths', nargs='+', metavar='PATH', help='run directories and sweep directories')
    p.add_argument('--sort', metavar='KEY', help='a column to sort the rows by')
    p.add_argument('--metric', default='loss.valid', metavar='KEY', help='the metric to show (default loss.valid)')
    p.add_argument('--csv', metavar='FILE', help='also write the table as CSV')
    p.add_argument('--plot', metavar='FILE.png', help='also plot the metric against tokens seen, a line per run')
    return p


def run(argv: list[str]) -> None:
    a = parser().parse(argv)
    compare_main(a.paths, a.metric, a.sort, a.csv, a.plot)
