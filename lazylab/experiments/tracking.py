"""labml's `experiment`/`tracker` API for a lazylab run: the place where labml's writers are chosen.

Every run records its configs and metrics through labml, so the same run shows in labml's tools and, when a labml
server is configured, live in the labml dashboard:

- the `file` writer always (labml's own files go to RUN_DIR/labml/, never inside site-packages);
- the `app` writer only when an app URL is configured: the trainer's `dashboard=URL` key, or else `app_url` in the
  nearest `.labml.yaml` at or above the working directory (labml's own convention).

labml's `screen` writer is not used: lazylab prints its own progress line, and both would redraw the same
terminal line.

Dashboard hook: `lazylab.dashboard_client.configure_app_writer(url)` decides whether the app writer is used (a quick
socket check; an unreachable server costs one warning, never a hang or retries) and sets labml's app URL.
"""
import contextlib
import io
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lazylab import labml_internals
from lazylab.dashboard_client import configure_app_writer

# late imports: labml only when a run starts tracking: importing the experiments imports no labml

#: how long a finished run waits for labml's file writer to write its last records (a disk that slow is failing)
WRITER_WAIT_S = 60.0


class LabmlRun:
    """One labml experiment whose files live in `run_dir / 'labml'`.

    `configs` is the flat dump (`lazylab.configs.to_dict(conf)['values']`); `explicit`, the keys the user set.
    Use as a context manager around the training loop; `log(step, values)` sends numeric indicators
    (labml names: `loss.train`, `loss.valid`, …) with `step` as labml's global step.
    """

    def __init__(self, run_dir: Path, name: str, uuid: str, configs: dict[str, Any], dashboard: str = '',
                 explicit: Iterable[str] = ()):
        from labml import experiment, lab

        run_dir = Path(run_dir).resolve()
        labml_internals.tolerate_concurrent_runs()
        labml_internals.guard_file_writer()  # a failed write of labml's must end the run, not hang it (see there)
        labml_internals.reset_file_writer_failure()
        # A .labml.yaml in the run directory makes labml's own config search stop here (no warning that none was
        # found, no lookups next to the installed package); `lab.configure` then pins the paths and the app URL.
        (run_dir / '.labml.yaml').write_text('experiments_path: labml\n', encoding='utf-8')
        labml_internals.new_lab(run_dir)
        lab.configure({'path': str(run_dir), 'experiments_path': 'labml', 'data_path': 'labml/data'})
        use_app = configure_app_writer(dashboard or None, search_from=Path.cwd())
        if use_app:
            # before any stdout redirection below, so that labml patches the real stdout
            labml_internals.send_console_to_app()
        writers = {'file', 'app'} if use_app else {'file'}
        _remove_stale_pid(run_dir / 'labml' / name / uuid / 'run.pid')
        # labml prints blank lines here
        with labml_internals.quiet_labml_notices(), contextlib.redirect_stdout(io.StringIO()):
            experiment.create(uuid=uuid, name=name, writers=writers,
                              python_file=str(run_dir / 'configs.yaml'), disable_screen=True)
            # the keys the user set go in as overrides: labml (and its dashboard) marks those as specified
            experiment.configs(configs, {k: configs[k] for k in explicit if k in configs})
        self._experiment = experiment
        self._started = None

    def __enter__(self) -> 'LabmlRun':
        out = io.StringIO()
        with contextlib.redirect_stdout(out):  # labml prints the run's name and git state here
            self._started = self._experiment.start()
            self._started.__enter__()
        for url in re.findall(r'https?://\S+', re.sub(r'\x1b\[[0-9;]*m', '', out.getvalue())):
            print(f'labml dashboard: {url}', flush=True)  # the one line worth keeping: where to watch the run
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._started.__exit__(exc_type, exc, tb)
        except OSError:  # labml could not write its run_log.jsonl (a read-only or full disk)
            labml_internals.finish_writers()  # labml's finish stopped before it ended its writer's thread: end it
            if exc_type is None:
                raise
            # the run is failing already, for a reason of its own (the same disk, usually): that one is reported
        labml_internals.wait_for_file_writer(WRITER_WAIT_S)  # its records whole when the run returns
        if exc_type is None:
            self._check_writer()

    def log(self, step: int, values: dict[str, float]) -> None:
        from labml import tracker
        tracker.save(step, values)
        self._check_writer()

    @staticmethod
    def _check_writer() -> None:
        """Raise the failure labml's file writer met on its thread (a read-only or full disk), so that the run
        ends with it instead of going on without its labml records."""
        failure = labml_internals.file_writer_failure()
        if failure is not None:
            labml_internals.reset_file_writer_failure()
            raise failure


def _remove_stale_pid(path: Path) -> None:
    """labml refuses to start a run whose run.pid exists; after a killed run (resume) that file is stale."""
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, 0)
        alive = pid != os.getpid()
    except OSError:
        alive = False
    if not alive:
        path.unlink()
