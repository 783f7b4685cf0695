"""`lazylab dashboard`: labml's own dashboard app over a file store, and the client hook that streams runs to it.

- :mod:`lazylab.dashboard.server`: what ``lazylab dashboard`` serves (labml's app, its database in files); the
  command line is :mod:`lazylab.cli.dashboard`.
- :mod:`lazylab.dashboard_client` (re-exported here): for the runs, labml's ``app`` writer pointed at a running
  dashboard; it sits below the experiments, which use it.
- :mod:`lazylab.dashboard.labml_patches`: the places where labml_app's internals are changed (labml's own are
  changed in :mod:`lazylab.labml_internals`).
- :mod:`lazylab.dashboard.studies`: the sweeps' studies, served read-mostly by optuna-dashboard on the next port.
- :mod:`lazylab.dashboard.guard` and :mod:`lazylab.dashboard.serving`: the request guard and the server both ports
  share (token, body limit, one-line JSON errors; a deadline for each request's head).

    lazylab dashboard [--port 5005] [--store DIR] [--host 127.0.0.1]
    lazylab train transformer ... dashboard=http://127.0.0.1:5005

Importing this package imports neither labml nor labml_app; they are imported when a server starts or a run
streams to one.
"""
from lazylab.dashboard.server import (
    CDN_ASSETS,
    DEFAULT_HOST,
    DEFAULT_STORE,
    INSTALL_HINT,
    create_app,
    install_file_store,
    missing_assets,
    require_app,
    run,
    serve,
)
from lazylab.dashboard_client import (
    DEFAULT_PORT,
    FLUSH_TIMEOUT_S,
    LABML_TOKEN,
    app_writer,
    app_writer_settings,
    configure_app_writer,
    configured_app_url,
    is_reachable,
    track_url,
    wait_for_app_upload,
)
from lazylab.errors import DashboardError

__all__ = [
    'CDN_ASSETS', 'DEFAULT_HOST', 'DEFAULT_PORT', 'DEFAULT_STORE', 'FLUSH_TIMEOUT_S', 'INSTALL_HINT', 'LABML_TOKEN',
    'DashboardError', 'app_writer', 'app_writer_settings', 'configure_app_writer', 'configured_app_url',
    'create_app', 'install_file_store', 'is_reachable', 'missing_assets', 'require_app', 'run', 'serve',
    'track_url', 'wait_for_app_upload',
]
