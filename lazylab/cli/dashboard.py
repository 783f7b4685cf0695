"""`lazylab dashboard [--port 5005] [--store DIR] [--host H]`: serve the labml dashboard (the optional extra)."""


def parser():
    from lazylab.dashboard.server import _parser
    return _parser()


def run(argv: list[str]) -> None:
    from lazylab.dashboard import run as serve  # its own optional dependencies, loaded only when asked
    serve(argv)
