"""lazylab/labml/console.py: what `lazylab labml` writes of labml's console, on hand-worked sequences of labml's
logger calls (parts, is_new_line, is_reset), off a terminal and on one, with a clock the test moves."""
import io

import labml.logger
import pytest

from lazylab.labml.console import Console, loop_time

KEY = labml.logger.Text.key
TIME = ('  0:00m/ 16:10m  ', labml.logger.Text.meta2)  # labml's loop time part: spent / left


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _console(plain=True, times=None, every_s=30.0):
    out, clock = io.StringIO(), Clock()
    return Console(out, plain=plain, times=times, every_s=every_s, clock=clock), out, clock


def _labml_never(parts, is_new_line, is_reset):
    raise AssertionError("labml's own console is not used off a terminal")


@pytest.mark.parametrize('spent, left, text', [
    (0, 0, '  0:00m/  0:00m  '),
    (59.9, 60, '  0:00m/  0:01m  '),
    (3600 + 125, 36000, '  1:02m/ 10:00m  '),
])
def test_loop_time_is_labmls_format(spent, left, text):
    assert loop_time(spent, left) == text


def test_off_a_terminal_redrawn_lines_wait_and_finished_ones_are_plain():
    console, out, clock = _console()
    console.on_log([('Load data', None), ('...', None)], False, True, _labml_never)
    console.on_log([('Load data', None), ('...[DONE]', KEY), ('\t2ms', None), ('\n', None)], False, True,
                   _labml_never)
    for step in (1, 2, 3):  # a progress line redrawn at each step, 9 s apart
        clock.now += 9
        console.on_log([(f'{step:8,}:  ', KEY), (f'loss.train: {4 - step}.0', None), TIME], False, True,
                       _labml_never)
    assert out.getvalue() == 'Load data...[DONE]\t2ms\n'  # < 30 s since the last line: nothing yet
    clock.now += 3
    console.on_log([('       4:  ', KEY), ('loss.train: 0.5', None), TIME], False, True, _labml_never)
    assert out.getvalue().splitlines()[-1] == '       4:  loss.train: 0.5  0:00m/ 16:10m'  # 30 s: one line
    console.on_log([('       5:  ', KEY), ('loss.train: 0.4', None)], False, True, _labml_never)
    console.line('lazylab labml: completed')
    assert out.getvalue() == ('Load data...[DONE]\t2ms\n'
                              '       4:  loss.train: 0.5  0:00m/ 16:10m\n'
                              '       5:  loss.train: 0.4\n'  # the last version, before lazylab's line
                              'lazylab labml: completed\n')


def test_a_line_written_by_the_clock_is_not_written_again_when_labml_ends_it():
    console, out, clock = _console(every_s=0)
    console.on_log([('epoch 1', None)], False, True, _labml_never)
    console.on_log([], True, False, _labml_never)  # labml's tracker.new_line(): the same line, ended
    console.on_log([('a', None), ('b', None)], True, False, _labml_never)  # appended, not reset, then ended
    console.on_log([], True, True, _labml_never)  # a blank line
    console.end_line()
    assert out.getvalue() == 'epoch 1\nab\n\n'


def test_the_time_left_is_the_step_limits_and_dropped_before_the_first_step():
    estimates = [None, (90.0, 30.0)]
    console, out, _ = _console(times=lambda: estimates.pop(0), every_s=0)
    console.on_log([('step 0', None), TIME], True, True, _labml_never)
    console.on_log([('step 3', None), TIME, ('end', None)], True, True, _labml_never)
    assert out.getvalue() == 'step 0\nstep 3  0:01m/  0:00m  end\n'
    console, out, _ = _console(times=None, every_s=0)  # no --steps: labml's own estimate
    console.on_log([('step 3', None), TIME], True, True, _labml_never)
    assert out.getvalue() == 'step 3  0:00m/ 16:10m\n'


def test_on_a_terminal_labml_draws_and_lazylabs_line_starts_on_a_line_of_its_own():
    console, out, _ = _console(plain=False, times=lambda: (0.0, 0.0))
    drawn = []
    console.on_log([('step 3', None), TIME], False, True, lambda *call: drawn.append(call))
    assert drawn == [([('step 3', None), ('  0:00m/  0:00m  ', labml.logger.Text.meta2)], False, True)]
    console.line('lazylab labml: completed')
    assert out.getvalue() == '\nlazylab labml: completed\n'
    console.on_log([('done', None)], True, True, lambda *call: None)
    console.line('again')
    assert out.getvalue().endswith('completed\nagain\n')  # the line was ended by labml: no blank line
