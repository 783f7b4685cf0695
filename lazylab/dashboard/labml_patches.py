"""Every change lazylab makes to labml_app's internals, in one place: the dashboard's one place for labml_app.

The dashboard runs labml's own app; three things of it are replaced, each by one function below. They rely on
internals of **labml-app 0.5.14** (pinned by the ``dashboard`` extra); ``tests/dashboard/test_labml_patches.py``
checks that each target still has the shape relied on, so an upgrade that moves one fails there with the target's
name. The changes to labml's own (client) internals — daemon upload threads, no web browser — are in
:mod:`lazylab.labml_internals`, the one module of lazylab that reaches into labml's private API.

    patch_app_database(store)          labml_app.db.init_mongo_db                   → labml-db file drivers
    patch_app_static_route(app, ...)   labml_app.flask_app's route GET /{file_path:path} → no file outside the web
                                       folder; STATIC_PATH → a folder of our making (--assets)
    patch_app_guard(app, ...)          labml_app.flask_app's error_handling_middleware → guard.RequestGuard
"""
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from lazylab.dashboard.guard import RequestGuard

# late imports: labml_app, labml_db and fastapi are the optional `dashboard` extra: imported only when the dashboard
# starts

# labml-app 0.5.14's catch-all route, which serves the web page's files.
CATCH_ALL_PATH = '/{file_path:path}'


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


def patch_app_static_route(app, static: Path, extra_roots: Sequence[Path] = ()) -> None:
    """Serve the web page from `static`, and never a file outside it (labml's own route served any file).

    labml-app 0.5.14's catch-all route ``GET /{file_path:path}`` (``send_js``) joined ``STATIC_PATH + '/' +
    file_path``, so ``/..%2f..%2fetc%2fpasswd`` (uvicorn decodes ``%2f`` before routing) returned /etc/passwd.
    The route is replaced, at the same place in the app's routes, by one that answers (:func:`static_file`):

    - the file, when the path resolves (symlinks followed) to a regular file inside `static` or `extra_roots`;
    - index.html for any other safe path (the page's own routes, ``/run/UUID``, are pages of index.html);
    - 404 and ``{"error": "not found"}`` for a path with a ``..`` part, a backslash, a NUL byte, a leading ``/``,
      or one that resolves outside every root (a symlink leading out).

    `extra_roots`: folders that symlinks in `static` may lead into (``--assets``' web folder links the app's static
    folder's files and the assets folder). Also sets ``labml_app.flask_app.STATIC_PATH``, which the index route
    ``GET /`` reads per request.

    Raises:
        RuntimeError: the app has no catch-all route ``send_js`` (labml-app is not 0.5.14).
    """
    from fastapi.responses import FileResponse, JSONResponse
    from fastapi.routing import APIRoute

    routes = app.router.routes
    index = next((i for i, r in enumerate(routes) if getattr(r, 'path', None) == CATCH_ALL_PATH
                  and getattr(r, 'endpoint', None) is not None and r.endpoint.__name__ == 'send_js'), None)
    if index is None:
        raise RuntimeError(f"labml_app has no route {CATCH_ALL_PATH} (send_js) to replace; is labml-app 0.5.14?")
    static = Path(static)
    roots = [Path(os.path.realpath(r)) for r in (static, *extra_roots)]
    from labml_app import flask_app  # imported by now (`app` is its app): only its STATIC_PATH is set here
    flask_app.STATIC_PATH = static

    def send_static_file(file_path: str):
        path = static_file(static, file_path, roots)
        if path is None:
            return JSONResponse({'error': 'not found'}, status_code=404)
        return FileResponse(path)

    routes[index] = APIRoute(CATCH_ALL_PATH, send_static_file, methods=['GET'])


def static_file(static: Path, file_path: str, roots: Sequence[Path]) -> Optional[Path]:
    """The file to answer for the URL path `file_path` (already percent-decoded, without its leading ``/``):
    the resolved file inside one of `roots` (real paths), ``static/index.html`` for a safe path naming no file,
    None for a refused one (see :func:`patch_app_static_route`)."""
    parts = file_path.split('/')
    if '\x00' in file_path or '\\' in file_path or file_path.startswith('/') or '..' in parts:
        return None
    real = Path(os.path.realpath(static.joinpath(*[p for p in parts if p not in ('', '.')])))
    if not any(real == root or root in real.parents for root in roots):
        return None
    if not real.is_file():
        return static / 'index.html'
    return real


def patch_app_guard(app, **guard_options) -> None:
    """Put :class:`lazylab.dashboard.guard.RequestGuard` (token, body limit, error answers) in front of labml's
    app, in place of labml's ``error_handling_middleware``, which answered any exception with HTTP 500 and the
    traceback in the body. `guard_options`: RequestGuard's keyword arguments.

    Relies on labml-app 0.5.14 (over Starlette): ``labml_app.flask_app`` registers that function with
    ``@app.middleware('http')``, i.e. an entry ``Middleware(BaseHTTPMiddleware, dispatch=error_handling_middleware)``
    of ``app.user_middleware``, and the middleware stack is built on the first request, so entries changed before
    it are used.

    Raises:
        RuntimeError: the app has served already, or has no ``error_handling_middleware`` (not labml-app 0.5.14).
    """
    if app.middleware_stack is not None:
        raise RuntimeError('the labml app has started already; its middlewares can no longer change')
    found = [m for m in app.user_middleware if getattr(m.kwargs.get('dispatch'), '__name__', None)
             == 'error_handling_middleware']
    if len(found) != 1:
        raise RuntimeError('labml_app has no error_handling_middleware to replace; is labml-app 0.5.14?')
    app.user_middleware.remove(found[0])
    app.add_middleware(RequestGuard, **guard_options)  # the outermost of the app's middlewares
