"""`lazylab diff RUN_A RUN_B`: the keys whose values differ between two runs, and where each value came from."""
from lazylab.command_line import Parser
from lazylab.sweeps.compare import diff_text  # torch-free: the command starts fast


def parser() -> Parser:
    p = Parser('diff', description='The keys whose values differ between two runs, with where each value came from '
                                   '(user, preset, --config, sweep, or how it was computed).')
    p.add_argument('run_a', metavar='RUN_A')
    p.add_argument('run_b', metavar='RUN_B')
    return p


def run(argv: list[str]) -> None:
    a = parser().parse(argv)
    print(diff_text(a.run_a, a.run_b))
