"""Dumps that replay soundly (issue 18, section 3): given vs computed values, the replay check, deterministic
dumps, what run.json records, the steps a run took, and the trainer's one hook.

The engine-level tests use small config classes (no torch); the others train tiny runs in this process.
"""
import json
import subprocess

import pytest
import torch
import yaml

from lazylab import cli
from lazylab.configs import BaseConfigs, apply_overrides, dump, load, option, replay_changes, to_dict
from lazylab.experiments import configure, lifecycle
from lazylab.experiments.metrics import read_metrics
from lazylab.testing import replaced

# --- the engine: given, computed, and the check -----------------------------------------------------------

class Inner(BaseConfigs):
    width: int = 8
    hidden: int            # 4 × width, computed
    gain: float = 1.5


@option(Inner.hidden)
def _hidden(c: Inner):
    return 4 * c.width


class Outer(BaseConfigs):
    d_model: int = 16
    lr: float = 0.1
    inner: Inner
    total: int             # computed from inner.hidden


@option(Outer.inner)
def _inner(c: Outer):
    conf = Inner()
    conf.width = c.d_model  # set by code while computing `inner`: follows d_model
    return conf


@option(Outer.total)
def _total(c: Outer):
    return c.inner.hidden + 1


def _computed(values=None):
    conf = Outer()
    if values:
        apply_overrides(conf, values)
    conf.total, conf.inner.gain, conf.lr  # noqa: B018 (computing them)
    return conf


def test_a_dump_separates_given_from_computed_values_and_says_how_each_was_computed():
    d = to_dict(_computed({'d_model': '32'}))
    assert d['given'] == {'d_model': 'override'}
    # a value an option computed is recorded as the option's name (replay runs the same option)
    assert d['values'] == {'d_model': 32, 'lr': 0.1, 'inner': '_inner', 'total': '_total', 'inner.width': 32,
                           'inner.hidden': '_hidden', 'inner.gain': 1.5}
    assert d['computed'] == {'lr': 'default', 'inner': 'option _inner', 'total': 'option _total',
                             'inner.width': 'assigned while computing inner', 'inner.hidden': 'option _hidden',
                             'inner.gain': 'default'}


def test_replay_applies_the_given_values_and_recomputes_the_rest():
    text = dump(_computed({'d_model': '16'}))
    fresh = Outer()
    assert load(fresh, text) == {'d_model': 16}
    apply_overrides(fresh, {'d_model': '32'})  # a new width after the dump's
    fresh.total  # noqa: B018
    assert (fresh.inner.width, fresh.inner.hidden, fresh.total) == (32, 128, 129)  # everything follows
    assert replay_changes(fresh) == []


def test_a_recorded_computed_value_that_comes_out_differently_is_a_change():
    doc = to_dict(_computed())
    doc['values']['inner.gain'] = 2.0      # as if the code's default had been 2.0 when the dump was made
    doc['values']['inner.width'] = 30      # … and `inner` had set width to d_model − 2
    fresh = Outer()
    load(fresh, doc)
    fresh.total, fresh.inner.gain  # noqa: B018
    changes = replay_changes(fresh)
    assert [(c.path, c.recorded, c.now) for c in changes] == [('inner.width', 30, 16), ('inner.gain', 2.0, 1.5)]
    assert str(changes[0]) == 'inner.width comes out 16, <dump> has 30'
    # a new value for what it is computed from excuses width (it follows), not gain (it depends on nothing given)
    again = Outer()
    load(again, doc)
    apply_overrides(again, {'d_model': '8'})
    again.total, again.inner.gain  # noqa: B018
    assert [c.path for c in replay_changes(again)] == ['inner.gain']


def test_an_item_the_code_no_longer_has_is_a_change():
    doc = to_dict(_computed())
    doc['values']['dropped'] = 3
    fresh = Outer()
    load(fresh, doc)
    fresh.total, fresh.inner.gain  # noqa: B018
    assert [(c.path, c.now) for c in replay_changes(fresh)] == [('dropped', None)]
    assert str(replay_changes(fresh)[0]) == 'dropped no longer exists, <dump> has 3'


def test_an_older_dump_without_a_given_section_is_applied_whole():
    fresh = Outer()
    applied = load(fresh, {'values': {'d_model': 24, 'total': 7}})
    assert applied == {'d_model': 24, 'total': 7} and fresh.total == 7 and replay_changes(fresh) == []


# --- real runs ----------------------------------------------------------------------------------------------

@pytest.fixture
def train(tmp_path, tools):
    """train(name, *settings) -> run dir, through `lazylab train` in this process (torch threads restored)."""
    def run(name, *settings, runs=None, sizes=True):
        runs = runs or tmp_path / 'runs'
        before = set((runs / name).iterdir()) if (runs / name).exists() else set()
        threads = torch.get_num_threads()
        try:
            base = replaced(tools.TINY, drop=tuple(s.split('=')[0] for s in settings)) if sizes else []
            assert cli.main(['train', name, *base, f'runs_dir={runs}', *settings]) == 0
        finally:
            torch.set_num_threads(threads)
        (new,) = set((runs / name).iterdir()) - before
        return new
    return run


def _direct(name, tools, *settings):
    """The configuration `lazylab train NAME TINY settings` computes, without a dump."""
    conf = configure.make_configs(name, replaced(tools.TINY, *settings))
    threads = torch.get_num_threads()
    try:
        configure.prepare(conf)
    finally:
        torch.set_num_threads(threads)
    return conf


@pytest.mark.parametrize('name, widths', [
    ('transformer', ['transformer.d_model', 'transformer.ffn.d_model', 'optimizer.d_model']),
    ('feedback', ['feedback.d_model', 'optimizer.d_model']),
])
def test_config_replay_with_a_new_width_trains_that_width_and_every_computed_value_follows(train, tools, name,
                                                                                          widths):
    first = train(name, 'd_model=16')
    second = train(name, '--config', str(first / 'configs.yaml'), 'd_model=32', sizes=False)
    info = json.loads((second / 'run.json').read_text())
    direct = _direct(name, tools, 'd_model=32')
    assert info['parameters'] == lifecycle.parameter_count(direct.model) > \
        json.loads((first / 'run.json').read_text())['parameters']
    doc = yaml.safe_load((second / 'configs.yaml').read_text())
    assert doc['given']['d_model'] == 'user'
    dumped = (first / 'configs.yaml').read_text().splitlines()  # the line of max_steps in the first run's values
    line = dumped.index('values:') + 1 + next(i for i, x in enumerate(dumped[dumped.index('values:') + 1:], 1)
                                              if x.startswith('  max_steps:'))
    assert doc['given']['max_steps'] == f'--config {first / "configs.yaml"}:{line}'
    for key in widths:
        assert doc['values'][key] == 32, key
    want = to_dict(direct)['values']
    assert {k: v for k, v in doc['values'].items() if k != 'runs_dir'} == \
        {k: v for k, v in want.items() if k != 'runs_dir'}


def test_replay_refuses_a_computed_value_that_changed_and_allow_changes_accepts_it(train, tmp_path, capsys):
    first = train('transformer')
    dump_file = tmp_path / 'changed.yaml'
    text = (first / 'configs.yaml').read_text()
    assert '  optimizer.warmup: 100\n' in text
    dump_file.write_text(text.replace('  optimizer.warmup: 100\n', '  optimizer.warmup: 50\n'))
    runs = tmp_path / 'again'
    assert cli.main(['train', 'transformer', '--config', str(dump_file), f'runs_dir={runs}']) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f'lazylab: error: optimizer.warmup comes out 100, --config {dump_file} has 50: the code or data '
                   f'computes it differently now, or the file was edited by hand (give a new setting as key=value '
                   f'instead); --allow-changes accepts it']
    assert not runs.exists()  # nothing written
    second = train('transformer', '--config', str(dump_file), '--allow-changes', runs=runs)
    assert 'lazylab: warning: optimizer.warmup comes out 100' in capsys.readouterr().err
    assert json.loads((second / 'run.json').read_text())['replay_changes'] == [
        f'optimizer.warmup comes out 100, --config {dump_file} has 50']


def test_dumps_are_deterministic_and_list_objects_by_type(tools):
    a, b = dump(_direct('transformer', tools)), dump(_direct('transformer', tools))
    assert a == b and ' at 0x' not in a
    objects = yaml.safe_load(a)['objects']
    assert objects['optimizer.parameters'] == 'generator (assigned while computing optimizer)'
    assert objects['transformer.src_embed'] == \
        'lazylab.models.autoregressive.TokenAndPositionEmbeddings (set_default func while computing transformer)'


def test_run_json_records_versions_device_commit_parameters_and_status(train, tools):
    info = json.loads((train('transformer') / 'run.json').read_text())
    import platform

    import lazylab
    assert (info['lazylab'], info['torch'], info['python'], info['device']) == \
        (lazylab.__version__, torch.__version__, platform.python_version(), 'cpu')
    head = subprocess.run(['git', '-C', str(tools.ROOT), 'rev-parse', 'HEAD'], capture_output=True, text=True)
    if head.returncode == 0:  # the tests run from a checkout (CI's is a fresh clone)
        assert info['git']['commit'] == head.stdout.strip() and isinstance(info['git']['dirty'], bool)
    assert info['status'] == 'completed' and info['steps'] == 4 and info['parameters'] == 4657


class _FakeClock:
    """The trainer's clock: every reading advances 10 ms, so a time budget is spent the same way on any machine."""

    def __init__(self):
        self.now = 0.0

    def time(self) -> float:
        self.now += 0.01
        return self.now


def test_total_steps_record_the_steps_a_time_budget_run_took(train, tools, monkeypatch):
    from lazylab.experiments import trainer
    monkeypatch.setattr(trainer, 'time', _FakeClock())
    run = train('transformer', 'max_steps=0', 'max_minutes=0.05', 'epochs=100', 'valid_interval=40')
    info = json.loads((run / 'run.json').read_text())
    doc = yaml.safe_load((run / 'configs.yaml').read_text())
    ck = torch.load(run / 'checkpoint.pt', weights_only=True)
    steps = ck['position']['step']
    assert 30 < steps == info['steps'] == doc['values']['total_steps'] == doc['values']['optimizer.total_steps']
    assert ck['scheduler']['lr_lambdas'][0]['total_steps'] == steps
    # what the configuration had computed: the upper bound of 100 epochs
    bound = 100 * -(-((len(_direct('transformer', tools).dataset.train) - 1) // 16) // 4)
    assert doc['computed_before_run'] == {'total_steps': bound, 'optimizer.total_steps': bound} and bound > steps
    assert read_metrics(run / 'metrics.jsonl')[-1]['step'] == steps


def test_the_trainer_hook_is_asked_at_each_validation_and_stops_the_run(tmp_path, tools):
    asked = []

    def hook(step, record):
        asked.append((step, record['loss.valid']))
        assert record['progress'] == step / 8  # the share of max_steps=8 done
        return 'pruned' if step == 4 else None

    settings = [t for t in tools.TINY if not t.startswith('max_steps=')] + ['max_steps=8', f'runs_dir={tmp_path}']
    threads = torch.get_num_threads()
    try:
        run = lifecycle.train_main('transformer', settings, on_validation=hook)
    finally:
        torch.set_num_threads(threads)
    records = read_metrics(run / 'metrics.jsonl')
    assert asked == [(r['step'], r['loss.valid']) for r in records if 'loss.valid' in r] and asked[-1][0] == 4
    assert records[-1]['step'] == 4
    info = json.loads((run / 'run.json').read_text())
    assert info['status'] == 'pruned' and info['steps'] == 4
    assert torch.load(run / 'checkpoint.pt', weights_only=True)['position']['step'] == 4


def test_under_a_time_budget_the_hook_is_told_the_share_of_the_minutes_done(tmp_path, tools):
    seen = []

    def hook(step, record):
        seen.append((record['progress'], record['time']))

    settings = replaced(tools.TINY, 'max_steps=0', 'max_minutes=0.05', 'valid_interval=5', f'runs_dir={tmp_path}')
    threads = torch.get_num_threads()
    try:
        lifecycle.train_main('transformer', settings, on_validation=hook)
    finally:
        torch.set_num_threads(threads)
    assert seen, 'no interleaved validation in 3 seconds'
    # the share of the budget's 3 seconds when the hook is asked: after its record's time (rounded to ms), before
    # the next one's
    times = [t for _, t in seen] + [3.0]
    assert all(t / 3 - 1e-3 <= p <= min(1.0, after / 3) for (p, t), after in zip(seen, times[1:])), seen
