"""`lazylab dashboard` as an attacker on loopback tries it (issue 24): the real server on 127.0.0.1, requests written
as bytes on a socket (no client library to normalise the path in between).

- No file outside the web folder, however the path is spelled (``..``, ``%2f``, ``%5c``, backslashes, absolute
  paths, NUL bytes) or wherever a symlink in the web folder leads.
- A malformed JSON body, on every labml-app 0.5.14 route that parses one, is a 400 with a short JSON body; its
  traceback is in the server's log, once.
- A body over the limit is a 413, before it is read (Content-Length) or as soon as it passes the limit (chunked),
  on both ports, and the server reads no more of it: its memory does not grow by it (issue 34).
- A request whose head does not come within --header-timeout is answered 408 and closed, on both ports, while
  other requests are served; a slow answer and a kept-alive connection are not cut (issue 34).
- A made-up run or session uuid on a route that writes is a 404, and a field of the wrong type a 400 (issue 34).
- With ``--token``, a request without it is a 401; a browser passes it once as ``?token=``, which sets a cookie.
"""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.client import HTTPConnection
from pathlib import Path

import hypothesis
import hypothesis.strategies as st
import pytest

from lazylab.dashboard.labml_patches import static_file

REPO = Path(__file__).resolve().parents[2]
TRACEBACK = 'Traceback (most recent call last)'
TOKEN = 'a-test-token-of-32-characters-xx'


class Response:
    def __init__(self, raw: bytes):
        head, _, self.body = raw.partition(b'\r\n\r\n')
        lines = head.decode('latin-1').split('\r\n')
        self.status = int(lines[0].split()[1])
        self.headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(':')
            self.headers.setdefault(name.strip().lower(), []).append(value.strip())

    def json(self):
        return json.loads(self.body)

    def header(self, name: str) -> str:
        return self.headers[name][0]


def raw_request(port: int, request: bytes, timeout: float = 30) -> Response:
    """Send `request` (the request line, headers and body, as bytes) to 127.0.0.1:`port`; read until the server
    closes the connection (each request says ``Connection: close``)."""
    with socket.create_connection(('127.0.0.1', port), timeout=timeout) as s:
        s.sendall(request)
        return Response(_read_all(s))


def _read_all(s: socket.socket) -> bytes:
    data = b''
    while True:
        try:
            chunk = s.recv(1 << 16)
        except ConnectionResetError:  # after a 413 the server closes with the rest of the body unread
            break
        if not chunk:
            break
        data += chunk
    return data


def http(method: str, target: bytes, body: bytes = b'', headers: bytes = b'') -> bytes:
    """A request as bytes: `target` goes into the request line exactly as given."""
    return (method.encode() + b' ' + target + b' HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n' + headers +
            (b'Content-Type: application/json\r\nContent-Length: %d\r\n' % len(body) if body or method != 'GET'
             else b'') + b'\r\n' + body)


class Dashboard:
    """A `lazylab dashboard` subprocess on a free loopback port; its stdout and stderr go to `log`."""

    def __init__(self, ports, cwd: Path, store: Path, *flags: str, env: dict = None):
        self.port, self.studies_port = ports.free(), ports.free()
        self.log = cwd / f'dashboard-{self.port}.log'
        self._out = open(self.log, 'w')
        self.proc = subprocess.Popen(
            [sys.executable, '-m', 'lazylab.cli', 'dashboard', '--port', str(self.port), '--store', str(store),
             '--studies-port', str(self.studies_port), '--runs-dir', str(cwd / 'runs'), *flags],
            cwd=cwd, env=env or _env(), stdout=self._out, stderr=subprocess.STDOUT, text=True)
        try:
            ports.wait(self.port, self.proc, 'the dashboard')
            ports.wait(self.studies_port, self.proc, 'the studies')
        except AssertionError as e:
            raise AssertionError(f'{e}\n{self.log.read_text()[-3000:]}') from None
        self.url = f'http://127.0.0.1:{self.port}'

    def request(self, request: bytes, timeout: float = 30, port: int = None) -> Response:
        return raw_request(port or self.port, request, timeout)

    def log_of(self, request: bytes) -> tuple[Response, str]:
        """Send `request`; return its answer and what the server logged meanwhile (the guard writes its lines
        before it answers)."""
        before = self.log.stat().st_size
        response = self.request(request)
        with open(self.log, encoding='utf-8', errors='replace') as f:
            f.seek(before)
            return response, f.read()

    def memory_peak_kib(self) -> int:
        """The server's peak resident memory so far (VmHWM, KiB)."""
        status = Path(f'/proc/{self.proc.pid}/status').read_text()
        return int(re.search(r'^VmHWM:\s+(\d+) kB', status, re.M).group(1))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()
        return self.proc.returncode


def _env(**extra) -> dict:
    env = dict(os.environ, LABML_DISABLE_GIT='1', PYTHONUNBUFFERED='1', **extra)
    env.pop('LAZYLAB_DASHBOARD_TOKEN', None)
    env.update(extra)
    env['PYTHONPATH'] = os.pathsep.join([str(REPO), env.get('PYTHONPATH', '')])
    return env


def _labml_version() -> str:
    from importlib.metadata import version
    return version('labml')


RUN_UUID = 'a' * 32
SESSION_UUID = 'b' * 32
COMPUTER_UUID = 'c' * 32
COMPUTER_ANALYSES = ('cpu', 'gpu', 'memory', 'network', 'disk', 'process', 'battery')


@pytest.fixture(scope='module')
def dashboard(tmp_path_factory, ports):
    """One dashboard for the module (default flags), with one run (with standard output, error and logger text) and
    one computer session (with its analyses) in its store, so that every body route gets as far as parsing the
    body; and a secret file beside (not inside) its web folder."""
    root = tmp_path_factory.mktemp('guard')
    (root / 'secret.txt').write_text('the secret: 7f3a9c\n')
    d = Dashboard(ports, root, root / 'store')
    d.root = root
    version = _labml_version()
    run = d.request(http('POST', f'/api/v1/default/track?run_uuid={RUN_UUID}&labml_version={version}'.encode(),
                         json.dumps([{'name': 'probe', 'time': time.time(), 'stdout': 'out', 'stderr': 'err',
                                      'logger': 'log'}]).encode()))
    computer = d.request(http('POST', f'/api/v1/default/computer?session_uuid={SESSION_UUID}&computer_uuid='
                                      f'{COMPUTER_UUID}&labml_version={version}'.encode(),
                              json.dumps([{'name': 'probe', 'time': time.time()}]).encode()))
    assert (run.status, computer.status) == (200, 200), (run.body, computer.body)
    for kind in COMPUTER_ANALYSES:  # each analysis (and its preferences) is made on its first GET
        assert d.request(http('GET', f'/api/v1/{kind}/{SESSION_UUID}'.encode())).status == 200, kind
    yield d
    assert d.stop() == 0, d.log.read_text()[-3000:]


# ------------------------------------------------------------------ files outside the web folder

def _traversals(secret: Path) -> list[bytes]:
    """Request targets that, joined naively to the web folder, name `secret` (an absolute path)."""
    rel = str(secret).lstrip('/')
    up = 20  # more `..` than any folder is deep
    enc = rel.replace('/', '%2f')
    return [
        ('/' + '../' * up + rel).encode(),
        ('/' + '..%2f' * up + enc).encode(),
        ('/' + '..%2F' * up + rel.replace('/', '%2F')).encode(),
        ('/' + '%2e%2e%2f' * up + enc).encode(),
        ('/' + '..%5c' * up + rel.replace('/', '%5c')).encode(),
        ('/' + '..\\' * up + rel.replace('/', '\\')).encode(),
        ('/js/' + '..%2f' * up + enc).encode(),  # from inside a folder of the web page
        ('/api/v1/' + '..%2f' * up + enc).encode(),  # below the API's prefix, which the catch-all also serves
        ('//' + rel).encode(),
        ('/%2f' + enc).encode(),
        ('/' + '..%2f' * up + enc + '%00.js').encode(),
    ]


TRAVERSAL_IDS = ['dot-dot', 'enc-2f', 'enc-2F', 'enc-dots', 'enc-5c', 'backslash', 'from-js', 'from-api', 'absolute',
                 'absolute-enc', 'nul']


@pytest.mark.parametrize('which', range(len(TRAVERSAL_IDS)), ids=TRAVERSAL_IDS)
@pytest.mark.parametrize('target', ['secret', 'passwd'])
def test_no_file_outside_the_web_folder(dashboard, which, target):
    secret = dashboard.root / 'secret.txt' if target == 'secret' else Path('/etc/passwd')
    r = dashboard.request(http('GET', _traversals(secret)[which]))
    assert r.status == 404 and r.json() == {'error': 'not found'}, (r.status, r.body[:200])


def test_the_web_page_is_still_served(dashboard):
    from importlib.util import find_spec

    from lazylab.dashboard import CDN_ASSETS, assets
    static = Path(find_spec('labml_app').origin).parent / 'static'
    index = (static / 'index.html').read_bytes()
    for url, name in CDN_ASSETS.items():  # the page's third-party files are served from here, never a CDN
        index = index.replace(url.encode(), f'/vendor/{name}'.encode())
    index = re.sub(rb'\s(integrity|crossorigin)="[^"]*"', b'', index)
    assert dashboard.request(http('GET', b'/')).body == index
    r = dashboard.request(http('GET', b'/vendor/d3.v6.min.js'))
    assert (r.status, r.body) == (200, (assets.VENDOR / 'd3.v6.min.js').read_bytes())
    # the page's own routes are pages of index.html; a real file is itself
    assert dashboard.request(http('GET', f'/run/{RUN_UUID}'.encode())).body == index
    asset = next(p for p in sorted(static.rglob('*')) if p.is_file() and p.name != 'index.html')
    r = dashboard.request(http('GET', b'/' + str(asset.relative_to(static)).encode()))
    assert (r.status, r.body) == (200, asset.read_bytes())


def test_symlinks_out_of_the_web_folder_are_refused(tmp_path, ports):
    """`--assets`: the web folder is a folder of symlinks into the app's static folder, plus `vendor` → the assets
    folder; those lead where they may. A symlink planted in either that leads elsewhere is refused."""
    assets = tmp_path / 'assets'
    for name in ('d3.v6.min.js', 'bootstrap.min.css', 'fontawesome/css/all.css', 'fontawesome/webfonts/f.woff2'):
        (assets / name).parent.mkdir(parents=True, exist_ok=True)
        (assets / name).write_text(f'/* {name} */')
    outside = tmp_path / 'outside'
    outside.mkdir()
    (outside / 'secret.txt').write_text('the secret: 7f3a9c\n')
    d = Dashboard(ports, tmp_path, tmp_path / 'store', '--assets', str(assets))
    try:
        web = tmp_path / 'store' / 'web'
        (web / 'leak.txt').symlink_to(outside / 'secret.txt')
        (web / 'leakdir').symlink_to(outside)
        (assets / 'leak.css').symlink_to(outside / 'secret.txt')
        for target in (b'/leak.txt', b'/leakdir/secret.txt', b'/vendor/leak.css'):
            r = d.request(http('GET', target))
            assert r.status == 404 and r.json() == {'error': 'not found'}, (target, r.status, r.body[:200])
        # what the web folder's own links lead to is served
        assert d.request(http('GET', b'/vendor/d3.v6.min.js')).body == b'/* d3.v6.min.js */'
        assert d.request(http('GET', b'/vendor/fontawesome/css/all.css')).body == b'/* fontawesome/css/all.css */'
    finally:
        assert d.stop() == 0, d.log.read_text()[-3000:]


# ------------------------------------------------------------------ malformed bodies

def _body_routes(version: str) -> list[tuple[str, str]]:
    """(method, target) of every labml-app 0.5.14 route that parses a JSON body (the list is pinned against the
    app's source in test_labml_patches.py), on the module's run and session."""
    return [
        ('POST', f'/api/v1/default/track?run_uuid={RUN_UUID}&labml_version={version}'),
        ('POST', f'/api/v1/default/computer?session_uuid={SESSION_UUID}&computer_uuid={COMPUTER_UUID}'
                 f'&labml_version={version}'),
        ('POST', '/api/v1/runs/archive'), ('POST', '/api/v1/runs/unarchive'), ('PUT', '/api/v1/runs'),
        ('PUT', '/api/v1/sessions'), ('POST', f'/api/v1/run/{RUN_UUID}'), ('POST', f'/api/v1/session/{SESSION_UUID}'),
        ('POST', '/api/v1/user'), ('POST', '/api/v1/auth/user'),
        ('POST', f'/api/v1/metrics/{RUN_UUID}'), ('POST', f'/api/v1/metrics/preferences/{RUN_UUID}'),
        ('POST', f'/api/v1/compare/metrics/{RUN_UUID}'), ('POST', f'/api/v1/compare/preferences/{RUN_UUID}'),
        ('POST', f'/api/v1/custom_metrics/{RUN_UUID}'), ('POST', f'/api/v1/custom_metrics/{RUN_UUID}/create'),
        ('POST', f'/api/v1/custom_metrics/{RUN_UUID}/delete'),
        *[('POST', f'/api/v1/{kind}/preferences/{SESSION_UUID}')
          for kind in COMPUTER_ANALYSES],
        *[('POST', f'/api/v1/logs/{log}/{RUN_UUID}{opt}') for log in ('stdout', 'stderr', 'std_logger')
          for opt in ('', '/opt')],
    ]


BODY_ROUTES = _body_routes('VERSION')
MALFORMED = {'syntax': b'{"run_uuids": [', 'empty': b'', 'not-utf8': b'{"\xff\xfe": 1}', 'not-json': b'hello'}


@pytest.mark.parametrize('body', list(MALFORMED), ids=list(MALFORMED))
@pytest.mark.parametrize('route', range(len(BODY_ROUTES)), ids=[f'{m} {t.split("?")[0]}' for m, t in BODY_ROUTES])
def test_malformed_json_is_a_400_with_a_json_message(dashboard, route, body):
    method, target = _body_routes(_labml_version())[route]
    r, log = dashboard.log_of(http(method, target.encode(), MALFORMED[body]))
    assert (r.status, r.header('content-type')) == (400, 'application/json'), r.body[:300]
    assert r.json() == {'error': 'malformed JSON body'}
    path = target.split('?')[0]
    assert log.startswith(f"lazylab dashboard: {method} '{path}': 400 malformed JSON body\n"), log[:300]
    assert log.count(TRACEBACK) == 1 and log.count('lazylab dashboard:') == 1, log


@pytest.mark.parametrize('body', [b'[]', b'{}', b'{"run_uuids": 7}'], ids=['list', 'no-key', 'wrong-type'])
def test_json_of_the_wrong_shape_is_a_400(dashboard, body):
    r, log = dashboard.log_of(http('POST', b'/api/v1/runs/archive', body))
    assert (r.status, r.json()) == (400, {'error': 'JSON body not understood by this route'})
    assert b'Traceback' not in r.body and log.count(TRACEBACK) == 1


def test_any_other_exception_is_a_500_without_its_traceback(dashboard):
    """labml-app 0.5.14's computer route passes its login's `token` to a function that takes none, whatever the
    computer: its TypeError is the app's (500), still without a traceback in the answer."""
    r, log = dashboard.log_of(http('GET', f'/api/v1/computer/{COMPUTER_UUID}'.encode()))
    assert (r.status, r.json()) == (500, {'error': 'internal server error (the traceback is in the server log)'})
    assert log.count(TRACEBACK) == 1 and "TypeError: get_computer() got an unexpected keyword argument 'token'" in log


def test_a_rank_that_is_not_an_integer_is_a_400(dashboard):
    """labml's track route parsed `rank` with int() unchecked: a 500 before."""
    r, log = dashboard.log_of(http('POST', f'/api/v1/default/track?run_uuid={RUN_UUID}&rank=one'.encode(), b'[]'))
    assert (r.status, r.json(), log) == (400, {'error': "rank must be an integer, got 'one'"}, '')


def test_good_requests_still_work(dashboard):
    r = dashboard.request(http('POST', f'/api/v1/metrics/{RUN_UUID}'.encode(),
                               json.dumps({'get_all': True, 'indicators': [], 'current_uuid': ''}).encode()))
    assert r.status == 200 and r.json()['series'] == []
    r = dashboard.request(http('GET', b'/api/v1/runs/null'))
    assert [run['run_uuid'] for run in r.json()['runs']] == [RUN_UUID]


# ------------------------------------------------------------------ routes that write: the run named, the fields' types

#: (method, target with {} for the uuid, what the uuid names, body) of labml-app's routes that write to a run or a
#: session named in the path
WRITE_ROUTES = [('POST', '/api/v1/run/{}', 'run', b'{"name": "x"}'), ('PUT', '/api/v1/run/{}/claim', 'run', b''),
                ('PUT', '/api/v1/run/{}/add', 'run', b''), ('POST', '/api/v1/session/{}', 'session', b'{"name": "x"}'),
                ('PUT', '/api/v1/session/{}/claim', 'session', b''), ('PUT', '/api/v1/session/{}/add', 'session', b'')]


@pytest.mark.parametrize('made_up', ['x', 'f' * 32], ids=['short', 'uuid-like'])
@pytest.mark.parametrize('route', range(len(WRITE_ROUTES)), ids=[f'{m} {t}' for m, t, _, _ in WRITE_ROUTES])
def test_a_made_up_uuid_on_a_route_that_writes_is_a_404_in_one_line(dashboard, route, made_up):
    """Before: 500 (edit, claim: an AttributeError on None, its traceback in the log), or 200 doing nothing."""
    method, target, kind, body = WRITE_ROUTES[route]
    r, log = dashboard.log_of(http(method, target.format(made_up).encode(), body))
    assert (r.status, r.header('content-type')) == (404, 'application/json') and b'\n' not in r.body
    assert r.json() == {'error': f"no {kind} '{made_up}' on this dashboard"} and log == ''
    assert [run['run_uuid'] for run in dashboard.request(http('GET', b'/api/v1/runs/null')).json()['runs']] == [
        RUN_UUID]


RUN_FIELDS = ('name', 'comment', 'note', 'tags', 'favourite_configs', 'selected_configs')


def _stored(dashboard) -> tuple[dict, dict]:
    """The module's run's and session's fields that the routes below write."""
    run = dashboard.request(http('GET', f'/api/v1/run/{RUN_UUID}'.encode())).json()
    session = dashboard.request(http('GET', f'/api/v1/session/{SESSION_UUID}'.encode())).json()
    return {k: run[k] for k in RUN_FIELDS}, {k: session[k] for k in ('name', 'comment')}


TRACK = f'/api/v1/default/track?run_uuid={RUN_UUID}&labml_version=VERSION'
COMPUTER = f'/api/v1/default/computer?session_uuid={SESSION_UUID}&computer_uuid={COMPUTER_UUID}&labml_version=VERSION'
WRONG_TYPES = [
    (f'/api/v1/run/{RUN_UUID}', {'name': {'x': 1}}, 'name must be a string, got an object'),
    (f'/api/v1/run/{RUN_UUID}', {'comment': ['a']}, 'comment must be a string, got a list'),
    (f'/api/v1/run/{RUN_UUID}', {'note': 3}, 'note must be a string, got a number'),
    (f'/api/v1/run/{RUN_UUID}', {'selected_configs': 'a'}, 'selected_configs must be a list of strings, got a string'),
    (f'/api/v1/run/{RUN_UUID}', {'favourite_configs': [1]}, 'favourite_configs must be a list of strings, got a list'),
    (f'/api/v1/run/{RUN_UUID}', ['name'], 'the body must be a JSON object, got a list'),
    (f'/api/v1/session/{SESSION_UUID}', {'name': True}, 'name must be a string, got true or false'),
    (TRACK, [{'time': 1.0}, {'tags': 'x'}], 'item 1: tags must be a list of strings, got a string'),
    (TRACK, {'name': {'x': 1}}, 'name must be a string, got an object'),
    (TRACK, 'x', 'the body must be a JSON object or a list of them, got a string'),
    (COMPUTER, [{'comment': {}}], 'item 0: comment must be a string, got an object'),
]


@pytest.mark.parametrize('case', range(len(WRONG_TYPES)), ids=[f'{t.split("?")[0]} {json.dumps(b)}'
                                                               for t, b, _ in WRONG_TYPES])
def test_a_field_of_the_wrong_type_is_a_400_in_one_line_and_nothing_is_stored(dashboard, case):
    """Before: {"name": {"x": 1}} became the run's name."""
    target, body, message = WRONG_TYPES[case]
    before = _stored(dashboard)
    r = dashboard.request(http('POST', target.replace('VERSION', _labml_version()).encode(), json.dumps(body).encode()))
    assert (r.status, r.json()) == (400, {'error': message}) and b'\n' not in r.body
    assert _stored(dashboard) == before


def test_fields_of_the_types_labmls_page_sends_are_stored(dashboard):
    r = dashboard.request(http('POST', f'/api/v1/run/{RUN_UUID}'.encode(), json.dumps(
        {'name': 'renamed', 'comment': 'a comment', 'note': None, 'favourite_configs': ['a'], 'selected_configs': [],
         'something_else': {'ignored': 1}}).encode()))
    assert (r.status, r.json()) == (200, {'errors': []})
    run, _ = _stored(dashboard)
    assert (run['name'], run['comment'], run['favourite_configs'], run['selected_configs']) == (
        'renamed', 'a comment', ['a'], [])


# ------------------------------------------------------------------ body limit

def test_a_declared_body_over_the_limit_is_413_before_it_is_sent(dashboard):
    """Content-Length says 50 MB; none of it is sent: the answer comes anyway (the server would wait for the body
    if it meant to read it)."""
    head = (b'POST /api/v1/runs/archive HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n'
            b'Content-Length: %d\r\n\r\n' % (50 << 20))
    r, log = dashboard.log_of(head)
    assert r.status == 413 and r.json() == {
        'error': 'request body over the limit of 16,777,216 bytes (lazylab dashboard --max-body-mb)'}
    assert log == "lazylab dashboard: POST '/api/v1/runs/archive': 413 request body too large\n"


#: per port: a route that reads a JSON body (the studies' one that writes: a study's note)
BODY_TARGETS = {'labml': ('POST', b'/api/v1/runs/archive'), 'studies': ('PUT', b'/api/studies/0/note')}


def _offer_chunked(port: int, method: str, target: bytes, frame: bytes, frames: int) -> tuple[Response, int]:
    """Send a chunked request of `frames` copies of `frame` (one chunk each) to `port` while reading the answer;
    returns the answer and how many bytes the kernel took from this client before the server closed."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)  # little held here: sent ≈ taken by the server
        s.settimeout(30)
        s.connect(('127.0.0.1', port))
        s.sendall(method.encode() + b' ' + target + b' HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json'
                  b'\r\nTransfer-Encoding: chunked\r\n\r\n')
        sent = [0]

        def send_body():
            try:
                for _ in range(frames):
                    view = memoryview(frame)
                    while view:
                        n = s.send(view)
                        sent[0] += n
                        view = view[n:]
                s.sendall(b'0\r\n\r\n')
            except OSError:  # the server closed the connection after its 413
                pass
        sender = threading.Thread(target=send_body)
        sender.start()
        r = Response(_read_all(s))
        sender.join(60)
    return r, sent[0]


@pytest.mark.parametrize('port', list(BODY_TARGETS))
def test_a_chunked_body_over_the_limit_is_413_and_read_no_further(tmp_path, ports, port):
    """300 MiB offered chunked (no Content-Length) against --max-body-mb 1: 413 with one line of JSON, and the
    server reads no further: the client gets no more into the connection than the limit and the kernel's buffers
    before it is closed (the studies port took all 300 MiB before), and the server's peak memory grows by much
    less than the body (112 → 247 MB before, on the studies port)."""
    d = Dashboard(ports, tmp_path, tmp_path / 'store', '--max-body-mb', '1')
    try:
        number = d.port if port == 'labml' else d.studies_port
        assert d.request(http('GET', b'/'), port=number).status in (200, 302)  # the first answer's imports are done
        peak = d.memory_peak_kib()
        chunk = b'[' + b'0,' * (1 << 19) + b'0]'  # 1 MiB of JSON
        r, sent = _offer_chunked(number, *BODY_TARGETS[port], b'%x\r\n' % len(chunk) + chunk + b'\r\n', 300)
        grown_mib = (d.memory_peak_kib() - peak) / 1024
        key = 'error' if port == 'labml' else 'reason'
        assert (r.status, r.header('content-type')) == (413, 'application/json') and b'\n' not in r.body
        assert r.json() == {key: 'request body over the limit of 1,048,576 bytes (lazylab dashboard --max-body-mb)'}
        assert sent < 48 << 20, f'the server took {sent / 2**20:.0f} MiB of a body refused after 1 MiB'
        assert grown_mib < 16, f'the server grew by {grown_mib:.0f} MiB for a 300 MiB body refused after 1 MiB'
    finally:
        assert d.stop() == 0, d.log.read_text()[-3000:]


# ------------------------------------------------------------------ the head's deadline

#: per port: (a GET that answers 200, the key of its JSON errors)
GET_TARGETS = {'labml': (b'/api/v1/runs/null', 'error'), 'studies': (b'/api/studies', 'reason')}


def test_half_sent_requests_are_closed_at_the_header_timeout_on_both_ports_while_others_are_served(tmp_path, ports):
    """50 requests whose head never ends and 5 connections that send nothing, per port, against --header-timeout
    3: a request sent meanwhile is answered; the half-sent ones get 408 and one line of JSON, the silent ones are
    closed, none before the deadline (before: all held for 30 s and more)."""
    timeout = 3.0
    d = Dashboard(ports, tmp_path, tmp_path / 'store', '--header-timeout', str(timeout))
    try:
        for number, (target, key) in ((d.port, GET_TARGETS['labml']), (d.studies_port, GET_TARGETS['studies'])):
            assert d.request(http('GET', target), port=number).status == 200  # the first answer's imports are done
            opened = time.monotonic()
            half = [socket.create_connection(('127.0.0.1', number), timeout=timeout + 30) for _ in range(50)]
            silent = [socket.create_connection(('127.0.0.1', number), timeout=timeout + 30) for _ in range(5)]
            for s in half:
                s.sendall(b'GET ' + target + b' HTTP/1.1\r\nHost: 127.0.0.1\r\n')  # no blank line: the head goes on
            r = d.request(http('GET', target), port=number)
            assert r.status == 200 and time.monotonic() - opened < timeout  # served while the 55 are held
            closed = []
            for s in half + silent:  # each read ends when the server closes (or raises at the socket's timeout)
                closed.append((_read_all(s), time.monotonic() - opened))
                s.close()
            answers = {Response(raw).body for raw, _ in closed[:50]}
            assert answers == {json.dumps({key: 'request head not complete within 3 s'}).encode()}
            assert {Response(raw).status for raw, _ in closed[:50]} == {408}
            assert [raw for raw, _ in closed[50:]] == [b''] * 5
            assert min(t for _, t in closed) >= timeout - 0.05, 'a connection was closed before its deadline'
    finally:
        assert d.stop() == 0, d.log.read_text()[-3000:]


def test_the_header_timeout_cuts_neither_a_slow_answer_nor_a_kept_alive_connection(tmp_path, ports):
    """--header-timeout 1: labml's track route, which answers 3 s after its request (its own wait), answers; a
    kept-alive connection idle for longer than the deadline between two requests (under uvicorn's keep-alive of
    5 s) serves the second, on both ports."""
    d = Dashboard(ports, tmp_path, tmp_path / 'store', '--header-timeout', '1')
    try:
        started = time.monotonic()
        r = d.request(http('POST', f'/api/v1/default/track?run_uuid={"d" * 32}&labml_version={_labml_version()}'
                           .encode(), json.dumps([{'name': 'slow', 'time': time.time()}]).encode()))
        assert (r.status, r.json()['errors']) == (200, []) and time.monotonic() - started >= 3
        for number, (target, _) in ((d.port, GET_TARGETS['labml']), (d.studies_port, GET_TARGETS['studies'])):
            connection = HTTPConnection('127.0.0.1', number, timeout=30)
            try:
                connection.request('GET', target.decode())
                first = connection.getresponse()
                first.read()
                kept = connection.sock
                time.sleep(2)  # the idle time under test: twice the head's deadline
                connection.request('GET', target.decode())
                second = connection.getresponse()
                second.read()
                assert (first.status, second.status) == (200, 200) and connection.sock is kept
            finally:
                connection.close()
    finally:
        assert d.stop() == 0, d.log.read_text()[-3000:]


# ------------------------------------------------------------------ token

def test_token_is_needed_on_every_request(tmp_path, ports):
    d = Dashboard(ports, tmp_path, tmp_path / 'store', '--token', TOKEN)
    try:
        for target in (b'/', b'/index.html', b'/api/v1/runs/null', b'/..%2f..%2fetc%2fpasswd'):
            r = d.request(http('GET', target))
            assert r.status == 401 and 'needs its token' in r.json()['error'], target
        wrong = TOKEN[:-1] + 'y'
        for headers in (f'X-Lazylab-Token: {wrong}\r\n', f'Cookie: lazylab_token={wrong}\r\n', ''):
            target = b'/api/v1/runs/null' + (b'?token=' + wrong.encode() if not headers else b'')
            assert d.request(http('GET', target, headers=headers.encode())).status == 401, headers
        # a client sends the header; a browser the token once in the address, then the cookie that sets
        assert d.request(http('GET', b'/api/v1/runs/null', headers=f'X-Lazylab-Token: {TOKEN}\r\n'.encode())
                         ).json()['runs'] == []
        r = d.request(http('GET', f'/run/x?a=1&token={TOKEN}'.encode()))
        assert r.status == 303 and r.header('location') == '/run/x?a=1'
        assert r.header('set-cookie') == f'lazylab_token={TOKEN}; Path=/; HttpOnly; SameSite=Strict'
        assert d.request(http('GET', b'/api/v1/runs/null', headers=f'Cookie: lazylab_token={TOKEN}\r\n'.encode())
                         ).json()['runs'] == []
        # the redirect stays on this server, whatever the path looks like
        for target in ('//elsewhere/', '/\\elsewhere/', '/\\/elsewhere/'):
            r = d.request(http('GET', f'{target}?token={TOKEN}'.encode()))
            assert r.header('location') == '/elsewhere/', target
        # a request that is not a page (a POST) may carry the token in its address too: no redirect then
        r = d.request(http('POST', f'/api/v1/runs/archive?token={TOKEN}'.encode(), b'{"run_uuids": []}'))
        assert (r.status, r.json()) == (200, {'is_successful': True})
    finally:
        assert d.stop() == 0, d.log.read_text()[-3000:]


def test_token_from_the_environment_and_a_training_run_that_sends_it(tmp_path, ports):
    """LAZYLAB_DASHBOARD_TOKEN is the server's --token and what `lazylab train` sends: the run arrives; a training
    process without it warns once and trains without the dashboard."""
    d = Dashboard(ports, tmp_path, tmp_path / 'store', env=_env(LAZYLAB_DASHBOARD_TOKEN=TOKEN))
    try:
        assert d.request(http('GET', b'/api/v1/runs/null')).status == 401
        text = tmp_path / 'tiny.txt'
        text.write_text((REPO / 'lazylab' / 'data' / 'tiny_shakespeare.txt').read_text(encoding='utf-8')[:5000])
        argv = [sys.executable, '-m', 'lazylab.cli', 'train', 'transformer', 'max_steps=3', 'd_model=16', 'heads=2',
                'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'valid_batches=1', 'sample_tokens=5',
                'device=cpu', f'text={text}', f'dashboard={d.url}']
        without = subprocess.run([*argv, f'runs_dir={tmp_path / "runs_without"}'], cwd=tmp_path, env=_env(),
                                 capture_output=True, text=True, timeout=300)
        assert without.returncode == 0, without.stderr[-3000:]
        assert [line for line in without.stderr.splitlines() if 'warning' in line] == [
            f'lazylab: warning: labml dashboard at {d.url} refuses requests without its token; training without it '
            f'(set LAZYLAB_DASHBOARD_TOKEN to its --token)']
        with_token = subprocess.run([*argv, f'runs_dir={tmp_path / "runs_with"}'], cwd=tmp_path,
                                    env=_env(LAZYLAB_DASHBOARD_TOKEN=TOKEN), capture_output=True, text=True,
                                    timeout=300)
        assert with_token.returncode == 0, with_token.stderr[-3000:]
        run_dir, = (tmp_path / 'runs_with' / 'transformer').iterdir()
        uuid = json.loads((run_dir / 'run.json').read_text())['uuid']
        request = urllib.request.Request(f'{d.url}/api/v1/runs/null', headers={'X-Lazylab-Token': TOKEN})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert [r['run_uuid'] for r in json.loads(answer.read())['runs']] == [uuid]
    finally:
        assert d.stop() == 0, d.log.read_text()[-3000:]


# ------------------------------------------------------------------ pins and properties

ROUTE_SCAN = r'''
import inspect, json, sys
from pathlib import Path
from lazylab.dashboard import server

def parses_body(f):
    """The endpoint reads the body as JSON itself, or through a helper of its module (update_run → _update_run)."""
    f = inspect.unwrap(f)
    helpers = [f.__globals__.get(n) for n in f.__code__.co_names]
    return any('request.json()' in inspect.getsource(g) for g in [f, *helpers] if inspect.isfunction(g))

app = server.create_app(Path(sys.argv[1]), '127.0.0.1', 1)
print(json.dumps(sorted([m, r.path] for r in app.routes if hasattr(r, 'endpoint') and parses_body(r.endpoint)
                        for m in r.methods)))
'''


def test_the_body_routes_tested_are_all_the_apps(tmp_path):
    """Every route of the installed labml app that parses a JSON body is in BODY_ROUTES (so a labml-app upgrade
    that adds one fails here until it is tested)."""
    out = subprocess.run([sys.executable, '-c', ROUTE_SCAN, str(tmp_path / 'store')], env=_env(), cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    templates = sorted([m, re.sub(r'\?.*', '', t).replace(RUN_UUID, '{run_uuid}').replace(SESSION_UUID,
                       '{session_uuid}').replace('/default/', '/{labml_token}/')] for m, t in BODY_ROUTES)
    assert json.loads(out.stdout) == templates


@pytest.fixture(scope='module')
def web(tmp_path_factory):
    """A web folder with a file, a folder, a symlink to a file in an allowed root and two symlinks leading out;
    returns (web folder, roots, the allowed root, the outside folder)."""
    base = tmp_path_factory.mktemp('web')
    web, allowed, outside = base / 'web', base / 'allowed', base / 'outside'
    for folder in (web / 'js', allowed, outside):
        folder.mkdir(parents=True)
    (web / 'index.html').write_text('index')
    (web / 'js' / 'app.js').write_text('app')
    (allowed / 'lib.js').write_text('lib')
    (outside / 'secret.txt').write_text('secret')
    (web / 'lib.js').symlink_to(allowed / 'lib.js')
    (web / 'out.txt').symlink_to(outside / 'secret.txt')
    (web / 'outdir').symlink_to(outside)
    return web, [web.resolve(), allowed.resolve()], allowed, outside


def test_static_file_answers(web):
    folder, roots, allowed, _ = web
    assert static_file(folder, 'js/app.js', roots) == (folder / 'js' / 'app.js').resolve()
    assert static_file(folder, 'lib.js', roots) == (allowed / 'lib.js').resolve()
    assert static_file(folder, 'run/0123', roots) == folder / 'index.html'  # a page of the web app
    assert static_file(folder, 'js', roots) == folder / 'index.html'  # a folder is no file to send
    for refused in ('out.txt', 'outdir/secret.txt', '../outside/secret.txt', 'js/../../outside/secret.txt',
                    '/etc/passwd', 'js\\app.js', 'js/app.js\x00', '..'):
        assert static_file(folder, refused, roots) is None, refused


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(path=st.lists(st.sampled_from(['..', '.', '', 'js', 'app.js', 'lib.js', 'out.txt', 'outdir',
                                                 'secret.txt', 'outside', 'web', 'x\\y', 'a\x00']), max_size=8))
def test_static_file_never_leaves_its_roots(web, path):
    folder, roots, _, outside = web
    answer = static_file(folder, '/'.join(path), roots)
    if answer is not None:
        real = Path(os.path.realpath(answer))
        assert any(real == root or root in real.parents for root in roots)
        assert outside.resolve() not in real.parents
