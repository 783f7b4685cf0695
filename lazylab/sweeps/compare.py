"""`lazylab compare` and `lazylab diff`: runs side by side, from their run directories alone.

    lazylab compare PATH… [--sort KEY] [--metric KEY] [--csv FILE] [--plot FILE.png]
    lazylab diff RUN_A RUN_B

A PATH is a run directory, a sweep directory (its trial-NNNN runs), or a folder of those (RUNS_DIR/NAME). The
table has one row per run: the configuration keys whose values differ between the runs (only keys that some run
was given — on the command line, in a preset, a --config file or by the sweep —, so the values computed from them
do not crowd the table), the final and best value of the metric (`loss.valid` unless --metric), the steps taken,
the training speed (mean tokens/s), the parameter count, the run's time and its status: completed, pruned, failed,
running, interrupted (a sweep trial whose process is gone: `lazylab sweep --resume` continues it), or damaged (a
file of it cannot be read whole: a run.json or trial.json that is not a JSON object, a metrics.jsonl line that is
not a record — its last line cut off by a crash, say —; a warning line on stderr names the file, and the table
shows what could be read). Runs of several experiments get an `experiment` column, and their keys that differ
include those set by each experiment's defaults. Rows are
sorted by the final metric, best first (--sort KEY sorts by any column; --sort=-KEY descending). --csv writes every
column at full precision; --plot draws the metric's curve of every run against tokens seen, one labelled line
per run.

`lazylab diff RUN_A RUN_B` lists every key whose value differs (given and computed ones), both values and where
each came from (user, preset, --config FILE, sweep, default, option NAME, assigned while computing ITEM, …), then
the differences of run.json's versions, device and git commit.

Only files are read (configs.yaml, run.json, metrics.jsonl, trial.json), so a sweep directory copied from
another machine compares as well; no study storage is needed.
"""
import csv
import fcntl
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from lazylab.errors import UsageError, plural

_MISSING = object()
FIXED_COLUMNS = ('final', 'best', 'steps', 'tok/s', 'params', 'time', 'status')
#: the keys of a metrics.jsonl record that say where the run was, not how it did (see lazylab.experiments.metrics)
POSITION_KEYS = ('step', 'tokens', 'epoch', 'time')


@dataclass
class Run:
    """One run as its files tell it."""
    path: Path
    label: str
    is_trial: bool
    values: dict[str, Any] = field(default_factory=dict)
    given: dict[str, str] = field(default_factory=dict)
    computed: dict[str, str] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    trial: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    status: str = 'running'
    error: Optional[str] = None
    damage: list[str] = field(default_factory=list)   # what is wrong with its files (warnings)

    @property
    def experiment(self) -> Optional[str]:
        """The experiment that made the run (run.json; a `lazylab labml` run: its module; a trial that never
        started its run: its sweep's folder, RUNS_DIR/NAME/sweep-ID)."""
        name = self.info.get('experiment') or self.info.get('module')
        if isinstance(name, str):
            return name
        return self.path.resolve().parent.parent.name if self.is_trial else None

    def metric(self, key: str) -> tuple[Optional[float], list[tuple[int, float]]]:
        """(final value, [(tokens, value) of every record that has it])."""
        points = [(r.get('tokens', r.get('step', 0)), float(r[key])) for r in self.records if key in r]
        return (points[-1][1] if points else None), points

    def steps(self) -> Optional[int]:
        if self.info.get('steps') is not None:
            return int(self.info['steps'])
        return int(self.records[-1]['step']) if self.records else None

    def tokens_per_s(self) -> Optional[float]:
        speeds = [r['tokens_per_s'] for r in self.records if 'tokens_per_s' in r]
        return sum(speeds) / len(speeds) if speeds else None

    def seconds(self) -> Optional[float]:
        return float(self.records[-1]['time']) if self.records and 'time' in self.records[-1] else None


def _read_json(path: Path, damage: Optional[list[str]] = None) -> dict[str, Any]:
    """The JSON object in `path`; {} when the file is missing, damaged or holds no object (then, when it is there,
    a line in `damage`: the file is written whole, through a rename, so a reader never sees half of it)."""
    try:
        doc = json.loads(path.read_text(encoding='utf-8'))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        doc = None
    if not isinstance(doc, dict):
        if damage is not None:
            damage.append(f'{path} is damaged (not a JSON object); the run\'s status is not known')
        return {}
    return doc


def _read_records(path: Path, damage: list[str], being_written: bool) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file, each whole line that is a JSON object; a line in `damage` for the lines
    that are not (a last line cut off by a crash, say), but for the last line of a run still being written."""
    lines = path.read_bytes().split(b'\n')
    torn = lines[-1] != b''
    records, bad = [], 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode('utf-8'))
        except ValueError:  # (UnicodeDecodeError too)
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif not (being_written and torn and i == len(lines) - 1):  # the line the trainer is writing now
            bad += 1
    if bad:
        last = torn and not being_written and not _is_record(lines[-1])
        why = 'its last line is cut off (a crash while it was written?)' if bad == 1 and last else \
            f'{plural(bad, "line")} {"is" if bad == 1 else "are"} not a JSON record'
        damage.append(f'{path} is damaged: {why}; the table shows its {plural(len(records), "whole record")}')
    return records


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line.decode('utf-8')), dict)
    except ValueError:
        return False


def _being_trained(path: Path) -> bool:
    """Whether a process trains the run in `path` now (it holds the run directory's lock: see
    lazylab.experiments.lifecycle.training_lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _read_dump(path: Path) -> dict[str, Any]:
    """A run's configs.yaml as a mapping.

    Raises:
        UsageError: the file is not UTF-8, not YAML, or not a mapping (it names the file).
    """
    import yaml
    try:
        doc = yaml.safe_load(path.read_text(encoding='utf-8'))
    except (UnicodeDecodeError, yaml.YAMLError):
        raise UsageError(f'{path} is damaged (not a YAML configuration dump)') from None
    sections = ('values', 'given', 'computed', 'objects')
    if doc is not None and (not isinstance(doc, dict) or
                            any(not isinstance(doc.get(k) or {}, dict) for k in sections)):
        raise UsageError(f'{path} is damaged (not a YAML configuration dump)')
    return doc or {}


def load_run(path: Path) -> Run:
    """A run directory (or a sweep trial's folder, which may hold only trial.json and output.log when the trial
    failed before its run started).

    Raises:
        UsageError: a damaged configs.yaml.
    """
    from lazylab.runs import METRICS_JSONL as METRICS
    damage: list[str] = []
    trial = _read_json(path / 'trial.json', damage)
    number = trial.get('number')
    label = f'{number:04d}' if isinstance(number, int) and not isinstance(number, bool) else path.name
    run = Run(path, label, bool(trial) or (path / 'trial.json').is_file(), info=_read_json(path / 'run.json', damage),
              trial=trial, damage=damage)
    if (path / 'configs.yaml').is_file():
        doc = _read_dump(path / 'configs.yaml')
        run.values = dict(doc.get('values') or {})
        run.given = dict(doc.get('given') or {k: '' for k in run.values})  # an older dump: all count as given
        run.computed = dict(doc.get('computed') or {})
        run.objects = dict(doc.get('objects') or {})
    elif trial:
        run.values = dict(trial.get('params') if isinstance(trial.get('params'), dict) else {})
        run.given = {k: 'sweep' for k in run.values}
    run.status, run.error = _status(run)
    if (path / METRICS).is_file():
        running = run.status == 'running' or run.info.get('status') == 'running'
        run.records = _read_records(path / METRICS, damage, being_written=running and _being_trained(path))
    if damage:
        run.status = 'damaged'
    return run


def _status(run: Run) -> tuple[str, Optional[str]]:
    if run.trial:
        state = run.trial.get('state', 'running')
        if state in ('running', 'interrupted') and not _owner_alive(run):
            return 'interrupted', None
        return state, run.trial.get('error')
    return run.info.get('status', '—'), run.info.get('error')  # '—': a run from before run.json had a status


def _owner_alive(run: Run) -> bool:
    """Whether the sweep process that runs this trial still holds its lock (see lazylab.sweeps.sweep)."""
    attempts = run.trial.get('attempts') or [{}]
    owner = attempts[-1].get('owner')
    if not owner:
        return True
    return lock_held(run.path.parent / '.owners' / owner)  # the trial's folder is SWEEP_DIR/trial-NNNN


def lock_held(lock: Path) -> bool:
    """Whether a live sweep process holds the owner lock file `lock` (it keeps an exclusive flock on it while it
    lives; see lazylab.sweeps.sweep). A lock that cannot be opened here counts as held: another machine's."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def expand(paths: list[str]) -> list[Path]:
    """Run directories of run, sweep, and experiment folders (see the module docstring), each once (a run named
    twice, or also through its folder, is one row).

    Raises:
        UsageError: a path that is none of those.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / 'sweep.yaml').is_file():
            out += sorted(d for d in p.glob('trial-*') if d.is_dir())
        elif (p / 'run.json').is_file() or (p / 'trial.json').is_file():
            out.append(p)
        elif p.is_dir() and any((d / 'run.json').is_file() or (d / 'sweep.yaml').is_file() for d in p.iterdir()):
            out += expand([str(d) for d in sorted(p.iterdir())
                           if (d / 'run.json').is_file() or (d / 'sweep.yaml').is_file()])
        else:
            raise UsageError(f'{p} is not a run or sweep directory (no run.json or sweep.yaml)')
    first: dict[Path, Path] = {}
    for d in out:
        first.setdefault(d.resolve(), d)
    return list(first.values())


def _direction(paths: list[str], metric: str) -> str:
    import yaml
    for p in map(Path, paths):
        if (p / 'sweep.yaml').is_file():
            try:
                record = yaml.safe_load((p / 'sweep.yaml').read_text(encoding='utf-8'))
            except (UnicodeDecodeError, yaml.YAMLError):
                record = None
            if not isinstance(record, dict):
                raise UsageError(f'{p / "sweep.yaml"} is damaged (not a YAML mapping)')
            if record.get('metric') == metric and record.get('direction'):
                return record['direction']
    return 'maximize' if metric.startswith(('accuracy', 'tokens')) else 'minimize'


def differing_keys(runs: list[Run]) -> list[str]:
    """Keys given to some run whose values are not the same in every run that has them, in dump order. Runs of
    several experiments: also the keys an experiment sets itself (a class default, or the option its default
    names), each experiment's own defaults differing (feedback's threads=1 against the transformer's 0)."""
    several = len({r.experiment for r in runs}) > 1
    order: dict[str, None] = {}
    for r in runs:
        for k in list(r.values) + list(r.objects):
            if k in r.given or several and _set_by_the_experiment(r.computed.get(k)):
                order.setdefault(k, None)
    keys = []
    for k in order:
        seen = {repr(r.values.get(k, r.objects.get(k, _MISSING))) for r in runs
                if k in r.values or k in r.objects}
        if len(seen) > 1:
            keys.append(k)
    return keys


def _set_by_the_experiment(how: Optional[str]) -> bool:
    """Whether a dump's `computed` entry is a value the experiment sets itself, not one computed from others."""
    return isinstance(how, str) and (how == 'default' or how.startswith('option ') and ' while ' not in how)


def keys_of_some(runs: list[Run]) -> list[str]:
    """Keys some runs have and others do not (runs of several experiments): `lazylab diff` lists them."""
    have = [set(r.values) | set(r.objects) for r in runs if r.values or r.objects]
    return sorted(set().union(*have) - set.intersection(*have)) if len(have) > 1 else []


@dataclass
class Table:
    paths: list[str]
    metric: str
    runs: list[Run]
    keys: list[str]
    rows: list[dict[str, Any]]   # column -> raw value
    columns: list[str]
    only_some: list[str] = field(default_factory=list)   # keys some runs have and others not (several experiments)

    @property
    def warnings(self) -> list[str]:
        """One line per damaged file (see `load_run`)."""
        return [line for r in self.runs for line in r.damage]


def compare(paths: list[str], metric: str = 'loss.valid', sort: Optional[str] = None) -> Table:
    """The comparison of the module docstring, as raw values.

    Raises:
        UsageError: no runs, a path that is not a run or sweep, a metric no run has (see `check_metric`), an
            unknown --sort column.
    """
    runs = [load_run(p) for p in expand(paths)]
    if not runs:
        raise UsageError(f'no runs in {" ".join(paths)}')
    check_metric(metric, runs)
    keys = differing_keys(runs)
    maximize = _direction(paths, metric) == 'maximize'
    name = 'trial' if all(r.is_trial for r in runs) and len({r.trial.get('sweep') for r in runs}) == 1 else 'run'
    several = len({r.experiment for r in runs}) > 1
    rows = []
    for r in runs:
        final, points = r.metric(metric)
        best = (max if maximize else min)((v for _, v in points), default=None)
        row = {name: r.label if name == 'trial' else _run_label(r)}
        if several:
            row['experiment'] = r.experiment
        for k in keys:
            row[k] = r.values.get(k, _type_of(r.objects.get(k)))
        row.update({'final': final, 'best': best, 'steps': r.steps(), 'tok/s': r.tokens_per_s(),
                    'params': r.info.get('parameters'), 'time': r.seconds(), 'status': r.status})
        rows.append(row)
    columns = [name, *(['experiment'] if several else []), *keys, *FIXED_COLUMNS]
    if sort is None:
        rows.sort(key=lambda row: (row['final'] is None, -row['final'] if maximize and row['final'] is not None
                                   else row['final'] or 0.0))
    else:
        descending, column = sort.startswith('-'), sort.lstrip('-')
        column = {metric: 'final'}.get(column, column)
        if column not in columns:
            raise UsageError(f'--sort {sort}: no such column; columns: {", ".join(columns)}')
        present = [row for row in rows if row[column] is not None]
        present.sort(key=lambda row: _sortable(row[column]), reverse=descending)
        rows = present + [row for row in rows if row[column] is None]
    return Table(paths, metric, runs, keys, rows, columns, keys_of_some(runs) if several else [])


def check_metric(metric: str, runs: list[Run]) -> None:
    """That some run's metrics.jsonl has `metric`, or that it is one the trainer records (lazylab sweep's
    metrics: a run may not have validated yet).

    Raises:
        UsageError: `--metric NAME: no run has it; did you mean …? the runs' metrics: …`
    """
    from lazylab.configs.engine.errors import suggestion
    from lazylab.sweeps.plan import METRICS
    have = sorted({k for r in runs for record in r.records for k in record} - set(POSITION_KEYS))
    if metric in have or metric in METRICS:
        return
    known = have or sorted(METRICS)
    what = "the runs' metrics" if have else 'no run has recorded any yet; metrics'
    raise UsageError(f'--metric {metric}: no run has it{suggestion(metric, known)} ({what}: {", ".join(known)})')


def _sortable(v: Any) -> tuple:
    return (0, v, '') if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def _type_of(text: Optional[str]) -> Optional[str]:
    return text.split(' (', 1)[0] if isinstance(text, str) else None


def _run_label(r: Run) -> str:
    return f'{r.path.parent.name}/{r.path.name}'


def _cell(column: str, v: Any) -> str:
    if v is None:
        return '—'
    if column in ('final', 'best'):
        return f'{v:.4f}'
    if column in ('tok/s',):
        return f'{v:,.0f}'
    if column in ('params', 'steps'):
        return f'{v:,}'
    if column == 'time':
        s = int(round(v))
        return f'{s // 60}:{s % 60:02d}'
    if isinstance(v, float):
        return f'{v:g}'
    return str(v)


def format_table(t: Table) -> str:
    """The table as text: a header line, the column names (the metric's name for 'final'), one line per run, then
    the errors of failed runs."""
    heads = [t.metric if c == 'final' else c for c in t.columns]
    cells = [[_cell(c, row[c]) for c in t.columns] for row in t.rows]
    widths = [max(len(h), *(len(line[i]) for line in cells)) for i, h in enumerate(heads)]
    numeric = {'final', 'best', 'steps', 'tok/s', 'params', 'time'}

    def line(parts: list[str]) -> str:
        return '  '.join(p.rjust(w) if c in numeric else p.ljust(w)
                         for p, w, c in zip(parts, widths, t.columns)).rstrip()
    what = plural(len(t.rows), 'trial' if t.columns[0] == 'trial' else 'run')
    experiments = len({r.experiment for r in t.runs})
    more = f'; {plural(len(t.only_some), "more key")} only some of the {experiments} experiments have: lazylab ' \
        f'diff lists them' if t.only_some else ''
    out = [f'lazylab compare {" ".join(t.paths)}      ({what}; keys that differ: {len(t.keys)}{more})',
           line(heads)] + [line(c) for c in cells]
    for r in t.runs:
        if r.status == 'failed' and r.error:
            out.append(f'{t.columns[0]} {r.label if r.is_trial else _run_label(r)} failed: {r.error}')
    return '\n'.join(out)


def compare_text(paths: list[str], metric: str = 'loss.valid', sort: Optional[str] = None) -> str:
    return format_table(compare(paths, metric, sort))


def write_csv(t: Table, path: str) -> Path:
    """Every column at full precision, plus each run's path and error."""
    from lazylab.experiments.plot import check_output
    out = check_output(path, '--csv')
    columns = [t.metric if c == 'final' else c for c in t.columns]
    by_label = {(r.label if t.columns[0] == 'trial' else _run_label(r)): r for r in t.runs}
    with open(out, 'w', newline='', encoding='utf-8') as f:
        w = csv.writer(f)
        w.writerow(columns + ['path', 'error'])
        for row in t.rows:
            r = by_label[row[t.columns[0]]]
            w.writerow(['' if row[c] is None else row[c] for c in t.columns] + [str(r.path), r.error or ''])
    return out


def plot(t: Table, path: str) -> list[str]:
    """The metric against tokens seen, one labelled line per run that has the metric; returns the labels.

    Raises:
        UsageError: a bad output file (see `lazylab.experiments.plot.check_output`), or no run has the metric yet.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    from lazylab.experiments.plot import check_output, loss_label
    out = check_output(path, '--plot', figure=True)
    short = _short_names(t.keys)
    by_label = {(r.label if t.columns[0] == 'trial' else _run_label(r)): r for r in t.runs}
    fig, ax = plt.subplots(figsize=(8, 5))
    labels = []
    for row in t.rows:
        r = by_label[row[t.columns[0]]]
        _, points = r.metric(t.metric)
        if not points:
            continue
        settings = ', '.join(f'{short[k]}={_cell(k, row[k])}' for k in t.keys)
        if 'experiment' in row:
            settings = f'{row["experiment"]}' + (f', {settings}' if settings else '')
        label = f'{row[t.columns[0]]}' + (f': {settings}' if settings else '') + \
            (f' ({r.status})' if r.status != 'completed' else '')
        ax.plot(*zip(*points), marker='o', markersize=3, linewidth=1.5, label=label)
        labels.append(label)
    if not labels:
        plt.close(fig)
        raise UsageError(f'no run has {t.metric} values yet')
    ax.set_xlabel('tokens seen')
    losses = {loss_label(r.path) for r in t.runs}  # the runs' tasks say what their loss is
    ax.set_ylabel(t.metric + (f': {losses.pop()}' if t.metric.startswith('loss') and len(losses) == 1 else ''))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return labels


def _short_names(keys: list[str]) -> dict[str, str]:
    """Each key's last part, unless two keys share it."""
    last = [k.rsplit('.', 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def compare_main(paths: list[str], metric: str, sort: Optional[str], csv_file: Optional[str],
                 plot_file: Optional[str]) -> None:
    """`lazylab compare …`: print the table; write the CSV and the plot when asked (both files checked first)."""
    from lazylab.experiments.plot import check_output
    if csv_file is not None:
        check_output(csv_file, '--csv')
    if plot_file is not None:
        check_output(plot_file, '--plot', figure=True)
    t = compare(paths, metric, sort)
    for warning in t.warnings:
        print(f'lazylab: warning: {warning}', file=sys.stderr, flush=True)
    print(format_table(t))
    if csv_file is not None:
        print(f'wrote {write_csv(t, csv_file)}')
    if plot_file is not None:
        plot(t, plot_file)
        print(f'wrote {plot_file}')


# --- diff -----------------------------------------------------------------------------------------------------

RUN_FIELDS = ('experiment', 'lazylab', 'torch', 'python', 'device', 'device_name', 'git', 'parameters')


def diff_rows(a: Run, b: Run) -> list[tuple[str, str, str]]:
    """(key, A's value and source, B's value and source) for every key whose value differs."""
    keys: dict[str, None] = {}
    for r in (a, b):
        for k in list(r.values) + list(r.objects):
            keys.setdefault(k, None)
    rows = []
    for k in keys:
        va, vb = _value(a, k), _value(b, k)
        if va != vb:
            rows.append((k, _with_source(a, k, va), _with_source(b, k, vb)))
    return rows


def _value(r: Run, k: str) -> Any:
    if k in r.values:
        return r.values[k]
    if k in r.objects:
        return _type_of(r.objects[k])
    return _MISSING


def _with_source(r: Run, k: str, v: Any) -> str:
    if v is _MISSING:
        return '—'
    if k in r.given:
        source = r.given[k] or 'given'
    elif k in r.computed:
        source = r.computed[k]
    elif k in r.objects:
        source = r.objects[k].split(' (', 1)[1].rstrip(')') if ' (' in r.objects[k] else ''
    else:
        source = ''
    return f'{_cell(k, v)}  ({source})' if source else _cell(k, v)


def diff_text(path_a: str, path_b: str) -> str:
    """`lazylab diff RUN_A RUN_B` (see the module docstring).

    Raises:
        UsageError: a path that is not a run directory with a configs.yaml.
    """
    for p in (path_a, path_b):
        if not (Path(p) / 'configs.yaml').is_file():
            raise UsageError(f'{p} is not a run directory (no configs.yaml)')
    a, b = load_run(Path(path_a)), load_run(Path(path_b))
    rows = diff_rows(a, b)
    lines = [f'lazylab diff {path_a} {path_b}: ' + (f'{plural(len(rows), "key")} differ{"s" * (len(rows) == 1)}'
                                                   if rows else 'the configurations are the same')]
    if rows:
        heads = ('key', 'A', 'B')
        widths = [max(len(heads[i]), *(len(row[i]) for row in rows)) for i in range(2)]
        lines.append(f'{heads[0]:<{widths[0]}}  {heads[1]:<{widths[1]}}  {heads[2]}')
        lines += [f'{k:<{widths[0]}}  {va:<{widths[1]}}  {vb}' for k, va, vb in rows]
    env = [(f, a.info.get(f), b.info.get(f)) for f in RUN_FIELDS if a.info.get(f) != b.info.get(f)]
    if env:
        lines.append('run.json: ' + '; '.join(f'{f} {_env(va)} vs {_env(vb)}' for f, va, vb in env))
    return '\n'.join(lines)


def _env(v: Any) -> str:
    if isinstance(v, dict) and 'commit' in v:
        return v['commit'][:10] + (' (with changes)' if v.get('dirty') else '')
    return '—' if v is None else f'{v:,}' if isinstance(v, int) else str(v)
