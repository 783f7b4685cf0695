"""The labml_app internals that lazylab.dashboard.labml_patches replaces still have the shape it relies on
(labml-app 0.5.14). The patches are exercised end to end in test_end_to_end.py (the file store, `--assets`) and
test_guard.py; the checks here name the moved target when an upgrade breaks one. (labml's own client internals, the
daemon upload threads and the browser, are pinned in tests/labml/test_labml_internals.py.)"""
import importlib.util
from pathlib import Path

import pytest

from lazylab.dashboard import labml_patches

# (module, attribute) pairs the patches read or replace.
TARGETS = [
    ('labml_app.db', 'init_mongo_db'),
    ('labml_app.db', 'models'),
    ('labml_app.db', 'indexes'),
    ('labml_app.db.project', 'create_project'),
    ('labml_app.db.project', 'ProjectIndex'),
    ('labml_app.db.user', 'get_or_create_user'),
    ('labml_app.settings', 'FLOAT_PROJECT_TOKEN'),
    ('labml_app.settings', 'SAMPLES_PROJECT_TOKEN'),
]


@pytest.mark.parametrize('module, name', TARGETS, ids=[f'{m}.{n}' for m, n in TARGETS])
def test_patch_target_exists(module, name, monkeypatch):
    # labml_app.settings reads these at import (create_app sets them before importing the app)
    monkeypatch.setenv('LABML_APP_SERVER_IP', '127.0.0.1')
    monkeypatch.setenv('LABML_APP_SERVER_PORT', '5005')
    assert hasattr(importlib.import_module(module), name), f'{module}.{name} is gone'


def test_app_sets_up_its_database_and_static_folder_as_relied_on():
    # labml_app.flask_app cannot be imported here (it would connect to MongoDB at import); read its source instead.
    source = Path(importlib.util.find_spec('labml_app.flask_app').origin).read_text(encoding='utf-8')
    assert 'db.init_mongo_db()' in source  # called once at import: patch_app_database must run before
    assert 'STATIC_PATH = ' in source and source.count('str(STATIC_PATH)') >= 2  # read per request


def test_labml_app_is_the_version_the_app_patches_were_written_for():
    from importlib.metadata import version
    assert version('labml-app') == '0.5.14', (
        'lazylab.dashboard.labml_patches replaces internals of labml-app 0.5.14 (its static route, its error '
        'middleware); check each against the new version before changing this pin')


def test_app_static_route_and_error_middleware_are_the_ones_replaced():
    """The two pieces of labml_app.flask_app that patch_app_static_route and patch_app_guard replace, as they were:
    a catch-all route that joins the URL path to STATIC_PATH unchecked, and a middleware that puts the traceback
    in the answer."""
    source = Path(importlib.util.find_spec('labml_app.flask_app').origin).read_text(encoding='utf-8')
    assert "@app.get('/{file_path:path}')\ndef send_js(file_path: str):\n" in source
    assert "    file_path = str(STATIC_PATH) + '/' + file_path\n" in source
    assert '@app.middleware("http")\nasync def error_handling_middleware(request: Request, call_next):' in source
    assert 'content={"error": str(e), "trace": stacktrace}' in source
    assert labml_patches.CATCH_ALL_PATH == '/{file_path:path}'


def test_app_patches_refuse_an_app_without_their_targets():
    from fastapi import FastAPI
    app = FastAPI()

    @app.get('/{file_path:path}')
    def other(file_path: str):
        return {}
    with pytest.raises(RuntimeError, match=r'no route /\{file_path:path\} \(send_js\)'):
        labml_patches.patch_app_static_route(app, Path('.'))
    with pytest.raises(RuntimeError, match='no error_handling_middleware'):
        labml_patches.patch_app_guard(app)
    with pytest.raises(RuntimeError, match=r'no route POST /api/v1/run/\{run_uuid\} to check'):
        labml_patches.patch_app_checks(app)


def test_the_checked_routes_are_the_apps_and_write_what_they_check():
    """Each route of CHECKED_ROUTES is registered by labml_app.handlers as it was (method, path, endpoint), and the
    fields checked are the ones the app's models store from that route."""
    root = Path(importlib.util.find_spec('labml_app').origin).parent
    handlers = (root / 'handlers.py').read_text(encoding='utf-8')
    registered = {
        ('POST', '{labml_token}/track'): "_add_server(app, 'POST', update_run, '{labml_token}/track')",
        ('POST', '{labml_token}/computer'): "_add_server(app, 'POST', update_session, '{labml_token}/computer')",
        ('POST', 'run/{run_uuid}'): "_add_ui(app, 'POST', edit_run, 'run/{run_uuid}')",
        ('PUT', 'run/{run_uuid}/claim'): "_add_ui(app, 'PUT', claim_run, 'run/{run_uuid}/claim')",
        ('PUT', 'run/{run_uuid}/add'): "_add_ui(app, 'PUT', add_run, 'run/{run_uuid}/add')",
        ('POST', 'session/{session_uuid}'): "_add_ui(app, 'POST', edit_session, 'session/{session_uuid}')",
        ('PUT', 'session/{session_uuid}/claim'): "_add_ui(app, 'PUT', claim_session, 'session/{session_uuid}/claim')",
        ('PUT', 'session/{session_uuid}/add'): "_add_ui(app, 'PUT', add_session, 'session/{session_uuid}/add')",
    }
    assert sorted((m, p.removeprefix('/api/v1/')) for m, p in labml_patches.CHECKED_ROUTES) == sorted(registered)
    assert [line for line in registered.values() if line not in handlers] == []
    run_model = (root / 'db' / 'run.py').read_text(encoding='utf-8')
    for field in labml_patches.RUN_EDIT:
        assert f"if '{field}' in data:" in run_model, field  # Run.edit_run stores it
    for field in ('name', 'comment', 'tags', 'python_file', 'commit', 'commit_message', 'start_step', 'pid'):
        assert f"data.get('{field}'" in run_model and field in labml_patches.TRACK, field  # Run.update_run stores it
    _, _, integers = labml_patches.CHECKED_ROUTES[('POST', '/api/v1/{labml_token}/track')]
    assert [f"int(request.query_params.get('{name}', 0))" in handlers for name in integers] == [True] * 3


def test_body_problem_names_the_first_field_of_the_wrong_type():
    problem = labml_patches.body_problem
    assert problem({'name': 'a', 'tags': None, 'other': {1: 2}}, labml_patches.TRACK) is None
    assert problem({'name': {'x': 1}}, labml_patches.RUN_EDIT) == 'name must be a string, got an object'
    assert problem({'tags': ['a', 2]}, labml_patches.TRACK) == 'tags must be a list of strings, got a list'
    assert problem({'pid': 1.5}, labml_patches.TRACK) == 'pid must be an integer, got a number'
    assert problem({'pid': True}, labml_patches.TRACK) == 'pid must be an integer, got true or false'
    assert problem({'time': '1'}, labml_patches.TRACK) == 'time must be a number, got a string'
    assert problem([{}, {'is_dirty': 0}], labml_patches.TRACK, items=True) == (
        'item 1: is_dirty must be true or false, got a number')
    assert problem([{}], labml_patches.RUN_EDIT) == 'the body must be a JSON object, got a list'
    assert problem(None, labml_patches.TRACK, items=True) == (
        'the body must be a JSON object or a list of them, got null')
