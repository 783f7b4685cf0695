"""How `lazylab dashboard` serves both its ports: one HTTP server, uvicorn over h11, with a deadline for each
request's head, and :class:`guard.RequestGuard` in front of each app.

The labml port serves labml's app (ASGI); the studies port serves optuna-dashboard's app (WSGI, a bottle app) under
:class:`WsgiApp`. So both ports share one guard at each layer, not a copy per port:

- :class:`HeadDeadlineProtocol` (the connection): a request whose head (request line and headers) is not complete
  ``header_timeout_s`` after its connection opened, or after the first byte of a next request on a kept-alive
  connection, is answered 408 and closed: a slowloris guard. Only the head is timed: a long answer (labml's track
  route waits 3 s before it answers) or a slow body is not, and an idle kept-alive connection is left to uvicorn's
  own keep-alive timeout (5 s).
- :class:`guard.RequestGuard` (the request): the token, the body limit (counted as the body is read, with a
  ``Content-Length`` or chunked), one-line JSON answers for the app's exceptions.

    server = uvicorn_server(RequestGuard(app), header_timeout_s=10)      # labml's port: server.run()
    studies = ServerThread(RequestGuard(WsgiApp(bottle_app)), host, port)  # bound now; .start(), .stop()
"""
import asyncio
import io
import json
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from lazylab.dashboard.guard import DEFAULT_HEADER_TIMEOUT_S


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for the request head (see the module docstring).

    Class attributes (set per server by :func:`protocol_class`): ``header_timeout_s``, and ``error_key``, the key
    of the one-line JSON body of the 408 (``error`` on the labml port, ``reason`` on the studies port).
    """
    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    error_key = 'error'
    _head_timer: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()  # a connection that sends nothing is held as long as one that sends half a head

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._head_timer is None:
            self._arm()  # the first bytes of a next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the head is complete (h11 has the request): its body and answer are not timed here

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a head came: say why the connection ends (none: no one to tell)
            body = json.dumps({self.error_key: f'request head not complete within {self.header_timeout_s:g} s'})
            # Written past h11, whose state machine has no request to answer yet; the connection closes right after.
            self.transport.write(b'HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n'
                                 b'content-length: %d\r\nconnection: close\r\n\r\n%s' % (len(body), body.encode()))
        self.transport.close()


def protocol_class(header_timeout_s: float, error_key: str = 'error') -> type:
    """:class:`HeadDeadlineProtocol` with this deadline and this error key (uvicorn makes one per connection)."""
    return type('HeadDeadlineProtocol', (HeadDeadlineProtocol,),
                {'header_timeout_s': header_timeout_s, 'error_key': error_key})


def uvicorn_server(app, host: str = '127.0.0.1', port: int = 0, *,
                   header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, error_key: str = 'error') -> uvicorn.Server:
    """A uvicorn server for the ASGI `app` on host:port with the head deadline (h11 always: the deadline is written
    against its states, and httptools, if installed, would be picked otherwise); quiet (warnings only, no access
    log), no lifespan events. ``.run()`` serves until SIGINT/SIGTERM (in the main thread) or ``should_exit``."""
    config = uvicorn.Config(app, host=host, port=port, http=protocol_class(header_timeout_s, error_key),
                            interface='asgi3', workers=1, log_level='warning', access_log=False, lifespan='off')
    return uvicorn.Server(config)


class ServerThread:
    """:func:`uvicorn_server` on host:port in a daemon thread of this process (the studies beside labml's app).

    The socket is bound here, so a port that cannot be had raises at once, and answers queue from now.

    Raises:
        OSError: host:port cannot be bound.
    """

    def __init__(self, app, host: str, port: int, **options):
        family = socket.AF_INET6 if ':' in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family)  # SO_REUSEADDR, as uvicorn's own bind
        self.server = uvicorn_server(app, host, port, **options)
        self._thread = threading.Thread(target=self.server.run, kwargs={'sockets': [self.socket]},
                                        name=f'dashboard:{port}', daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10) -> None:
        self.server.should_exit = True  # uvicorn looks every 0.1 s, then closes its connections
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.socket.close()


class WsgiApp:
    """A WSGI app as an ASGI app (HTTP only), for optuna-dashboard's bottle app behind :class:`guard.RequestGuard`.

    The body is read whole before the app is called (the guard outside bounds it, chunked or not, and a WSGI app
    reads from a file), and handed on de-chunked with its length; the app runs in a worker thread; its answer is
    sent as the app produces it (a static file in its pieces). An exception of the app reaches the guard, which
    answers it.

    Args:
        app: the WSGI app.
        threads: worker threads (requests served at once).
    """

    def __init__(self, app, threads: int = 8):
        self.app = app
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix='wsgi')

    async def __call__(self, scope, receive, send) -> None:
        if scope['type'] != 'http':
            return
        body = bytearray()
        while True:
            message = await receive()
            if message['type'] == 'http.disconnect':
                return
            body += message.get('body', b'')
            if not message.get('more_body', False):
                break
        loop = asyncio.get_running_loop()

        def send_from_thread(message) -> None:  # waits until uvicorn took it: a slow reader slows the app down
            asyncio.run_coroutine_threadsafe(send(message), loop).result()

        await loop.run_in_executor(self.pool, _respond, self.app, wsgi_environ(scope, bytes(body)), send_from_thread)


def _respond(app, environ: dict, send) -> None:
    """Call the WSGI `app` (in a worker thread) and pass its answer to `send` as ASGI messages."""
    head = {'sent': False}

    def start_response(status: str, headers, exc_info=None):
        if exc_info is not None and head['sent']:
            raise exc_info[1].with_traceback(exc_info[2])  # too late to answer otherwise (PEP 3333)
        head['start'] = {'type': 'http.response.start', 'status': int(status.split(' ', 1)[0]),
                         'headers': [(k.lower().encode('latin-1'), v.encode('latin-1')) for k, v in headers]}
        return write

    def write(data: bytes) -> None:
        if not head['sent']:
            send(head['start'])
            head['sent'] = True
        if data:
            send({'type': 'http.response.body', 'body': data, 'more_body': True})

    result = app(environ, start_response)
    try:
        for chunk in result:
            write(chunk)
        write(b'')  # the head, when the body was empty
        send({'type': 'http.response.body', 'body': b'', 'more_body': False})
    finally:
        if hasattr(result, 'close'):
            result.close()


def wsgi_environ(scope, body: bytes) -> dict:
    """The WSGI environ (PEP 3333) of an ASGI HTTP `scope` whose whole (de-chunked) body is `body`."""
    server = scope.get('server') or ('localhost', 80)
    environ = {
        'REQUEST_METHOD': scope['method'], 'SCRIPT_NAME': '',
        'PATH_INFO': scope['path'].encode('utf-8').decode('latin-1'),  # WSGI's "bytes as latin-1" string
        'QUERY_STRING': scope.get('query_string', b'').decode('latin-1'),
        'SERVER_PROTOCOL': f'HTTP/{scope.get("http_version", "1.1")}', 'SERVER_NAME': str(server[0]),
        'SERVER_PORT': str(server[1]), 'REMOTE_ADDR': (scope.get('client') or ('', 0))[0],
        'CONTENT_LENGTH': str(len(body)),
        'wsgi.version': (1, 0), 'wsgi.url_scheme': scope.get('scheme', 'http'), 'wsgi.input': io.BytesIO(body),
        'wsgi.errors': sys.stderr, 'wsgi.multithread': True, 'wsgi.multiprocess': False, 'wsgi.run_once': False,
    }
    for name, value in scope['headers']:
        key = name.decode('latin-1').upper().replace('-', '_')
        if key in ('CONTENT_LENGTH', 'TRANSFER_ENCODING'):
            continue  # the body is whole and de-chunked: its length is CONTENT_LENGTH above
        key = key if key == 'CONTENT_TYPE' else 'HTTP_' + key
        value = value.decode('latin-1')
        environ[key] = f'{environ[key]},{value}' if key in environ else value
    return environ
