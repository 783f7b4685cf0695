"""`lazylab dashboard`: labml's own dashboard app served over a file store, and the client hook that streams runs to it.

The server side runs the real labml app (PyPI ``labml-app``) unchanged except for its database: the app's set-up
function ``labml_app.db.init_mongo_db`` is replaced, before ``labml_app.flask_app`` is imported, by one that installs
``labml-db``'s file drivers (models pickled, one folder per model class; indexes as YAML files). So no MongoDB is
needed and the whole dashboard state is one folder (``--store``, default ``runs/.dashboard``).

The client side is for the trainer: :func:`configure_app_writer` (or :func:`app_writer`, which only returns labml's
`app_url`) points labml's ``app`` writer at a dashboard URL (``http://HOST:PORT``) after a quick socket check, so an
unreachable server costs one warning, not a hang. What arrives is what labml's tracker gets: the configs, every
`tracker.save` indicator and the run's standard output (the sampled text). labml itself thins long series (the
client averages bursts late in a run, the app keeps at most 1024 points per series); metrics.jsonl keeps them all.

    lazylab dashboard [--port 5005] [--store DIR] [--host 127.0.0.1]
    lazylab train transformer ... dashboard=http://127.0.0.1:5005
"""
import argparse
import atexit
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Dict, Optional
from urllib.parse import urlsplit

DEFAULT_PORT = 5005
DEFAULT_HOST = '127.0.0.1'
DEFAULT_STORE = os.path.join('runs', '.dashboard')
# The path segment labml's app wants before /track; the app ignores it (it reads a token from the query string only).
LABML_TOKEN = 'default'
INSTALL_HINT = "pip install 'lazylab[dashboard]'"
# Seconds the end of a run may wait for the last metrics to reach the dashboard (the app answers each post after a
# fixed 3 s pause, so a healthy server needs two or three round trips).
FLUSH_TIMEOUT_S = 30.0


# ----------------------------------------------------------------------------------------------------------------
# Server


def _require_app():
    """Import check for the optional extra; returns an error line, or None when labml-app and labml-db are here."""
    try:
        import labml_db  # noqa: F401
        import uvicorn  # noqa: F401
        import labml_app  # noqa: F401
    except ImportError as e:
        return f'lazylab: error: the dashboard needs labml\'s app ({e.name} is missing): {INSTALL_HINT}'
    return None


def install_file_store(store: Path) -> None:
    """Replace the labml app's MongoDB set-up with labml-db's file drivers rooted at `store`.

    Must run before ``labml_app.flask_app`` is imported: that module calls ``db.init_mongo_db()`` at import time.
    Layout: ``store/models/<ModelClass>/<key>.pkl`` (pickle: the app keeps numpy arrays in its models) and
    ``store/indexes/<IndexClass>.yaml``.
    """
    from labml_db import Model, Index
    from labml_db.driver.file import FileDbDriver
    from labml_db.index_driver.file import FileIndexDbDriver
    from labml_db.serializer.pickle import PickleSerializer
    from labml_db.serializer.yaml import YamlSerializer
    from labml_app import db, settings
    from labml_app.db import project, user

    store = Path(store).resolve()

    def init_file_db(*args, **kwargs):
        Model.set_db_drivers([FileDbDriver(PickleSerializer(), m, store / 'models' / m.__name__)
                              for m in db.models])
        Index.set_db_drivers([FileIndexDbDriver(YamlSerializer(), i, store / 'indexes' / f'{i.__name__}.yaml')
                              for i in db.indexes])
        project.create_project(settings.FLOAT_PROJECT_TOKEN, 'float project')
        project.create_project(settings.SAMPLES_PROJECT_TOKEN, 'samples project')
        # A local app has no login: every page acts as the user 'local' and lists that user's first project.
        # labml clients send no project token (labml rejects '?' in app_url, and the app reads the token from the
        # query string only), so the app would file their runs as unclaimed, in its floating project ("will be
        # deleted in 12 hours"). Register the empty token as the local user's project: runs are then claimed by
        # that user and listed on the home page.
        local = user.get_or_create_user(identifier='local', is_local_user=True)
        if project.ProjectIndex.get('') is None:
            project.ProjectIndex.set('', local.projects[0])
        return None

    db.init_mongo_db = init_file_db


# The labml web page loads three files from CDNs; `--assets DIR` serves them from DIR instead (no internet needed).
# URL in labml-app 0.5.14's index.html → file under DIR (npm: d3@6.7.0 dist/d3.min.js, bootstrap@5.0.0-beta2
# dist/css/bootstrap.min.css, @fortawesome/fontawesome-free@5.9.0 css/ and webfonts/).
CDN_ASSETS = {
    'https://d3js.org/d3.v6.min.js': 'd3.v6.min.js',
    'https://cdn.jsdelivr.net/npm/bootstrap@5.0.0-beta2/dist/css/bootstrap.min.css': 'bootstrap.min.css',
    'https://cdnjs.cloudflare.com/ajax/libs/font-awesome/5.9.0/css/all.css': 'fontawesome/css/all.css',
}


def missing_assets(assets: Path):
    """Files of CDN_ASSETS (and Font Awesome's webfonts folder) that `assets` lacks."""
    needed = list(CDN_ASSETS.values()) + ['fontawesome/webfonts']
    return [name for name in needed if not (Path(assets) / name).exists()]


def _offline_static(static: Path, assets: Path, dest: Path) -> Path:
    """A copy of the app's static folder (as symlinks) whose index.html loads the CDN files from /vendor/."""
    import shutil
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for entry in static.iterdir():
        if entry.name != 'index.html':
            (dest / entry.name).symlink_to(entry.resolve())
    (dest / 'vendor').symlink_to(Path(assets).resolve())
    html = (static / 'index.html').read_text(encoding='utf-8')
    for url, name in CDN_ASSETS.items():
        html = html.replace(url, f'/vendor/{name}')
    # Subresource-integrity hashes name the CDN's bytes; a local copy is trusted as it is.
    html = re.sub(r'\s(integrity|crossorigin)="[^"]*"', '', html)
    (dest / 'index.html').write_text(html, encoding='utf-8')
    return dest


def create_app(store: Path, host: str, port: int, assets: Optional[Path] = None):
    """Import the labml app (a FastAPI object) over the file store in `store`; returns it.

    `assets`: a folder with the page's CDN files (see CDN_ASSETS) to serve instead of the internet ones.
    """
    # labml_app.settings reads these at import.
    os.environ['LABML_APP_SERVER_IP'] = host
    os.environ['LABML_APP_SERVER_PORT'] = str(port)
    if 'labml_app.flask_app' in sys.modules:
        raise RuntimeError('labml_app.flask_app was imported before the file store was installed')
    install_file_store(store)
    import logging
    import warnings
    # The app averages empty series on some pages; numpy's warnings about that are noise in the terminal.
    warnings.filterwarnings('ignore', category=RuntimeWarning, module=r'numpy\..*')
    from labml_app.logger import logger as app_logger
    app_logger.setLevel(logging.WARNING)  # the app logs every request's timing at INFO
    from labml_app import flask_app
    if assets is not None:
        # The app's routes read this module global on every request.
        flask_app.STATIC_PATH = _offline_static(Path(flask_app.STATIC_PATH), assets, Path(store) / 'web')
    return flask_app.app


def serve(store: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, assets: Optional[Path] = None) -> None:
    """Serve the labml app until SIGINT/SIGTERM (uvicorn handles both and shuts down cleanly)."""
    import uvicorn
    app = create_app(store, host, port, assets)
    config = uvicorn.Config(app, host=host, port=port, workers=1, log_level='warning', access_log=False,
                            lifespan='off')
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM and then re-raises the signal to the handler found before it;
    # make that KeyboardInterrupt for both, so `main` ends with exit code 0 either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    shown_host = f'[{host}]' if ':' in host else host
    print(f'labml dashboard: http://{shown_host}:{port}  (store: {Path(store).resolve()})', flush=True)
    print(f'  train with: lazylab train NAME ... dashboard=http://{shown_host}:{port}   (Ctrl-C stops)',
          flush=True)
    server.run()


def main(argv=None) -> int:
    """`lazylab dashboard [--port 5005] [--store DIR] [--host 127.0.0.1]`; returns the exit code."""
    parser = argparse.ArgumentParser(prog='lazylab dashboard',
                                     description="Serve labml's dashboard app over a local file store.")
    parser.add_argument('--port', type=int, default=DEFAULT_PORT, help=f'TCP port (default {DEFAULT_PORT})')
    parser.add_argument('--host', default=DEFAULT_HOST,
                        help=f'address to bind (default {DEFAULT_HOST}: this machine only)')
    parser.add_argument('--store', default=DEFAULT_STORE,
                        help=f'folder holding the dashboard\'s data (default {DEFAULT_STORE})')
    parser.add_argument('--assets', default=None,
                        help='folder with the web page\'s CDN files (d3.v6.min.js, bootstrap.min.css, '
                             'fontawesome/css/all.css + fontawesome/webfonts/), for machines without internet')
    args = parser.parse_args(argv)
    error = _require_app()
    if error is not None:
        print(error, file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f'lazylab: error: --port must be in 1..65535, got {args.port}', file=sys.stderr)
        return 2
    if not _port_is_free(args.host, args.port):
        print(f'lazylab: error: {args.host}:{args.port} is already in use; choose another --port', file=sys.stderr)
        return 2
    if args.assets is not None and missing_assets(Path(args.assets)):
        print(f'lazylab: error: --assets {args.assets} lacks {", ".join(missing_assets(Path(args.assets)))}',
              file=sys.stderr)
        return 2
    try:
        serve(Path(args.store), args.host, args.port, None if args.assets is None else Path(args.assets))
    except KeyboardInterrupt:
        pass
    print('labml dashboard stopped', flush=True)
    return 0


def _port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# ----------------------------------------------------------------------------------------------------------------
# Client (used by the trainer)


def track_url(url: str) -> str:
    """labml's `app_url` for a dashboard at `url`.

    ``http://127.0.0.1:5005`` → ``http://127.0.0.1:5005/api/v1/default``; a URL that already has a path (e.g. a
    labml ``app_url`` ending in ``/api/v1/TOKEN``) is kept as given.

    Raises:
        ValueError: `url` is not an http(s) URL with a host (the message names it).
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ('http', 'https') or not parts.hostname or parts.query:
        raise ValueError(f"dashboard: expected a URL like http://127.0.0.1:{DEFAULT_PORT}, got {url!r}")
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


def configured_app_url(search_from: Optional[Path] = None) -> Optional[str]:
    """The `app_url` a user configured for labml: env ``labml_app_url``, else the nearest ``.labml.yaml``
    from `search_from` (default: the working directory) up to the root; None when there is none."""
    env = os.environ.get('labml_app_url', '').strip()
    if env:
        return env
    import yaml
    path = Path(search_from or os.getcwd()).resolve()
    for folder in [path, *path.parents]:
        f = folder / '.labml.yaml'
        if f.is_file():
            conf = yaml.safe_load(f.read_text(encoding='utf-8')) or {}
            if conf.get('app_url'):
                return str(conf['app_url'])
    return None


def app_writer_settings(url: Optional[str] = None, *, search_from: Optional[Path] = None,
                        timeout: float = 1.0) -> Optional[Dict[str, object]]:
    """labml lab settings that send a run to the dashboard, or None when there is no reachable dashboard.

    `url` is the `dashboard=` key (``http://HOST:PORT``); when empty, the user's labml `app_url` is used
    (:func:`configured_app_url`). If that server does not accept a TCP connection within `timeout` seconds,
    prints one warning to stderr and returns None: train without the app writer.

    Returns:
        ``{'app_url': ..., 'app_open_browser': False, 'app_track_frequency': 0}`` for
        ``labml.internal.lab.lab_singleton().set_configurations`` (or ``experiment.record(lab_conf=...)``).
    Raises:
        ValueError: `url` is not an http(s) URL.
    """
    if not url:
        url = configured_app_url(search_from)
        if not url:
            return None
    app_url = track_url(url)
    if not is_reachable(app_url, timeout):
        print(f'lazylab: warning: labml dashboard at {url} is not reachable; training without it '
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
        ValueError: `url` is not an http(s) URL (the message names it).
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
    from labml.internal.lab import lab_singleton
    settings = app_writer_settings(url, search_from=search_from, timeout=timeout)
    if settings is None:
        lab_singleton().set_configurations({'app_url': ''})  # also silences a .labml.yaml app_url
        return False
    lab_singleton().set_configurations(settings)
    _adjust_labml_client()
    return True


_ADJUSTED = False
_UPLOADS = []  # labml upload threads of the runs this process streamed to a dashboard


def _adjust_labml_client() -> None:
    """Make labml's app client safe to run from a training command (idempotent, this process only).

    - labml retries a failed upload forever (sleeping 10 s, 20 s, ...) on a non-daemon thread: a dashboard that
      goes away mid-run would keep the finished process alive. The thread becomes a daemon, and at exit we wait at
      most ``FLUSH_TIMEOUT_S`` for it (:func:`wait_for_app_upload`).
    - labml opens a web browser on the run's page by default; a training command prints the URL instead.
    """
    global _ADJUSTED
    if _ADJUSTED:
        return
    _ADJUSTED = True
    import labml.internal.app as labml_client
    import labml.internal.app.experiment as labml_client_experiment

    class DaemonAppTracker(labml_client.AppTracker):
        def __init__(self, app_track_url, params, *, timeout_seconds=15, daemon=True):
            super().__init__(app_track_url, params, timeout_seconds=timeout_seconds, daemon=True)

        def _check(self) -> bool:
            ok = super()._check()
            if self.thread is not None and self.thread not in _UPLOADS:
                _UPLOADS.append(self.thread)
            return ok

    class PrintOnlyUrlHandler(labml_client_experiment.AppUrlResponseHandler):
        def __init__(self, open_browser: bool, label: str):
            super().__init__(False, label)

    # labml's experiment looks AppTracker up in this module when a run starts; AppExperiment looks the handler up
    # in its own module.
    labml_client.AppTracker = DaemonAppTracker
    labml_client_experiment.AppUrlResponseHandler = PrintOnlyUrlHandler
    atexit.register(wait_for_app_upload, FLUSH_TIMEOUT_S)


def wait_for_app_upload(timeout: float = FLUSH_TIMEOUT_S, threads=None) -> bool:
    """Wait up to `timeout` seconds in all for labml upload threads to send what they hold; True when all did.

    `threads`: labml ``_AppTrackThread`` objects (default: those of the runs this process streamed). Only threads
    whose run has finished are waited for (labml stops them then); an unfinished run's thread waits on its queue
    forever. Prints one warning when giving up.
    """
    import time
    deadline = time.monotonic() + timeout
    for t in list(_UPLOADS if threads is None else threads):
        if t.is_alive() and t.is_stopped:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                print(f'lazylab: warning: gave up sending the last metrics to the labml dashboard after '
                      f'{timeout:.0f} s; the run\'s local files are complete', file=sys.stderr, flush=True)
                return False
    return True


if __name__ == '__main__':
    sys.exit(main())
