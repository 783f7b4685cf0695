"""Every mistake a user can make on the command line: one line `lazylab: error: …`, exit code 2, no traceback,
and (before training starts) no run directory. `short_run` (tests/conftest.py) is the finished run the tests
damage, each in a copy."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lazylab import cli
from lazylab.experiments.trainer import load_checkpoint
from lazylab.testing import as_stopped, tiny

TINY = tiny(drop=('valid_interval',))


def _files(tmp_path):
    """(path, bytes) of the texts the cases use."""
    (tmp_path / 'latin1.txt').write_bytes(b'First Citizen:\nBefore we proceed' + 'caf\xe9'.encode('latin-1'))
    (tmp_path / 'short.txt').write_text('x' * 1000)  # 900 train / 100 valid characters
    (tmp_path / 'tiny.txt').write_text('abcdefghij' * 2)  # 18 train / 2 valid
    (tmp_path / 'bad.yaml').write_text('d_model: [1, 2\n')
    (tmp_path / 'list.yaml').write_text('- 1\n- 2\n')
    (tmp_path / 'empty.yaml').write_text('# only a comment\n')
    (tmp_path / 'no_values.yaml').write_text('values: {}\ngiven: {}\n')
    (tmp_path / 'sweep').mkdir()
    (tmp_path / 'sweep' / 'sweep.yaml').write_text('command: lazylab sweep transformer d_model=8,16\n')


CASES = [
    (['train', 'transformer', 'd_modle=3'], r"no config item 'd_modle'; did you mean 'd_model'"),
    (['train', 'transformer', 'seq_len=abc'], r'bad value for seq_len: expected int'),
    (['train', 'transformer', 'd_model.x=3'], r'd_model is not a sub-config \(its type is .*int.*\), so d_model.x'),
    (['train', 'transformer', 'optimizer.learning_rate.x=3'], r'optimizer.learning_rate is not a sub-config'),
    (['train', 'transformer', 'dropout=lots'], r'bad value for dropout'),
    (['train', 'transformer', 'optimizer.optimizer=Adamm'],
     r"unknown option 'Adamm' for optimizer.optimizer .*did you mean 'Adam'"),
    (['train', 'transformer', 'model=transfomer'], r"unknown option 'transfomer' for model .*'transformer'"),
    (['train', 'transformer', 'transformer.encoder_attn=relativ'],
     r"unknown option 'relativ' for transformer.encoder_attn .*did you mean 'relative'"),
    (['train', 'transformer', 'd_model'], r"unexpected argument 'd_model': give settings as key=value"),
    (['train', 'transformr'],
     r"unknown experiment 'transformr'; did you mean 'transformer'\? \(experiments: feedback"),
    (['train', 'transformer', 'text={tmp}/missing.txt'], r'text file not found: .*missing.txt'),
    (['train', 'transformer', 'text={tmp}/latin1.txt'],
     r'latin1.txt is not UTF-8 text: invalid byte 0xe9 at byte offset 35$'),  # 15 + 17 + len("caf")
    (['train', 'transformer', 'text={tmp}/short.txt', 'seq_len=128'],
     r'validation split of .*short.txt has 100 characters, fewer than seq_len \+ 1 = 129'),
    (['train', 'transformer', 'text={tmp}/tiny.txt', 'seq_len=18'],
     r'training split of .*tiny.txt has 18 characters, fewer than seq_len \+ 1 = 19'),
    (['train', 'transformer', 'batch_size=0'], r'bad value for batch_size: must be ≥ 1, got 0'),
    (['train', 'feedback', 'threads=100000'], r'^bad value for threads: must be ≤ 1024, got 100000$'),
    (['train', 'transformer', 'device=cuda:7' if not torch.cuda.is_available() else 'device=tpu'], r'device'),
    (['train', 'transformer', 'heads=3'], r'model|heads'),
    (['train', 'transformer', 'prompt=¿Qué?'], r"^prompt='¿Qué\?' \(the start of the validation samples\): "
                                               r"character '¿' \(position 0\) is not in the text tiny_shakespeare"),
    (['train', 'transformer', '--config', '{tmp}/none.yaml'], r'config file not found: .*none.yaml'),
    (['train', 'transformer', '--config', '{tmp}/bad.yaml'], r'cannot read config file .*bad.yaml: line'),
    (['train', 'transformer', '--config', '{tmp}/list.yaml'], r'must hold a mapping'),
    (['train', 'transformer', '--config', '{tmp}/empty.yaml'],
     r'^config file \S+/empty.yaml is empty: it holds no settings$'),
    (['train', 'transformer', '--config', '{tmp}/no_values.yaml'],
     r'^config file \S+/no_values.yaml is empty: it holds no settings$'),
    (['train', 'transformer', '--config='], r'^--config needs a YAML file$'),
    (['train', 'transformer', '--config', ''], r'^--config needs a YAML file$'),
    (['train', 'transformer', 'preset=gpu'], r"unknown preset 'gpu' for transformer; presets: labml_nn"),
    (['train', 'transformer', '--verbose'], r"unknown option '--verbose'"),
    (['options', 'fast_weight'], r"unknown experiment 'fast_weight'; did you mean 'fast_weights'"),
    (['resume', '{tmp}'], r'is not a lazylab run directory'),
    (['resume', '{tmp}/sweep'], r'^\S+/sweep is a sweep directory, not a run: `lazylab sweep --resume \S+/sweep` '
                                r'continues the sweep \(`lazylab resume \S+/sweep/trial-NNNN` one of its runs\)$'),
    (['generate', '{tmp}', '--prompt', 'a'], r'required: --tokens'),
    (['plot', '{tmp}', '-o', '{tmp}/x.png'], r'has no metrics.jsonl'),
    (['plot', '{tmp}', '-o', '{tmp}/x.txt'], r'x.txt: the file name must end in a figure format .*\.png'),
    (['plot', '{tmp}', '-o', '{tmp}'], r'-o .* is a folder; give a file name'),
    (['plot', '{tmp}', '-o', ''], r'^-o needs a file name$'),
    (['trian', 'transformer'], r"unknown command 'trian'; did you mean 'train'\?"),
]


@pytest.mark.parametrize('argv, message', CASES, ids=[' '.join(a)[:60] for a, _ in CASES])
def test_user_error_is_one_line_exit_2_and_writes_nothing(tmp_path, cli_error, argv, message):
    import re
    _files(tmp_path)
    runs = tmp_path / 'runs'
    argv = [a.format(tmp=tmp_path) for a in argv]
    if argv[0] == 'train':  # the tiny settings first, so the case's own key=value wins
        argv = argv[:2] + TINY + [f'runs_dir={runs}'] + argv[2:]
    text = cli_error(argv)
    assert re.search(message, text), text
    assert not runs.exists()


def test_damaged_checkpoint_is_reported_by_resume_and_generate(short_run, tmp_path, cli_error):
    import shutil
    run = tmp_path / 'run'
    shutil.copytree(short_run, run)
    data = (run / 'checkpoint.pt').read_bytes()
    (run / 'checkpoint.pt').write_bytes(data[:len(data) // 2])
    assert 'checkpoint.pt: it is damaged or not a lazylab checkpoint' in cli_error(['resume', str(run)])
    assert 'damaged' in cli_error(['generate', str(run), '--prompt', 'a', '--tokens', '3'])
    (run / 'checkpoint.pt').unlink()
    assert 'no checkpoint at' in cli_error(['resume', str(run)])
    assert "character 'é'" in cli_error(['generate', str(short_run), '--prompt', 'é', '--tokens', '3'])
    assert '--tokens must be ≥ 0' in cli_error(['generate', str(short_run), '--prompt', 'a', '--tokens', '-1'])


def test_a_plain_pickle_as_the_checkpoint_is_one_line_without_torchs_warning(short_run, tmp_path):
    """torch.load(weights_only=True) of a pickle that is not torch's zip format warns (two lines, about its pickle
    protocol) before it fails; the user sees lazylab's one line only, in-process and as a process."""
    import pickle
    import shutil
    import warnings
    run = tmp_path / 'run'
    shutil.copytree(short_run, run)
    (run / 'checkpoint.pt').write_bytes(pickle.dumps({'model': {}, 'format': 'lazylab-checkpoint-1'}, protocol=4))
    line = (f'lazylab: error: cannot read checkpoint {run / "checkpoint.pt"}: it is damaged or not a lazylab '
            f'checkpoint (UnpicklingError)')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with pytest.raises(Exception) as error:
            load_checkpoint(run / 'checkpoint.pt')
    assert f'lazylab: error: {error.value}' == line and [str(w.message) for w in caught] == []
    for command in (['resume', str(run)], ['generate', str(run), '--prompt', 'a', '--tokens', '1']):
        done = subprocess.run([sys.executable, '-m', 'lazylab.cli', *command], capture_output=True, text=True,
                              timeout=120, cwd=Path(__file__).resolve().parents[1])
        assert (done.returncode, done.stderr) == (2, line + '\n')


@pytest.mark.parametrize('content, message', [
    (b'values:\n  d_model: \xff16\n', 'configs.yaml: not UTF-8 text (invalid byte at offset 19)'),
    (b'values: [1, 2\n', "configs.yaml: line 2: while parsing a flow sequence: expected ',' or ']', but got "
                         "'<stream end>'"),
    (b'- 1\n', 'a configuration YAML must be a mapping of keys to values: {run}/configs.yaml'),
], ids=['not UTF-8', 'not YAML', 'a list'])
def test_damaged_configs_yaml_is_reported_by_resume_and_generate_naming_it(
        short_run, tmp_path, cli_error, content, message):
    import shutil
    run = tmp_path / 'run'
    shutil.copytree(short_run, run)
    (run / 'configs.yaml').write_bytes(content)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    for argv in (['resume', str(run)], ['generate', str(run), '--prompt', 'a', '--tokens', '3']):
        text = cli_error(argv)
        assert str(run / 'configs.yaml') in text and message.format(run=run) in text, text
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


@pytest.mark.parametrize('content', ['', '# a comment\n', '{}\n', 'values: {}\ngiven: {}\n'],
                         ids=['nothing', 'a comment', 'an empty mapping', 'no values'])
def test_an_empty_configs_yaml_is_reported_by_resume_and_generate_naming_it(short_run, tmp_path, cli_error, content):
    import shutil
    run = tmp_path / 'run'
    shutil.copytree(short_run, run)
    (run / 'configs.yaml').write_text(content)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    for argv in (['resume', str(run)], ['generate', str(run), '--prompt', 'a', '--tokens', '3']):
        assert cli_error(argv) == f"{run / 'configs.yaml'} is empty: the run's configuration is not in it any more"
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


@pytest.mark.parametrize('section, key, hint', [
    ('values', 'd_modle', "; did you mean 'd_model' or 'model'?"),
    ('values', 'd_model.width', "; did you mean 'd_model'?"),  # replay used to skip this one without a word
    ('values', 'transformer.ffn.d_fff', "; did you mean 'transformer.ffn.d_ff' or 'transformer.ffn.ffn' or "
                                        "'transformer.ffn'?"),
    ('given', 'n_layerz', "; did you mean 'n_layers'?"),
    ('values', 'zzz', ''),
], ids=['typo', 'below a plain item', 'in a sub-config', 'given', 'nothing close'])
def test_an_unknown_key_written_into_a_dump_is_an_error_naming_it(short_run, tmp_path, cli_error, section, key, hint):
    import shutil

    import yaml
    run = tmp_path / 'run'
    shutil.copytree(short_run, run)
    doc = yaml.safe_load((run / 'configs.yaml').read_text())
    doc[section][key] = 3 if section == 'values' else 'user'
    if section == 'given':
        doc['values'][key] = 3
    (run / 'configs.yaml').write_text(yaml.safe_dump(doc))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    dump = run / 'configs.yaml'
    assert cli_error(['resume', str(run)]) == f"{dump}: transformer has no config item {key!r}{hint}"
    assert cli_error(['generate', str(run), '--prompt', 'a', '--tokens', '3']) == \
        f"{dump}: transformer has no config item {key!r}{hint}"
    runs = tmp_path / 'runs'
    assert cli_error(['train', 'transformer', '--config', str(dump), f'runs_dir={runs}']) == \
        f"{dump}: transformer has no config item {key!r}{hint}"
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before and not runs.exists()


def test_every_unknown_key_of_a_dump_is_named(short_run, tmp_path, cli_error):
    import yaml
    doc = yaml.safe_load((short_run / 'configs.yaml').read_text())
    doc['values'].update({'d_modle': 3, 'zzz': 1, 'yyy': 2})
    (tmp_path / 'dump.yaml').write_text(yaml.safe_dump(doc, sort_keys=False))
    assert cli_error(['train', 'transformer', '--config', str(tmp_path / 'dump.yaml')]) == \
        f"{tmp_path / 'dump.yaml'}: transformer has no config item 'd_modle'; did you mean 'd_model' or 'model'? " \
        f"(also unknown: 'zzz', 'yyy')"


def test_a_setting_written_beside_a_dumps_sections_is_an_error_naming_it(short_run, tmp_path, cli_error):
    text = (short_run / 'configs.yaml').read_text()
    dump = tmp_path / 'dump.yaml'
    dump.write_text(text + 'd_modle: 32\n')  # at the top level, beside values:, given:, … (it used to be ignored)
    runs = tmp_path / 'runs'
    assert cli_error(['train', 'transformer', '--config', str(dump), f'runs_dir={runs}']) == \
        f"--config {dump}: 'd_modle' is not a section of a dump (its sections: values, given, computed, objects, " \
        f"computed_before_run, hyperparams, meta); a setting belongs under values:"
    assert not runs.exists()
    run = tmp_path / 'run'  # resume reads its run's dump the same way
    import shutil
    shutil.copytree(short_run, run)
    (run / 'configs.yaml').write_text(text + 'd_modle: 32\n')
    assert "'d_modle' is not a section of a dump" in cli_error(['resume', str(run)])


@pytest.mark.parametrize('where', ['in its run directory', 'copied elsewhere'])
@pytest.mark.parametrize('other', ['feedback', 'fast_weights', 'retrieval'])
def test_config_with_another_experiments_dump_names_both_experiments(short_run, tmp_path, cli_error, where, other):
    import shutil
    dump = short_run / 'configs.yaml'  # a transformer run's
    if where == 'copied elsewhere':  # no run.json beside it: its keys tell which experiment wrote it
        dump = Path(shutil.copy(dump, tmp_path / 'sizes.yaml'))
    runs = tmp_path / 'runs'
    assert cli_error(['train', other, '--config', str(dump), f'runs_dir={runs}']) == \
        f'{dump} is a dump of experiment transformer, not {other}; replay it with: lazylab train transformer ' \
        f'--config {dump}'
    assert not runs.exists()


def test_resume_and_generate_of_a_labml_run_say_what_it_is(tmp_path, cli_error):
    run = tmp_path / 'run'  # what `lazylab labml` writes (see lazylab.labml.session)
    run.mkdir()
    (run / 'run.json').write_text('{"module": "labml_nn.transformers.feedback.experiment", "steps": 2}')
    (run / 'configs.yaml').write_text('values:\n  d_model: 16\n')
    message = f'{run} is a run of lazylab labml labml_nn.transformers.feedback.experiment; lazylab resume and ' \
              f'generate take runs of lazylab train'
    assert cli_error(['resume', str(run)]) == message
    assert cli_error(['generate', str(run), '--prompt', 'a', '--tokens', '3']) == message
    # as `lazylab labml` writes run.json now: `experiment` and `source` of kind labml
    (run / 'run.json').write_text('{"experiment": "experiment", "source": {"kind": "labml", "module": '
                                  '"labml_nn.transformers.feedback.experiment"}, "steps": 2}')
    assert cli_error(['resume', str(run)]) == message


def test_nan_loss_stops_with_exit_2_naming_the_step(tmp_path, cli_error):
    runs = tmp_path / 'runs'
    # an infinite learning rate makes the parameters inf/NaN in the first update, so step 2's loss is NaN
    text = cli_error(['train', 'transformer', *TINY, 'max_steps=5', 'valid_interval=2',
                           'optimizer.learning_rate=1e30', f'runs_dir={runs}'])
    assert text.startswith('training loss is nan at step 2; no checkpoint was written'), text


def test_resume_on_another_number_of_processes_is_refused(short_run, tmp_path, cli_error):
    import shutil
    run = tmp_path / 'run'
    shutil.copytree(short_run, run)
    as_stopped(run)  # a run with steps left (a finished one's resume has nothing to do, and checks nothing)
    ck = torch.load(run / 'checkpoint.pt', weights_only=True)
    ck['world_size'] = 2  # as if a two-process torchrun job had written it
    torch.save(ck, run / 'checkpoint.pt')
    before = (run / 'metrics.jsonl').read_bytes()
    assert 'was saved by 2 process(es); resume it with 2, not 1' in cli_error(['resume', str(run)])
    assert (run / 'metrics.jsonl').read_bytes() == before


def test_nan_loss_keeps_the_last_good_checkpoint(tmp_path, cli_error, monkeypatch):
    import torch.nn.functional as F
    runs = tmp_path / 'runs'
    cross_entropy, calls = F.cross_entropy, []

    def nan_at_training_step_4(*args, **kwargs):
        loss = cross_entropy(*args, **kwargs)
        if kwargs.get('reduction', 'mean') == 'mean':  # the training loss (validation sums)
            calls.append(1)
            if len(calls) == 4:
                return loss * float('nan')
        return loss

    monkeypatch.setattr(F, 'cross_entropy', nan_at_training_step_4)
    text = cli_error(['train', 'transformer', *TINY, 'max_steps=6', 'valid_interval=1', f'runs_dir={runs}'])
    assert text.startswith('training loss is nan at step 4; the checkpoint of step 3 is kept'), text
    run = next((runs / 'transformer').iterdir())
    ck = load_checkpoint(run / 'checkpoint.pt')
    assert ck['position']['step'] == 3
    assert all(torch.isfinite(v).all() for v in ck['model'].values() if v.is_floating_point())


def test_python_dash_m_reports_errors_the_same_way(tmp_path):
    done = subprocess.run([sys.executable, '-m', 'lazylab.experiments.transformer', 'd_modle=3',
                           f'runs_dir={tmp_path}/runs'], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2
    assert done.stderr.strip() == ("lazylab: error: Configs has no config item 'd_modle'; "
                                   "did you mean 'd_model' or 'model'?")
    assert not (tmp_path / 'runs').exists()


def test_the_error_module_and_the_command_line_import_no_torch():
    # `lazylab --help` and the error path must not pay for torch; the script fails if torch gets imported
    code = ('import sys, lazylab.errors, lazylab.cli; '
            'assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))[:5]')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr


def test_user_errors_are_the_lazylab_errors_and_config_errors_wherever_they_are_imported_from():
    from lazylab import errors
    from lazylab.configs import CalculatorError, ConfigError
    from lazylab.data import DataError
    from lazylab.experiments import configure, distributed, trainer
    assert DataError is errors.DataError and issubclass(DataError, ValueError)
    assert configure.UsageError is errors.UsageError and distributed.DistributedError is errors.DistributedError
    assert (trainer.TrainingError, trainer.CheckpointError, trainer.NonFiniteLossError) == \
        (errors.TrainingError, errors.CheckpointError, errors.NonFiniteLossError)
    assert issubclass(errors.CheckpointError, errors.TrainingError) and issubclass(errors.TrainingError, RuntimeError)
    message = errors.user_error_message
    assert message(errors.CheckpointError('no checkpoint at x\nsecond line')) == 'no checkpoint at x'
    assert message(ConfigError('bad value for seq_len')) == 'bad value for seq_len'
    wrapped = CalculatorError('dataset: option failed', 'dataset', 'character_split')
    wrapped.__cause__ = DataError('text file not found: a.txt')
    assert message(wrapped) == 'text file not found: a.txt'
    assert message(ValueError('a bug')) is None and message(RuntimeError('a bug')) is None


def test_no_command_prints_the_usage_on_stderr_with_exit_2(capsys):
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == '' and err.startswith('usage:\n    lazylab train EXPERIMENT')
    assert cli.main(['--help']) == 0
    out, err = capsys.readouterr()
    assert err == '' and out.startswith('usage:\n    lazylab train EXPERIMENT')
