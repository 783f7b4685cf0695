"""The dashboard's request guard: an ASGI middleware between uvicorn and each port's app (labml-app 0.5.14's; the
studies', optuna-dashboard's, under :class:`serving.WsgiApp`).

labml's app was written for a server behind its own login; served as it is on a workstation it answered a malformed
JSON body with HTTP 500 and the Python traceback in the body, read a body of any size into memory, and had no
authentication. :class:`RequestGuard` wraps the app (:func:`labml_patches.patch_app_guard` installs it as the
outermost of the app's own middlewares, in place of labml's ``error_handling_middleware``; the studies' app is
wrapped by :class:`studies.StudiesServer`) and, per request:

1. with a token (``--token``), refuses a request that does not carry it: 401 and a one-line JSON message;
2. refuses a body over ``max_body_bytes``: 413, before the body is read when ``Content-Length`` says so, and as
   soon as the count passes the limit when the body streams (chunked);
3. turns an exception of the app into a short JSON answer — 400 ``{"error": "malformed JSON body"}`` when the body
   was not JSON, 400 for a JSON body the route could not use, 500 otherwise — and writes its traceback, once, to
   the server's stderr.

Each JSON answer is one line, ``{"error": …}`` on the labml port (what labml's page reads) and ``{"reason": …}`` on
the studies port (what optuna-dashboard's own answers and page use): the guard's ``error_key``. Files outside the
web folder are refused by the patched static route (:func:`labml_patches.patch_app_static_route`), and a request
head that does not come in time by the server (:class:`serving.HeadDeadlineProtocol`), not here.
"""
import hmac
import json
import sys
import traceback
from http.cookies import CookieError, SimpleCookie
from typing import Optional
from urllib.parse import parse_qsl, urlencode

from lazylab.dashboard_client import TOKEN_HEADER

DEFAULT_MAX_BODY_MB = 16
#: seconds a request has to send its head (request line and headers): serving.HeadDeadlineProtocol
DEFAULT_HEADER_TIMEOUT_S = 10
TOKEN_COOKIE = 'lazylab_token'
TOKEN_QUERY = 'token'

# Raised by the app for a JSON body it could read but not use ({} where it needs {"run_uuids": …}, a list for an
# object): the client's mistake, so a 400; from a request without a body the same exceptions are the app's (500).
_BODY_SHAPE_ERRORS = (KeyError, TypeError, IndexError, AttributeError, ValueError)


class BodyTooLarge(Exception):
    """A request body passed the guard's limit while the app was reading it."""


def _json_error(status: int, message: str, key: str = 'error') -> tuple[int, list, bytes]:
    body = json.dumps({key: message}).encode('utf-8')
    return status, [(b'content-type', b'application/json'), (b'content-length', str(len(body)).encode())], body


async def _send_answer(send, status: int, headers: list, body: bytes) -> None:
    await send({'type': 'http.response.start', 'status': status, 'headers': headers})
    await send({'type': 'http.response.body', 'body': body})


def _is_json_syntax_error(e: BaseException) -> bool:
    """True when `e`, an exception it was raised from, or one in an exception group among those, is a JSON
    decoding error (bad syntax, bad UTF-8)."""
    todo, seen = [e], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)):
            return True
        seen.add(id(e))
        todo += [e.__cause__, e.__context__, *getattr(e, 'exceptions', ())]  # `exceptions`: an ExceptionGroup's
    return False


#: token_answer's answers
OK, REDIRECT, REFUSE = 'ok', 'redirect', 'refuse'
NEEDS_TOKEN = 'this dashboard needs its token: open it once as /?token=TOKEN, or send the header X-Lazylab-Token'


def token_answer(token: bytes, header: Optional[bytes], cookie_header: str, query: list[tuple[str, str]]) -> str:
    """Whether a request carries `token`: in the header (``X-Lazylab-Token``'s value), in the cookie header's
    ``lazylab_token``, or in the address (``token=``) — OK, REDIRECT (only in the address: a GET is answered by a
    redirect that sets the cookie, :func:`redirect_with_cookie`) or REFUSE. Compared in constant time."""
    def matches(given: Optional[bytes]) -> bool:
        return given is not None and hmac.compare_digest(given, token)

    if matches(header):
        return OK
    cookie = SimpleCookie()
    try:
        cookie.load(cookie_header)
    except CookieError:  # a cookie header that is not one: as if there were none
        cookie = SimpleCookie()
    if TOKEN_COOKIE in cookie and matches(cookie[TOKEN_COOKIE].value.encode('utf-8')):
        return OK
    given = [v for k, v in query if k == TOKEN_QUERY]
    return REDIRECT if given and matches(given[0].encode('utf-8')) else REFUSE


def redirect_with_cookie(token: bytes, raw_path: str, query: list[tuple[str, str]]) -> tuple[str, str]:
    """(Location, Set-Cookie) of the 303 to the same page without ``token=`` in its address (nor in the browser's
    history), setting the cookie that later requests carry."""
    # One leading slash: '//host/…' (or '/\\host/…', to some browsers) would send the browser to another host.
    rest = [(k, v) for k, v in query if k != TOKEN_QUERY]
    location = '/' + raw_path.lstrip('/\\') + ('?' + urlencode(rest) if rest else '')
    return location, f'{TOKEN_COOKIE}={token.decode()}; Path=/; HttpOnly; SameSite=Strict'


class RequestGuard:
    """ASGI middleware: token, body limit and error answers for either port's app (see the module docstring).

    Args:
        app: the ASGI app to guard (labml's middleware stack below this one).
        max_body_bytes: the largest request body accepted, in bytes.
        token: the secret every request must carry (header ``X-Lazylab-Token``, cookie ``lazylab_token``, or
            ``?token=``: a GET with it is answered by a redirect to the same address without it, which sets the
            cookie); None: no check.
        log: where tracebacks go (default sys.stderr), one per failed request.
        error_key: the key of the message in the JSON answers (``error``; ``reason`` on the studies port).
    """

    def __init__(self, app, max_body_bytes: int = DEFAULT_MAX_BODY_MB << 20, token: Optional[str] = None,
                 log=None, error_key: str = 'error'):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.token = None if token is None else token.encode('utf-8')
        self.log = log
        self.error_key = error_key

    async def __call__(self, scope, receive, send):
        if scope['type'] not in ('http', 'websocket'):
            await self.app(scope, receive, send)
            return
        if self.token is not None and not await self._authorized(scope, send):
            return
        if scope['type'] == 'http':
            await self._guarded(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _authorized(self, scope, send) -> bool:
        """True when the request carries the token; else answers it (401, or the cookie-setting redirect)."""
        headers = dict(scope['headers'])  # names are lower-case bytes in ASGI
        query = parse_qsl(scope.get('query_string', b'').decode('latin-1'), keep_blank_values=True)
        answer = token_answer(self.token, headers.get(TOKEN_HEADER.encode()),
                              headers.get(b'cookie', b'').decode('latin-1'), query)
        if answer == OK or (answer == REDIRECT and (scope['type'] != 'http' or scope['method'] != 'GET')):
            return True  # (a token in the address of a request there is no redirecting: enough for this request)
        if answer == REDIRECT:
            path = scope.get('raw_path', scope['path'].encode()).decode('latin-1')
            location, cookie = redirect_with_cookie(self.token, path, query)
            await _send_answer(send, 303, [(b'location', location.encode('latin-1')),
                                           (b'set-cookie', cookie.encode('latin-1')), (b'content-length', b'0')], b'')
        elif scope['type'] == 'websocket':
            await send({'type': 'websocket.close', 'code': 1008})
        else:
            await _send_answer(send, *_json_error(401, NEEDS_TOKEN, self.error_key))
        return False

    async def _guarded(self, scope, receive, send):
        length = dict(scope['headers']).get(b'content-length')
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await self._too_large(scope, send)  # the body is never read
            return
        state = {'received': 0, 'started': False, 'too_large': False}

        async def counted_receive():
            message = await receive()
            if message['type'] == 'http.request':
                state['received'] += len(message.get('body', b''))
                if state['received'] > self.max_body_bytes:
                    state['too_large'] = True
                    raise BodyTooLarge()
            return message

        async def watched_send(message):
            if message['type'] == 'http.response.start':
                state['started'] = True
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except Exception as e:  # the app's fault or the client's; either way no traceback in the answer
            if state['too_large']:  # BodyTooLarge, maybe inside the exception group of a middleware's task group
                if not state['started']:
                    await self._too_large(scope, send)
                return
            status, message = self._classify(e, state['received'])
            self._log(scope, status, message, e)
            if not state['started']:
                await _send_answer(send, *_json_error(status, message, self.error_key))

    def _classify(self, e: Exception, received: int) -> tuple[int, str]:
        if _is_json_syntax_error(e):
            return 400, 'malformed JSON body'
        if received and isinstance(e, _BODY_SHAPE_ERRORS):
            return 400, 'JSON body not understood by this route'
        return 500, 'internal server error (the traceback is in the server log)'

    async def _too_large(self, scope, send) -> None:
        self._log(scope, 413, 'request body too large')
        status, headers, body = _json_error(
            413, f'request body over the limit of {self.max_body_bytes:,} bytes (lazylab dashboard --max-body-mb)',
            self.error_key)
        await _send_answer(send, status, headers + [(b'connection', b'close')], body)

    def _log(self, scope, status: int, message: str, e: Optional[BaseException] = None) -> None:
        """One line naming the request, then the traceback of `e` (if any), to the server's stderr."""
        out = self.log or sys.stderr
        text = f'lazylab dashboard: {scope["method"]} {ascii(scope["path"])}: {status} {message}\n'
        if e is not None:
            # Without the exceptions it was raised from: Starlette's BaseHTTPMiddleware re-raises each exception
            # `from` its context, so a JSON error would bring json's internal StopIteration along every time.
            text += ''.join(traceback.format_exception(type(e), e, e.__traceback__, chain=False))
        out.write(text)
        out.flush()
