"""The first and last lines of a run: what it is, how it ended and why it stopped (max_steps, the epochs, the time
budget, the task's target); under a time budget the step count is shown as the estimate it is, steadily."""
import io
from types import SimpleNamespace

import pytest

from lazylab import cli
from lazylab.experiments.metrics import Progress, readable_estimate

TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'valid_batches=1',
        'final_valid_batches=1', 'sample_tokens=5', 'device=cpu', 'threads=1']


@pytest.mark.parametrize('steps, shown', [(7, 7), (99, 99), (100, 100), (636, 640), (644, 640), (645, 650),
                                          (1049, 1000), (1050, 1100), (24613, 25000), (24400, 24000)])
def test_an_estimate_is_rounded_half_up_to_two_significant_digits(steps, shown):
    assert readable_estimate(steps) == shown


def _line(progress: Progress, stream: io.StringIO, total: int, calibrated: bool = True) -> str:
    progress.total_steps = total
    progress.show(SimpleNamespace(epoch=0, batch=3, step=120, calibrated=calibrated), {}, eta=0, newline=True)
    return stream.getvalue().splitlines()[-1].split(' | ')[0]


def test_a_fitted_step_count_is_shown_as_a_steady_estimate():
    stream = io.StringIO()
    progress = Progress(24_600, stream=stream, every_s=0, estimated=True)
    before = _line(progress, stream, 24_600, calibrated=False)
    assert before == 'epoch 1 step 120 (timing the steps for the time budget)'
    # the refits of a real run (the 24,600 → 614 → 505 → 689 → 636): a change within 10% of the shown
    # estimate keeps it
    shown = [_line(progress, stream, total) for total in (614, 640, 590, 505, 689, 636, 660, 700)]
    assert shown == ['epoch 1 step 120/≈610', 'epoch 1 step 120/≈610', 'epoch 1 step 120/≈610',
                     'epoch 1 step 120/≈510', 'epoch 1 step 120/≈690', 'epoch 1 step 120/≈690',
                     'epoch 1 step 120/≈690', 'epoch 1 step 120/≈690']
    exact = Progress(1_200, stream=stream, every_s=0)
    assert _line(exact, stream, 1_200) == 'epoch 1 step 120/1,200'


def _run(capsys, argv) -> list[str]:
    assert cli.main(argv) == 0
    return capsys.readouterr().out.splitlines()


def test_the_last_line_says_max_steps_stopped_it(tmp_path, capsys):
    lines = _run(capsys, ['train', 'transformer', *TINY, 'max_steps=2', 'valid_interval=1', f'runs_dir={tmp_path}'])
    assert lines[-1].startswith('done: step 2, valid loss ') and '; stopped at max_steps=2; run dir ' in lines[-1]


def test_the_last_line_says_a_given_total_steps_stopped_it_not_the_epochs(tmp_path, capsys):
    lines = _run(capsys, ['train', 'transformer', *TINY, 'total_steps=3', 'valid_interval=1', f'runs_dir={tmp_path}'])
    assert lines[-1].startswith('done: step 3, valid loss ') and '; stopped at total_steps=3; run dir ' in lines[-1]


def test_the_last_line_says_the_epochs_stopped_it(tmp_path, capsys):
    text = tmp_path / 'small.txt'
    text.write_text('It is a truth universally acknowledged, that a single man in possession. ' * 12)
    lines = _run(capsys, ['train', 'transformer', *TINY, f'text={text}', 'prompt=It', 'epochs=1', 'max_steps=0',
                          'max_minutes=0', 'valid_interval=100', f'runs_dir={tmp_path}'])
    steps = int(lines[0].split(', ')[1].split(' steps of 4×16 characters')[0])  # an epoch's batches
    assert steps > 1
    assert lines[-1].startswith(f'done: step {steps}, ') and '; stopped after 1 epoch (epochs=1); ' in lines[-1]


def test_under_a_time_budget_the_first_line_says_the_steps_are_fitted_and_the_last_that_time_ran_out(tmp_path,
                                                                                                     capsys):
    lines = _run(capsys, ['train', 'transformer', *TINY, 'max_minutes=0.0002', 'max_steps=0', 'valid_interval=50',
                          f'runs_dir={tmp_path}'])
    assert '0.0002 minutes (the step count is fitted to them after the first steps; at most ' in lines[0]
    assert '; stopped by the time budget (max_minutes=0.0002); ' in lines[-1]


def test_a_retrieval_run_its_target_stops_says_so(tmp_path, capsys):
    lines = _run(capsys, ['train', 'retrieval', 'n_keys=4', 'max_steps=20', 'valid_interval=10', 'log_interval=5',
                          'stop_loss=10', 'device=cpu', 'threads=1', f'runs_dir={tmp_path}'])
    assert "; stopped early, at step 10 of 20: the task's target was reached (RetrievalTask.converged, valid " \
           "loss " in lines[-1] and lines[-1].startswith('done: step 10, ')
