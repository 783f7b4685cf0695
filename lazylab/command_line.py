"""The one parser class of the command line, and its one `key=value` splitter.

It lives below every layer (it imports only `lazylab.errors` and `lazylab.user_files`), not in `lazylab.cli`: the
commands parse with it, and so do the layers that read a command line back — a sweep's `--resume` re-reads the
recorded `lazylab sweep` command (`lazylab.sweeps.plan`), and a sweep's trial process reads its own
(`lazylab.sweeps.trial`).

Every `lazylab` command parses its flags with a `Parser`: argparse, except that a mistake is a one-line
`UsageError` (printed by `run_cli` as `lazylab: error: …`, exit 2; never argparse's usage block and exit code) and
that `-h`/`--help` returns from the command (`HelpShown`) instead of ending the interpreter, so that a command can
also be called from Python (tests, notebooks).

`Parser.parse_with_settings` splits a command line into its flags and its settings: the positional arguments the
parser declares come first (`EXPERIMENT`), every later token without a leading `-` is a `key=value` setting, and a
flag that takes a value takes the next token whatever it holds (`--launcher 'torchrun --nproc_per_node=2'`).
train, labml, sweep and a sweep's trial process all read their command lines this way.
"""
import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, Optional

from lazylab import user_files
from lazylab.errors import LazylabError, UsageError, given_twice, shown
from lazylab.user_files import control_character

#: what `--config` is, in the help of every command that takes it (train, options, sweep, labml)
CONFIG_HELP = ("settings from a YAML file, or a run's configs.yaml; repeat it to stack files (a later file wins, then "
               "key=value). A value may read the environment: ${env:NAME} or ${env:NAME,default}, here and in "
               "key=value (quote it for the shell: 'lr=${env:LR}'); $${ is the text ${")


class HelpShown(Exception):
    """-h/--help was answered (the text is printed); the command returns exit code 0."""


class Parser(argparse.ArgumentParser):
    """argparse for one lazylab command (`prog` is `lazylab COMMAND`).

    Raises (from the parse methods):
        UsageError: a flag that does not exist, a missing or malformed value, an unexpected argument; the message
            is argparse's, with where to read the command's help.
        HelpShown: -h or --help was given; the help is printed on stdout.
    """

    def __init__(self, command: str, **kwargs: Any):
        kwargs.setdefault('allow_abbrev', False)  # `--stor` must not silently mean `--storage`
        self._flags: set[str] = set()  # before argparse's __init__, which adds -h/--help through add_argument
        self._takes_value: set[str] = set()
        super().__init__(prog=f'lazylab {command}', **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self._flags.update(action.option_strings)
        if action.option_strings and action.nargs != 0:
            self._takes_value.update(action.option_strings)
        return action

    def error(self, message: str) -> NoReturn:
        raise UsageError(f'{message} (see: {self.prog} --help)')

    def exit(self, status: int = 0, message: Optional[str] = None) -> NoReturn:
        if message:
            print(message, file=sys.stderr, end='')
        if status:
            raise UsageError((message or 'bad arguments').strip())
        raise HelpShown()

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """`parse_args`, for a command without settings."""
        return self.parse_args(list(argv))

    def parse_with_settings(self, argv: Sequence[str], *, what: str = 'settings') -> tuple[argparse.Namespace,
                                                                                           list[str]]:
        """(the flags and positional arguments, the `key=value` settings) of `argv` (see the module docstring).

        Raises:
            UsageError: a flag the command does not have; a token after the positional arguments that is neither a
                flag nor `key=value` (the message says how settings are written); a key with a control character
                (`split_setting`); a key given twice (`lr is given twice: lr=1e-2 and lr=1e-3; give it once`: a later
                token never quietly replaces an earlier one); argparse's own errors.
        """
        positionals = [a for a in self._actions if not a.option_strings and a.nargs is None]
        flags: list[str] = []
        settings: list[str] = []
        first: dict[str, str] = {}  # key → the setting that gave it
        taken, i, argv = 0, 0, list(argv)
        while i < len(argv):
            a = argv[i]
            if a.startswith('-') and a != '-':
                if a.split('=', 1)[0] not in self._flags:
                    self.error(f'unknown option {a.split("=", 1)[0]!r}')
                flags.append(a)
                if a in self._takes_value and i + 1 < len(argv):
                    flags.append(argv[i + 1])
                    i += 1
            elif taken < len(positionals):
                flags.append(a)
                taken += 1
            elif '=' in a:
                key = split_setting(a)[0]  # a key with a control character is refused here, before anything reads it
                if key in first:
                    raise UsageError(given_twice(key, first[key], a))
                first[key] = a
                settings.append(a)
            else:
                raise UsageError(f'unexpected argument {a!r}: give {what} as key=value (see: {self.prog} --help)')
            i += 1
        return self.parse_args(flags), settings


def split_setting(token: str, expected: str = 'key=value',
                  error: type[LazylabError] = UsageError) -> tuple[str, str]:
    """(key, value) of a `key=value` token, the key stripped of spaces: the one splitter of settings (the config
    engine's `parse_overrides` splits with it too, raising its own error class).

    Raises:
        error: no `=`, or an empty key (`expected KEY=VALUE, got …`); a key with a control character (a newline, a
            tab, …), shown escaped: `'d_model\\n'=16` must not quietly mean `d_model=16`.
    """
    key, eq, text = token.partition('=')
    bad = control_character(key)
    if bad is not None:  # before the strip
        raise error(f'bad key {key!r} in {shown(token)}: a key holds no control characters, and this one holds '
                    f'{bad!r}')
    key = key.strip()
    if not eq or not key:
        raise error(f'expected {expected}, got {token!r}')
    return key, text


def add_config_flag(p: Parser, help: str = CONFIG_HELP) -> None:
    """`--config FILE.yaml`, repeatable: the one flag of every command that stacks config files."""
    p.add_argument('--config', metavar='FILE.yaml', action='append', help=help)


def config_files(files: Optional[Sequence[str]]) -> list[str]:
    """The `--config` files of a command line (`add_config_flag`), checked before anything is imported or read:
    a FIFO, /dev/zero or a huge file is one line at once (each is read later, bounded, by
    `lazylab.experiments.configure.stack_config_files`).

    Raises:
        UsageError: `--config=` or `--config ''` (not the current folder); a file `user_files.check_file` refuses.
    """
    files = list(files or ())
    if '' in files:
        raise UsageError('--config needs a YAML file')
    for path in files:
        user_files.check_file(path, 'config file', user_files.CONFIG)
    return files


def asks_help(argv: Sequence[str]) -> bool:
    """-h or --help among the arguments (before a `--`)."""
    argv = list(argv)
    head = argv[:argv.index('--')] if '--' in argv else argv
    return '-h' in head or '--help' in head
