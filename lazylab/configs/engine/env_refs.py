"""Values that read the environment: ``${env:NAME}`` and ``${env:NAME,default}``.

    expand_env({'runs_dir': 'runs/${env:USER}', 'lr': '${env:LR,3e-4}'}, environ={'USER': 'ada'})
        == ({'runs_dir': 'runs/ada', 'lr': '3e-4'},
            {'runs_dir': EnvUse('runs/${env:USER}', ('USER',), (), False),
             'lr': EnvUse('${env:LR,3e-4}', ('LR',), ('LR',), False)})

In a string value of a ``--config`` file (anywhere inside a list or mapping too), in the text of a command line's
``key=value`` and in the given values of a dump (``load``):

``${env:NAME}``
    the variable's value. An unset variable is an error naming it, the key and where it was written
    (``FILE:LINE`` for a file).
``${env:NAME,default}``
    the variable's value, or ``default`` when it is unset; ``${env:NAME,}`` is the empty string.
``$${``
    the text ``${``: ``$${env:HOME}`` is the text ``${env:HOME}``, read by nothing. (Backslashes mean nothing, so a
    Windows path or a regular expression is written as it is.)

A reference may be the whole value or part of a text (``runs/${env:USER}/x``), several in one value. NAME is a
variable name (letters, digits and ``_``, not starting with a digit); spaces around it and around the default are
dropped. The default is the text up to the first ``}``: it holds no ``}`` and no reference (no nesting). Any other
``${…}`` is an error naming the text: ``${env:}``, ``${env:1BAD}``, ``${foo:X}``, ``${X}``, a ``${`` never closed.

The result is text, typed by the item exactly as a command line's text is: ``${env:LR}`` with ``LR=3e-4`` is 0.0003
for a float item (a bool, an int, a Literal, an option's name alike). A variable's value is used as it is: a
``${env:…}`` inside it is text, never read again (no recursion). The values read from the environment in one call
(one command line, one file) may together be no longer than a configuration file (``LAZYLAB_MAX_CONFIG_MB``).

A value is *secret* when a variable it reads, or its key, has a secret's name (``lazylab.redaction.secret_name``:
``API_TOKEN``, ``PGPASSWORD``, ``api_key``…). Its text is hidden from every error message from then on
(``lazylab.redaction.conceal``), and :func:`note_env` has the dumps write its reference in its place
(``values: {api_key: ${env:API_KEY}}``), so that a replay in the same environment reads it again. The values a dump
gives are written escaped (:func:`escape_env`), so that a replay reads each back as it was.
"""
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, Optional, Union

from lazylab import user_files
from lazylab.errors import shown
from lazylab.redaction import MIN_SECRET, conceal, secret_name

from .errors import BadValueError
from .state import state_of

_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
#: what a message says a reference is
FORMS = '${env:NAME} or ${env:NAME,default} ($${ for the text ${)'


class EnvUse(NamedTuple):
    """How a given value read the environment (one of :func:`expand_env`'s results).

    Args:
        written: the value as written, references and all (what a dump writes for a secret).
        names: the variables it read, in order, each once.
        unset: those of them that were unset, whose default it took.
        secret: a variable or the key has a secret's name: the value is hidden (see the module docstring).
    """
    written: Any
    names: tuple[str, ...]
    unset: tuple[str, ...]
    secret: bool

    @property
    def label(self) -> str:
        """Where the value came from, as provenance says it: ``env LR``, ``env USER, RUN (default)``."""
        return 'env ' + ', '.join(f'{n} (default)' if n in self.unset else n for n in self.names)


class _Ref(NamedTuple):
    name: str
    default: Optional[str]


def has_env_reference(text: str) -> bool:
    """Whether ``text`` holds a ``${`` that is not written ``$${`` (a reference, or a malformed one).

    Args:
        text: a value as written (a command line's text, a string of a config file).
    """
    return any(isinstance(part, _Ref) for part in _parts(text, '', strict=False))


def escape_env(value: Any) -> Any:
    """``value`` written so that :func:`expand_env` reads it back as it is: each ``${`` in its strings (inside lists
    and mappings too) as ``$${``.

    Args:
        value: a given value as a dump writes it (text, a number, a list or mapping of them).
    """
    if isinstance(value, str):
        return value.replace('${', '$${')
    if isinstance(value, (list, tuple)):
        return [escape_env(v) for v in value]
    if isinstance(value, dict):
        return {k: escape_env(v) for k, v in value.items()}
    return value


def _parts(text: str, where: str, strict: bool = True) -> Iterator[Union[str, _Ref]]:
    """The literal texts and references of ``text``, in order (see the module docstring).

    Raises:
        BadValueError: with ``strict``, a malformed reference (``where`` starts the message).
    """
    i = 0
    while True:
        j = text.find('$', i)
        if j < 0:
            yield text[i:]
            return
        if text.startswith('$${', j):
            yield text[i:j] + '${'
            i = j + 3
        elif text.startswith('${', j):
            yield text[i:j]
            end = text.find('}', j + 2)
            if end < 0 or '${' in text[j + 2:end]:
                if strict:
                    problem = 'a ${ never closed' if end < 0 else 'a reference inside a reference'
                    raise BadValueError(f'{where}: {problem} in {shown(text)}; write {FORMS}', where)
                yield _Ref('', None)
                return
            yield _reference(text[j + 2:end], text[j:end + 1], where, strict)
            i = end + 1
        else:
            yield text[i:j + 1]
            i = j + 1


def _reference(body: str, written: str, where: str, strict: bool) -> _Ref:
    """The reference ``written`` (``${BODY}``).

    Raises:
        BadValueError: with ``strict``, anything but ``env:NAME[,default]`` (naming ``written``).
    """
    resolver, colon, rest = body.partition(':')
    name, comma, default = rest.partition(',')
    name = name.strip()
    if not colon:
        problem = 'a reference needs a resolver'
    elif resolver.strip() != 'env':
        problem = f'unknown resolver {resolver.strip()!r}'
    elif not name:
        problem = 'no variable name'
    elif not _NAME.fullmatch(name):
        problem = f'{name!r} is not a variable name (letters, digits and _, not starting with a digit)'
    else:
        return _Ref(name, default.strip() if comma else None)
    if strict:
        raise BadValueError(f'{where}: {problem} in {shown(written)}; write {FORMS}', where)
    return _Ref('', None)


class _Budget:
    """The bytes the values read from the environment may still take, in one call of `expand_env`."""

    def __init__(self):
        self.left = self.limit = user_files.CONFIG.bytes(BadValueError)

    def take(self, text: str, where: str) -> None:
        self.left -= len(text.encode('utf-8', 'surrogatepass'))
        if self.left < 0:
            raise BadValueError(f'{where}: the values read from the environment are longer than {self.limit:,} '
                                f'bytes together (a configuration file\'s limit, {user_files.CONFIG.variable})',
                                where)


def _expand_text(text: str, where: str, environ: Mapping[str, str], budget: _Budget,
                 names: dict[str, bool]) -> str:
    """``text`` with its references replaced; ``names``: each variable read → whether it was set."""
    out = []
    for part in _parts(text, where):
        if isinstance(part, str):
            out.append(part)
            continue
        value = environ.get(part.name)
        names.setdefault(part.name, value is not None)
        if value is None:
            if part.default is None:
                raise BadValueError(f'{where}: environment variable {part.name} is not set; set it, or give a '
                                    f'default: ${{env:{part.name},VALUE}}', where)
            value = part.default
        budget.take(value, where)
        out.append(value)
    return ''.join(out)


def _expand(value: Any, where: str, environ: Mapping[str, str], budget: _Budget, names: dict[str, bool]) -> Any:
    if isinstance(value, str):
        return _expand_text(value, where, environ, budget, names)
    if isinstance(value, (list, tuple)):
        return type(value)(_expand(v, where, environ, budget, names) for v in value)
    if isinstance(value, dict):
        return {k: _expand(v, where, environ, budget, names) for k, v in value.items()}
    return value


def expand_env(values: Mapping[str, Any], origins: Optional[Mapping[str, str]] = None,
               environ: Optional[Mapping[str, str]] = None) -> tuple[dict[str, Any], dict[str, EnvUse]]:
    """``values`` with the references in their strings replaced (see the module docstring), and how each value that
    holds one read the environment. A secret's text is concealed from messages (``lazylab.redaction.conceal``).

    Args:
        values: {key: value}: text from a command line, or what YAML parsed (strings inside lists and mappings are
            expanded too; other values are left as they are).
        origins: {key: where it was written}, for messages (``base.yaml:3``); a key without one is the command
            line's.
        environ: the environment (default: ``os.environ``).

    Returns:
        (the expanded values, {key: EnvUse} of the values that held a reference).

    Raises:
        BadValueError: a malformed reference (naming its text); an unset variable without a default; the values
            read longer together than a configuration file may be. Each message starts with ``FILE:LINE: key``
            (``key`` for the command line).
    """
    environ = os.environ if environ is None else environ
    budget = _Budget()
    out: dict[str, Any] = {}
    uses: dict[str, EnvUse] = {}
    for key, value in values.items():
        origin = (origins or {}).get(key)
        where = f'{origin}: {key}' if origin else str(key)
        names: dict[str, bool] = {}
        out[key] = _expand(value, where, environ, budget, names)
        if names:
            secret = secret_name(str(key), config_key=True) or any(secret_name(n) for n in names)
            uses[key] = EnvUse(value, tuple(names), tuple(n for n, found in names.items() if not found), secret)
            if secret:
                _conceal(out[key], [environ[n] for n, found in names.items() if found])
    return out, uses


def _conceal(value: Any, read: list[str]) -> None:
    """Hide a secret value, and each variable's text it holds, from messages: as written when long enough not to
    hide ordinary letters, and as messages quote it."""
    for text in [*read, *([value] if isinstance(value, str) else [])]:
        conceal(*([text] if len(text) >= MIN_SECRET else []), repr(text), shown(text))


def note_env(configs: Any, uses: Mapping[str, EnvUse]) -> None:
    """Record on ``configs`` that the given values at these dotted paths read the environment: each is labelled
    ``env NAME`` (the dump's ``given`` section, ``lazylab options --resolved``), and a secret one is written as its
    reference in dumps (:func:`redacted`); a path that was not given is passed over. A value given again later
    (``apply_overrides``, assignment) drops its record.

    Args:
        configs: the root config object the values were given to.
        uses: {full dotted path: EnvUse}, from :func:`expand_env`.
    """
    st = state_of(configs)
    labels = st.__dict__.setdefault('given', {})
    hidden = st.__dict__.setdefault('redacted', {})
    for path, use in uses.items():
        if path not in labels:  # not given (a value a caller left out): nothing to say
            continue
        labels[path] = use.label
        if use.secret:
            hidden[path] = use.written
        else:
            hidden.pop(path, None)


def redacted(configs: Any) -> dict[str, Any]:
    """{full dotted path: the value as written, reference and all} of the secret values given to ``configs`` (see
    :func:`note_env`): what dumps and listings show in their place."""
    return dict(state_of(configs).__dict__.get('redacted', {}))


def forget_env(st: Any, keys) -> None:
    """A value given again for each of ``keys`` of the config state ``st``: its environment record goes."""
    hidden = st.__dict__.get('redacted')
    if hidden:
        for key in keys:
            hidden.pop(key, None)
