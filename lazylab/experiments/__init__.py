"""Runnable experiments: character-level language models trained on Tiny Shakespeare (or any UTF-8 text).

Each experiment module defines `Configs` (an `NLPAutoRegressionConfigs` subclass with its model options),
`PRESETS` and `main(argv)`:

    python -m lazylab.experiments.feedback key=value …       (≡ lazylab train feedback key=value …)
    python -m lazylab.experiments.fast_weights key=value …
    python -m lazylab.experiments.transformer key=value …
    python -m lazylab.experiments.retrieval key=value …      (associative retrieval: a synthetic task, no text)

`lazylab.experiments.runner` turns a command line into a run; `trainer.train` is the training loop, with its
parts beside it: `task` (what the loop takes from an experiment: batches, loss, validation, samples), `budget`
(the time budget), `checkpoint` (checkpoint.pt and resume), `metrics` (metrics.jsonl, progress line, samples).
"""
EXPERIMENTS = ('feedback', 'fast_weights', 'transformer', 'retrieval')
