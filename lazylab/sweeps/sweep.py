"""`lazylab sweep`: many configurations of one experiment (or labml script), each trial an ordinary run of its own.

    lazylab sweep EXPERIMENT [key=value | key=SWEEP …] [--config FILE …] [--workers N] [--trials N]
                  [--sampler grid|random|tpe] [--zip KEY,KEY…] [--metric loss.valid] [--direction minimize|maximize]
                  [--prune none|median|halving] [--storage URL_OR_FILE] [--study NAME] [--seed N]
                  [--launcher COMMAND | --launcher slurm --slurm KEY=VALUE,…] [--dry-run]
    lazylab sweep --labml MODULE [key=value | key=SWEEP …] [--steps N] [--runs-dir DIR] [--config FILE …] …
    lazylab sweep --resume SWEEP_DIR [--workers N] [--storage URL]

Everything is checked before anything is written — a mistake is one line `lazylab: error: …`, exit code 2 —, and
`--dry-run` stops there, printing the plan. The sweep directory RUNS_DIR/STEM/sweep-STUDY holds sweep.yaml, the
study's journal and one run directory per trial (trial-NNNN); the sweep prints a line as each trial starts and
ends, then the `lazylab compare` table. Exit code 0 when every trial completed or was pruned, 1 when some failed or
did not finish (`lazylab sweep --resume SWEEP_DIR` finishes it), 130 or 143 when stopped by Ctrl-C or SIGTERM.

The contract (the grammar, what is checked and written, workers, threads, GPUs and launchers, resume and many
processes on one study, labml scripts, secrets) is written once: see docs/guide/sweeps.md.

The parts: lazylab.sweeps.plan (the checked command line), .workers (one sweep process at work), .launcher (how a
trial is started), .owners, .study, .scripts (labml scripts).
"""
import sys
from pathlib import Path
from typing import Any

from lazylab.errors import Interrupted, UsageError, plural, signals_interrupt, user_error_message
from lazylab.redaction import redact
from lazylab.runs import SWEEP_YAML, read_sweep_record
from lazylab.sweeps import study
from lazylab.sweeps.plan import METRICS, Plan, make_plan, parser
from lazylab.sweeps.workers import Sweep, outcome

__all__ = ['METRICS', 'Plan', 'Sweep', 'make_plan', 'outcome', 'resume_plan', 'sweep_main']


def sweep_main(argv: list[str]) -> int:
    """`lazylab sweep …` (or `--resume SWEEP_DIR`); returns the exit code of the module docstring."""
    a = parser().parse_intermixed_args(argv)
    if a.help:  # the usage lines, then the rest of the module docstring
        title, _, body = __doc__.partition('\n\n')
        print('usage: ' + body.strip() + '\n')
        return 0
    urls = [a.storage] if a.storage else []
    try:
        with signals_interrupt():  # planning writes nothing: a signal ends it at once, with one line
            if a.resume is not None:
                plan, urls = resume_plan(a.resume, argv)
            else:
                plan = make_plan(argv)
            if a.dry_run:
                if plan.storage is not None:
                    study.check_storage(plan.storage)
                print(dry_run_text(plan))
                return 0
            store = None
            if plan.storage is not None:
                store = study.open_storage(plan.storage)  # a bad URL, server or journal file: an error before any file
    except Interrupted as e:
        print(f'lazylab: {e.message} while the sweep was being checked; nothing was written', file=sys.stderr,
              flush=True)
        return e.exit_code
    except Exception as e:  # a user's mistake: its line with the storage's credentials hidden
        _raise_redacted(e, urls)
    try:
        return Sweep(plan, store, resuming=a.resume is not None).run()
    except Exception as e:
        _raise_redacted(e, urls + [plan.storage or ''])


def _raise_redacted(e: Exception, urls: list[str]):
    message = user_error_message(e)
    if message is None:
        raise e
    shown = redact(message, urls)
    if shown == message:
        raise e
    raise UsageError(shown) from None


def resume_plan(sweep_dir: str, argv: list[str]) -> tuple[Plan, list[str]]:
    """The plan of `lazylab sweep --resume SWEEP_DIR [--workers N] [--storage URL]`: the command sweep.yaml
    recorded, for its study; and the storage URLs the messages must hide.

    Raises:
        UsageError: not a sweep directory, a damaged sweep.yaml, flags other than --workers and --storage, a
            hidden password and no --storage, a sweep directory that was moved; and what `make_plan` raises.
    """
    a = parser().parse_intermixed_args(argv)
    path = Path(sweep_dir)
    if a.settings or a.config or a.zip or a.trials is not None or a.sampler or a.study or a.dry_run or a.labml \
            or a.steps is not None or a.runs_dir is not None:
        raise UsageError('lazylab sweep --resume SWEEP_DIR takes only --workers and --storage: the rest is in '
                         f'{SWEEP_YAML}')
    if not (path / SWEEP_YAML).is_file():
        raise UsageError(f'{sweep_dir} is not a sweep directory (no {SWEEP_YAML})')
    record = read_sweep_record(path)
    if not isinstance(record, dict) or not isinstance(record.get('argv'), list) or \
            not isinstance(record.get('study'), str):
        raise UsageError(f'{path / SWEEP_YAML} is damaged (no command and study recorded)')
    storage = a.storage or record.get('storage_url')
    if storage and '***' in storage:
        raise UsageError(f'{SWEEP_YAML} hides the storage password: give --storage URL (or keep the password in '
                         f'~/.pgpass, out of the URL)')
    given = argv
    argv = [str(x) for x in record['argv']]
    if any(x == '--workers' or x.startswith('--workers=') for x in given):
        argv = _without(argv, '--workers') + ['--workers', str(a.workers)]
    copies = record.get('config_copy')
    if copies:  # one file (a name) or several (a list), in the order given
        copies = [copies] if isinstance(copies, str) else copies
        argv = _without(argv, '--config') + [arg for c in copies for arg in ('--config', str(path / c))]
    argv = _without(argv, '--dry-run')
    plan = make_plan(argv, study=record['study'], storage=storage or None, check=False)
    if plan.sweep_dir.resolve() != path.resolve():
        # run from another folder: the sweep directory is RUNS_DIR/NAME/sweep-STUDY from here (as given, when that
        # names it); from the folder it was started in, the trials get the runs_dir the sweep gave, as written
        runs_dir = path.parent.parent if path.parent.parent.resolve() == path.resolve().parent.parent else \
            path.resolve().parent.parent
        if '--labml' in argv:
            argv = _without(argv, '--runs-dir') + ['--runs-dir', str(runs_dir)]
        else:
            argv = [x for x in argv if not x.startswith('runs_dir=')] + [f'runs_dir={runs_dir}']
        plan = make_plan(argv, study=record['study'], storage=storage or None, check=False)
    if plan.sweep_dir.resolve() != path.resolve():
        raise UsageError(f'{sweep_dir}: {SWEEP_YAML} describes {plan.sweep_dir} (was the folder moved? run the '
                         f'command of {SWEEP_YAML} from the folder it was started in)')
    return make_plan(argv, study=record['study'], storage=storage or None), [storage] if storage else []


def _without(argv: list[str], flag: str) -> list[str]:
    """`argv` without `flag` and its value (`--flag V`, `--flag=V`; `--dry-run` alone)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
            continue
        if x == flag:
            skip = flag != '--dry-run'
            continue
        if x.startswith(flag + '='):
            continue
        out.append(x)
    return out


# --- --dry-run -----------------------------------------------------------------------------------------------

def dry_run_text(plan: Plan) -> str:
    """What `lazylab sweep … --dry-run` prints: the points (or the space a sampler draws from), the study, the
    storage; see the module docstring."""
    space = plan.space
    if plan.labml:  # a script's points are known only as far as its configs tell before it trains
        lines = [f'lazylab sweep --labml {plan.name} --dry-run: every key and value checked against its configs; '
                 f'nothing written']
    else:
        lines = [f'lazylab sweep {plan.name} --dry-run: every point checked; nothing written']
    if plan.sampler == 'grid':
        lines.append(f'{plural(plan.trials, "point")} (the grid, in the order they run):')
        width = len(str(plan.trials))
        for i, point in enumerate(plan.points):
            values = ' '.join(f'{k}={_typed(v)}' for k, v in point.items()) or '(no swept keys)'
            lines.append(f'  trial {i:0{max(4, width)}d}  {values}')
    else:
        lines.append(f'{plural(plan.trials, "trial")}, each drawn by the {plan.sampler} sampler (seed {plan.seed}) '
                     f'from:')
        for d in space.dims:
            if d.discrete:
                lines.append(f'  {d.key}: one of ' + ', '.join(_typed(v) for v in d.values))
            else:
                scale = 'log-uniform' if d.log else 'uniform'
                lines.append(f'  {d.key}: {scale} in [{_typed(d.low)}, {_typed(d.high)}] '
                             f'({"int" if d.is_int else "float"})')
    fixed = ' '.join(plan.redact(t) for t in plan.fixed)
    default = "the script's settings" if plan.labml else "the experiment's defaults"
    steps = f' (at most {plural(plan.steps, "optimizer step")})' if plan.steps else ''
    lines.append((f'every trial: {fixed}' if fixed else f'every trial: {default}') + steps)
    name = plan.study if plan.study_named else f'{plan.study} (made of the start time: give --study to choose one)'
    prune = f'pruning {plan.prune}' if plan.prune != 'none' else 'no pruning'
    lines.append(f'study: {name}; sampler {plan.sampler}, {plural(plan.trials, "trial")}, metric {plan.metric} '
                 f'({plan.direction}), {prune}')
    lines.append(f'storage: {plan.storage_shown()}')
    if plan.slurm is not None:
        lines.append(f'each trial a Slurm job, at most {plan.workers} at once: '
                     f'--slurm {plan.slurm.shown() or "(the cluster defaults)"}')
    lines.append(f'sweep directory: {plan.sweep_dir} (not made)')
    return '\n'.join(lines)


def _typed(v: Any) -> str:
    """A value as the trial sees it: 0.001, 16, 'GEGLU', True, (0.9, 0.99)."""
    return repr(v)
