"""`lazylab dashboard [--port 5005] [--store DIR] [--host H] [--runs-dir runs] [--studies-port N] [--assets DIR]
[--max-body-mb N] [--header-timeout S] [--token T]`: serve the labml dashboard, and the sweeps' studies with
optuna-dashboard (the optional `dashboard` extra; lazylab.dashboard.server)."""
import os

from lazylab.command_line import Parser
from lazylab.dashboard import server
from lazylab.dashboard.guard import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_BODY_MB, TOKEN_COOKIE
from lazylab.dashboard_client import TOKEN_ENV, TOKEN_HEADER


def parser() -> Parser:
    p = Parser('dashboard', description="Serve labml's dashboard app over a local file store, showing every run under "
                                        "--runs-dir (finished ones and those still training), and the studies of "
                                        "the sweeps there with optuna-dashboard on the next port.")
    p.add_argument('--port', type=int, default=server.DEFAULT_PORT, help=f'TCP port (default {server.DEFAULT_PORT})')
    p.add_argument('--host', default=server.DEFAULT_HOST,
                   help=f'address to bind (default {server.DEFAULT_HOST}: this machine only; any other address '
                        'prints a warning: without --token the dashboard has no authentication)')
    p.add_argument('--store', default=server.DEFAULT_STORE,
                   help=f'folder holding the dashboard\'s data (default {server.DEFAULT_STORE})')
    p.add_argument('--runs-dir', default=server.DEFAULT_RUNS_DIR, metavar='DIR',
                   help=f'show every run under DIR (run.json, at any depth; read, never written; runs still '
                        f'training followed, new ones shown within seconds), and serve the studies of the sweeps '
                        f'there with optuna-dashboard (default {server.DEFAULT_RUNS_DIR})')
    p.add_argument('--studies-port', type=int, default=None, metavar='PORT',
                   help='TCP port of the studies (default: --port + 1); http://HOST:PORT/api/studies lists them')
    p.add_argument('--assets', default=None,
                   help='folder with other copies of the web page\'s third-party files (d3.v6.min.js, '
                        'bootstrap.min.css, fontawesome/css/all.css + fontawesome/webfonts/); default: those '
                        'installed with lazylab (no internet needed)')
    p.add_argument('--max-body-mb', type=int, default=DEFAULT_MAX_BODY_MB, metavar='MB',
                   help=f'largest request body accepted, in MB of 2^20 bytes (default {DEFAULT_MAX_BODY_MB}); '
                        'a larger one is answered 413 and never held in memory')
    p.add_argument('--header-timeout', type=float, default=DEFAULT_HEADER_TIMEOUT_S, metavar='SECONDS',
                   help=f'seconds a request has to send its request line and headers (default '
                        f'{DEFAULT_HEADER_TIMEOUT_S}); a connection that takes longer is closed, on both ports')
    p.add_argument('--token', default=os.environ.get(TOKEN_ENV) or None,
                   help=f'a secret every request must carry (default: ${TOKEN_ENV}; none: no check): '
                        f'at least 16 letters, digits or - _ . ~. A browser opens the page once as '
                        f'http://HOST:PORT/?token=TOKEN, which sets a cookie ({TOKEN_COOKIE}); other clients '
                        f'send the header {_header_name()}: TOKEN; `lazylab train` sends ${TOKEN_ENV}')
    return p


def _header_name() -> str:
    return '-'.join(part.capitalize() for part in TOKEN_HEADER.split('-'))  # x-lazylab-token → X-Lazylab-Token


def run(argv: list[str]) -> None:
    a = parser().parse(argv)
    server.run(a.store, a.host, a.port, a.assets, max_body_mb=a.max_body_mb, token=a.token, runs_dir=a.runs_dir,
               studies_port=a.studies_port, header_timeout_s=a.header_timeout)
