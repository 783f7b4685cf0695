"""A fuzz test of the command line: `lazylab train`, `--config` files, `generate` and `resume` with key=value tokens
drawn from every declared item of every experiment, values of the right and wrong types and edge values.

Every call must end in exit 0, or in exit 2 with one line `lazylab: error: …` (warnings aside) and nothing written:
no run directory, no file anywhere under the working folder, no change to an existing run. The one documented
exception: a run whose loss (or sampled logits) became NaN stops with exit 2 and keeps its run directory.

Deterministic (derandomized, fixed numbers of examples, no example database) and sized for about a minute of CI:
tiny models on a 600-character text, at most 2 optimizer steps, in this process.

Left out on purpose (each would cost minutes, not find mistakes): `compile=true` (torch.compile's first call),
the bundled Tiny Shakespeare as `text` (a whole validation split per run), sizes such as 10⁶ that are legal but slow
(sample_tokens=1000000); the huge sizes drawn are 10¹⁸ and 10²³, which must fail at once.
"""
import contextlib
import io
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazylab import cli
from lazylab.configs import describe
from lazylab.experiments.configure import declared_keys
from lazylab.experiments.discovery import BUILTIN, load_experiment
from lazylab.testing import as_stopped

EXPERIMENTS = tuple(BUILTIN)

SETTINGS = dict(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: examples per test are multiplied by this (LAZYLAB_FUZZ_SCALE=20 for a longer local search; CI: 1)
SCALE = int(os.environ.get('LAZYLAB_FUZZ_SCALE', '1'))

HUGE = ['1000000000000000000', '99999999999999999999999']
EDGE = ['0', '-1', 'nan', 'inf', '-inf', '', '1e308', '-0.0', '0.5', '1', '2', 'é', '日本語', 'None', 'null',
        'true', 'False', '[1, 2', '[a, b]', '{}', ' ', '\x00', *HUGE]
# The run's length: only values that keep it at 1–2 steps, or that are wrong (the base sets max_steps=2, epochs=1).
LENGTH_KEYS = {'max_steps': ['1', '2', '-1', 'nan', 'inf', '', 'é', '2.5'],
               'total_steps': ['1', '2', '0', '-1', 'nan', '', 'é'],
               'epochs': ['0', '1', '3', '-1', 'nan', '', 'é', *HUGE]}
# Legal values that are slow rather than wrong (see the module docstring).
SLOW = {'compile': {'true', 'True', 'yes', '1', 'on', 'y', 't'}, 'text': {'tiny_shakespeare'}}
#: Items in other helpers' files whose declarations have no upper bound yet, so that a huge value builds layers
#: (or DPFP's ν rolled copies) one by one until the memory runs out: the fuzz draws no huge values for them, and
#: `test_known_gaps_are_still_gaps` fails once they are bounded (then remove them here). See issue 14's report.
UNBOUNDED = {('feedback', 'n_layers'), ('feedback', 'feedback.n_layers'), ('fast_weights', 'n_layers'),
             ('fast_weights', 'fast_weights.n_layers'), ('fast_weights', 'nu'), ('fast_weights', 'fast_weights.nu')}


def _rows(name):
    return [r for r in describe(load_experiment(name).Configs)]


def _right_values(name, row):
    """Values of the item's type that are likely to work: its options, its choices, its default, small numbers."""
    key = row['name']
    if key in LENGTH_KEYS:
        return [v for v in LENGTH_KEYS[key] if v in ('1', '2')]
    values = [str(o) for o in row['options']]
    if row['default'] is not None and not isinstance(row['default'], dict):
        values.append(str(row['default']))
    kind = row['base_type']
    if kind == 'int':
        values += ['1', '2', '3']
    elif kind == 'float':
        values += ['0', '0.1', '0.5']
    elif kind == 'bool':
        values += ['true', 'false']
    elif ' | ' in kind:  # a Literal's choices
        values += kind.split(' | ')
    values += RIGHT_EXTRA.get(key, [])
    return [v for v in dict.fromkeys(values) if v not in SLOW.get(key, ())]


def _wrong_values(name, row):
    """Values of the wrong type, edge values, wrong-case option names, and the paths and URLs that cannot work."""
    key = row['name']
    if key in LENGTH_KEYS:
        return [v for v in LENGTH_KEYS[key] if v not in ('1', '2')]
    values = [*EDGE]
    for option in row['options']:
        values += [str(option).upper(), str(option).lower(), str(option)[:-1]]
    if row['base_type'] == 'bool':
        values += ['yes', 'no', 'FALSE', 'maybe']
    values += WRONG_EXTRA.get(key, [])
    if (name, key) in UNBOUNDED:
        values = [v for v in values if v not in HUGE]
    right = set(_right_values(name, row))
    return [v for v in dict.fromkeys(values) if v not in SLOW.get(key, ()) and v not in right]


RIGHT_EXTRA = {'runs_dir': ['runs', 'a/b/c', 'é'], 'text': ['small.txt'], 'dashboard': ['http://127.0.0.1:9'],
               'prompt': ['It', 'zzz'], 'device': ['cpu', 'cpu:0', 'auto'], 'preset': ['labml_nn'],
               'seq_len_start': ['4', '8'], 'seq_len_warmup': ['1', '3'], 'max_minutes': ['0', '0.05']}
WRONG_EXTRA = {'runs_dir': ['/proc/lazylab-cannot', 'afile', 'afile/below'],
               'text': ['missing.txt', 'adir', 'latin1.txt', '/dev/null', 'small.txt/x'],
               'dashboard': ['ftp://127.0.0.1:9', 'http://', '127.0.0.1:9'], 'prompt': ['Ü'],
               'device': ['CPU', 'cuda', 'meta', 'mps', 'cuda:99'], 'preset': ['LABML_NN', 'gpu'],
               'seq_len_start': ['9']}


def _token_strategies(name):
    """(right, wrong): strategies of (key, value) pairs over every declared item of experiment `name`."""
    rows = _rows(name) + [{'name': 'preset', 'options': [], 'default': None, 'base_type': 'str'}]
    right = [(r['name'], v) for r in rows for v in _right_values(name, r)]
    wrong = [(r['name'], v) for r in rows for v in _wrong_values(name, r)]
    wrong += [('d_modle', '16'), ('D_MODEL', '16'), ('.', '1'), ('x.', '1'), ('ffn.', '1')]
    right += [('ffn.glu_variant', 'SwiGLU')] if name == 'transformer' else []
    return st.sampled_from(right), st.sampled_from(wrong)


def _draws(name):
    """0–2 settings likely to work, then maybe one that is wrong: most runs get past the checks, and each wrong
    value meets a configuration that is not only the base one."""
    right, wrong = _token_strategies(name)
    return st.tuples(st.lists(right, max_size=2), st.lists(wrong, max_size=1)).map(lambda t: t[0] + t[1]).filter(
        bool)


TEXT = 'It is ' + ''.join(chr(ord('a') + (i * 7) % 26) + (' ' if i % 5 == 4 else '') + ('\n' if i % 40 == 39 else '')
                         for i in range(475))  # 600 characters of 29 distinct ones; the default prompt is in them


def _workdir() -> Path:
    """A fresh folder with the files the drawn values name (the tests chdir into it)."""
    work = Path(tempfile.mkdtemp(prefix='lazylab-fuzz-'))
    (work / 'small.txt').write_text(TEXT, encoding='utf-8')
    (work / 'latin1.txt').write_bytes(b'abc' + 'caf\xe9'.encode('latin-1') * 100)
    (work / 'adir').mkdir()
    (work / 'afile').write_text('not a folder')
    return work


BASE = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=8', 'batch_size=8', 'max_steps=2',
        'max_minutes=0', 'epochs=1', 'valid_interval=1', 'valid_batches=1', 'final_valid_batches=1',
        'sample_tokens=3', 'log_interval=1', 'device=cpu', 'threads=1', 'text=small.txt', 'runs_dir=runs']


#: what an experiment needs besides BASE for a run to start (MQAR's default 4 pairs and 4 queries need 16 tokens)
FITS = {'mqar': ['n_pairs=2']}


def _base(name):
    """BASE less the keys experiment `name` does not declare (retrieval, mqar and state_tracking read no text and
    sample nothing), with what it needs to fit (FITS), so that a draw meets a run that can start."""
    keys = declared_keys(load_experiment(name).Configs)
    return [b for b in BASE if b.split('=', 1)[0] in keys] + FITS.get(name, [])


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    """relative path → (size, mtime_ns) of everything under `folder`."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for entry in dirs + files:
            path = Path(root) / entry
            stat = path.lstat()
            out[str(path.relative_to(folder))] = (stat.st_size if entry in files else 0, stat.st_mtime_ns)
    return out


NAN_STOPS = ('training loss is ', 'validation loss is ', 'sampling after step ')


def _call(argv, work: Path, allowed_changes=None):
    """cli.main(argv) in `work`; checks the exit code, stderr and the files, returns (code, stderr)."""
    before = _tree(work)
    threads = torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    text = err.getvalue()
    assert 'Traceback' not in text, (argv, text)
    assert code in (0, 2), (argv, code, text)
    lines = [line for line in text.splitlines() if line.strip()]
    others = [line for line in lines if not line.startswith('lazylab: warning: ')]
    if code == 2:
        assert len(others) == 1 and others[0].startswith('lazylab: error: '), (argv, text)
        if not others[0][len('lazylab: error: '):].startswith(NAN_STOPS):
            after = _tree(work)
            changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)
                       and not _labml_of_an_earlier_run(p, before)}
            assert changed <= (allowed_changes or set()), (argv, text, sorted(changed)[:5])
    else:
        assert not others, (argv, text)
    return code, text


def _labml_of_an_earlier_run(path: str, before) -> bool:
    """labml's own files of a run an earlier call of this process made: labml's file writer of that finished run
    may still flush into them (in this process only; a command's process flushes everything when it exits)."""
    parts = Path(path).parts
    return 'labml' in parts and str(Path(*parts[:parts.index('labml')], 'run.json')) in before


def _tokens(draws):
    return [f'{k}={v}' for k, v in draws]


@pytest.mark.parametrize('name', EXPERIMENTS)
def test_train_with_drawn_overrides_exits_0_or_2_with_one_line_and_nothing_written(name):
    work = _workdir()

    @settings(max_examples=60 * SCALE, **SETTINGS)
    @given(draws=_draws(name))
    def run(draws):
        _call(['train', name, *_base(name), *_tokens(draws)], work)

    try:
        run()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _yaml_value_strategy():
    scalars = st.sampled_from([0, -1, 1, 2, 10**18, 10**23, 0.5, float('nan'), float('inf'), -0.0, True, False,
                               None, '', 'é', 'SwiGLU', 'adamw', 'AdamW', 'cpu', 'true', '1e3', '[1, 2'])
    return st.one_of(scalars, st.lists(scalars, max_size=2), st.dictionaries(st.sampled_from(['a', 'd_model']),
                                                                             scalars, max_size=1))


@pytest.mark.parametrize('name', ['transformer', 'feedback'])
def test_config_files_with_drawn_values_exit_0_or_2_with_one_line_and_nothing_written(name):
    work = _workdir()
    keys = [r['name'] for r in _rows(name) if r['name'] not in LENGTH_KEYS and r['name'] not in SLOW
            and (name, r['name']) not in UNBOUNDED] + ['preset', 'values', 'ffn.glu_variant', 'd_modle']

    @settings(max_examples=30 * SCALE, **SETTINGS)
    @given(doc=st.dictionaries(st.sampled_from(keys), _yaml_value_strategy(), min_size=1, max_size=3),
           broken=st.sampled_from([None, None, None, 'd_model: [1, 2\n', '- a\n- b\n', 'x: 1\n\tbad: 2\n']))
    def run(doc, broken):
        config = work / 'drawn.yaml'
        config.write_text(broken if broken is not None else yaml.safe_dump(doc, allow_unicode=True),
                          encoding='utf-8')
        _call(['train', name, *BASE, '--config', str(config)], work, allowed_changes=set())

    try:
        run()
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope='module')
def finished_run():
    """(work folder, run directory) of a finished 2-step transformer run."""
    work = _workdir()
    threads = torch.get_num_threads()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli.main(['train', 'transformer', *BASE]) == 0
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    run_dir, = (work / 'runs' / 'transformer').iterdir()
    yield work, run_dir
    shutil.rmtree(work, ignore_errors=True)


def test_generate_with_drawn_arguments_exits_0_or_2_with_one_line_and_writes_nothing(finished_run):
    work, run_dir = finished_run
    options = {'--prompt': ['It', '', 'é', 'a' * 300, '-h x'], '--tokens': ['0', '5', '-1', 'nan', 'x', *HUGE],
               '--temperature': ['0', '0.8', 'nan', 'inf', '-inf', '-1', '1e-300', '1e308', 'x'],
               '--top-k': ['0', '1', '5', '-1', 'nan', *HUGE], '--seed': ['0', '-1', '3', '2.5', *HUGE],
               '--bogus': ['1']}
    pairs = [(k, v) for k, vs in options.items() for v in vs]

    @settings(max_examples=50 * SCALE, **SETTINGS)
    @given(draws=st.lists(st.sampled_from(pairs), max_size=4),
           where=st.sampled_from(['run', 'run', 'run', 'missing', 'work']))
    def run(draws, where):
        target = {'run': str(run_dir), 'missing': str(work / 'nope'), 'work': str(work)}[where]
        args = dict([('--prompt', 'It'), ('--tokens', '3')] + draws)
        flat = [part for k, v in args.items() for part in (k, v)]
        if '-h x' in flat:  # a prompt that is a help flag: help is printed
            flat = [p if p != '-h x' else '-h' for p in flat]
        _call(['generate', target, *flat], work, allowed_changes=set())

    run()


def test_resume_with_drawn_configs_exits_0_or_2_with_one_line_and_leaves_the_run_as_it_was(finished_run):
    work, run_dir = finished_run
    rows = _rows('transformer')
    pairs = [(r['name'], v) for r in rows
             for v in _right_values('transformer', r)[:3] + _wrong_values('transformer', r)[:6]]
    pairs += [('text', 'latin1.txt'), ('text', str(work / 'other.txt')), ('d_model', '32'), ('n_tokens', '30')]
    (work / 'other.txt').write_text(TEXT.replace('a', 'A'), encoding='utf-8')  # another vocabulary

    @settings(max_examples=20 * SCALE, **SETTINGS)
    @given(draws=st.lists(st.sampled_from(pairs), min_size=1, max_size=2))
    def run(draws):
        copy = work / 'resumed'
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(run_dir, copy)
        path = copy / 'configs.yaml'
        doc = yaml.safe_load(path.read_text(encoding='utf-8'))
        doc['values'].update(dict(draws))  # text, as a user would edit it
        path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding='utf-8')
        code, err = _call(['resume', str(copy)], work, allowed_changes=set())
        if ('text', str(work / 'other.txt')) in draws and code == 2:
            assert 'another vocabulary' in err or 'bad value' in err or 'unknown' in err, err

    run()


def test_resume_refuses_another_vocabulary_saying_what_changed(finished_run):
    work, run_dir = finished_run
    copy = work / 'vocab'
    shutil.copytree(run_dir, copy)
    as_stopped(copy)  # steps left to train: a finished run's resume has nothing to do, and checks nothing
    (work / 'more.txt').write_text(TEXT + 'ÉÉ', encoding='utf-8')
    path = copy / 'configs.yaml'
    doc = yaml.safe_load(path.read_text(encoding='utf-8'))
    doc['values']['text'] = str(work / 'more.txt')
    doc['values'].pop('n_tokens')  # (else: n_tokens=29, but the text has 30 characters)
    path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding='utf-8')
    code, err = _call(['resume', str(copy)], work, allowed_changes=set())
    assert code == 2
    assert "has another vocabulary than the checkpoint was trained on (29 → 30 characters; added 'É')" in err, err


def test_known_gaps_are_still_gaps():
    """The items UNBOUNDED lists still take any size (when one gets an upper bound, remove it from UNBOUNDED)."""
    for name, key in sorted(UNBOUNDED):
        row = next(r for r in _rows(name) if r['name'] == key)
        assert '≤' not in row['rule'], f'{name}: {key} is bounded now ({row["rule"]}); remove it from UNBOUNDED'
