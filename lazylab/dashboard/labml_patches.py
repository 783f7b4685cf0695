"""Every change lazylab makes to labml_app's internals, in one place: the dashboard's one place for labml_app.

The dashboard runs labml's own app; six things of it are replaced, each by one function below. They rely on
internals of **labml-app 0.5.14** (pinned by the ``dashboard`` extra); ``tests/dashboard/test_labml_patches.py``
checks that each target still has the shape relied on, so an upgrade that moves one fails there with the target's
name. The changes to labml's own (client) internals — daemon upload threads, no web browser — are in
:mod:`lazylab.labml_internals`, the one module of lazylab that reaches into labml's private API.

    patch_app_database(store)          labml_app.db.init_mongo_db                   → labml-db file drivers
    patch_app_static_route(app, ...)   labml_app.flask_app's route GET /{file_path:path} → no file outside the web
                                       folder; STATIC_PATH → a folder of our making (--assets)
    patch_app_guard(app, ...)          labml_app.flask_app's error_handling_middleware → guard.RequestGuard
    patch_app_checks(app)              the routes of CHECKED_ROUTES → the same, after checking the run or session
                                       named exists (404) and the body's fields have their types (400)
    patch_app_followed(app, followed)  the track route → the same, less a client's metrics and configs for a run
                                       followed from its files (lazylab.dashboard.follower)
    patch_app_series_defaults()        analyses.experiments.metrics.MetricsAnalysis.track → a loss.* series that
                                       comes after the first packet is shown too
"""
import functools
import os
from collections.abc import Container, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

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


# ---- the routes' checks ------------------------------------------------------------------------------------------

def _text(v) -> bool:
    return v is None or isinstance(v, str)  # None: labml's client sends it for what it does not know


def _texts(v) -> bool:
    return v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v))


def _whole(v) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))


def _number(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _flag(v) -> bool:
    return v is None or isinstance(v, bool)


def _mapping(v) -> bool:
    return v is None or isinstance(v, dict)


TEXT, TEXTS = (_text, 'a string'), (_texts, 'a list of strings')
WHOLE, NUMBER, FLAG, MAPPING = (_whole, 'an integer'), (_number, 'a number'), (_flag, 'true or false'), \
    (_mapping, 'an object')

#: the fields the page edits on a run (POST /api/v1/run/UUID), and their types; other keys the app ignores
RUN_EDIT = {'name': TEXT, 'comment': TEXT, 'note': TEXT, 'favourite_configs': TEXTS, 'selected_configs': TEXTS}
#: on a session (POST /api/v1/session/UUID)
SESSION_EDIT = {'name': TEXT, 'comment': TEXT}
#: the fields of each item labml's client sends a run's track route (labml's AppExperiment, its logs and tracker)
TRACK = {
    'name': TEXT, 'comment': TEXT, 'notes': TEXT, 'computer': TEXT, 'python_file': TEXT, 'repo_remotes': TEXTS,
    'commit': TEXT, 'commit_message': TEXT, 'is_dirty': FLAG, 'start_step': WHOLE, 'load_run': TEXT, 'tags': TEXTS,
    'pid': WHOLE, 'main_rank': WHOLE, 'configs': MAPPING, 'favorite_configs': TEXTS, 'selected_configs': TEXTS,
    'indicators': MAPPING, 'wildcard_indicators': MAPPING, 'track': MAPPING, 'status': MAPPING, 'time': NUMBER,
    'stdout': TEXT, 'stderr': TEXT, 'logger': TEXT,
}
#: of each item of a computer's session (labml's monitor: POST /api/v1/TOKEN/computer)
COMPUTER = {'name': TEXT, 'comment': TEXT, 'configs': MAPPING, 'track': MAPPING, 'time': NUMBER}

#: labml-app 0.5.14's routes that write: (method, path) → (what the path's uuid names, None for the track routes;
#: the body's fields; the query's integers). A made-up uuid was a 500 (an AttributeError on None) or silently
#: nothing, a field of any type was stored ({"name": {"x": 1}} became the run's name), and ``rank=one`` was a 500.
CHECKED_ROUTES = {
    ('POST', '/api/v1/run/{run_uuid}'): ('run', RUN_EDIT, ()),
    ('PUT', '/api/v1/run/{run_uuid}/claim'): ('run', None, ()),
    ('PUT', '/api/v1/run/{run_uuid}/add'): ('run', None, ()),
    ('POST', '/api/v1/session/{session_uuid}'): ('session', SESSION_EDIT, ()),
    ('PUT', '/api/v1/session/{session_uuid}/claim'): ('session', None, ()),
    ('PUT', '/api/v1/session/{session_uuid}/add'): ('session', None, ()),
    ('POST', '/api/v1/{labml_token}/track'): (None, TRACK, ('rank', 'world_size', 'main_rank')),
    ('POST', '/api/v1/{labml_token}/computer'): (None, COMPUTER, ()),
}


def _json_kind(v) -> str:
    kinds = ((bool, 'true or false'), (str, 'a string'), ((int, float), 'a number'), (dict, 'an object'),
             (list, 'a list'))
    return 'null' if v is None else next((kind for t, kind in kinds if isinstance(v, t)), type(v).__name__)


def body_problem(body: Any, fields: dict, items: bool = False) -> Optional[str]:
    """What is wrong with the JSON `body` for `fields` (name → (check, what it must be)), in one line; None when
    nothing is. `items`: the body is a list of such objects (or one), as the track routes take."""
    if items and isinstance(body, list):
        for i, item in enumerate(body):
            problem = body_problem(item, fields)
            if problem is not None:
                return f'item {i}: {problem}'
        return None
    if not isinstance(body, dict):
        return f'the body must be a JSON object{" or a list of them" if items else ""}, got {_json_kind(body)}'
    for name, (check, what) in fields.items():
        if name in body and not check(body[name]):
            return f'{name} must be {what}, got {_json_kind(body[name])}'
    return None


def _query_problem(query, integers: Sequence[str]) -> Optional[str]:
    for name in integers:
        try:
            int(query.get(name, 0))
        except ValueError:
            return f'{name} must be an integer, got {query[name]!r}'
    return None


def _checked(endpoint: Callable, find: Optional[Callable[[str], Any]], kind: Optional[str], fields: Optional[dict],
             integers: Sequence[str]):
    """`endpoint`, answering 404 when `find` (the app's run.get or session.get) finds no `kind` of the path's uuid,
    and 400 when a query parameter of `integers` is not one, or the body's `fields` have the wrong types; else as
    before. One-line JSON, as the guard's."""
    from fastapi.responses import JSONResponse  # (the `dashboard` extra, see the module's late imports)

    @functools.wraps(endpoint)  # FastAPI reads the parameters of the endpoint's own signature through __wrapped__
    async def checked(request, **kwargs):
        if find is not None and find(kwargs[f'{kind}_uuid']) is None:
            return JSONResponse({'error': f'no {kind} {kwargs[f"{kind}_uuid"]!r} on this dashboard'}, status_code=404)
        problem = _query_problem(request.query_params, integers)
        if problem is not None:
            return JSONResponse({'error': problem}, status_code=400)
        if fields is not None:
            problem = body_problem(await request.json(), fields, items=kind is None)  # the app reads it again: cached
            if problem is not None:
                return JSONResponse({'error': problem}, status_code=400)
        return await endpoint(request, **kwargs)
    return checked


def patch_app_checks(app) -> None:
    """Put the checks of :data:`CHECKED_ROUTES` in front of those routes of labml's app: each route is replaced, at
    its place, by one that checks the run or session its path names exists (404 ``{"error": "no run 'x' on this
    dashboard"}``), the query's integers are integers and the body's fields have the types labml's own client and
    page send (400, naming the field or parameter), then calls the app's endpoint. A malformed body is left to the
    guard (400).

    Raises:
        RuntimeError: a route of CHECKED_ROUTES is not in the app (labml-app is not 0.5.14).
    """
    from fastapi.routing import APIRoute
    from labml_app.db import run, session

    finders = {'run': run.get, 'session': session.get, None: None}
    routes = app.router.routes
    for (method, path), (kind, fields, integers) in CHECKED_ROUTES.items():
        index = next((i for i, r in enumerate(routes) if getattr(r, 'path', None) == path
                      and method in getattr(r, 'methods', ())), None)
        if index is None:
            raise RuntimeError(f'labml_app has no route {method} {path} to check; is labml-app 0.5.14?')
        routes[index] = APIRoute(path, _checked(routes[index].endpoint, finders[kind], kind, fields, integers),
                                 methods=[method])


# ---- the runs followed from their files, and the series shown ----------------------------------------------------

TRACK_ROUTE = ('POST', '/api/v1/{labml_token}/track')


def patch_app_followed(app, followed: Callable[[], Container[str]]) -> None:
    """Make the track route drop the metrics and configs a labml client streams for a run that the dashboard
    follows from its run directory (`followed()`: their uuids; :mod:`lazylab.dashboard.follower`): its files are
    the truth, and the same points sent twice would be drawn twice. The rest of what the client sends (its status,
    its console) is kept. Call after :func:`patch_app_checks` (this wraps the checked route).

    Raises:
        RuntimeError: the app has no track route (labml-app is not 0.5.14).
    """
    from fastapi.routing import APIRoute

    routes = app.router.routes
    method, path = TRACK_ROUTE
    index = next((i for i, r in enumerate(routes) if getattr(r, 'path', None) == path
                  and method in getattr(r, 'methods', ())), None)
    if index is None:
        raise RuntimeError(f'labml_app has no route {method} {path}; is labml-app 0.5.14?')
    endpoint = routes[index].endpoint

    @functools.wraps(endpoint)  # (FastAPI reads the parameters through __wrapped__, as for _checked)
    async def track(request, **kwargs):
        if request.query_params.get('run_uuid', '') in followed():
            body = await request.json()  # cached: the endpoint reads this same object
            for item in body if isinstance(body, list) else [body]:
                if isinstance(item, dict):
                    item.pop('track', None)
                    item.pop('configs', None)
        return await endpoint(request, **kwargs)

    routes[index] = APIRoute(path, track, methods=[method])


def patch_app_series_defaults() -> None:
    """Show every ``loss.*`` series of a run on its page, however late it first comes.

    labml-app 0.5.14 (``analyses.experiments.metrics.MetricsAnalysis.track``) shows the ``loss.*`` series present
    at a run's first packet, and hides (preference -1) any series that comes later: a run's ``loss.valid``, first
    measured after some training steps, was never drawn. Here a ``loss.*`` series new to a run that had series
    already is shown (preference 1), as it would have been at the start; a preference the page set is not changed.
    """
    from labml_app.analyses.experiments import metrics

    original = metrics.MetricsAnalysis.track
    if getattr(original, 'lazylab_patched', False):
        return

    def track(self, data, run_uuid=None):
        before = set(self.metrics.indicators)
        original(self, data, run_uuid)
        new = {i for i in set(self.metrics.indicators) - before if i.split('.')[0].lower() == 'loss'}
        key = metrics.MetricsPreferencesIndex.get(run_uuid) if new and before else None
        if key is None:
            return  # nothing new, or the first packet: the app's own default shows every loss.* already
        mp = key.load()
        preferences = list(mp.series_preferences)
        names = sorted(self.metrics.indicators)  # the preferences' order (the app's)
        if len(preferences) != len(names):
            return
        for i, name in enumerate(names):
            if name in new and preferences[i] == -1:
                preferences[i] = 1
        mp.update_preferences({'series_preferences': preferences})

    track.lazylab_patched = True
    metrics.MetricsAnalysis.track = track
