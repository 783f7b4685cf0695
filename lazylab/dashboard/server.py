"""`lazylab dashboard`: labml's own dashboard app served over a file store.

The server runs the real labml app (PyPI ``labml-app``) unchanged except for its database: before
``labml_app.flask_app`` is imported, :func:`labml_patches.patch_app_database` replaces the app's MongoDB set-up
with ``labml-db``'s file drivers (models pickled, one folder per model class; indexes as YAML files). So no MongoDB
is needed and the whole dashboard state is one folder (``--store``, default ``runs/.dashboard``).

    lazylab dashboard [--port 5005] [--store DIR] [--host 127.0.0.1] [--assets DIR]
"""
import argparse
import ipaddress
import os
import re
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Optional

from lazylab.dashboard import labml_patches
from lazylab.dashboard.guard import DEFAULT_MAX_BODY_MB, TOKEN_COOKIE, TOKEN_ENV, TOKEN_HEADER
from lazylab.errors import DashboardError

DEFAULT_PORT = 5005
DEFAULT_HOST = '127.0.0.1'
DEFAULT_STORE = os.path.join('runs', '.dashboard')
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
        DashboardError: labml-app, labml-db or uvicorn is not installed (the message says what to install).
    """
    try:
        import labml_app  # noqa: F401
        import labml_db  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise DashboardError(f"the dashboard needs labml's app ({e.name} is missing): {INSTALL_HINT}") from None


def install_file_store(store: Path) -> None:
    """Make the labml app keep its database in files under `store` (see :func:`labml_patches.patch_app_database`).

    Must run before ``labml_app.flask_app`` is imported: that module sets up its database at import time.
    """
    labml_patches.patch_app_database(store)


def missing_assets(assets: Path) -> list[str]:
    """Files of CDN_ASSETS (and Font Awesome's webfonts folder) that `assets` lacks."""
    needed = list(CDN_ASSETS.values()) + ['fontawesome/webfonts']
    return [name for name in needed if not (Path(assets) / name).exists()]


def _offline_static(static: Path, assets: Path, dest: Path) -> Path:
    """A copy of the app's static folder (as symlinks) whose index.html loads the CDN files from /vendor/."""
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


def create_app(store: Path, host: str, port: int, assets: Optional[Path] = None, *,
               max_body_bytes: int = DEFAULT_MAX_BODY_MB << 20, token: Optional[str] = None):
    """Import the labml app (a FastAPI object) over the file store in `store`, guarded; returns it.

    `assets`: a folder with the page's CDN files (see CDN_ASSETS) to serve instead of the internet ones.
    `max_body_bytes`, `token`: the request guard's body limit and secret (:class:`guard.RequestGuard`). The app
    serves no file outside its web folder (:func:`labml_patches.patch_app_static_route`).

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
        labml_patches.patch_app_static_route(flask_app.app, app_static)
    else:
        # The web folder links the app's files and the assets folder: both are roots its symlinks may lead into.
        web = _offline_static(app_static, assets, Path(store) / 'web')
        labml_patches.patch_app_static_route(flask_app.app, web, [app_static, Path(assets)])
    labml_patches.patch_app_guard(flask_app.app, max_body_bytes=max_body_bytes, token=token)
    return flask_app.app


def serve(store: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, assets: Optional[Path] = None, *,
          max_body_bytes: int = DEFAULT_MAX_BODY_MB << 20, token: Optional[str] = None) -> None:
    """Serve the labml app until SIGINT/SIGTERM (uvicorn handles both and shuts down cleanly)."""
    import uvicorn
    app = create_app(store, host, port, assets, max_body_bytes=max_body_bytes, token=token)
    config = uvicorn.Config(app, host=host, port=port, workers=1, log_level='warning', access_log=False,
                            lifespan='off')
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM and then re-raises the signal to the handler found before it;
    # make that KeyboardInterrupt for both, so `run` ends normally either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    shown_host = f'[{host}]' if ':' in host else host
    print(f'labml dashboard: http://{shown_host}:{port}  (store: {Path(store).resolve()})', flush=True)
    if token is None:
        print(f'  train with: lazylab train NAME ... dashboard=http://{shown_host}:{port}   (Ctrl-C stops)',
              flush=True)
    else:
        print(f'  open once: http://{shown_host}:{port}/?token=…  (the --token; it sets a cookie); train with '
              f'{TOKEN_ENV} set and dashboard=http://{shown_host}:{port}   (Ctrl-C stops)', flush=True)
    server.run()


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


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one-line DashboardErrors (the command line's `lazylab: error: …`)."""

    def error(self, message):
        raise DashboardError(f'{self.prog}: {message}')


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog='lazylab dashboard', description="Serve labml's dashboard app over a local file store.")
    parser.add_argument('--port', type=int, default=DEFAULT_PORT, help=f'TCP port (default {DEFAULT_PORT})')
    parser.add_argument('--host', default=DEFAULT_HOST,
                        help=f'address to bind (default {DEFAULT_HOST}: this machine only; any other address '
                             'prints a warning: without --token the dashboard has no authentication)')
    parser.add_argument('--store', default=DEFAULT_STORE,
                        help=f'folder holding the dashboard\'s data (default {DEFAULT_STORE})')
    parser.add_argument('--assets', default=None,
                        help='folder with the web page\'s CDN files (d3.v6.min.js, bootstrap.min.css, '
                             'fontawesome/css/all.css + fontawesome/webfonts/), for machines without internet')
    parser.add_argument('--max-body-mb', type=int, default=DEFAULT_MAX_BODY_MB, metavar='MB',
                        help=f'largest request body accepted, in MB of 2^20 bytes (default {DEFAULT_MAX_BODY_MB}); '
                             'a larger one is answered 413 and never held in memory')
    parser.add_argument('--token', default=os.environ.get(TOKEN_ENV) or None,
                        help=f'a secret every request must carry (default: ${TOKEN_ENV}; none: no check): '
                             f'at least 16 letters, digits or - _ . ~. A browser opens the page once as '
                             f'http://HOST:PORT/?token=TOKEN, which sets a cookie ({TOKEN_COOKIE}); other clients '
                             f'send the header {_header_name()}: TOKEN; `lazylab train` sends ${TOKEN_ENV}')
    return parser


def _header_name() -> str:
    return '-'.join(part.capitalize() for part in TOKEN_HEADER.split('-'))  # x-lazylab-token → X-Lazylab-Token


def run(argv: Optional[list[str]] = None) -> None:
    """`lazylab dashboard [--port 5005] [--store DIR] [--host 127.0.0.1] [--assets DIR] [--max-body-mb 16]
    [--token TOKEN]`: serve until Ctrl-C.

    Everything is checked before anything is written or bound; a `--host` that is not a loopback address prints
    one warning on stderr (:func:`host_warning`).

    Raises:
        DashboardError: a malformed flag, the ``dashboard`` extra is missing, the port is out of range or in use,
            `--store` is inside a file, `--assets` lacks files, `--max-body-mb` is below 1, or the token is too
            short or has other characters; one line each, naming the value.
    """
    args = _parser().parse_args(argv)
    require_app()
    if not 0 < args.port < 65536:
        raise DashboardError(f'--port must be in 1..65535, got {args.port}')
    store = Path(args.store)
    existing = next(p for p in (store, *store.parents) if p.exists())  # '.' or '/' at the latest
    if not args.store or not existing.is_dir():
        raise DashboardError(f'--store {args.store!r}: ' + (f'{existing} is a file, not a folder' if args.store
                                                            else 'give a folder'))
    if not _port_is_free(args.host, args.port):
        raise DashboardError(f'{args.host}:{args.port} is already in use; choose another --port')
    if args.assets is not None and missing_assets(Path(args.assets)):
        raise DashboardError(f'--assets {args.assets} lacks {", ".join(missing_assets(Path(args.assets)))}')
    if args.max_body_mb < 1:
        raise DashboardError(f'--max-body-mb must be at least 1, got {args.max_body_mb}')
    if args.token is not None and not _TOKEN_RE.fullmatch(args.token):
        # the token itself is not shown: it is a secret
        raise DashboardError(f'--token (or ${TOKEN_ENV}): use at least 16 letters, digits or - _ . ~ '
                             f'(e.g. python -c "import secrets; print(secrets.token_urlsafe())")')
    warning = host_warning(args.host, args.token)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
    try:
        serve(Path(args.store), args.host, args.port, None if args.assets is None else Path(args.assets),
              max_body_bytes=args.max_body_mb << 20, token=args.token)
    except KeyboardInterrupt:
        pass
    print('labml dashboard stopped', flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    """:func:`run`, returning the exit code: 0, or 2 after printing a DashboardError as `lazylab: error: …`
    (through the CLI's one error path, `lazylab.errors.run_cli`)."""
    from lazylab.errors import run_cli
    return run_cli(run, argv)


def _port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
