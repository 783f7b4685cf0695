"""Writes reference/cli.md at build time (mkdocs-gen-files): `lazylab --help`, then `lazylab COMMAND --help` for
every command, run in this process, so the page is the parsers' own text and never copied by hand.

The commands are the keys of `lazylab.cli.COMMANDS`. The help is formatted 100 columns wide, whatever the terminal
that builds the site.
"""
import contextlib
import io
import os

import mkdocs_gen_files

from lazylab import cli

WIDTH = '100'


def commands() -> list[str]:
    """The commands the reference lists, in the order `lazylab --help` shows them."""
    return list(cli.COMMANDS)


def help_text(argv: list[str]) -> str:
    """What `lazylab ARGV` prints on stdout; a command whose parser exits after printing its help (argparse's own
    -h) counts as answering, if it exits with 0."""
    out = io.StringIO()
    columns = os.environ.get('COLUMNS')
    os.environ['COLUMNS'] = WIDTH  # argparse wraps at the terminal's width: the same page on every machine
    try:
        with contextlib.redirect_stdout(out):
            try:
                code = cli.main(argv)
            except SystemExit as e:
                code = e.code or 0
    finally:
        if columns is None:
            del os.environ['COLUMNS']
        else:
            os.environ['COLUMNS'] = columns
    if code != 0:
        raise RuntimeError(f'lazylab {" ".join(argv)} exited with {code}')
    text = out.getvalue().rstrip()
    if not text:
        raise RuntimeError(f'lazylab {" ".join(argv)} printed nothing')
    return text


def page() -> str:
    """The whole page: an introduction, the overview, then a section per command."""
    parts = ['# Command line reference\n',
             'Every command and flag, as `lazylab COMMAND --help` prints it: this page is generated when the site is '
             'built (`docs/_gen/cli_reference.py`), so it is always the installed parsers\' own text. A mistake in a '
             'command is one line `lazylab: error: …` and exit code 2.\n',
             '## lazylab\n', '```text', help_text(['--help']), '```\n']
    for command in commands():
        parts += [f'## lazylab {command}\n', '```text', help_text([command, '--help']), '```\n']
    return '\n'.join(parts)


with mkdocs_gen_files.open('reference/cli.md', 'w') as f:
    f.write(page())
