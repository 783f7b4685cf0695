"""Sweeps and comparisons: `lazylab sweep`, `lazylab compare`, `lazylab diff`.

    grammar.py   the sweep grammar (Hydra's multirun: a,b,c, choice(), range(), interval(), tag(log, …)), the
                 grid and zipped keys; pure (no torch, no configs, no experiments)
    typed.py     a sweep's values typed and checked against an experiment's declarations, as `lazylab train`
    points.py    checking a sweep's points as `lazylab train` would, many of them fast (what does not depend on the
                 point is shared)
    scripts.py   sweeps of labml scripts (`--labml MODULE`): their check, in a child process
    plan.py      a `lazylab sweep` command line, parsed and checked: the Plan
    study.py     the Optuna study: storage (journal file or database URL), samplers, pruners, claiming each trial once
    owners.py    which process runs which trial of a sweep directory; taking over the trials of dead processes
    launcher.py  starting a trial: one small interface (`launch(trial) -> process`); local subprocesses, or a
                 `--launcher` prefix such as torchrun; a cluster launcher is one more class
    workers.py   one sweep process at work: the sweep directory, the study, the workers; the outcome of a trial
    sweep.py     the `lazylab sweep` command: planning, --dry-run, resume
    trial.py     one trial's process: an ordinary run (lazylab.experiments.lifecycle) with the pruning hook, or a
                 `lazylab labml` run
    compare.py   `lazylab compare` (table, CSV, plot) and `lazylab diff`, from run directories alone (read by
                 lazylab.runs.load_run)

Trials are ordinary runs made through `lazylab.experiments.lifecycle` (or `lazylab.labml.runner` for a labml
script), one process each; the only part of the trainer a sweep touches is its one hook, `on_validation` (see
lazylab.experiments.trainer), through which a trial reports its metric to Optuna and learns whether its pruner stops
it. Credentials of a storage URL are hidden in everything printed and written, and reach the database driver as
connection arguments, never inside a URL it parses (lazylab.redaction). The contract of `lazylab sweep` (what is
checked and written, exit codes, resume, many processes on one study) is in docs/guide/sweeps.md.
"""
