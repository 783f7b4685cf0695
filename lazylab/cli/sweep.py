"""`lazylab sweep EXPERIMENT [key=value | key=a,b,c …] …` and `lazylab sweep --resume SWEEP_DIR`.

(lazylab.sweeps.sweep loads no torch when imported: the points are checked, with torch, once the command runs.)
"""
from lazylab.sweeps.plan import parser as sweep_parser
from lazylab.sweeps.sweep import sweep_main


def parser():
    """The parser of `lazylab sweep` (lazylab.sweeps.plan's)."""
    return sweep_parser()


def run(argv: list[str]) -> int:
    """`lazylab sweep …`; its exit code also says whether every trial finished (lazylab.sweeps.sweep)."""
    return sweep_main(argv)
