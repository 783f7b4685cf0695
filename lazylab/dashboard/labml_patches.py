"""Every change lazylab makes to labml's and labml_app's internals, in one place.

The dashboard runs labml's own app and labml's own client; four attributes of theirs are replaced, each by one
function below. They rely on internals of **labml-app 0.5.14** (pinned by the ``dashboard`` extra) and **labml
0.5.3** (the version the tests run); ``tests/dashboard/test_labml_patches.py`` checks that each target still has
the shape relied on, so an upgrade that moves one fails there with the target's name.

    patch_app_database(store)          labml_app.db.init_mongo_db                   → labml-db file drivers
    patch_app_static_path(static)      labml_app.flask_app.STATIC_PATH              → a folder of our making
    patch_client_upload_thread(sink)   labml.internal.app.AppTracker                → daemon upload threads
    patch_client_browser()             labml.internal.app.experiment.AppUrlResponseHandler → never opens a browser
"""
from pathlib import Path


def patch_app_database(store: Path) -> None:
    """Make the labml app keep its database in files under `store` instead of MongoDB.

    Relies on labml-app 0.5.14: ``labml_app.flask_app`` calls ``labml_app.db.init_mongo_db()`` once, at import, to
    set the drivers of every model class in ``db.models`` and index class in ``db.indexes`` and to create the two
    built-in projects. So this must run before ``labml_app.flask_app`` is imported. Layout: ``store/models/
    <ModelClass>/<key>.pkl`` (pickle, as the app's own Mongo driver: its models hold numpy arrays) and
    ``store/indexes/<IndexClass>.yaml``.
    """
    from labml_app import db, settings
    from labml_app.db import project, user
    from labml_db import Index, Model
    from labml_db.driver.file import FileDbDriver
    from labml_db.index_driver.file import FileIndexDbDriver
    from labml_db.serializer.pickle import PickleSerializer
    from labml_db.serializer.yaml import YamlSerializer

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


def patch_app_static_path(static: Path) -> None:
    """Serve the app's web page from `static` instead of the folder inside the labml_app package.

    Relies on labml-app 0.5.14: its routes build every file path from the module global
    ``labml_app.flask_app.STATIC_PATH`` on each request, so replacing the global after import takes effect.
    """
    from labml_app import flask_app
    flask_app.STATIC_PATH = Path(static)


def patch_client_upload_thread(sink: list) -> None:
    """Make labml's upload threads daemons, and append each one to `sink` when it starts.

    labml retries a failed upload forever (sleeping 10 s, 20 s, …) on a non-daemon thread, so a dashboard that goes
    away mid-run would keep a finished training process alive; as daemons they cannot, and the caller waits for the
    threads in `sink` at exit for a bounded time instead.

    Relies on labml 0.5.3: an experiment with the ``app`` writer looks ``AppTracker`` up in
    ``labml.internal.app`` when the run starts, constructs it with ``(app_track_url, params, *, timeout_seconds,
    daemon)``, and ``AppTracker._check()`` creates its ``_AppTrackThread`` in ``self.thread`` on first use.
    """
    import labml.internal.app as labml_client

    class DaemonAppTracker(labml_client.AppTracker):
        def __init__(self, app_track_url, params, *, timeout_seconds=15, daemon=True):
            super().__init__(app_track_url, params, timeout_seconds=timeout_seconds, daemon=True)

        def _check(self) -> bool:
            ok = super()._check()
            if self.thread is not None and self.thread not in sink:
                sink.append(self.thread)
            return ok

    labml_client.AppTracker = DaemonAppTracker


def patch_client_browser() -> None:
    """Stop labml from opening a web browser on the run's page; it still prints the page's URL.

    Relies on labml 0.5.3: ``labml.internal.app.experiment`` imports ``AppUrlResponseHandler`` into its own
    namespace and constructs it there as ``AppUrlResponseHandler(open_browser, label)`` when a run starts.
    """
    import labml.internal.app.experiment as labml_client_experiment

    class PrintOnlyUrlHandler(labml_client_experiment.AppUrlResponseHandler):
        def __init__(self, open_browser: bool, label: str):
            super().__init__(False, label)

    labml_client_experiment.AppUrlResponseHandler = PrintOnlyUrlHandler
