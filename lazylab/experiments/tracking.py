"""labml's `experiment`/`tracker` API for a lazylab run: the place where labml's writers are chosen.

Every run records its configs and metrics through labml, so the same run shows in labml's tools and, when a labml
server is configured, live in the labml dashboard:

- the `file` writer always (labml's own files go to RUN_DIR/labml/, never inside site-packages);
- the `app` writer only when an app URL is configured: the trainer's `dashboard=URL` key, or else `app_url` in the
  nearest `.labml.yaml` at or above the working directory (labml's own convention).

labml's `screen` writer is not used: lazylab prints its own progress line, and both would redraw the same
terminal line.

Dashboard hook: `lazylab.dashboard.configure_app_writer(url)` decides whether the app writer is used (a quick
socket check; an unreachable server costs one warning, never a hang or retries) and sets labml's app URL.
"""
import contextlib
import io
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class LabmlRun:
    """One labml experiment whose files live in `run_dir / 'labml'`.

    `configs` is the flat dump (`lazylab.configs.to_dict(conf)['values']`); `explicit`, the keys the user set.
    Use as a context manager around the training loop; `log(step, values)` sends numeric indicators
    (labml names: `loss.train`, `loss.valid`, …) with `step` as labml's global step.
    """

    def __init__(self, run_dir: Path, name: str, uuid: str, configs: dict[str, Any], dashboard: str = '',
                 explicit: Iterable[str] = ()):
        from labml import experiment, lab
        from labml.internal import lab as labml_lab

        from lazylab.dashboard import configure_app_writer

        run_dir = Path(run_dir).resolve()
        _tolerate_concurrent_runs()
        # A .labml.yaml in the run directory makes labml's own config search stop here (no warning that none was
        # found, no lookups next to the installed package); `lab.configure` then pins the paths and the app URL.
        (run_dir / '.labml.yaml').write_text('experiments_path: labml\n', encoding='utf-8')
        labml_lab._internal = labml_lab.Lab(path=run_dir)
        lab.configure({'path': str(run_dir), 'experiments_path': 'labml', 'data_path': 'labml/data'})
        use_app = configure_app_writer(dashboard or None, search_from=Path.cwd())
        if use_app:
            # labml's app writer sends the console to the dashboard by patching sys.stdout.write when this module is
            # first imported; import it now, before any stdout redirection below, so it patches the real stdout.
            import labml.internal.app.logs  # noqa: F401
        writers = {'file', 'app'} if use_app else {'file'}
        _remove_stale_pid(run_dir / 'labml' / name / uuid / 'run.pid')
        with _without_git_notices(), contextlib.redirect_stdout(io.StringIO()):  # labml prints blank lines here
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

    def __exit__(self, *exc) -> None:
        self._started.__exit__(*exc)

    def log(self, step: int, values: dict[str, float]) -> None:
        from labml import tracker
        tracker.save(step, values)


def _tolerate_concurrent_runs() -> None:
    """labml keeps a list of projects in ~/.labml/projects/*.txt, and each run's start reads every file there and
    removes those of folders gone; two runs starting at once (a sweep's workers) race on it, and the one that finds a
    file just removed by the other fails with FileNotFoundError. Reading the list here skips such files instead."""
    from labml.internal.computer import configs as computer_configs
    if getattr(computer_configs.Computer.get_projects, '_lazylab', False):
        return

    def get_projects(self) -> set:
        projects = set()
        for p in list(self.projects_folder.iterdir()):
            try:
                project_path = p.read_text()
            except OSError:  # removed by another run meanwhile
                continue
            if project_path in projects or not Path(project_path).exists():
                p.unlink(missing_ok=True)
            else:
                projects.add(project_path)
        return projects

    get_projects._lazylab = True
    computer_configs.Computer.get_projects = get_projects


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


@contextlib.contextmanager
def _without_git_notices():
    """labml warns when the run directory is not a git repository (it never is); drop only that notice."""
    import labml.internal.experiment as labml_experiment
    original = labml_experiment.labml_notice

    def notice(message, **kwargs):
        text = message if isinstance(message, str) else ''.join(m if isinstance(m, str) else m[0] for m in message)
        if 'git' not in text.lower():
            original(message, **kwargs)

    labml_experiment.labml_notice = notice
    try:
        yield
    finally:
        labml_experiment.labml_notice = original
