"""The median pruner of `--prune median` (lazylab.sweeps.study.MedianByProgress): Optuna's MedianPruner where
every trial reports at the same points, and a comparison at the same share of each trial's budget where they do
not (a time-budgeted sweep, whose trials' steps differ in cost)."""
import math

import optuna
from hypothesis import given
from hypothesis import strategies as st

from lazylab.sweeps.study import PROGRESS_SCALE, MedianByProgress

optuna.logging.set_verbosity(optuna.logging.WARNING)
COMPLETE, RUNNING = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING


def _study(direction: str, finished: list[dict[int, float]]) -> optuna.Study:
    study = optuna.create_study(direction=direction)
    for values in finished:
        last = values[max(values)]
        study.add_trial(optuna.trial.create_trial(state=COMPLETE, value=last if last == last else 0.0,
                                                  intermediate_values=values))
    return study


def _running(values: dict[int, float]) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(state=RUNNING, intermediate_values=values)


metric = st.one_of(st.floats(0.5, 3.0, allow_nan=False), st.just(math.nan))


@given(direction=st.sampled_from(['minimize', 'maximize']), points=st.integers(1, 5),
       finished=st.integers(0, 5), data=st.data())
def test_with_shared_points_it_is_optunas_median_pruner(direction, points, finished, data):
    grid = list(range(0, points * 100, 100))
    done = [{p: data.draw(metric) for p in grid} for _ in range(finished)]
    upto = data.draw(st.integers(1, points))
    mine = _running({p: data.draw(metric) for p in grid[:upto]})
    study = _study(direction, done)
    reference = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0, interval_steps=1)
    assert MedianByProgress(warmup=0).prune(study, mine) == reference.prune(study, mine)


def test_trials_are_compared_at_the_same_share_of_their_budgets():
    # two finished trials of a time-budgeted sweep: a slow one that validated at 30% and 70% of its minutes, a fast
    # one at every 10% (per-mille keys, as lazylab.sweeps.trial.Pruning reports them)
    slow = {300: 2.40, 700: 2.00}
    fast = {k: 2.6 - k / 1000 for k in range(100, 1000, 100)}  # 2.5, 2.4, …, 1.7
    study = _study('minimize', [slow, fast])
    prune = MedianByProgress().prune
    # at 45%: slow's last value by then is 2.40 (30%), fast's 2.20 (40%): the median is 2.30
    assert not prune(study, _running({150: 2.6, 450: 2.29}))
    assert prune(study, _running({150: 2.6, 450: 2.31}))
    # its best value so far counts, as in Optuna's pruner
    assert not prune(study, _running({300: 2.2, 450: 2.5}))
    # in the first quarter of its run no trial is stopped, however bad
    assert not prune(study, _running({200: 9.0}))
    assert prune(study, _running({PROGRESS_SCALE // 4: 9.0}))
    # a diverged trial (only NaN) is stopped; fewer than two finished trials stop none
    assert prune(study, _running({400: math.nan}))
    assert not prune(_study('minimize', [slow]), _running({400: 9.0}))
    # by 26% only the fast one has a value (2.4 at 20%): the median of one
    assert prune(study, _running({260: 2.41})) and not prune(study, _running({260: 2.39}))


def test_optunas_pruner_would_stop_the_fast_trial_that_this_one_keeps():
    # by step number (Optuna's MedianPruner): a fast, small trial at its step 100 against large trials at their
    # step 100, which had seen 8× its tokens. By the share of the budget it is ahead.
    by_step = _study('minimize', [{100: 2.0, 300: 1.8}, {100: 2.1, 300: 1.9}])
    reference = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0, interval_steps=1)
    assert reference.prune(by_step, _running({30: 2.6, 100: 2.3}))
    # the same runs keyed by their share of 2 minutes: the large ones validated at 50% and 100%; by 30% neither
    # has a value, so the small one goes on
    by_share = _study('minimize', [{500: 2.0, 1000: 1.8}, {500: 2.1, 1000: 1.9}])
    assert not MedianByProgress().prune(by_share, _running({100: 2.6, 300: 2.3}))
