"""What ``lazylab labml`` adds to a labml run: command-line overrides, checked before anything is written; a lazylab
run directory; the offline Tiny Shakespeare; a step limit; a console that reads well in a log file.

A :class:`Session` is driven by the labml functions :mod:`lazylab.labml.adapter` wraps, in the order a labml
script calls them::

    experiment.create(name=…)         before_create: labml's data goes under RUNS_DIR/data/, its writers are chosen
    experiment.configs(conf, {...})   apply_configs: the script's dict, then the --config files (stacked as
                                      `lazylab train` stacks them), then key=value (typed and checked first: an
                                      unknown key or bad value is a one-line error, exit 2); values may read the
                                      environment (`${env:NAME}`), labelled `env NAME`
    experiment.start()                before_start: RUN_DIR is made (lazylab.runs.make_run_dir: a new id when
                                      another run took one), labml's run moved under RUN_DIR/labml/, run.json and
                                      configs.yaml written; after_start: metrics.jsonl / samples.txt, --steps limit
    (training)                        the step limit ends training after N optimizer updates, as 'completed'
    end of the `with` block           on_exit: configs.yaml rewritten with everything computed, files closed
    main() returns or raises          record_end: run.json's status (running since the start): completed,
                                      interrupted, or failed with the one-line error

RUN_DIR is ``RUNS_DIR/MODULE/RUN_ID`` (MODULE: the dotted module name, or a file's stem); its run.json is a
:class:`lazylab.runs.RunRecord` whose ``source`` is ``{'kind': 'labml', 'module': …}`` (a file's also has its
``path``), which ``lazylab resume`` and ``generate`` refuse: the script owns its training loop. Nothing is written
before ``experiment.start()`` except the bundled Tiny Shakespeare copied into ``RUNS_DIR/data`` (labml's data path)
before the script's ``main()`` runs, so that no code of the script downloads it (labml_nn's datasets, a script that
builds its model before ``experiment.configs``, ``--options``); :meth:`Session.abort` removes that copy again when
the run ends before it started (a mistake, ``--options``).
"""
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

from lazylab import labml_internals, runs
from lazylab.configs import apply_overrides, dump, inspect, label_given, load, note_env, parse_overrides
from lazylab.dashboard_client import configure_app_writer
from lazylab.errors import UsageError, error_line
from lazylab.experiments.configure import StackedFiles
from lazylab.labml import adapter
from lazylab.labml.console import Console

# late imports: what imports torch (the step limit's hooks, the bundled text) is imported when a session starts:
# importing the session (the CLI) imports no torch

TINY_SHAKESPEARE = 'tiny_shakespeare.txt'  # the name labml_nn's `tiny_shakespeare` option looks for
SOURCE_KIND = 'labml'  # run.json's source.kind of a `lazylab labml` run


class OptionsRequested(BaseException):
    """``--options``: raised at ``experiment.configs`` with the script's config object, before anything is computed."""

    def __init__(self, conf: Any, values: dict[str, Any]):
        super().__init__('options requested')
        self.conf = conf
        self.values = values


class Session:
    """One ``lazylab labml`` run; see the module docstring.

    Args:
        module: the name of the runs' folder ``RUNS_DIR/MODULE`` (the dotted module name, or a file's stem); run.json's
            ``experiment``.
        overrides: ``key=value`` text, typed by the engine against the script's config class (its ``${env:…}``
            references read already).
        files: the ``--config`` files, read and stacked (``lazylab.experiments.configure.stack_config_files``).
        env: {key: EnvUse} of the overrides that read the environment (``lazylab.configs.expand_env``).
        steps: end training after this many optimizer updates (None: the script's own length).
        runs_dir: the folder of runs (``RUNS_DIR/MODULE/RUN_ID``) and of labml's data (``RUNS_DIR/data``).
        dashboard: a labml dashboard URL (``lazylab dashboard``); '' uses labml's ``app_url`` setting, if any.
        argv: the command line, recorded in run.json.
        options_only: stop at ``experiment.configs`` (``--options``) with :class:`OptionsRequested`.
        path: the script's file (None for a dotted module), recorded in run.json's ``source``.
        console: where labml's console goes (default: stdout, plain when it is not a terminal).
        run_dir: the run directory, an existing folder (a sweep's trial folder); None: a new RUNS_DIR/MODULE/RUN_ID.
    """

    def __init__(self, module: str, overrides: dict[str, str], files: StackedFiles, *,
                 env: Optional[dict[str, Any]] = None, steps: Optional[int] = None, runs_dir: str = 'runs/labml',
                 dashboard: str = '',
                 argv: tuple[str, ...] = (), options_only: bool = False, path: Optional[Path] = None,
                 console: Optional[Console] = None, run_dir: Optional[Path] = None):
        self.module = module
        self.overrides = overrides
        self.files = files
        self.file_values = files.flat()
        self.env = dict(env or {})
        self.steps = steps
        self.runs_dir = Path(runs_dir)
        self.dashboard = dashboard
        self.argv = list(argv)
        self.options_only = options_only
        self.source: dict[str, Any] = {'kind': SOURCE_KIND, 'module': module}
        if path is not None:
            self.source['path'] = str(Path(path).resolve())
        self.run_dir: Optional[Path] = None  # made at experiment.start()
        self._given_run_dir = run_dir
        self.data_dir = self.runs_dir / 'data'
        self.conf: Any = None
        self.started = False
        self.finished = False
        self.status = ''
        self._placed: list[Path] = []  # what place_data created, to undo when the run ends before its start
        self._writer: Optional[adapter.MetricsWriter] = None
        self._limit: Optional[adapter.StepLimit] = None
        self._sigint: Any = None
        self._started_at = 0.0
        self.console = console or Console(sys.stdout, plain=not sys.stdout.isatty(),
                                          times=self.times if steps is not None else None)

    def times(self) -> Optional[tuple[float, float]]:
        """(seconds since the start, seconds left to the --steps limit at the rate so far), or None before the
        first step."""
        if self._limit is None or self._limit.count == 0:
            return None
        spent = time.monotonic() - self._started_at
        return spent, spent / self._limit.count * max(0, self._limit.steps - self._limit.count)

    def configure_lab(self, fresh: bool = True) -> None:
        """labml's lab: data in RUNS_DIR/data, run folders under RUNS_DIR/MODULE/labml until the start moves the run
        into RUN_DIR/labml (set before the module is imported, in case it asks labml for its data path at import;
        labml writes nothing in its run folders before the start)."""
        labml_dir = (self.run_dir or self.runs_dir / self.module).resolve() / runs.LABML_DIR
        adapter.configure_lab(labml_dir, self.data_dir.resolve(), fresh=fresh)

    # experiment.create
    def before_create(self, writers: Optional[set[str]]) -> set[str]:
        """Pin labml's paths again (over any the script set); the writers to use: the script's ('screen' and 'app'
        by labml's default) with labml's 'file' writer, and 'app' only when a dashboard is reachable."""
        self.configure_lab(fresh=False)
        wanted = set(writers) if writers is not None else {'screen', 'app'}
        script_wants_app = 'app' in wanted
        wanted = (wanted - {'app'}) | {'file'}
        if not self.options_only and (self.dashboard or script_wants_app):
            if configure_app_writer(self.dashboard or None, search_from=Path.cwd()):
                labml_internals.send_console_to_app()
                wanted.add('app')
        return wanted

    # experiment.configs
    def check_not_lazylab(self, conf: Any) -> None:
        """``experiment.configs`` got a dict or a labml config first (a later dict updates the config object, as in
        labml): the command line's settings have no declared types to follow."""
        if self.conf is None and self.options_only:  # nothing to list, and nothing of the script runs further
            raise UsageError(f'{self.module} passes a {type(conf).__name__} to experiment.configs, not a config '
                             f'class: there are no keys to list')
        if self.conf is None and (self.overrides or self.file_values):
            raise UsageError(f'{self.module} passes a {type(conf).__name__} to experiment.configs; key=value and '
                             f'--config need a config class (labml.configs.BaseConfigs under lazylab labml)')

    def apply_configs(self, conf: Any, script_values: dict[str, Any]) -> None:
        """The script's dict, then --config FILE, then key=value; the command line is checked before anything is
        applied, so a mistake there leaves the config untouched."""
        if self.options_only:
            raise OptionsRequested(conf, script_values)
        if self.conf is not None:
            raise UsageError(f'{self.module} calls experiment.configs with a second config object')
        self.conf = conf
        self.give(conf, script_values)

    def give(self, conf: Any, script_values: dict[str, Any]) -> None:
        """Give `conf` the script's dict, then the --config files' values (each labelled with its file and line, or
        the variables it read), then the key=value settings (checked first, so a mistake there leaves `conf`
        untouched)."""
        parse_overrides([f'{k}={v}' for k, v in self.overrides.items()], conf)  # types and checks; applies nothing
        conf._set_values(script_values)
        if self.file_values:
            load(conf, without_class_defaults(conf, self.file_values), env=False)  # (read by stack_config_files)
            for key, label in self.files.labels.items():
                label_given(conf, [key], label)
            note_env(conf, self.files.env)
        if self.overrides:
            apply_overrides(conf, self.overrides)
            note_env(conf, self.env)

    def place_data(self) -> None:
        """Copy the bundled Tiny Shakespeare to labml's data path, where labml_nn's TextFileDataset (and scripts of
        their own, such as glu_variants.simple) look for it, so it is not downloaded."""
        from lazylab.data import bundled_text_path  # imports torch: only when a run places its data (CLI start-up)
        target = self.data_dir / TINY_SHAKESPEARE
        if target.exists():
            return
        missing = [p for p in [self.data_dir, *self.data_dir.parents] if not p.exists()]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundled_text_path(), target)
        self._placed = [target, *missing]

    # experiment.start
    def before_start(self) -> None:
        if self.options_only:
            raise UsageError(f'{self.module} reached experiment.start() without calling experiment.configs(conf, …); '
                             f'there are no configs to list')
        # The sub-configs a dotted key addresses are built when the script first reads them, as labml builds them:
        # building one here would compute what it reads too soon (ponder_net's optimizer reads the model its
        # init() sets inside the run). Keys checkable against a declared config class were checked when given.
        self.run_dir = self._given_run_dir or runs.make_run_dir(self.runs_dir / self.module)
        labml_internals.move_run(self.run_dir.resolve() / runs.LABML_DIR)
        self.started = True
        if self.conf is not None:
            dump(self.conf, self.run_dir / runs.CONFIGS_YAML)
        runs.write_record(self.run_dir, self.record())

    def record(self) -> runs.RunRecord:
        """run.json at the start (see the module docstring); `record_end` adds how it ended."""
        run = labml_internals.run_info()
        return runs.RunRecord(experiment=self.module, source=dict(self.source), run_id=self.run_dir.name,
                              uuid=run.uuid, labml_run=os.path.relpath(run.run_path, self.run_dir),
                              steps=self.steps, argv=self.argv, created=runs.timestamp(), status='running',
                              **runs.environment())

    def after_start(self) -> None:
        self._writer = adapter.metrics_writer(self.run_dir / runs.METRICS_JSONL, self.run_dir / runs.SAMPLES_TXT)
        self._sigint = signal.getsignal(signal.SIGINT)  # labml's training loops replace it and restore it at the end
        if self.steps is not None:
            self._limit = adapter.StepLimit(self.steps)
        self._started_at = time.monotonic()
        self.console.line(f'lazylab labml: {self.module} → {self.run_dir}' +
                          (f' (stops after {self.steps} optimizer steps)' if self.steps is not None else ''))

    def on_exit(self, exc_type: Optional[type]) -> None:
        """The script's ``with experiment.start():`` block ended (or the step limit ended it)."""
        if exc_type is None or issubclass(exc_type, adapter.StepLimitReached):
            self.status = 'completed'
        else:
            self.status = 'interrupted' if issubclass(exc_type, KeyboardInterrupt) else 'crashed'
        self.finish()

    def finish(self) -> None:
        """Write the final configs (labml's configs.yaml and ours, with everything computed); close the files."""
        if self.finished or not self.started:
            return
        self.finished = True
        if self._limit is not None:
            self._limit.remove()
        if self._sigint is not None:
            signal.signal(signal.SIGINT, self._sigint)
        if self.conf is not None:
            adapter.save_configs()
            dump(self.conf, self.run_dir / runs.CONFIGS_YAML)
        if self._writer is not None:
            self._writer.close()

    def record_end(self, error: Optional[BaseException] = None) -> None:
        """run.json's end of a started run: `status` completed (the script's main() returned, or the step limit
        ended it), interrupted (Ctrl-C) or failed with its one-line `error` (what `lazylab: error:` prints for a
        user's mistake such as a package the module needs that is missing, else the exception's type and first
        line), and `finished`. Nothing before ``experiment.start()`` (there is no run directory)."""
        if not self.started:
            return
        values: dict[str, Any] = {'status': 'completed', 'finished': runs.timestamp()}
        if isinstance(error, KeyboardInterrupt):
            values['status'] = 'interrupted'
        elif error is not None:
            values['status'] = 'failed'
            values['error'] = error_line(error)
        elif self.status not in ('', 'completed'):  # the script went on after its `with experiment.start()` failed
            values['status'] = 'failed' if self.status == 'crashed' else self.status
        try:
            runs.update_record(self.run_dir, **values)
        except (OSError, UsageError) as e:  # a full disk, a removed folder: say so, and keep the run's own error
            print(f'lazylab: warning: cannot record the end of the run in {self.run_dir / runs.RUN_JSON}: '
                  f'{getattr(e, "strerror", None) or e}', file=sys.stderr, flush=True)
        self.status = values['status']

    def abort(self) -> None:
        """The run ended before ``experiment.start()`` (a mistake, ``--options``): remove the data copy this run
        placed."""
        if self.started:
            return
        for path in self._placed:
            if path.is_file():
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        self._placed = []

    def summary(self) -> str:
        """One line: how the run ended, its first and last training loss, its directory."""
        if not self.started:
            return f'lazylab labml: {self.module} ended without experiment.start(); nothing was recorded'
        losses = []
        metrics = self.run_dir / runs.METRICS_JSONL
        if metrics.exists():
            for line in metrics.read_text(encoding='utf-8').splitlines():
                record = json.loads(line)
                if 'loss.train' in record:
                    losses.append(record['loss.train'])
        steps = f' after {self._limit.count} optimizer steps' if self._limit is not None else ''
        loss = f'; loss.train {losses[0]:.4f} → {losses[-1]:.4f}' if losses else ''
        return f'lazylab labml: {self.status or "ended"}{steps}{loss}; run dir {self.run_dir}'


def without_class_defaults(conf: Any, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` less the top-level entries equal to the item's class default: the class gives those anyway. A
    configs.yaml dump lists them, and labml classes give some defaults their declared type does not admit
    (labml_nn's ``TrainValidConfigs.loop_step = None`` for an ``int`` item), which an override may not set."""
    defaults = inspect.class_defaults(type(conf))

    def same(default: Any, value: Any) -> bool:
        return (default is None and value is None) or (type(default) is type(value) and default == value)

    return {k: v for k, v in values.items() if not ('.' not in k and k in defaults and same(defaults[k], v))}
