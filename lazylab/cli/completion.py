"""`lazylab completion bash|zsh|fish`: the shell code that makes TAB complete lazylab's command lines.

Completion runs through argcomplete: the shell calls `lazylab` itself with the line in `COMP_LINE`/`COMP_POINT`
and `_ARGCOMPLETE` set, and `lazylab.cli.main` answers with `complete()` before anything else is imported. argcomplete
rather than shtab because what TAB offers depends on the line: an experiment's keys (its own file's, or a built-in's)
and then each key's options are only known once EXPERIMENT is typed, and shtab writes one static script from the
parsers when it is generated (dynamic values would be shell functions calling back into Python anyway).

A TAB imports only argcomplete, the parser of the command being completed and the completers; an experiment's keys
come from a listing cached per file sha256 (`lazylab.cli.key_cache`), so no TAB imports torch.
"""
import argparse
import importlib
import os
from typing import Any, Callable, Optional, TextIO

from lazylab.cli import completers
from lazylab.command_line import Parser

SHELLS = ('bash', 'zsh', 'fish')

#: where each shell's code goes, as the help and the docs say it
WHERE = {
    'bash': 'eval "$(lazylab completion bash)" in ~/.bashrc',
    'zsh': 'eval "$(lazylab completion zsh)" in ~/.zshrc (after compinit)',
    'fish': 'lazylab completion fish > ~/.config/fish/completions/lazylab.fish',
}


def parser() -> Parser:
    p = Parser('completion', description='Print the shell code that makes TAB complete lazylab\'s commands, flags, '
                                         'experiments, their keys and values, and run and sweep directories. '
                                         + '; '.join(f'{shell}: {where}' for shell, where in WHERE.items()) + '.')
    p.add_argument('shell', choices=SHELLS, help='the shell to complete in')
    return p


def run(argv: list[str]) -> None:
    a = parser().parse(argv)
    import argcomplete  # only for this command and for a TAB: other commands start without it
    print(argcomplete.shellcode(['lazylab'], shell=a.shell), end='')


def completion_parser(command: str, commands: dict[str, str]) -> argparse.ArgumentParser:
    """The parser TAB completes with: `lazylab`'s commands and flags, with COMMAND's own parser (its flags,
    positional arguments and their completers) under its name; the other commands' parsers are not made (the sweep
    command's alone costs a tenth of a second), as a TAB only ever completes one command.

    Args:
        command: the command on the line (its second word), or '' before one is typed.
        commands: every command's name → its module (`lazylab.cli.COMMANDS`).
    """
    top = argparse.ArgumentParser(prog='lazylab', add_help=False)
    top.add_argument('-h', '--help', action='store_true')
    top.add_argument('-V', '--version', action='store_true')
    subs = top.add_subparsers(dest='command')
    for name, module in commands.items():
        if name == command:
            own = importlib.import_module(module).parser()
            attach_completers(own)
            subs.add_parser(name, parents=[own], add_help=False, conflict_handler='resolve')
        else:
            subs.add_parser(name, add_help=False)
    return top


def attach_completers(p: argparse.ArgumentParser) -> None:
    """Give each argument of a command's parser what TAB offers for it, by what the argument holds."""
    from argcomplete.completers import DirectoriesCompleter, FilesCompleter  # argcomplete: only for a TAB

    by_dest = {'experiment': completers.experiments, 'settings': completers.settings,
               'run_dir': completers.run_dirs, 'run_a': completers.run_dirs, 'run_b': completers.run_dirs,
               'run_dirs': completers.run_dirs, 'paths': completers.paths, 'resume': completers.sweep_dirs,
               'config': FilesCompleter(('yaml', 'yml')), 'runs_dir': DirectoriesCompleter(),
               'store': DirectoriesCompleter()}
    for action in p._actions:
        if action.dest in by_dest and action.dest != 'help':
            action.completer = by_dest[action.dest]  # type: ignore[attr-defined] - argcomplete's protocol


def complete(commands: dict[str, str], output: Optional[TextIO] = None,
             exit_method: Callable[[int], Any] = os._exit) -> None:
    """Answer a TAB (argcomplete's protocol: the line in `COMP_LINE`, the cursor in `COMP_POINT`; the candidates,
    separated by `_ARGCOMPLETE_IFS`, go to file descriptor 8 or `_ARGCOMPLETE_STDOUT_FILENAME`) and exit. Only
    called with `_ARGCOMPLETE` set.

    Args:
        commands: every command's name → its module (`lazylab.cli.COMMANDS`).
        output: where the candidates go instead (a test's `io.StringIO`).
        exit_method: called with 0 once they are written (argcomplete's `os._exit`: no atexit handler, nothing else
            printed into the shell).
    """
    import argcomplete  # only for a TAB: other commands start without it

    words = argcomplete.split_line(os.environ.get('COMP_LINE', ''), int(os.environ.get('COMP_POINT', 0)))[3]
    command = words[1] if len(words) > 1 else ''
    complete_with = finder(argcomplete.CompletionFinder)()
    complete_with.debug_to_fd9 = output is None  # (fd 9 is the shell's debug stream; in a test it is pytest's)
    complete_with(completion_parser(command, commands), always_complete_options=False, exit_method=exit_method,
                  output_stream=output)


def finder(base: type) -> type:
    """argcomplete's `CompletionFinder` (passed in: imported only for a TAB), completing settings after flags too.

    argparse fills a `nargs='*'` positional (the settings) before the first flag, empty if nothing is there, so in
    `lazylab train EXP --config a.yaml d_mo<TAB>` argcomplete finds no argument left to complete; this finder then
    asks the settings' completer, as the command's own parser (`parse_with_settings`) takes settings anywhere.
    """
    from argcomplete.finders import action_is_greedy  # argcomplete: only for a TAB

    class SettingsAnywhere(base):  # type: ignore[misc,valid-type]
        debug_to_fd9 = True

        def _init_debug_stream(self):
            if self.debug_to_fd9:
                super()._init_debug_stream()

        def collect_completions(self, active_parsers, parsed_args, cword_prefix):
            out = super().collect_completions(active_parsers, parsed_args, cword_prefix)
            active = active_parsers[-1]
            settings = next((a for a in active._actions if a.dest == 'settings'), None)
            if out or cword_prefix.startswith('-') or settings is None or not hasattr(settings, 'completer') \
                    or any(action_is_greedy(a, False) for a in active.active_actions):
                return out
            for candidate, description in settings.completer(prefix=cword_prefix, parsed_args=parsed_args).items():
                out.append(candidate)
                self._display_completions[candidate] = description
            return out

    return SettingsAnywhere
