"""`lazylab sweep EXPERIMENT [key=value | key=a,b,c …] …` and `lazylab sweep --resume SWEEP_DIR`."""


def parser():
    from lazylab.sweeps.plan import parser as sweep_parser
    return sweep_parser()


def run(argv: list[str]) -> int:
    from lazylab.sweeps.sweep import sweep_main  # its exit code also says whether every trial finished
    return sweep_main(argv)
