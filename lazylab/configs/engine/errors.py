"""Errors a user of the config engine can cause.

Every error here is a :class:`ConfigError`, itself a :class:`lazylab.errors.LazylabError` (the user errors of all
of lazylab); catch that one class to report a configuration mistake as one line (the command line prints
``lazylab: error: <message>`` and exits with status 2). Each subclass also derives
from the built-in exception labml.configs raises in the same situation, so labml-style code that catches
``AttributeError``, ``KeyError`` or ``ValueError`` keeps working.

Messages name the full dotted config path (``optimizer.learning_rate``) and, where a name was mistyped, the
nearest declared names.

Programming errors inside the engine itself still raise the usual built-in exceptions with a traceback.
"""
import difflib
from collections.abc import Iterable, Sequence

from lazylab.errors import LazylabError, WrapsUserError


class ConfigError(LazylabError):
    """Base class of every user-caused configuration error.

    Attributes:
        path: the full dotted config path the error is about (``''`` when it is about no single item).
    """

    def __init__(self, message: str, path: str = ''):
        super().__init__(message)
        self.message = message
        self.path = path

    def __str__(self):
        return self.message


class UnknownItemError(ConfigError, AttributeError, KeyError):
    """A name that the config class does not declare was read, assigned or overridden.

    It is an ``AttributeError`` (for ``conf.name``) and a ``KeyError`` (for ``conf._set_values({name: ...})``),
    as in labml.configs.
    """


class NoValueError(ConfigError, AttributeError):
    """A declared item has no value: no override, default, option, or constructible type."""


class AlreadyComputedError(ConfigError, ValueError):
    """An item was assigned, overridden or given a default after its value was computed."""


class UnknownOptionError(ConfigError, ValueError):
    """A string that is not one of an item's options (and not a valid value of its type) was given."""


class BadValueError(ConfigError, ValueError):
    """A value (usually text from the command line or YAML) does not fit the item's declared type."""


class CycleError(ConfigError, RuntimeError):
    """Computing an item needs its own value, e.g. ``a -> b -> a``.

    Attributes:
        chain: the dotted paths of the cycle, first item repeated at the end.
    """

    def __init__(self, chain: Sequence[str]):
        self.chain = list(chain)
        super().__init__('cycle in config dependencies: ' + ' -> '.join(self.chain), self.chain[0])


class CalculatorError(ConfigError, WrapsUserError, RuntimeError):
    """A calculator (an option function, a ``set_default`` function or a constructed type) raised.

    The original exception is chained as ``__cause__``; when that is a user error itself (a ``DataError`` an
    option raised), ``cause_for_user()`` returns it and the command line shows its message instead.

    Attributes:
        option: the option name (or source such as ``set_default``) that failed.
    """

    def __init__(self, message: str, path: str, option: str):
        super().__init__(message, path)
        self.option = option


class DeclarationError(ConfigError, TypeError):
    """A registration is malformed: ``option`` without config items, a calculator with the wrong
    signature, a multi-item option returning the wrong number of values."""


class NotBuiltError(ConfigError):
    """An item that a block asked the engine not to compute (``inspect.not_built``: the model, while a command
    resolves a configuration without building it) was needed. ``path`` names that item. Not a mistake of the user's:
    the caller catches it and says the value is computed when the run starts."""


class OverrideSyntaxError(ConfigError, ValueError):
    """A command-line token is not ``key=value``."""


def nearest(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The up-to-``n`` candidates closest to ``name`` (case-insensitive), best first."""
    candidates = list(candidates)
    lowered = {c.lower(): c for c in candidates}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.6)
    return [lowered[h] for h in hits]


def suggestion(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` or ``"; did you mean 'x' or 'y'?"``, or ``''`` when nothing is close."""
    hits = nearest(name, candidates)
    if not hits:
        return ''
    return '; did you mean ' + ' or '.join(repr(h) for h in hits) + '?'


def unknown_item(class_name: str, path: str, key: str, declared: Iterable[str]) -> UnknownItemError:
    """The error for an undeclared name, listing the nearest declared names."""
    return UnknownItemError(f'{class_name} has no config item {path!r}{suggestion(key, declared)}', path)
