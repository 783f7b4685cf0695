"""A loss or gradient that is not finite on the first batch, before any update, is the model's and its settings',
not the learning rate's: the up-front check (`trainer.check_trains`) says so in one line, naming the settings given
that the model is made from, before anything is written; a NaN after updates keeps the learning-rate hint."""
import pytest

from lazylab.errors import TrainingError
from lazylab.experiments import configure, trainer
from lazylab.experiments.configure import compute, make_configs

SIZES = ['d_model=32', 'heads=2', 'seq_len=16', 'batch_size=4', 'valid_batches=1',
         'final_valid_batches=1', 'sample_tokens=4', 'device=cpu', 'threads=1', 'max_steps=3']
#: φ = linear without the sum normalisation divides by a sum that can be zero: NaN at once (whatever the rate)
UNNORMALISED = ['fast_weights.phi=linear', 'fast_weights.sum_normalization=false']
CAUSE = ('so the learning rate is not the cause: the likely cause is one of these settings (device=cpu, seq_len=16, '
         'd_model=32, heads=2, fast_weights.phi=linear, fast_weights.sum_normalization=false)')


@pytest.mark.parametrize('rate', [[], ['optimizer.learning_rate=1e-9']], ids=['default rate', 'tiny rate'])
def test_a_nan_loss_before_any_update_names_the_settings_and_writes_nothing(tmp_path, cli_error, rate):
    message = cli_error(['train', 'fast_weights', *UNNORMALISED, *SIZES, *rate, f'runs_dir={tmp_path / "runs"}'])
    assert message == f"the model's loss is nan on the first batch (16×4), before any update, {CAUSE}"
    assert not (tmp_path / 'runs').exists()


def test_a_nan_loss_at_step_1_of_training_says_it_is_not_the_learning_rate(tmp_path, cli_error, monkeypatch):
    monkeypatch.setattr(configure, 'check_trains', lambda c: None)  # as when eval and training mode differ
    message = cli_error(['train', 'fast_weights', *UNNORMALISED, *SIZES, f'runs_dir={tmp_path}'])
    assert message == f'training loss is nan at step 1, before any update (no checkpoint was written), {CAUSE}'


def test_a_gradient_that_is_not_finite_before_any_update_is_named():
    conf = make_configs('transformer', ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=8',
                                        'batch_size=2', 'device=cpu'])
    compute(conf)
    # a finite loss, an infinite gradient
    conf.model.generator.projection.weight.register_hook(lambda g: g * float('inf'))
    with pytest.raises(TrainingError) as e:
        trainer.check_trains(conf)
    assert str(e.value) == ("the model's gradient of generator.projection.weight is not finite (inf) on the first "
                            "batch (8×2), before any update, so the learning rate is not the cause: the likely "
                            "cause is one of these settings (device=cpu, seq_len=8, d_model=16, heads=2, d_ff=32, "
                            "n_layers=1)")
    assert all(p.grad is None for p in conf.model.parameters())


def test_the_default_settings_are_named_as_such():
    conf = make_configs('transformer', [])
    assert trainer.not_finite_cause(conf) == ('so the learning rate is not the cause: the model itself is, with the '
                                               'default settings')


def test_a_nan_after_an_update_keeps_the_learning_rate_hint(tmp_path, cli_error):
    message = cli_error(['train', 'transformer', 'd_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16',
                         'batch_size=4', 'valid_batches=1', 'final_valid_batches=1', 'device=cpu', 'threads=1',
                         'max_steps=20', 'optimizer.learning_rate=1e30', 'grad_norm_clip=0', f'runs_dir={tmp_path}'])
    assert message == ('training loss is nan at step 2; no checkpoint was written (try a lower '
                       'optimizer.learning_rate or grad_norm_clip)')
