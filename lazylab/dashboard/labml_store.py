"""The labml app's database as the run follower writes it: a run made, updated with a labml client's packet, its
analyses cleared (:mod:`lazylab.dashboard.follower` decides what; this module only knows labml_app).

A packet is what labml's own client posts to the app's track route (``POST /api/v1/TOKEN/track``: ``name``,
``comment``, ``configs``, ``track``, ``status``, ``stdout``, …), and :func:`update` applies it the way that route's
handler does (``labml_app.handlers._update_run``), without the route: the follower runs in the server's event loop,
so the app's requests and its writes never interleave. It relies on **labml-app 0.5.14**, pinned by
``tests/dashboard/test_labml_patches.py``:

    labml_app.db.run.get_or_create(request, uuid, rank, world_size, main_rank, token)   makes the run, in the
        project of `token` ('' is the local user's project: lazylab.dashboard.labml_patches.patch_app_database)
    Run.update_run(packet), Status.update_time_status(packet)    the run's fields, configs and status
    labml_app.analyses.AnalysisManager.track(uuid, series) / delete_run(uuid)   the metrics
    labml_app.analyses.experiments.stdout.update_stdout(uuid, text), StdOutIndex    the run's text card

Every function imports labml_app when called: the `dashboard` extra, and the file store must be installed first.
"""
from types import SimpleNamespace
from typing import Any, Optional

# late imports: labml_app is the optional `dashboard` extra, imported once the file store is installed (server.py)

#: the request get_or_create reads the client's address from: the follower is this machine
_LOCAL_REQUEST = SimpleNamespace(client=SimpleNamespace(host='127.0.0.1'))


def has_run(uuid: str) -> bool:
    """Whether the app has a run of this uuid (made by the follower, or streamed by a labml client)."""
    from labml_app.db import run
    return run.get(uuid) is not None


def create_run(uuid: str, start_time: Optional[float]) -> None:
    """Make the run `uuid` in the local user's project (listed on the home page), started at `start_time`."""
    from labml_app.db import run
    r = run.get_or_create(_LOCAL_REQUEST, uuid, 0, 0, 0, '')
    if start_time is not None:
        r.start_time = start_time  # get_or_create stamps "now": the run's page and list show when it really began
        r.save()


def update(uuid: str, packet: dict[str, Any], updated: Optional[float] = None) -> None:
    """Apply one labml client packet to the run `uuid` (as the track route's handler does); `updated`: the time of
    the run's last change, shown as "last updated" (default: now)."""
    from labml_app import analyses
    from labml_app.analyses.experiments import stdout
    from labml_app.db import run
    r = run.get(uuid)
    s = r.status.load()
    r.update_run(packet)
    s.update_time_status(packet)
    if packet.get('track'):
        analyses.AnalysisManager.track(uuid, packet['track'])
    if packet.get('stdout'):
        stdout.update_stdout(uuid, packet['stdout'])
    if updated is not None:
        s.last_updated_time = updated
        s.save()


def clear(uuid: str) -> None:
    """Remove the run's metrics and text (not the run: its name, notes and choices on the page stay), before they
    are sent again from its files."""
    from labml_app import analyses
    from labml_app.analyses.experiments import stdout
    analyses.AnalysisManager.delete_run(uuid)
    key = stdout.StdOutIndex.get(uuid)
    if key is not None:
        key.load().delete()
        stdout.StdOutIndex.delete(uuid)


def series(uuid: str) -> dict[str, tuple[list[float], list[float]]]:
    """The run's metrics as the app keeps them: name → (steps, values) (for the tests and the figures)."""
    from labml_app import analyses
    m = analyses.AnalysisManager.get_experiment_analysis('MetricsAnalysis', uuid)
    return {name: (list(map(float, t['step'])), list(map(float, t['value'])))
            for name, t in m.metrics.tracking.items()}
