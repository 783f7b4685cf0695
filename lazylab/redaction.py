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

Imports nothing of lazylab (a leaf: messages anywhere can use it) and no torch.
"""
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any, NamedTuple, Optional

MASK = '***'
#: a secret shorter than this is hidden only inside its URL, not elsewhere in a text (it would hide letters)
MIN_SECRET = 4
_SECRET_PARAM = re.compile(
    r'(?P<name>[?&;][^=&;?#]*?(?:password|passwd|pwd|secret|token|key|credentials?)\s*=)(?P<value>[^&;#]*)',
    re.IGNORECASE)
_SECRET_NAME = re.compile(r'(?:password|passwd|pwd|secret|token|key|credentials?)\s*$', re.IGNORECASE)
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
