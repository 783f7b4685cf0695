"""`lazylab new NAME [--task text|custom]`: write NAME.py, an experiment of your own that trains as written."""
from lazylab.command_line import Parser
from lazylab.experiments.templates import write_experiment  # torch-free


def parser() -> Parser:
    p = Parser('new', description='Write NAME.py: a short, commented experiment that trains as written with '
                                  '`lazylab train NAME.py` (or `python NAME.py`). Never overwrites a file.')
    p.add_argument('name', metavar='NAME', help='the experiment\'s name (a Python name): the file is NAME.py')
    p.add_argument('--task', choices=('text', 'custom'), default='text',
                   help='text: a character-level model of your own on a text (default); custom: a Task of your '
                        'own, with its data, loss and evaluation')
    return p


def run(argv: list[str]) -> None:
    a = parser().parse(argv)
    path = write_experiment(a.name, a.task)
    print(f'wrote {path}: train it with `lazylab train {path}` (or `python {path}`); `lazylab options {path}` lists '
          f'its keys')
