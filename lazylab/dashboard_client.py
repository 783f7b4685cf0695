"""The trainer's side of the dashboard: point labml's ``app`` writer at a running `lazylab dashboard` (torch-free).

Below the experiments, the labml layer and the dashboard, which all use it (``lazylab train``'s and ``lazylab
labml``'s runs stream to a dashboard; ``lazylab.dashboard`` re-exports it); it reaches labml's internals only through
:mod:`lazylab.labml_internals`.

:func:`configure_app_writer` (or :func:`app_writer`, which only returns labml's `app_url`) points labml's ``app``
writer at a dashboard URL (``http://HOST:PORT``) after a quick socket check, so an unreachable server costs one
warning, not a hang. What arrives is what labml's tracker gets: the configs, every `tracker.save` indicator and the
run's standard output (the sampled text). A server that answers but is not a labml app (another web server on
that port, a proxy's error page) costs one warning and at most a few seconds too (:func:`labml_app_problem`).
A dashboard started with ``--token`` gets the token from ``$LAZYLAB_DASHBOARD_TOKEN`` as a header on each request
(:func:`send_token`); without it, one warning and training goes on without the dashboard. labml itself thins long
series (the client averages bursts late in a run, the app keeps at most 1024 points per series); metrics.jsonl
keeps them all.

    lazylab train transformer ... dashboard=http://127.0.0.1:5005
"""
import atexit
import http.client
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from lazylab import labml_internals, safe_yaml
from lazylab.errors import DashboardError

# late imports: PyYAML only when a run's configs are sent to the dashboard (the CLI's start-up)

#: the port `lazylab dashboard` serves on by default
DEFAULT_PORT = 5005
#: the environment variable holding a dashboard's token: the server's default --token, and what a run sends
TOKEN_ENV = 'LAZYLAB_DASHBOARD_TOKEN'
#: the request header that carries the token
TOKEN_HEADER = 'x-lazylab-token'

# The path segment labml's app wants before /track; the app ignores it (it reads a token from the query string only).
LABML_TOKEN = 'default'
# Seconds the end of a run may wait for the last metrics to reach the dashboard (the app answers each post after a
# fixed 3 s pause, so a healthy server needs two or three round trips).
FLUSH_TIMEOUT_S = 30.0
# Seconds the labml-app check may wait for one answer (the app answers a track post after its fixed 3 s pause).
PROBE_TIMEOUT_S = 5.0
# labml_app_problem's answer for a dashboard started with --token when this process does not send it.
NEEDS_TOKEN = 'refuses requests without its token'


def track_url(url: str) -> str:
    """labml's `app_url` for a dashboard at `url`.

    ``http://127.0.0.1:5005`` → ``http://127.0.0.1:5005/api/v1/default``; a URL that already has a path (e.g. a
    labml ``app_url`` ending in ``/api/v1/TOKEN``) is kept as given.

    Raises:
        DashboardError (a ValueError): `url` is not an http(s) URL with a host (the message names it).
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ('http', 'https') or not parts.hostname or parts.query:
        raise DashboardError(f"dashboard: expected a URL like http://127.0.0.1:{DEFAULT_PORT}, got {url!r}")
    if parts.path.strip('/'):
        return url.strip().rstrip('/')
    return f'{parts.scheme}://{parts.netloc}/api/v1/{LABML_TOKEN}'


def is_reachable(url: str, timeout: float = 1.0) -> bool:
    """True when a TCP connection to `url`'s host and port opens within `timeout` seconds."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == 'https' else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def labml_app_problem(app_url: str, timeout: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """None when the server at `app_url` (labml's ``…/api/v1/TOKEN``) answers as a labml app; else what it does
    instead, for a warning ('answers HTTP 404', 'answers with something that is not labml's JSON', 'does not
    answer within 5 s').

    Two questions, the second only when the first is not conclusive: GET ``…/api/v1/runs/TOKEN`` (a labml app
    answers at once with ``{"runs": […]}``), then what labml's own client does, a POST to ``…/track`` with an
    empty list and no run (a labml app answers a JSON object, e.g. "invalid run uuid", after its 3 s pause).
    """
    head, _, token = app_url.rstrip('/').rpartition('/')
    if head.endswith('/api/v1') and token:
        status, body = _ask(urllib.request.Request(f'{head}/runs/{token}'), timeout)
        if status == 200 and isinstance(body, dict) and 'runs' in body:
            return None
        if status == 401:
            return NEEDS_TOKEN
    request = urllib.request.Request(f'{app_url.rstrip("/")}/track?run_uuid=&labml_version=0', data=b'[]',
                                     headers={'Content-Type': 'application/json; charset=utf-8'})
    status, body = _ask(request, timeout)
    if status == 200 and isinstance(body, dict):
        return None
    if status is None:
        return body
    if status != 200:
        return f'answers HTTP {status}'
    return "answers with something that is not labml's JSON"


def _ask(request: urllib.request.Request, timeout: float):
    """(HTTP status, the JSON answer or None) of `request`; (None, what went wrong) when there is no answer."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read(1 << 20)
    except urllib.error.HTTPError as e:
        return e.code, None
    except (OSError, ValueError, http.client.HTTPException) as e:  # timeouts, resets, a reply that is not HTTP
        if isinstance(getattr(e, 'reason', e), (socket.timeout, TimeoutError)):
            return None, f'does not answer within {timeout:g} s'
        return None, f'does not answer as a web server ({type(e).__name__})'
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


class _TokenHeader(urllib.request.BaseHandler):
    """A urllib handler that adds the dashboard's token header to every request to the dashboard's origin (labml's
    client posts through urllib.request.urlopen, with no way to add a header of ours)."""

    def __init__(self, origin: tuple, token: str):
        self.origin, self.token = origin, token

    def http_request(self, request):
        if _origin(request.full_url) == self.origin:
            request.add_unredirected_header(TOKEN_HEADER, self.token)  # not sent on to where a redirect points
        return request

    https_request = http_request


def _origin(url: str) -> tuple:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or '').lower(), parts.port or (443 if parts.scheme == 'https' else 80)


def send_token(app_url: str, token: Optional[str]) -> None:
    """Make this process's urllib requests to `app_url`'s origin carry `token` (a `lazylab dashboard --token`),
    labml's uploads included; None: no token (the urllib opener is left as it is). Installs a process-wide urllib
    opener; requests to other origins go out as before."""
    if token is not None:
        urllib.request.install_opener(urllib.request.build_opener(_TokenHeader(_origin(app_url), token)))


def configured_app_url(search_from: Optional[Path] = None) -> Optional[str]:
    """The `app_url` a user configured for labml: env ``labml_app_url``, else the nearest ``.labml.yaml``
    from `search_from` (default: the working directory) up to the root; None when there is none."""
    env = os.environ.get('labml_app_url', '').strip()
    if env:
        return env
    path = Path(search_from or os.getcwd()).resolve()
    for folder in [path, *path.parents]:
        f = folder / '.labml.yaml'
        if f.is_file():
            conf = safe_yaml.load(f.read_text(encoding='utf-8')) or {}
            if conf.get('app_url'):
                return str(conf['app_url'])
    return None


def app_writer_settings(url: Optional[str] = None, *, search_from: Optional[Path] = None,
                        timeout: float = 1.0) -> Optional[dict[str, object]]:
    """labml lab settings that send a run to the dashboard, or None when there is no reachable dashboard.

    `url` is the `dashboard=` key (``http://HOST:PORT``); when empty, the user's labml `app_url` is used
    (:func:`configured_app_url`). If that server does not accept a TCP connection within `timeout` seconds, or
    answers but not as a labml app (:func:`labml_app_problem`), prints one warning to stderr and returns None:
    train without the app writer.

    Returns:
        ``{'app_url': ..., 'app_open_browser': False, 'app_track_frequency': 0}`` for
        :func:`lazylab.labml_internals.set_lab` (labml's lab settings).
    Raises:
        DashboardError (a ValueError): `url` is not an http(s) URL.
    """
    if not url:
        url = configured_app_url(search_from)
        if not url:
            return None
    app_url = track_url(url)
    send_token(app_url, os.environ.get(TOKEN_ENV) or None)
    if not is_reachable(app_url, timeout):
        print(f'lazylab: warning: labml dashboard at {url} is not reachable; training without it '
              f'(start one with: lazylab dashboard --port {urlsplit(app_url).port or 80})',
              file=sys.stderr, flush=True)
        return None
    problem = labml_app_problem(app_url)
    if problem == NEEDS_TOKEN:
        print(f'lazylab: warning: labml dashboard at {url} {problem}; training without it (set {TOKEN_ENV} to '
              f'its --token)', file=sys.stderr, flush=True)
        return None
    if problem is not None:
        print(f'lazylab: warning: {url} {problem}: it is not a labml dashboard; training without it '
              f'(start one with: lazylab dashboard --port {urlsplit(app_url).port or 80})',
              file=sys.stderr, flush=True)
        return None
    return {'app_url': app_url, 'app_open_browser': False, 'app_track_frequency': 0}


def app_writer(url: str) -> Optional[str]:
    """The trainer's hook: the labml `app_url` to give labml's ``app`` writer for dashboard `url`, or None.

    `url` is the `dashboard=` key or a `.labml.yaml` `app_url`. None (after ONE warning on stderr) when the server
    does not accept a TCP connection within a second: train without the app writer. When a URL is returned, the
    labml client is also adjusted for this process (see :func:`_adjust_labml_client`): no web browser is opened,
    and the end of the program waits at most ``FLUSH_TIMEOUT_S`` seconds for the last upload.

    Raises:
        DashboardError (a ValueError): `url` is not an http(s) URL (the message names it).
    """
    settings = app_writer_settings(url)
    if settings is None:
        return None
    _adjust_labml_client()
    return settings['app_url']


def configure_app_writer(url: Optional[str] = None, *, search_from: Optional[Path] = None,
                         timeout: float = 1.0) -> bool:
    """Point labml's ``app`` writer at the dashboard; True when the run should add ``'app'`` to its writers.

    For scripts that drive labml themselves: call before ``labml.experiment.create(..., writers={..., 'app'})``.
    When no dashboard is configured or it is unreachable (one warning), sets labml's `app_url` to nothing and
    returns False: leave ``'app'`` out of the writers.
    """
    settings = app_writer_settings(url, search_from=search_from, timeout=timeout)
    if settings is None:
        labml_internals.set_lab({'app_url': ''})  # also silences a .labml.yaml app_url
        return False
    labml_internals.set_lab(settings)
    _adjust_labml_client()
    return True


_ADJUSTED = False
_UPLOADS = []  # labml upload threads of the runs this process streamed to a dashboard


def _adjust_labml_client() -> None:
    """Make labml's app client safe to run from a training command (idempotent, this process only).

    - labml's upload threads become daemons (:func:`labml_internals.patch_client_upload_thread`), and at exit we
      wait at most ``FLUSH_TIMEOUT_S`` for them (:func:`wait_for_app_upload`): a dashboard that goes away mid-run
      cannot keep the finished process alive.
    - labml opens a web browser on the run's page by default; a training command prints the URL instead
      (:func:`labml_internals.patch_client_browser`).
    - labml's client prints its progress in colour with padding; it becomes plain lines (:class:`ClientConsole`).
    """
    global _ADJUSTED
    if _ADJUSTED:
        return
    _ADJUSTED = True
    labml_internals.patch_client_upload_thread(_UPLOADS)
    labml_internals.patch_client_browser()
    labml_internals.patch_client_console(ClientConsole())
    atexit.register(wait_for_app_upload, FLUSH_TIMEOUT_S)


class ClientConsole:
    """labml's app client's console lines as lazylab's: plain text, no colours, no padding, no progress dots, so
    that a log file reads as the terminal did (labml_internals.patch_client_console):

        labml dashboard: http://127.0.0.1:5005/run/UUID       the run's page, once the dashboard answered
        lazylab: warning: labml dashboard stopped answering; retrying (the run's files are complete)   (stderr, once)
        labml dashboard: caught up: all of the run is sent    when the last upload is through

    labml's "Still updating labml server…", "Updating App. Please wait..." and its blank lines say nothing more.
    """

    def __init__(self, out=None, err=None):
        self.out, self.err = out, err
        self.retrying = False

    def __call__(self, text: str) -> None:
        text = text.strip()
        if text.startswith('Monitor experiment at'):
            self._say(f'labml dashboard: {text[len("Monitor experiment at"):].strip()}', self.out or sys.stdout)
        elif text.startswith('Retrying again') and not self.retrying:
            self.retrying = True
            self._say("lazylab: warning: labml dashboard stopped answering; retrying (the run's files are complete)",
                      self.err or sys.stderr)
        elif text == 'Finished updating LabML App.':
            self._say('labml dashboard: caught up: all of the run is sent', self.out or sys.stdout)

    @staticmethod
    def _say(line: str, stream) -> None:
        print(line, file=stream, flush=True)


def wait_for_app_upload(timeout: float = FLUSH_TIMEOUT_S, threads=None) -> bool:
    """Wait up to `timeout` seconds in all for labml upload threads to send what they hold; True when all did.

    `threads`: labml ``_AppTrackThread`` objects (default: those of the runs this process streamed). Only threads
    whose run has finished are waited for (labml stops them then); an unfinished run's thread waits on its queue
    forever. Prints one warning when giving up.
    """
    deadline = time.monotonic() + timeout
    for t in list(_UPLOADS if threads is None else threads):
        if t.is_alive() and t.is_stopped:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                print(f'lazylab: warning: gave up sending the last metrics to the labml dashboard after '
                      f'{timeout:.0f} s; the run\'s local files are complete', file=sys.stderr, flush=True)
                return False
    return True
