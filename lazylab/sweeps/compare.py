"""`lazylab compare` and `lazylab diff`: runs side by side, from their run directories alone.

    lazylab compare PATH… [--sort KEY] [--metric KEY] [--csv FILE] [--plot FILE.png]
    lazylab diff RUN_A RUN_B

A PATH is a run directory, a sweep directory (its trial-NNNN runs), or a folder of those (RUNS_DIR/NAME). The table
has one row per run: the configuration keys whose values differ between the runs (only keys that some run was given
— on the command line, in a preset, a --config file or by the sweep —, so the values computed from them do not crowd
the table), the final and best value of the metric (`loss.valid` unless --metric), the steps taken, the training
speed (tokens over training seconds), its MFU (model FLOPs utilization: run.json's flops_per_token · that speed /
its peak_flops; `—` for a run whose FLOPs were not counted), the parameter count, the run's time and its status:
completed, pruned, failed, running, interrupted (a sweep trial whose process is gone: `lazylab sweep --resume`
continues it), dead (a run whose run.json says running but whose process is gone: killed by SIGKILL or the
out-of-memory killer, or its machine stopped; a line after the table says whether `lazylab resume` can continue it),
or damaged (a file of it cannot be read whole: a run.json or trial.json that is not a JSON object, a configs.yaml
that is not a dump, a metrics.jsonl line that is not a record — its last line cut off by a crash, say —; a warning
line on stderr names the file, and the table shows what could be read). Runs of several experiments get an
`experiment` column, and their keys that differ include those set by each experiment's defaults; a run whose
experiment no file names (a damaged run.json) shows `—` there and counts as none of them. Rows are sorted by the
final metric, best first (--sort KEY sorts by any column; --sort=-KEY descending). --csv writes every column at full
precision; --plot draws the metric's curve of every run against tokens seen, one labelled line per run.

`lazylab diff RUN_A RUN_B` lists every key whose value differs (given and computed ones), both values and where
each came from (user, preset, --config FILE, sweep, default, option NAME, assigned while computing ITEM, …), then
the differences of run.json's versions, device and git commit.

Only files are read (configs.yaml, run.json, metrics.jsonl, trial.json), so a sweep directory copied from
another machine compares as well; no study storage is needed.
"""
import csv
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from lazylab.configs import suggestion
from lazylab.errors import UsageError, plural
from lazylab.experiments.metrics import percent
from lazylab.experiments.plot import check_output, loss_label
from lazylab.runs import (
    CHECKPOINT_PT,
    CONFIGS_YAML,
    METRIC_KEYS,
    POSITION_KEYS,
    Run,
    find_runs,
    load_run,
    read_dump,
    read_sweep_record,
)

_MISSING = object()
FIXED_COLUMNS = ('final', 'best', 'steps', 'tok/s', 'MFU', 'params', 'time', 'status')


def _direction(paths: list[str], metric: str) -> str:
    """The direction a sweep among `paths` optimizes `metric` in; else maximize for accuracies, speeds and MFU.

    Raises:
        UsageError: a damaged sweep.yaml.
    """
    for p in map(Path, paths):
        if (p / 'sweep.yaml').is_file():
            record = read_sweep_record(p)
            if record is None:
                raise UsageError(f'{p / "sweep.yaml"} is damaged (not a YAML mapping)')
            if record.get('metric') == metric and record.get('direction'):
                return record['direction']
    return 'maximize' if metric.startswith(('accuracy', 'tokens', 'mfu')) else 'minimize'


def differing_keys(runs: list[Run]) -> list[str]:
    """Keys given to some run whose values are not the same in every run that has them, in dump order. Runs of
    several experiments: also the keys an experiment sets itself (a class default, or the option its default
    names), each experiment's own defaults differing (feedback's threads=1 against the transformer's 0)."""
    several = len(experiments(runs)) > 1
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
    """The comparison of some runs (`compare`): the raw value of every cell, the columns in their order."""
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

    Args:
        paths: run directories, sweep directories (their trial-NNNN runs) or folders of those (RUNS_DIR/NAME).
        metric: the metrics.jsonl key of the `final` and `best` columns, e.g. 'loss.valid', 'accuracy.valid'.
        sort: the column to sort by (`-KEY`: descending; the metric's name stands for `final`); runs without a
            value go last. None: by the final metric, best first (the direction a sweep among `paths` optimizes
            it in, else maximize for accuracies, speeds and MFU).

    Raises:
        UsageError: no runs, a path that is not a run or sweep, a metric no run has (see `check_metric`), an
            unknown --sort column, a damaged sweep.yaml (a damaged run file is a warning: `Table.warnings`).
    """
    runs = [load_run(p) for p in find_runs(paths)]
    if not runs:
        raise UsageError(f'no runs in {" ".join(paths)}')
    check_metric(metric, runs)
    keys = differing_keys(runs)
    maximize = _direction(paths, metric) == 'maximize'
    name = 'trial' if all(r.is_trial for r in runs) and len({r.trial.get('sweep') for r in runs}) == 1 else 'run'
    several = len(experiments(runs)) > 1
    rows = []
    for r in runs:
        final, points = r.metric(metric)
        best = (max if maximize else min)((v for _, v in points), default=None)
        row = {name: r.label if name == 'trial' else _run_label(r)}
        if several:
            row['experiment'] = r.experiment
        for k in keys:
            row[k] = r.values.get(k, _type_of(r.objects.get(k)))
        row.update({'final': final, 'best': best, 'steps': r.steps(), 'tok/s': r.tokens_per_s(), 'MFU': r.mfu(),
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
    have = sorted({k for r in runs for record in r.records for k in record} - set(POSITION_KEYS))
    if metric in have or metric in METRIC_KEYS:
        return
    known = have or sorted(METRIC_KEYS)
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
    if column == 'MFU':
        return percent(v)
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
    numeric = {'final', 'best', 'steps', 'tok/s', 'MFU', 'params', 'time'}

    def line(parts: list[str]) -> str:
        return '  '.join(p.rjust(w) if c in numeric else p.ljust(w)
                         for p, w, c in zip(parts, widths, t.columns)).rstrip()
    what = plural(len(t.rows), 'trial' if t.columns[0] == 'trial' else 'run')
    more = f'; {plural(len(t.only_some), "more key")} only some of the {len(experiments(t.runs))} experiments ' \
        f'have: lazylab diff lists them' if t.only_some else ''
    out = [f'lazylab compare {" ".join(t.paths)}      ({what}; keys that differ: {len(t.keys)}{more})',
           line(heads)] + [line(c) for c in cells]
    for r in t.runs:
        if r.status == 'failed' and r.error:
            out.append(f'{t.columns[0]} {r.label if r.is_trial else _run_label(r)} failed: {r.error}')
        elif r.status == 'dead':
            out.append(dead_line(r))
    return '\n'.join(out)


def dead_line(r: Run) -> str:
    """What a dead run's line after the table says (see the module docstring): how `lazylab resume` continues it."""
    then = f'lazylab resume {r.path} continues it from its last checkpoint' if (r.path / CHECKPOINT_PT).is_file() \
        else (f'it wrote no checkpoint, so lazylab resume cannot continue it (lazylab train with --config '
              f'{r.path / CONFIGS_YAML} starts it again with its settings)')
    return (f'run {_run_label(r)} is dead: its process is gone without recording how it ended (killed by SIGKILL or '
            f'out of memory?); {then}')


def experiments(runs: list[Run]) -> set[str]:
    """The experiments of `runs` that their files name (a run whose run.json is damaged names none)."""
    return {r.experiment for r in runs if r.experiment is not None}


def compare_text(paths: list[str], metric: str = 'loss.valid', sort: Optional[str] = None) -> str:
    """The table of `compare` as `lazylab compare` prints it.

    Args:
        paths, metric, sort: as `compare`'s.

    Raises:
        UsageError: see `compare`.
    """
    return format_table(compare(paths, metric, sort))


def write_csv(t: Table, path: str) -> Path:
    """Every column at full precision, plus each run's path and error; returns the file written.

    Raises:
        UsageError: a bad output file (see `lazylab.experiments.plot.check_output`).
    """
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
    import matplotlib  # start-up time: only a --plot loads matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # (after choosing the Agg backend)

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
    """`lazylab compare …`: print the table; write the CSV and the plot when asked (both files checked first).

    Raises:
        UsageError: see `compare`, `write_csv` and `plot`.
    """
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

    Args:
        path_a: run directory A (the first values column).
        path_b: run directory B (the second).

    Raises:
        UsageError: a path that is not a run directory with a configs.yaml, or a damaged configs.yaml.
    """
    for p in (path_a, path_b):
        if not (Path(p) / CONFIGS_YAML).is_file():
            raise UsageError(f'{p} is not a run directory (no configs.yaml)')
        read_dump(Path(p) / CONFIGS_YAML)  # a diff is of the configurations: a damaged one is an error, not a warning
    a, b = load_run(Path(path_a)), load_run(Path(path_b))
    for warning in a.damage + b.damage:
        print(f'lazylab: warning: {warning}', file=sys.stderr, flush=True)
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
