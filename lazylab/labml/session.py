"""What ``lazylab labml`` adds to a labml run: command-line overrides, checked before anything is written; a lazylab
run directory; the offline Tiny Shakespeare; a step limit.

A :class:`Session` is driven by the labml functions :mod:`lazylab.labml.adapter` wraps, in the order a labml
script calls them::

    experiment.create(name=…)         before_create: labml's folders go under RUN_DIR/labml/, data under RUNS/data/
    experiment.configs(conf, {...})   apply_configs: the script's dict, then --config FILE, then key=value (typed
                                      and checked first: an unknown key or bad value is a one-line error, exit 2)
    experiment.start()                before_start: the sub-configs a dotted key names are built (so their keys are
                                      checked too), then RUN_DIR is created with run.json and configs.yaml;
                                      after_start: metrics.jsonl / samples.txt writer, the --steps limit
    (training)                        the step limit ends training after N optimizer updates, as 'completed'
    end of the `with` block           on_exit: configs.yaml rewritten with everything computed, files closed
    main() returns or raises          record_end: run.json's status (running since the start): completed,
                                      interrupted, or failed with the one-line error

RUN_DIR is ``RUNS_DIR/MODULE/RUN_ID``; RUN_ID is the start time and four random hex digits, so runs sort by time.
Nothing is written before ``experiment.start()`` except the bundled Tiny Shakespeare copied into ``RUNS_DIR/data``
(labml's data path) once the overrides are known to be good; :meth:`Session.abort` removes that copy again when a
mistake ends the run before it started.
"""
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

from lazylab.configs import apply_overrides, dump, load, parse_overrides
from lazylab.errors import UsageError, user_error_message
from lazylab.labml import adapter
from lazylab.runs import write_record as write_run_json

TINY_SHAKESPEARE = 'tiny_shakespeare.txt'  # the name labml_nn's `tiny_shakespeare` option looks for


class OptionsRequested(BaseException):
    """``--options``: raised at ``experiment.configs`` with the script's config object, before anything is computed."""

    def __init__(self, conf: Any, values: dict[str, Any]):
        super().__init__('options requested')
        self.conf = conf
        self.values = values


class StepLimit:
    """A torch optimizer pre-step hook that lets ``steps`` updates happen and stops the run at the next one.

    Counts every optimizer's steps (torch's global hook), so it works for any labml script; raising before the
    (N+1)-th update means the N steps' indicators were all saved.
    """

    def __init__(self, steps: int):
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        self.steps = steps
        self.count = 0
        self._handle = register_optimizer_step_pre_hook(self)

    def __call__(self, optimizer, args, kwargs):
        if self.count >= self.steps:
            raise adapter.StepLimitReached(self.steps)
        self.count += 1

    def remove(self):
        self._handle.remove()


class Session:
    """One ``lazylab labml`` run; see the module docstring.

    Args:
        module: the module name (or script stem) that names ``RUNS_DIR/MODULE``.
        overrides: ``key=value`` text, typed by the engine against the script's config class.
        file_values: ``--config FILE`` values (a flat mapping, or a configs.yaml dump's ``values``).
        steps: end training after this many optimizer updates (None: the script's own length).
        runs_dir: the folder of runs (``RUNS_DIR/MODULE/RUN_ID``) and of labml's data (``RUNS_DIR/data``).
        dashboard: a labml dashboard URL (``lazylab dashboard``); '' uses labml's ``app_url`` setting, if any.
        argv: the command line, recorded in run.json.
        options_only: stop at ``experiment.configs`` (``--options``) with :class:`OptionsRequested`.
    """

    def __init__(self, module: str, overrides: dict[str, str], file_values: dict[str, Any], *,
                 steps: Optional[int] = None, runs_dir: str = 'runs/labml', dashboard: str = '',
                 argv: tuple[str, ...] = (), options_only: bool = False):
        self.module = module
        self.overrides = overrides
        self.file_values = file_values
        self.steps = steps
        self.runs_dir = Path(runs_dir)
        self.dashboard = dashboard
        self.argv = list(argv)
        self.options_only = options_only
        run_id = time.strftime('%Y%m%d-%H%M%S') + '-' + os.urandom(2).hex()
        self.run_dir = self.runs_dir / module / run_id
        self.data_dir = self.runs_dir / 'data'
        self.conf: Any = None
        self.started = False
        self.finished = False
        self.status = ''
        self._placed: list[Path] = []  # what the data placement created, to undo on a mistake before start
        self._writer: Any = None
        self._limit: Optional[StepLimit] = None
        self._sigint: Any = None

    def configure_lab(self, fresh: bool = True) -> None:
        """labml's lab: run folders under RUN_DIR/labml, data in RUNS_DIR/data (before the module is imported, in
        case it asks labml for its data path at import)."""
        adapter.configure_lab(self.run_dir.resolve() / 'labml', self.data_dir.resolve(), fresh=fresh)

    # experiment.create
    def before_create(self, writers: Optional[set[str]]) -> set[str]:
        """Pin labml's paths again (over any the script set); the writers to use: the script's ('screen' and 'app'
        by labml's default) with labml's 'file' writer, and 'app' only when a dashboard is reachable."""
        self.configure_lab(fresh=False)
        wanted = set(writers) if writers is not None else {'screen', 'app'}
        script_wants_app = 'app' in wanted
        wanted = (wanted - {'app'}) | {'file'}
        if not self.options_only and (self.dashboard or script_wants_app):
            from lazylab.dashboard import configure_app_writer
            if configure_app_writer(self.dashboard or None, search_from=Path.cwd()):
                import labml.internal.app.logs  # noqa: F401  (labml sends the console to the app once imported)
                wanted.add('app')
        return wanted

    # experiment.configs
    def check_not_lazylab(self, conf: Any) -> None:
        """``experiment.configs`` got a dict or a labml config first (a later dict updates the config object, as in
        labml): the command line's settings have no declared types to follow."""
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
        parse_overrides([f'{k}={v}' for k, v in self.overrides.items()], conf)  # types and checks; applies nothing
        conf._set_values(script_values)
        if self.file_values:
            load(conf, without_class_defaults(conf, self.file_values))
        if self.overrides:
            apply_overrides(conf, self.overrides)
        self._place_data()

    def _place_data(self) -> None:
        """Copy the bundled Tiny Shakespeare to labml's data path, where labml_nn's TextFileDataset looks for it
        (so it is not downloaded)."""
        from lazylab.data import bundled_text_path
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
        if self.conf is not None:
            build_addressed_subconfigs(self.conf)
        self.run_dir.mkdir(parents=True, exist_ok=False)
        self.started = True
        if self.conf is not None:
            dump(self.conf, self.run_dir / 'configs.yaml')
        run = adapter.experiment_run()
        info = {'module': self.module, 'run_id': self.run_dir.name, 'uuid': run.uuid, 'name': run.name,
                'labml_run': os.path.relpath(run.run_path, self.run_dir), 'steps': self.steps, 'argv': self.argv,
                'created': time.strftime('%Y-%m-%dT%H:%M:%S'), 'status': 'running'}
        write_run_json(self.run_dir, info)

    def after_start(self) -> None:
        self._writer = adapter.metrics_writer(self.run_dir / 'metrics.jsonl', self.run_dir / 'samples.txt')
        adapter.add_writer(self._writer)
        self._sigint = signal.getsignal(signal.SIGINT)  # labml's training loops replace it and restore it at the end
        if self.steps is not None:
            self._limit = StepLimit(self.steps)
        print(f'lazylab labml: {self.module} → {self.run_dir}' +
              (f' (stops after {self.steps} optimizer steps)' if self.steps is not None else ''), flush=True)

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
            dump(self.conf, self.run_dir / 'configs.yaml')
        if self._writer is not None:
            self._writer.close()

    def record_end(self, error: Optional[BaseException] = None) -> None:
        """run.json's end of a started run: `status` completed (the script's main() returned, or the step limit
        ended it), interrupted (Ctrl-C) or failed with its one-line `error` (what `lazylab: error:` prints for a
        user's mistake such as a package the module needs that is missing, else the exception's type and first
        line), and `finished`. Nothing before ``experiment.start()`` (there is no run directory)."""
        if not self.started:
            return
        values: dict[str, Any] = {'status': 'completed', 'finished': time.strftime('%Y-%m-%dT%H:%M:%S')}
        if isinstance(error, KeyboardInterrupt):
            values['status'] = 'interrupted'
        elif error is not None:
            values['status'] = 'failed'
            values['error'] = user_error_message(error) or f'{type(error).__name__}: {error}'.splitlines()[0]
        elif self.status not in ('', 'completed'):  # the script went on after its `with experiment.start()` failed
            values['status'] = 'failed' if self.status == 'crashed' else self.status
        try:
            info = json.loads((self.run_dir / 'run.json').read_text(encoding='utf-8'))
            write_run_json(self.run_dir, {**info, **values})
        except (OSError, ValueError) as e:  # a full disk, a removed folder: say so, and keep the run's own error
            print(f'lazylab: warning: cannot record the end of the run in {self.run_dir / "run.json"}: '
                  f'{getattr(e, "strerror", None) or e}', file=sys.stderr, flush=True)
        self.status = values['status']

    def abort(self) -> None:
        """A mistake ended the run before ``experiment.start()``: remove the data copy this run placed."""
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
        metrics = self.run_dir / 'metrics.jsonl'
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
    from lazylab.configs.engine.declarations import spec_of
    defaults = spec_of(type(conf)).defaults

    def same(default: Any, value: Any) -> bool:
        return (default is None and value is None) or (type(default) is type(value) and default == value)

    return {k: v for k, v in values.items() if not ('.' not in k and k in defaults and same(defaults[k], v))}


def build_addressed_subconfigs(conf: Any) -> None:
    """Build every sub-config that a dotted key (``optimizer.learning_rate``) waits for, so a misspelt key there is
    an error now rather than mid-training; recurses into sub-configs."""
    from lazylab.configs.engine.state import state_of
    st = state_of(conf)
    for key in list(st.pending):
        getattr(conf, key)
    for child in list(st.children.values()):
        build_addressed_subconfigs(child)

