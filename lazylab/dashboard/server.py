"""`lazylab dashboard`: labml's own dashboard app served over a file store.

The server runs the real labml app (PyPI ``labml-app``) unchanged except for its database: before
``labml_app.flask_app`` is imported, :func:`labml_patches.patch_app_database` replaces the app's MongoDB set-up
with ``labml-db``'s file drivers (models pickled, one folder per model class; indexes as YAML files). So no MongoDB
is needed and the whole dashboard state is one folder (``--store``, default ``runs/.dashboard``).

    lazylab dashboard [--port 5005] [--store DIR] [--host 127.0.0.1] [--assets DIR] [--runs-dir runs]

Beside it, on ``--studies-port`` (default the next port), optuna-dashboard serves the studies of the sweeps under
``--runs-dir`` (:mod:`lazylab.dashboard.studies`).

The command line is read by :mod:`lazylab.cli.dashboard`, which calls :func:`run`.
"""
import asyncio
import contextlib
import errno
import ipaddress
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import Container
from pathlib import Path
from typing import Callable, Optional

from lazylab.dashboard import assets as page_assets
from lazylab.dashboard import labml_patches
from lazylab.dashboard.follower import RunFollower
from lazylab.dashboard.guard import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_BODY_MB
from lazylab.dashboard_client import DEFAULT_PORT, TOKEN_ENV
from lazylab.errors import DashboardError

# late imports: uvicorn and labml_app are the optional `dashboard` extra, and their logging set-up runs only when
# serving (so is lazylab.dashboard.serving, which imports uvicorn)

DEFAULT_HOST = '127.0.0.1'
DEFAULT_STORE = os.path.join('runs', '.dashboard')
DEFAULT_RUNS_DIR = 'runs'  # the sweeps whose studies are served
INSTALL_HINT = "pip install 'lazylab[dashboard]'"
# A token travels in a header, a cookie and a URL: these characters need no quoting in any of them.
_TOKEN_RE = re.compile(r'[A-Za-z0-9._~-]{16,}')

# The labml web page loads three files from CDNs; `--assets DIR` serves them from DIR instead (no internet needed).
# URL in labml-app 0.5.14's index.html → file under DIR (npm: d3@6.7.0 dist/d3.min.js, bootstrap@5.0.0-beta2
# dist/css/bootstrap.min.css, @fortawesome/fontawesome-free@5.9.0 css/ and webfonts/).
CDN_ASSETS = {
    'https://d3js.org/d3.v6.min.js': 'd3.v6.min.js',
    'https://cdn.jsdelivr.net/npm/bootstrap@5.0.0-beta2/dist/css/bootstrap.min.css': 'bootstrap.min.css',
    'https://cdnjs.cloudflare.com/ajax/libs/font-awesome/5.9.0/css/all.css': 'fontawesome/css/all.css',
}


def require_app() -> None:
    """Import check for the optional ``dashboard`` extra.

    Raises:
        DashboardError: labml-app, labml-db, uvicorn or optuna-dashboard is not installed (the message says what
            to install).
    """
    try:
        import labml_app  # noqa: F401
        import labml_db  # noqa: F401
        import optuna_dashboard  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise DashboardError(f"the dashboard needs labml's app and optuna-dashboard ({e.name} is missing): "
                             f"{INSTALL_HINT}") from None


def install_file_store(store: Path) -> None:
    """Make the labml app keep its database in files under `store` (see :func:`labml_patches.patch_app_database`).

    Must run before ``labml_app.flask_app`` is imported: that module sets up its database at import time.
    """
    labml_patches.patch_app_database(store)


def missing_assets(assets: Path) -> list[str]:
    """Files of CDN_ASSETS (and Font Awesome's webfonts folder) that `assets` lacks."""
    needed = list(CDN_ASSETS.values()) + ['fontawesome/webfonts']
    return [name for name in needed if not (Path(assets) / name).exists()]


#: labml-app 0.5.14's page reloads a running run's cards every 120 s (twice in its bundle: the timer's start and its
#: restart); a run followed from its files changes every second, so the dashboard's page reloads every REFRESH_S
BUNDLE = 'js/bundle.min.js'
BUNDLE_REFRESH = 'this.remainingTime=120'
REFRESH_S = 5


def _offline_static(static: Path, assets: Path, dest: Path, refresh_s: int = REFRESH_S) -> Path:
    """A copy of the app's static folder (as symlinks) whose index.html loads the CDN files from /vendor/, and
    whose bundle reloads a running run's page every `refresh_s` seconds.

    Raises:
        RuntimeError: the bundle's refresh timer is not where labml-app 0.5.14 has it.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for entry in static.iterdir():
        if entry.name not in ('index.html', 'js'):
            (dest / entry.name).symlink_to(entry.resolve())
    (dest / 'js').mkdir()
    for entry in (static / 'js').iterdir():
        if entry.name != Path(BUNDLE).name:
            (dest / 'js' / entry.name).symlink_to(entry.resolve())
    bundle = (static / BUNDLE).read_text(encoding='utf-8')
    if bundle.count(BUNDLE_REFRESH) != 2:
        raise RuntimeError(f'labml_app\'s {BUNDLE} has not its refresh timer ({BUNDLE_REFRESH}); is it 0.5.14?')
    (dest / BUNDLE).write_text(bundle.replace(BUNDLE_REFRESH, f'this.remainingTime={int(refresh_s)}'),
                               encoding='utf-8')
    (dest / 'vendor').symlink_to(Path(assets).resolve())
    html = (static / 'index.html').read_text(encoding='utf-8')
    for url, name in CDN_ASSETS.items():
        html = html.replace(url, f'/vendor/{name}')
    # Subresource-integrity hashes name the CDN's bytes; a local copy is trusted as it is.
    html = re.sub(r'\s(integrity|crossorigin)="[^"]*"', '', html)
    (dest / 'index.html').write_text(html, encoding='utf-8')
    return dest


def create_app(store: Path, host: str, port: int, assets: Optional[Path] = None, *,
               max_body_bytes: int = DEFAULT_MAX_BODY_MB << 20, token: Optional[str] = None,
               followed: Optional[Callable[[], Container[str]]] = None):
    """Import the labml app (a FastAPI object) over the file store in `store`, guarded; returns it.

    `assets`: a folder with the page's CDN files (see CDN_ASSETS); None: those lazylab installs
    (:mod:`lazylab.dashboard.assets`). Never the internet's.
    `max_body_bytes`, `token`: the request guard's body limit and secret (:class:`guard.RequestGuard`). The app
    serves no file outside its web folder (:func:`labml_patches.patch_app_static_route`), and its routes that write
    check the run or session they name and the types of the body's fields (:func:`labml_patches.patch_app_checks`).
    `followed`: the uuids of the runs followed from their files, whose streamed metrics the track route drops
    (:func:`labml_patches.patch_app_followed`).

    Raises:
        RuntimeError: ``labml_app.flask_app`` was imported already (its database would be MongoDB).
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
    app_static = Path(flask_app.STATIC_PATH)
    if assets is None:
        assets = page_assets.assemble(Path(store) / 'assets')
        roots = [page_assets.VENDOR, page_assets.font_awesome()]
    else:
        roots = [Path(assets)]
    # The web folder links the app's files and the assets folder: roots its symlinks may lead into.
    web = _offline_static(app_static, assets, Path(store) / 'web')
    labml_patches.patch_app_static_route(flask_app.app, web, [app_static, *roots])
    labml_patches.patch_app_checks(flask_app.app)
    labml_patches.patch_app_series_defaults()
    if followed is not None:
        labml_patches.patch_app_followed(flask_app.app, followed)
    labml_patches.patch_app_guard(flask_app.app, max_body_bytes=max_body_bytes, token=token)
    return flask_app.app


def serve(store: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, assets: Optional[Path] = None, *,
          max_body_bytes: int = DEFAULT_MAX_BODY_MB << 20, token: Optional[str] = None,
          runs_dir: Optional[Path] = None, studies_port: Optional[int] = None,
          header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S) -> None:
    """Serve the labml app until SIGINT/SIGTERM (uvicorn handles both and shuts down cleanly), and with `runs_dir`
    the studies of the sweeps under it with optuna-dashboard on `studies_port` (:mod:`lazylab.dashboard.studies`;
    the same host, token, body limit and `header_timeout_s`: :mod:`lazylab.dashboard.serving`)."""
    from lazylab.dashboard.serving import uvicorn_server  # imports uvicorn: only when serving
    from lazylab.dashboard.studies import StudiesServer, find_sweeps  # imports optuna: only when serving
    follower = None if runs_dir is None else RunFollower(runs_dir, store)
    app = create_app(store, host, port, assets, max_body_bytes=max_body_bytes, token=token,
                     followed=None if follower is None else follower.followed_uuids)
    server = uvicorn_server(app, host, port, header_timeout_s=header_timeout_s)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM and then re-raises the signal to the handler found before it;
    # make that KeyboardInterrupt for both, so `run` ends normally either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    shown_host = f'[{host}]' if ':' in host else host
    url = f'http://{shown_host}:{port}'
    studies = None
    if runs_dir is not None:
        studies = StudiesServer(runs_dir, host, studies_port or port + 1, labml_url=url,
                                max_body_bytes=max_body_bytes, token=token, header_timeout_s=header_timeout_s)
    shown_runs = '' if runs_dir is None else f'; every run under {runs_dir}, followed as it trains'
    print(f'labml dashboard: {url}  (store: {Path(store).resolve()}{shown_runs})', flush=True)
    if studies is not None:
        found = len(find_sweeps(runs_dir))
        print(f'studies: {studies.url}  (optuna-dashboard: {found} sweep{"" if found == 1 else "s"} under '
              f'{runs_dir}; sweeps started later appear too)', flush=True)
    if token is None:
        print(f'  train with: lazylab train NAME ... dashboard={url}   (Ctrl-C stops)', flush=True)
    else:
        print(f'  open once: {url}/?token=…  (the --token; it sets a cookie); train with {TOKEN_ENV} set and '
              f'dashboard={url}   (Ctrl-C stops)', flush=True)
    if studies is not None:
        studies.start()
    try:
        asyncio.run(_serve_and_follow(server, follower))
    finally:
        if studies is not None:
            studies.stop()


async def _serve_and_follow(server, follower: Optional[RunFollower]) -> None:
    """uvicorn's server, and the run follower in the same event loop (the app's database is written by one thread),
    until the server stops."""
    task = None if follower is None else asyncio.create_task(follower.follow())
    try:
        await server.serve()
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def is_loopback(host: str) -> bool:
    """True for 'localhost' and loopback addresses (127.0.0.0/8, ::1): a server bound there is this machine's."""
    if host.lower() == 'localhost':
        return True
    try:
        return ipaddress.ip_address(host.strip('[]')).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def host_warning(host: str, token: Optional[str]) -> Optional[str]:
    """The one-line warning `lazylab dashboard` prints for `--host` (None on a loopback address)."""
    if is_loopback(host):
        return None
    if token is None:
        return (f'lazylab: warning: --host {host} is not a loopback address and the dashboard has no '
                f'authentication: anyone who reaches this port can read and change it (add --token, or keep '
                f'{DEFAULT_HOST})')
    return (f'lazylab: warning: --host {host} is not a loopback address: the dashboard speaks plain HTTP, so its '
            f'token can be read on the way by anyone on the network')


def check(store: str, host: str, port: int, assets: Optional[str], max_body_mb: int, token: Optional[str],
          runs_dir: Optional[str] = None, studies_port: Optional[int] = None,
          header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S) -> None:
    """The checks `lazylab dashboard` makes before anything is written or bound (`studies_port` and `runs_dir`:
    those of the studies, when served).

    Raises:
        DashboardError: the ``dashboard`` extra is missing, a port is out of range or in use (or both are the
            same), `store` is empty or inside a file, `runs_dir` is inside a file, `assets` lacks files,
            `max_body_mb` is below 1, `header_timeout_s` is not a positive number of seconds, or the token is too
            short or has other characters; one line each, naming the value (never the token).
    """
    require_app()
    for flag, value in (('--port', port), ('--studies-port', studies_port)):
        if value is not None and not 0 < value < 65536:
            raise DashboardError(f'{flag} must be in 1..65535, got {value}')
    if studies_port == port:
        raise DashboardError(f'--studies-port {studies_port} is the labml dashboard\'s --port; choose another')
    existing = next(p for p in (Path(store), *Path(store).parents) if p.exists())  # '.' or '/' at the latest
    if not store or not existing.is_dir():
        raise DashboardError(f'--store {store!r}: ' + (f'{existing} is a file, not a folder' if store
                                                       else 'give a folder'))
    if runs_dir is not None:
        existing = next(p for p in (Path(runs_dir), *Path(runs_dir).parents) if p.exists())
        if not runs_dir or not existing.is_dir():
            raise DashboardError(f'--runs-dir {runs_dir!r}: ' + (f'{existing} is a file, not a folder' if runs_dir
                                                                 else 'give a folder'))
    for flag, value in (('--port', port), ('--studies-port', studies_port)):
        problem = None if value is None else _bind_problem(host, value, flag)
        if problem is not None:
            raise DashboardError(problem)
    if assets is not None and missing_assets(Path(assets)):
        raise DashboardError(f'--assets {assets} lacks {", ".join(missing_assets(Path(assets)))}')
    if assets is None and page_assets.missing():
        raise DashboardError(f'the web page\'s files are not installed ({", ".join(page_assets.missing())}): '
                             f'run `python {page_assets.__file__}` (fetches them), or give --assets DIR')
    if max_body_mb < 1:
        raise DashboardError(f'--max-body-mb must be at least 1, got {max_body_mb}')
    if not 0 < header_timeout_s < float('inf'):  # (also refuses nan)
        raise DashboardError(f'--header-timeout must be a positive number of seconds, got {header_timeout_s:g}')
    if token is not None and not _TOKEN_RE.fullmatch(token):
        # the token itself is not shown: it is a secret
        raise DashboardError(f'--token (or ${TOKEN_ENV}): use at least 16 letters, digits or - _ . ~ '
                             f'(e.g. python -c "import secrets; print(secrets.token_urlsafe())")')


def run(store: str = DEFAULT_STORE, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
        assets: Optional[str] = None, *, max_body_mb: int = DEFAULT_MAX_BODY_MB, token: Optional[str] = None,
        runs_dir: Optional[str] = DEFAULT_RUNS_DIR, studies_port: Optional[int] = None,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S) -> None:
    """`lazylab dashboard`: check everything (:func:`check`), then serve until Ctrl-C or SIGTERM: labml's app on
    `port`, and the studies of the sweeps under `runs_dir` (None: no studies) on `studies_port` (default port + 1).

    A `host` that is not a loopback address prints one warning on stderr (:func:`host_warning`).

    Raises:
        DashboardError: what :func:`check` raises (one line, naming the value).
    """
    if runs_dir is not None and studies_port is None:
        studies_port = port + 1
    check(store, host, port, assets, max_body_mb, token, runs_dir, studies_port, header_timeout_s)
    warning = host_warning(host, token)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
    try:
        serve(Path(store), host, port, None if assets is None else Path(assets), max_body_bytes=max_body_mb << 20,
              token=token, runs_dir=None if runs_dir is None else Path(runs_dir), studies_port=studies_port,
              header_timeout_s=header_timeout_s)
    except KeyboardInterrupt:
        pass
    print('labml dashboard stopped', flush=True)


def _bind_problem(host: str, port: int, flag: str) -> Optional[str]:
    """Why the server could not listen on host:port (a test bind, released at once), as one line; None if it can.
    An address that is not one (``256.1.1.1``) is refused before any name lookup."""
    if ':' in host or host.replace('.', '').isdigit():
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return f'--host {host} is not an IP address'
    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except socket.gaierror as e:
            return f'--host {host}: no such host ({e.strerror})'
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f'{host}:{port} is already in use; choose another {flag}'
            if e.errno == errno.EACCES:
                return f'{host}:{port}: permission denied (ports below 1024 need root); choose another {flag}'
            if e.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):
                return f'--host {host} is not an address of this machine'
            return f'cannot listen on {host}:{port}: {e.strerror}'
    return None
