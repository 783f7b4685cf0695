"""`lazylab plot RUN_DIR [RUN_DIR …] -o FILE.png`: train and valid loss against tokens seen, one colour per run."""
import sys
from collections.abc import Sequence
from pathlib import Path

from lazylab import user_files
from lazylab.errors import UsageError
from lazylab.runs import (
    CONFIGS_YAML,
    METRICS_JSONL,
    OWN_FILES,
    RUN_JSON,
    SWEEP_YAML,
    TRIAL_JSON,
    load_run,
    read_json,
)

# late imports: matplotlib (and IPython in a notebook) only when a plot is made: the CLI starts without them


def check_output(path: str, flag: str, figure: bool = False) -> Path:
    """The file a command is asked to write (`flag` names the option in messages), checked before anything is
    computed or written: a file name, not a folder, in a folder that exists; for a figure, a format matplotlib
    writes (by the suffix: .png, .pdf, .svg, …). An existing file is overwritten only when it is of the kind the
    command writes (a .csv for --csv, a figure's format for a figure) and not one of a run's or a sweep's own files
    (`lazylab.runs.OWN_FILES` in a folder holding a run or a sweep): `--csv RUN/run.json` would destroy the run.

    Raises:
        UsageError: any of those is not so; the path exists and is not a regular file (a FIFO, a device).
    """
    if not path:
        raise UsageError(f'{flag} needs a file name')
    out = Path(path)
    if out.is_dir():
        raise UsageError(f'{flag} {path} is a folder; give a file name')
    if not out.parent.is_dir():
        raise UsageError(f'{flag} {path}: folder {out.parent} does not exist')
    user_files.check_output_file(out, flag)  # a FIFO would block the writer, a device swallow the file
    if out.exists():
        if out.name in OWN_FILES and any((out.parent / f).is_file() for f in (RUN_JSON, CONFIGS_YAML, TRIAL_JSON,
                                                                              SWEEP_YAML)):
            raise UsageError(f'{flag} {path} is a file of the run or sweep in {out.parent}: writing there would '
                             f'destroy it; give another file name')
        if not figure and out.suffix.lower() != '.csv':
            raise UsageError(f'{flag} {path} exists and is not a .csv file: refusing to overwrite it; give a new '
                             f'file name or a .csv one')
    if figure:
        from matplotlib.backend_bases import FigureCanvasBase
        formats = FigureCanvasBase.get_supported_filetypes()
        if out.suffix[1:].lower() not in formats:
            raise UsageError(f'{flag} {path}: the file name must end in a figure format matplotlib writes '
                             f'({", ".join("." + f for f in sorted(formats))})')
    return out


def _status_note(info: dict) -> str:
    """' (status failed: ERROR)' from a run's run.json (`info`), or '' when it has none."""
    if 'status' not in info:
        return ''
    error = info.get('error')
    return f" (status {info['status']}{': ' + str(error) if error else ''})"


def plot_runs(run_dirs: Sequence[str], output: str) -> Path:
    """Draw loss.train (thin line) and loss.valid (line with dots) of each run against `tokens` (against `step` when
    a run does not record tokens: a `lazylab labml` run); save a PNG (or another format matplotlib writes, by the
    suffix of `output`).

    The y axis says what the loss is: the runs' `loss_label` (run.json: their task's, e.g. 'cross-entropy
    (nats/char)'), or 'loss' when the runs' tasks differ.

    A run directory (it has a run.json) without loss values yet — one that failed or was stopped before its first
    record, as a glob like `runs/NAME/*` may take in — is left out with a warning on stderr; a damaged file (a
    metrics.jsonl whose last line a crash cut off) is a warning too, and the whole records are drawn.

    Raises:
        UsageError: a bad output file (see `check_output`), a folder that is no run directory (neither
            metrics.jsonl nor run.json), or no run with loss values.
    """
    import matplotlib
    matplotlib.use('Agg')  # files only; never needs a display
    import matplotlib.pyplot as plt

    out = check_output(output, '-o', figure=True)
    runs, kept, left_out = [], [], []
    for d in run_dirs:
        path = Path(d) / METRICS_JSONL
        if not path.is_file() and not (Path(d) / RUN_JSON).is_file():
            raise UsageError(f'{d} has no {METRICS_JSONL} (is it a lazylab run directory?)')
        run = load_run(Path(d))  # as compare reads it: a damaged file is a warning, a run being trained is not one
        records = run.records
        left_out += [f'lazylab: warning: {line}' for line in run.damage]
        if not any('loss.train' in r or 'loss.valid' in r for r in records):
            if len(run_dirs) == 1:
                raise UsageError(f'{path} has no loss values yet' if path.is_file() else
                                 f'{d} has no {METRICS_JSONL} yet{_status_note(run.info)}')
            left_out.append(f'lazylab: warning: {d} has no loss values yet{_status_note(run.info)}; left out')
            continue
        runs.append((_label(Path(d)), records))
        kept.append(d)
    if not runs:
        raise UsageError(f'none of the {len(run_dirs)} runs has loss values yet')
    for line in left_out:
        print(line, file=sys.stderr)
    run_dirs = kept

    # `lazylab labml` runs record labml's global step, not the tokens seen: then every run is drawn against its step
    x = 'tokens' if all('tokens' in r for _, records in runs for r in records
                        if 'loss.train' in r or 'loss.valid' in r) else 'step'
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (label, records) in enumerate(runs):
        color = f'C{i % 10}'
        train = [(r[x], r['loss.train']) for r in records if 'loss.train' in r and x in r]
        valid = [(r[x], r['loss.valid']) for r in records if 'loss.valid' in r and x in r]
        if train:
            ax.plot(*zip(*train), color=color, alpha=0.45, linewidth=1, label=f'{label} train')
        if valid:
            ax.plot(*zip(*valid), color=color, marker='o', markersize=3, linewidth=1.6, label=f'{label} valid')
    ax.set_xlabel('tokens seen' if x == 'tokens' else 'step')
    labels = {loss_label(Path(d)) for d in run_dirs}
    ax.set_ylabel(labels.pop() if len(labels) == 1 else 'loss')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


#: the loss of runs whose run.json does not say (older ones, `lazylab labml` runs): all character models
TEXT_LOSS_LABEL = 'cross-entropy (nats/char)'


def loss_label(run_dir: Path) -> str:
    """What the run's loss is, with its unit: run.json's `loss_label` (its task's), else TEXT_LOSS_LABEL."""
    label = (read_json(run_dir / RUN_JSON) or {}).get('loss_label')
    return label if isinstance(label, str) and label else TEXT_LOSS_LABEL


def _label(run_dir: Path) -> str:
    """'experiment/run_id' from the run folder's path (…/NAME/RUN_ID)."""
    run_dir = run_dir.resolve()
    return f'{run_dir.parent.name}/{run_dir.name}'



class LiveLossPlot:
    """Train and validation loss against the step, redrawn in place in one notebook output (Jupyter, Colab).

    Pass it as the `labml_run` argument of `lazylab.experiments.trainer.train`, which hands it every metrics
    record through `log(step, values)` (its only use of that argument); `updates` counts the redraws. Needs
    matplotlib and IPython (the `notebooks` extra).

    Args:
        title: the plot's title; the latest losses are added to it at each redraw.
    """

    def __init__(self, title: str):
        import matplotlib.pyplot as plt
        from IPython.display import display

        self.fig, self.ax = plt.subplots(figsize=(7.5, 3.6))
        plt.close(self.fig)  # shown only through the display handle below, not again at the end of the cell
        self.title = title
        self.train: tuple[list, list] = ([], [])
        self.valid: tuple[list, list] = ([], [])
        self.updates = 0
        self.handle = display(self.fig, display_id=True)

    def log(self, step: int, values: dict) -> None:
        for key, (steps, losses) in (('loss.train', self.train), ('loss.valid', self.valid)):
            if key in values:
                steps.append(step)
                losses.append(values[key])
        ax = self.ax
        ax.clear()
        ax.plot(*self.train, linewidth=1, alpha=0.7, label='train')
        ax.plot(*self.valid, marker='o', markersize=3, label='validation')
        ax.set_xlabel('step')
        ax.set_ylabel('cross-entropy (nats/char)')
        last = f'train {self.train[1][-1]:.3f}' if self.train[1] else ''
        if self.valid[1]:
            last += f', valid {self.valid[1][-1]:.3f}'
        ax.set_title(f'{self.title} — step {step}: {last}', fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(loc='upper right')
        self.fig.tight_layout()
        self.handle.update(self.fig)
        self.updates += 1
