"""Credentials out of what lazylab prints and writes: a storage URL's password and secret query parameters.

    redact_url('postgresql://qa:S3c/r@t@127.0.0.1:5432/db?sslmode=require&password=x')
        == 'postgresql://qa:***@127.0.0.1:5432/db?sslmode=require&password=***'

Two parts of a URL are secret:

- the password of its userinfo, `scheme://USER:PASSWORD@HOST…`: everything after the first `:` that follows `://`
  up to the LAST `@` of the URL, so a password may hold any character — `@`, `/`, `:`, `%`, `?`, spaces,
  percent-encoded ones — and is hidden whole (an `@` in a non-secret query value makes it hide the host too: it
  errs on the side of hiding). A user without a password (`scheme://USER@HOST`) is left as it is.
- the value of each query (or `;`-separated) parameter whose name ends in password, passwd, pwd, secret, token,
  key or credential(s), in any case (`password=`, `sslpassword=`, `api_key=`, `X-Auth-Token=`, …), up to the next
  `&`, `;` or `#`.

`redact(text, urls)` hides them inside a text that holds such a URL (a command line, an error message): each URL
as `redact_url` does, each of its secrets wherever else it appears (as written and percent-decoded, when at least
4 characters long: a shorter one would blank out ordinary letters), and any other `scheme://…` word of the text
(less the punctuation that ends it: `URL: message`).

Imports nothing of lazylab (a leaf: messages anywhere can use it) and no torch.
"""
import re
import urllib.parse
from collections.abc import Iterable

MASK = '***'
#: a secret shorter than this is hidden only inside its URL, not elsewhere in a text (it would hide letters)
MIN_SECRET = 4
_SECRET_PARAM = re.compile(
    r'(?P<name>[?&;][^=&;?#]*?(?:password|passwd|pwd|secret|token|key|credentials?)\s*=)(?P<value>[^&;#]*)',
    re.IGNORECASE)
_URL_WORD = re.compile(r'[A-Za-z][A-Za-z0-9+.-]*://\S+')
_TRAILING = ':;,.)]}\'"'


def redact_url(url: str) -> str:
    """`url` with its userinfo password and the values of its secret query parameters replaced by `***` (see the
    module docstring); a text without `://` (a file path) is returned as it is. Idempotent."""
    scheme_end = url.find('://')
    if scheme_end < 0:
        return url
    url = _SECRET_PARAM.sub(lambda m: m.group('name') + MASK, url)  # first: a secret value may hold an `@`
    head, rest = url[:scheme_end + 3], url[scheme_end + 3:]
    at = rest.rfind('@')
    if at < 0:
        return url
    colon = rest.find(':', 0, at)
    if colon < 0:
        return url  # a user name only
    return head + rest[:colon + 1] + MASK + rest[at:]


def secrets(url: str) -> list[str]:
    """The secret parts of `url` (see the module docstring), as written and percent-decoded, longest first."""
    found: set[str] = set()
    scheme_end = url.find('://')
    if scheme_end < 0:
        return []
    for m in _SECRET_PARAM.finditer(url):
        found.add(m.group('value'))
    rest = _SECRET_PARAM.sub(lambda m: m.group('name') + MASK, url)[scheme_end + 3:]
    at = rest.rfind('@')
    colon = rest.find(':', 0, at) if at >= 0 else -1
    if colon >= 0:
        found.add(rest[colon + 1:at])
    for s in list(found):
        found.add(urllib.parse.unquote(s))
        found.add(urllib.parse.unquote_plus(s))
    return sorted((s for s in found if s and s != MASK), key=lambda s: (-len(s), s))


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
