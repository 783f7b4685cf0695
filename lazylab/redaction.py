"""Credentials out of what lazylab prints and writes, and out of what a database driver parses: a storage URL's
password and secret query parameters.

    redact_url('postgresql://qa:S3c/r@t@127.0.0.1:5432/db?sslmode=require&password=x')
        == 'postgresql://qa:***@127.0.0.1:5432/db?sslmode=require&password=***'

Two parts of a URL are secret:

- the password of its userinfo, `scheme://USER:PASSWORD@HOST…`: everything after the first `:` that follows `://`
  up to the LAST `@` of the URL, so a password may hold any character — `@`, `/`, `:`, `%`, `?`, spaces,
  percent-encoded ones — and is hidden whole. A user without a password (`scheme://USER@HOST`) is left as it is,
  and so is an `@` after a `/`, `?` or `#` that no `:` precedes (`…/db?passwd=a@b`: in the path or the query).
  When a `?` comes before that last `@` the URL is ambiguous (`u:p@h/db?x=a@b` or a password `p@h/db?x=a`?): then
  the union of both readings' secrets is hidden — it errs on the side of hiding.
- the value of each query (or `;`-separated) parameter whose name ends in password, passwd, pwd, secret, token,
  key or credential(s), in any case (`password=`, `sslpassword=`, `api_key=`, `X-Auth-Token=`, …), up to the next
  `&`, `;` or `#`.

`redact(text, urls)` hides them inside a text that holds such a URL (a command line, an error message): each URL
as `redact_url` does, each of its secrets wherever else it appears (as written and percent-decoded, when at least
4 characters long: a shorter one would blank out ordinary letters), and any other `scheme://…` word of the text
(less the punctuation that ends it: `URL: message`).

`database_connection(url)` reads a database URL by the same rule, so that the driver never parses a URL with a
password in it (SQLAlchemy's parser ends the password at the FIRST `@`: the rest of it became a host name, sent to
the resolver and echoed in the driver's error): it returns the URL with no secret in it, for SQLAlchemy and Optuna,
and the secrets as the DBAPI's `connect_args`. An ambiguous URL (a `?` before the last `@`), a port that is not a
number and a password that is not valid percent-encoding are refused (`StorageURLError`) with a message that
quotes no part of the URL.

Values read from the environment (`${env:NAME}` in a configuration, lazylab.configs) are secret by their names,
with the same words (`secret_name`):

- an environment variable is secret when one of its words (split at `_`, `-`, `.`) ends in PASSWORD, PASSWD,
  SECRET, TOKEN, KEY or CREDENTIAL, plural or not, in any case: `PGPASSWORD`, `GITHUB_TOKEN`, `WANDB_API_KEY`,
  `AWS_SECRET_ACCESS_KEY`, `SSH_KEYS`; not `PWD` (a folder), `TOKENIZERS_PARALLELISM`, `KEYBOARD`;
- a config key only by its last part's last word, whole: `password`, `passwd`, `secret(s)`, `token`,
  `credential(s)`, `apikey`, or `key` after `api`, `access`, `secret`, `private` or `auth` (`api_key`,
  `hf_token`, `db_password`, `secret`); not a model's `key`, `d_key`, `n_tokens` or `token_embeddings`.

Such a value is written as its reference (`${env:NAME}`) in every dump, and `conceal` hides its text from every
message `hide_concealed` sees from then on in this process (`lazylab.errors.user_error_message`: what the command
line prints and run.json's `error` records).

Imports nothing of lazylab (the bottom layer: messages anywhere, `lazylab.errors` included, can use it) and no torch.
"""
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any, NamedTuple, Optional

MASK = '***'
#: a secret shorter than this is hidden only inside its URL, not elsewhere in a text (it would hide letters)
MIN_SECRET = 4
#: the words a secret's name ends in (a URL's query parameter, an environment variable, a config key's last word)
SECRET_WORDS = ('password', 'passwd', 'secret', 'token', 'key', 'credential')
_WORDS = '|'.join(SECRET_WORDS)
# a URL's parameter: its name ends in a secret word, `credentials` or ODBC's `pwd`, in any case
_SECRET_PARAM = re.compile(
    rf'(?P<name>[?&;][^=&;?#]*?(?:pwd|{_WORDS}|credentials)\s*=)(?P<value>[^&;#]*)', re.IGNORECASE)
_SECRET_NAME = re.compile(rf'(?:pwd|{_WORDS}|credentials)\s*$', re.IGNORECASE)
# an environment variable's word: ends in a secret word (PGPASSWORD, API_KEYS)
_SECRET_VARIABLE_WORD = re.compile(rf'.*(?:{_WORDS})s?', re.IGNORECASE)
# a config key's last word, whole; `key` only after a word that makes it a credential (a model has `key`, `d_key`)
_SECRET_KEY_WORDS = frozenset({'password', 'passwd', 'secret', 'secrets', 'token', 'credential', 'credentials',
                               'apikey'})
_KEY_KINDS = frozenset({'api', 'access', 'secret', 'private', 'auth'})
#: texts `hide_concealed` hides (see `conceal`), in this process
_CONCEALED: dict[str, None] = {}
_URL_WORD = re.compile(r'[A-Za-z][A-Za-z0-9+.-]*://\S+')
_TRAILING = ':;,.)]}\'"'
_SCHEME = re.compile(r'[A-Za-z][\w+.-]*')
_HOST = re.compile(r'[^\s/?#@\[\]{}:]*')  # a name, an IPv4 address, libpq's `h1,h2`; no brace (Optuna formats the URL)
_IPV6 = re.compile(r'\[[0-9A-Fa-f:.]+(?:%[\w.-]+)?\]')
#: how to write a password so that it reads one way only
ENCODE_HINT = ("percent-encode the password and the query values (@ → %40, / → %2F, ? → %3F, : → %3A, % → %25: "
               "urllib.parse.quote(value, safe=''))")


class StorageURLError(ValueError):
    """A database URL that cannot be read one way only; the message quotes no part of it."""


class DatabaseURL(NamedTuple):
    """A database URL's parts, percent-decoded (`parse_database_url`)."""
    scheme: str
    user: Optional[str]
    password: Optional[str]              # None: no `:` in the userinfo
    host: Optional[str]
    port: Optional[int]
    database: Optional[str]
    query: tuple[tuple[str, str], ...]   # the parameters whose names are not secret
    secret_query: tuple[tuple[str, str], ...]  # password=, sslpassword=, token=, …


def _userinfo(rest: str) -> tuple[int, int, bool]:
    """For `rest`, a URL after its `://`: (the index of the `@` that ends the userinfo, of the `:` that starts its
    password, whether that reading is ambiguous); -1 where there is none. The userinfo ends at the LAST `@`, unless
    the user name before the first `:` would hold a `/`, `?` or `#` (no user name does: that `@` is in the path or
    the query) or the URL has no authority (`sqlite:////path`). Ambiguous: a `?` in the password, which may be the
    start of a query holding that `@` (`h:1/db?password=p@ss`)."""
    at = rest.rfind('@')
    if at < 0 or rest.startswith('/'):
        return -1, -1, False
    colon = rest.find(':', 0, at)
    if any(c in rest[:colon if colon >= 0 else at] for c in '/?#'):
        return -1, -1, False
    return at, colon, colon >= 0 and '?' in rest[colon:at]


def redact_url(url: str) -> str:
    """`url` with its userinfo password and the values of its secret query parameters replaced by `***` (see the
    module docstring); a text without `://` (a file path) is returned as it is. Idempotent."""
    spans = _secret_spans(url)
    for start, end in reversed(spans):
        url = url[:start] + MASK + url[end:]
    return url


def secrets(url: str) -> list[str]:
    """The secret parts of `url` (see the module docstring), as written and percent-decoded, longest first."""
    found = {url[start:end] for start, end in _secret_spans(url, merge=False)}
    for s in list(found):
        found.add(urllib.parse.unquote(s))
        found.add(urllib.parse.unquote_plus(s))
    return sorted((s for s in found if s and s != MASK), key=lambda s: (-len(s), s))


def _secret_spans(url: str, merge: bool = True) -> list[tuple[int, int]]:
    """The (start, end) of each secret of `url` (the password, each secret parameter's value), in order; with
    `merge`, overlapping ones (an ambiguous URL's two readings) joined into one."""
    scheme_end = url.find('://')
    if scheme_end < 0:
        return []
    base = scheme_end + 3
    at, colon, ambiguous = _userinfo(url[base:])
    spans = [(base + colon + 1, base + at)] if colon >= 0 else []
    query_from = 0 if ambiguous or at < 0 else base + at  # after the userinfo, unless that is one reading of two
    spans += [m.span('value') for m in _SECRET_PARAM.finditer(url, query_from)]
    spans.sort()
    if not merge:
        return spans
    joined: list[tuple[int, int]] = []
    for start, end in spans:
        if joined and start <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(end, joined[-1][1]))
        else:
            joined.append((start, end))
    return joined


def parse_database_url(url: str) -> DatabaseURL:
    """`url`'s parts, read as `redact_url` reads it (the module docstring): the userinfo up to the last `@`, so a
    password may hold an unencoded `@`, `/` or `:`; each part percent-decoded as SQLAlchemy decodes it.

    Raises:
        StorageURLError: no `SCHEME://`, a `?` before the last `@` (ambiguous), a port that is not a number, a host
            with a space or a bracket, a part that is not valid percent-encoding; the message quotes no part of
            `url`.
    """
    scheme, sep, rest = url.partition('://')
    if not sep or not _SCHEME.fullmatch(scheme):
        raise StorageURLError('a database URL starts with SCHEME:// (postgresql://USER:PASSWORD@HOST:PORT/DB)')
    at, colon, ambiguous = _userinfo(rest)
    if ambiguous:
        raise StorageURLError(f"the database URL has a '?' before its last '@', so it reads two ways (is that "
                              f"'@' the password's or a query value's?); {ENCODE_HINT}")
    user = password = None
    if at >= 0:
        user = _decoded(rest[:colon if colon >= 0 else at], 'user name') or None
        password = _decoded(rest[colon + 1:at], 'password') if colon >= 0 else None
        rest = rest[at + 1:]
    path, _, query_text = rest.partition('?')
    host_port, slash, database = path.partition('/')
    host, port = _host_port(host_port)
    query, secret = [], []
    try:
        pairs = urllib.parse.parse_qsl(query_text, errors='strict')  # (as SQLAlchemy reads the query)
    except UnicodeDecodeError:
        raise StorageURLError(f"the database URL's query is not valid percent-encoding (UTF-8); "
                              f'{ENCODE_HINT}') from None
    for name, value in pairs:
        (secret if _SECRET_NAME.search(name) else query).append((name, value))
    return DatabaseURL(scheme, user, password, host, port, _decoded(database, 'database') if slash else None,
                       tuple(query), tuple(secret))


def _decoded(part: str, what: str) -> str:
    try:
        return urllib.parse.unquote(part, errors='strict')
    except UnicodeDecodeError:
        raise StorageURLError(f"the database URL's {what} is not valid percent-encoding (UTF-8); "
                              f'{ENCODE_HINT}') from None


def _host_port(text: str) -> tuple[Optional[str], Optional[int]]:
    """(host, port) of `HOST[:PORT]` or `[IPV6][:PORT]`, each None when not there."""
    if text.startswith('['):
        end = text.find(']') + 1
        host, port = text[:end], text[end:]
        if not _IPV6.fullmatch(host) or (port and not port.startswith(':')):
            raise StorageURLError('the host of the database URL is not an address in brackets ([::1]:5432)')
        host, port = host[1:-1], port[1:]
    else:
        host, _, port = text.partition(':')
        if not _HOST.fullmatch(host):
            raise StorageURLError(f'the host of the database URL is not a host name; {ENCODE_HINT}')
    if port and not port.isdigit():
        raise StorageURLError('the port of the database URL is not a number (an IPv6 address goes in brackets: '
                              f'[::1]:5432); {ENCODE_HINT}')
    return host or None, int(port) if port else None


def database_connection(url: str) -> tuple[str, dict[str, Any]]:
    """(`url` rebuilt from its parts with no secret in it, for SQLAlchemy's `create_engine` and Optuna's
    `RDBStorage`; the DBAPI `connect_args` that carry the password and the secret query parameters).

    Raises:
        StorageURLError: as `parse_database_url`.
    """
    from sqlalchemy.engine import URL  # optional here: Optuna's dependency, needed only to open a database
    parts = parse_database_url(url)
    query: dict[str, list[str]] = {}
    for name, value in parts.query:
        query.setdefault(name, []).append(value)
    safe = URL.create(parts.scheme, username=parts.user, host=parts.host, port=parts.port, database=parts.database,
                      query={k: v[0] if len(v) == 1 else v for k, v in query.items()})
    connect: dict[str, Any] = dict(parts.secret_query)
    if parts.password is not None:
        connect['password'] = parts.password  # psycopg(2), pymysql, mysqlclient and pg8000 all call it so
    return safe.render_as_string(hide_password=False), connect


def redact(text: str, urls: Iterable[str] = ()) -> str:
    """`text` with every URL of `urls` redacted (`redact_url`), each secret of theirs of at least `MIN_SECRET`
    characters hidden wherever else it appears (as written or percent-decoded), and any other `scheme://…` word
    of the text redacted too."""
    urls = [u for u in urls if u and '://' in u]
    for url in sorted(urls, key=len, reverse=True):
        text = text.replace(url, redact_url(url))
    for url in urls:
        for secret in secrets(url):
            if len(secret) >= MIN_SECRET:
                text = text.replace(secret, MASK)
    return _URL_WORD.sub(_redact_word, text)


def _redact_word(m: re.Match) -> str:
    """A URL word of a text, redacted; punctuation that ends the word (`URL: message`, `(URL)`) is kept out of it,
    so that it is not taken for the end of a password."""
    word = m.group(0)
    core = word.rstrip(_TRAILING)
    return redact_url(core) + word[len(core):]


def secret_name(name: str, config_key: bool = False) -> bool:
    """Whether `name` names a secret (see the module docstring): an environment variable's name, or with
    `config_key` a config key (dotted or not: its last part counts).

        secret_name('GITHUB_TOKEN') and secret_name('AWS_SECRET_ACCESS_KEY') and not secret_name('PWD')
        secret_name('optimizer.api_key', config_key=True) and not secret_name('d_key', config_key=True)
    """
    if not config_key:
        return any(_SECRET_VARIABLE_WORD.fullmatch(w) for w in re.split(r'[^A-Za-z0-9]+', name) if w)
    words = [w.lower() for w in re.split(r'[^A-Za-z0-9]+', name.rsplit('.', 1)[-1]) if w]
    if not words:
        return False
    return words[-1] in _SECRET_KEY_WORDS or (words[-1] == 'key' and len(words) > 1 and words[-2] in _KEY_KINDS)


def conceal(*forms: str) -> None:
    """From now on, in this process, hide each of `forms` — a secret value as written, and as messages quote it
    (`repr`, `lazylab.errors.shown`) — from every text `hide_concealed` sees. The caller decides the forms: a
    value shorter than `MIN_SECRET` only in its quoted forms (alone it would hide ordinary letters)."""
    for form in forms:
        if form:
            _CONCEALED[form] = None


def hide_concealed(text: str) -> str:
    """`text` with every form `conceal` was given replaced by `***`, the longest first."""
    for form in sorted(_CONCEALED, key=len, reverse=True):
        if form in text:
            text = text.replace(form, MASK)
    return text
