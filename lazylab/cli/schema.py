"""`lazylab schema EXPERIMENT`: the JSON Schema (draft 2020-12) of the `--config` YAML files of EXPERIMENT, for an
editor's YAML language server (`# yaml-language-server: $schema=FILE` on a config file's first line)."""
import json

from lazylab.command_line import Parser


def parser() -> Parser:
    p = Parser('schema', description='Print the JSON Schema (draft 2020-12) of what a --config YAML file of '
                                     'EXPERIMENT may set: each key in full with its type, option names and Literal '
                                     'values as enums, its bounds and its help. Save it (lazylab schema EXPERIMENT > '
                                     'EXPERIMENT.schema.json) and start a config file with `# yaml-language-server: '
                                     '$schema=EXPERIMENT.schema.json` for completion and checks in an editor.')
    p.add_argument('experiment', metavar='EXPERIMENT',
                   help='a built-in or installed experiment, a .py file or a dotted module')
    return p


def run(argv: list[str]) -> None:
    a = parser().parse(argv)
    from lazylab.experiments.listing import config_schema  # torch: the experiment's module is imported
    print(json.dumps(config_schema(a.experiment), indent=2, ensure_ascii=False))
