"""Sweeps and comparisons: `lazylab sweep`, `lazylab compare`, `lazylab diff`.

    spec.py     the sweep grammar (Hydra's multirun: a,b,c, choice(), range(), interval(), tag(log, …)), typed and
                checked against an experiment's declarations; the grid and zipped keys
    study.py    the Optuna study: storage (journal file or database URL), samplers, pruners, claiming each trial once
    sweep.py    the `lazylab sweep` command: the sweep directory, the workers (one process per trial), resume
    trial.py    one trial's process: an ordinary run (lazylab.experiments.runner) with the pruning hook
    compare.py  `lazylab compare` (table, CSV, plot) and `lazylab diff`, from run directories alone

Trials are ordinary runs made through `lazylab.experiments.runner`, one process each; the only part of the trainer
a sweep touches is its one hook, `on_validation` (see lazylab.experiments.trainer), through which a trial reports
its metric to Optuna and learns whether its pruner stops it.
"""
