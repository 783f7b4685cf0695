"""`lazylab generate RUN_DIR --prompt TEXT --tokens N …`: text sampled from a run's checkpoint, streamed."""
import sys

from lazylab.command_line import Parser
from lazylab.errors import signals_polled


def parser() -> Parser:
    p = Parser('generate', description='Text sampled from the latest checkpoint of RUN_DIR: the prompt followed by '
                                       'TOKENS new characters.')
    p.add_argument('run_dir', metavar='RUN_DIR')
    p.add_argument('--prompt', required=True, help='the start of the text (characters the model knows)')
    p.add_argument('--tokens', type=int, required=True, help='characters to add (0 … 1,000,000)')
    p.add_argument('--temperature', type=float, default=1.0, help='finite, ≥ 0; 0 is greedy (default 1.0)')
    p.add_argument('--top-k', type=int, default=None, help='sample among the K most likely characters')
    p.add_argument('--seed', type=int, default=None, help='for a reproducible sample (0 … 2**64 − 1)')
    return p


def run(argv: list[str]) -> None:
    a = parser().parse(argv)
    from lazylab.experiments.generation import generate  # torch: only when text is generated
    out = Streamed(sys.stdout)

    def on_text(text: str) -> None:
        interrupted()  # Ctrl-C or SIGTERM stops the stream here, after a whole token, never inside torch
        out.write(text)

    try:
        with signals_polled() as interrupted:
            generate(a.run_dir, a.prompt, a.tokens, a.temperature, a.top_k, a.seed, on_text=on_text)
            interrupted()
    except Exception:
        if out.written:  # the error line (stderr) starts on a line of its own
            out.write('\n')
            out.flush()
        raise
    out.write('\n')  # as print(text) did before the text was streamed
    out.flush()


class Streamed:
    """Text written to `stream` as it comes, flushed every `every` pieces (and by `flush`), so that the
    generated text shows while it is sampled and Ctrl-C or `| head` leave what came so far."""

    def __init__(self, stream, every: int = 8):
        self.stream, self.every, self.pieces, self.written = stream, every, 0, False

    def write(self, text: str) -> None:
        self.stream.write(text)
        self.written, self.pieces = True, self.pieces + 1
        if self.pieces % self.every == 0:
            self.stream.flush()

    def flush(self) -> None:
        self.stream.flush()
