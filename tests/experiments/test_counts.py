"""Counts in messages take the noun in their number: '1 step', '2 steps' (`lazylab.errors.plural`)."""
import pytest

from lazylab.errors import plural

TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'sample_tokens=4',
        'valid_batches=1', 'final_valid_batches=1', 'device=cpu', 'threads=1']


@pytest.mark.parametrize('n, nouns, shown', [(1, None, '1 step'), (0, None, '0 steps'), (2, None, '2 steps'),
                                             (1200, None, '1,200 steps'), (1.0, None, '1 step'),
                                             (1.5, None, '1.5 steps'), (2, 'stepz', '2 stepz'), (1, 'stepz', '1 step')])
def test_plural(n, nouns, shown):
    assert plural(n, 'step', nouns) == shown


def test_the_start_line_of_a_one_step_one_minute_run_is_singular(tmp_path, capsys):
    from lazylab import cli
    assert cli.main(['train', 'transformer', *TINY, 'max_steps=1', 'max_minutes=1', f'runs_dir={tmp_path}']) == 0
    run, = (tmp_path / 'transformer').iterdir()
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f'transformer: 4,657 parameters, 1 step (at most 1 minute) of 4×16 characters on cpu → {run}'

