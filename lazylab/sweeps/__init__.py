"""Sweeps and comparisons: `lazylab sweep`, `lazylab compare`, `lazylab diff`.

    spec.py     the sweep grammar (Hydra's multirun: a,b,c, choice(), range(), interval(), tag(log, …)), typed and
                checked against an experiment's declarations; the grid and zipped keys
    points.py   checking a sweep's points as `lazylab train` would, many of them fast (what does not depend on the
                point is shared)
    plan.py     a `lazylab sweep` command line, parsed and checked: the Plan
    study.py    the Optuna study: storage (journal file or database URL), samplers, pruners, claiming each trial once
    owners.py   which process runs which trial of a sweep directory; taking over the trials of dead processes
    workers.py  one sweep process at work: the sweep directory, the workers (one process per trial)
    sweep.py    the `lazylab sweep` command: planning, --dry-run, resume
    trial.py    one trial's process: an ordinary run (lazylab.experiments.lifecycle) with the pruning hook
    compare.py  `lazylab compare` (table, CSV, plot) and `lazylab diff`, from run directories alone

Trials are ordinary runs made through `lazylab.experiments.lifecycle`, one process each; the only part of the trainer
a sweep touches is its one hook, `on_validation` (see lazylab.experiments.trainer), through which a trial reports
its metric to Optuna and learns whether its pruner stops it. Credentials of a storage URL are hidden in everything
printed and written (lazylab.redaction).
"""
