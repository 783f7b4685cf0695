"""The sweep grammar (Hydra's multirun overrides) and the grid, without running anything; the grammar is pure."""
import json
import subprocess
import sys

import pytest

from lazylab.errors import UsageError
from lazylab.sweeps.grammar import Dimension, Fixed, Space, parse_value


@pytest.mark.parametrize('text, texts', [
    ('a,b,c', ['a', 'b', 'c']),
    ('choice(1, 2)', ['1', '2']),
    ('GEGLU, SwiGLU', ['GEGLU', 'SwiGLU']),
    ('range(1,4)', ['1', '2', '3']),
    ('range(5)', ['0', '1', '2', '3', '4']),
    ('range(3,0,-1)', ['3', '2', '1']),
    ('range(start=1,stop=8,step=3)', ['1', '4', '7']),
    ('range(0,1,0.25)', ['0.0', '0.25', '0.5', '0.75']),
    ('range(0.1,0.4,0.1)', ['0.1', '0.2', '0.3']),  # no 0.30000000000000004
    ('[1,2],[3,4]', ['[1,2]', '[3,4]']),
    ('(0.9,0.99),(0.8,0.9)', ['(0.9,0.99)', '(0.8,0.9)']),
    ("'a,b',c", ['a,b', 'c']),
    (r'a\,b,c', ['a,b', 'c']),
], ids=lambda v: v if isinstance(v, str) else None)
def test_choices(text, texts):
    d = parse_value('k', text)
    assert isinstance(d, Dimension) and d.kind == 'choice' and d.texts == texts


@pytest.mark.parametrize('text, value', [
    ('16', '16'), ('[1,2]', '[1,2]'), ("'a,b'", 'a,b'), ('"x, y"', 'x, y'), (r'a\,b', 'a,b'), ('It is ', 'It is '),
    ('(0.8, 0.9)', '(0.8, 0.9)'), ('', ''),
])
def test_fixed_values(text, value):
    assert parse_value('k', text) == Fixed(value)


def test_intervals_and_tags():
    d = parse_value('lr', 'tag(log, interval(1e-4, 1e-2))')
    assert (d.kind, d.low_text, d.high_text, d.log) == ('interval', '1e-4', '1e-2', True)
    d = parse_value('n', 'tag(int, interval(1, 9))')
    assert (d.kind, d.is_int, d.log) == ('interval', True, False)
    d = parse_value('n', 'tag(log, range(1,5))')
    assert (d.kind, d.texts, d.log, d.int_step) == ('choice', ['1', '2', '3', '4'], True, 1)


@pytest.mark.parametrize('text, message', [
    ('range(1,a)', "'a' is not a number"),
    ('range(1,1)', 'range() is empty'),
    ('range(1,5,0)', 'step must not be 0'),
    ('range(stop=3,2)', 'positional argument after a named one'),
    ('interval(1)', 'interval() needs two bounds'),
    ('interval(a,2)', "'a' is not a number"),
    ('tag(lg, interval(1,2))', "unknown tag 'lg'"),
    ('tag(log, choice(1,2))', 'tag(log, …) needs interval'),
    ('glob(*)', 'glob() is not supported'),
    ('shuffle(a,b)', 'shuffle() is not supported'),
    ('a,,b', 'an empty value'),
    ('a,b,', 'an empty value'),
    ('[1,2', 'unclosed bracket'),
    ('choice()', 'choice() needs at least one value'),
    ('a,range(1,3)', 'cannot be an element of a list'),
])
def test_bad_sweeps_name_the_key_and_the_text(text, message):
    with pytest.raises(UsageError) as e:
        parse_value('k', text)
    assert str(e.value).startswith(f'k={text}: ') and message in str(e.value)


def _dim(key, values):
    d = Dimension(key, 'choice', ','.join(map(str, values)), texts=[str(v) for v in values])
    d.values = list(values)
    return d


def test_the_grid_is_the_product_in_command_line_order_with_the_last_key_fastest():
    space = Space([_dim('a', [1, 2]), _dim('b', ['x', 'y', 'z'])])
    assert space.grid() == [{'a': 1, 'b': 'x'}, {'a': 1, 'b': 'y'}, {'a': 1, 'b': 'z'},
                            {'a': 2, 'b': 'x'}, {'a': 2, 'b': 'y'}, {'a': 2, 'b': 'z'}]


def test_zipped_keys_move_together_at_the_place_of_their_first_key():
    space = Space([_dim('a', [1, 2]), _dim('c', [True, False]), _dim('b', [10, 20])], [['a', 'b']])
    assert space.axes() == [['a', 'b'], ['c']]
    assert space.grid() == [{'a': 1, 'b': 10, 'c': True}, {'a': 1, 'b': 10, 'c': False},
                            {'a': 2, 'b': 20, 'c': True}, {'a': 2, 'b': 20, 'c': False}]
    assert space.overrides({'a': 2, 'b': 20, 'c': False}) == ['a=2', 'c=False', 'b=20']


def test_ints_and_floats_are_different_values():
    space = Space([_dim('x', [1, 1.5])])
    assert space.overrides({'x': 1}) == ['x=1']
    with pytest.raises(ValueError):
        space.by_key['x'].text_of(1.0)
    with pytest.raises(UsageError, match='1.0 is given twice'):
        Space([_dim('x', [1.0, 1.0])])


def test_progress_lines_show_a_drawn_float_with_4_significant_digits_and_the_rest_as_overrides():
    lr = Dimension('optimizer.learning_rate', 'interval', 'interval(1e-4,1e-2)', low=1e-4, high=1e-2)
    layers = Dimension('n_layers', 'interval', 'interval(1,8)', low=1, high=8, is_int=True)
    dropout = Dimension('dropout', 'choice', '0.123456789,0.2', texts=['0.123456789', '0.2'], values=[0.123456789, 0.2])
    space = Space([lr, layers, dropout])
    params = {'optimizer.learning_rate': 0.0012345678901234, 'n_layers': 3, 'dropout': 0.123456789}
    assert space.shown(params) == ['optimizer.learning_rate=0.001235', 'n_layers=3', 'dropout=0.123456789']
    assert space.overrides(params) == ['optimizer.learning_rate=0.0012345678901234', 'n_layers=3',
                                       'dropout=0.123456789']
    assert space.shown({**params, 'optimizer.learning_rate': 2.5e-05}) [0] == 'optimizer.learning_rate=2.5e-05'


# --- pure: no torch, no configs, no experiments ------------------------------------------------------------------

BLOCKED = ('torch', 'lazylab.configs', 'lazylab.experiments')
PURE_SCRIPT = '''
import json, sys

class Block:
    """A meta-path finder that refuses torch and lazylab's configs and experiments, so an import of any fails."""
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + '.') for b in %r):
            raise ImportError(f'{name} is blocked in this test')
        return None

sys.meta_path.insert(0, Block())
%s
from lazylab.sweeps.grammar import Space, parse_value
lr, glu = parse_value('lr', 'tag(log, interval(1e-4,1e-2))'), parse_value('glu', "none,'a,b'")
width = parse_value('d_model', 'range(16,49,16)')
width.values = [int(t) for t in width.texts]
glu.values = list(glu.texts)
space = Space([width, glu])
print(json.dumps({'lr': [lr.kind, lr.low_text, lr.high_text, lr.log], 'grid': space.grid(),
                  'loaded': sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith(%r))}))
'''


def _pure_run(before: str = '') -> subprocess.CompletedProcess:
    code = PURE_SCRIPT % (BLOCKED, before, ('lazylab.configs', 'lazylab.experiments'))
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)


def test_the_grammar_imports_and_works_with_torch_configs_and_experiments_blocked():
    done = _pure_run()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report['lr'] == ['interval', '1e-4', '1e-2', True]
    assert report['grid'] == [{'d_model': w, 'glu': g} for w in (16, 32, 48) for g in ('none', 'a,b')]
    assert report['loaded'] == []


@pytest.mark.parametrize('blocked', BLOCKED)
def test_the_blocker_of_the_grammar_test_catches_each_import(blocked):
    done = _pure_run(f'import {blocked}')  # the guard itself must be able to fail
    assert done.returncode != 0 and f'{blocked} is blocked in this test' in done.stderr
