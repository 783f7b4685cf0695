"""Every shell command the README shows is run by a test, with tiny sizes.

The `lazylab` commands of the README's Train section run here, in this process, in a scratch folder, in the
README's order (the `resume`, `generate` and `plot` lines use the runs the `train` lines made): each keeps its
own keys, and tiny sizes go before them (so a run takes seconds; a preset is applied before any key, so the tiny
sizes shrink it too). Every other command the README shows must be in COVERED, naming the test that runs it; a
command in neither place fails `test_every_readme_command_is_run_by_a_test`, so a new README command needs a test.
"""
import ast
import glob
import os
import re
import shlex
from pathlib import Path

import pytest
import torch

from lazylab import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / 'README.md'

TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'max_steps=2',
        'valid_interval=1', 'valid_batches=1', 'final_valid_batches=1', 'sample_tokens=5', 'device=cpu',
        'threads=1']

#: README command → the test that runs it (file::function), for the commands outside the Train section's `lazylab`
#: lines, and why that test is the command.
COVERED = {
    'make train': ('tests/test_readme_commands.py::test_make_targets_are_the_readme_commands',
                   'the target is `lazylab train feedback`, run by test_train_section_commands_run'),
    'make test': ('tests/test_readme_commands.py::test_make_targets_are_the_readme_commands',
                  'the target is `pytest -q`: the suite these tests are in (CI runs it, .ci/run)'),
    'torchrun --standalone --nproc_per_node=4 -m lazylab.experiments.feedback batch_size=16':
        ('tests/experiments/test_distributed.py::test_two_processes_train_like_one_process_on_the_combined_batches',
         'torchrun --standalone -m lazylab.experiments.NAME, with 2 processes'),
    'torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --rdzv-id=shakespeare '
    '-m lazylab.experiments.feedback batch_size=16':
        ('tests/experiments/test_distributed.py::test_two_processes_train_like_one_process_on_the_combined_batches',
         'the same launcher and module; several machines cannot be a test, the c10d rendezvous is torchrun\'s own'),
    'torchrun --standalone --nproc_per_node=4 -m lazylab.cli resume runs/feedback/RUN_ID':
        ('tests/experiments/test_distributed.py::test_killing_one_rank_ends_the_job_and_the_run_resumes_exactly',
         'torchrun --standalone -m lazylab.cli resume RUN_DIR, with 2 processes'),
    "pip install 'lazylab[dashboard]'":
        ('tests/test_readme_commands.py::test_make_targets_are_the_readme_commands',
         'make install installs the dashboard extra the same way (.[test,dashboard]); the tests import it'),
    'lazylab dashboard --port 5005':
        ('tests/dashboard/test_end_to_end.py::test_run_streams_configs_metrics_and_sample_to_dashboard',
         'its server fixture runs `lazylab dashboard --port PORT --store DIR`'),
    'lazylab train feedback dashboard=http://127.0.0.1:5005':
        ('tests/dashboard/test_end_to_end.py::test_run_streams_configs_metrics_and_sample_to_dashboard',
         'a training run with dashboard=http://127.0.0.1:PORT (the transformer experiment, tiny)'),
    # Associative retrieval
    'lazylab train retrieval n_keys=60 phi=dpfp nu=2':
        ('tests/experiments/test_retrieval.py::test_a_short_run_learns_and_writes_loss_valid_and_accuracy',
         'its dpfp2-sum case: phi=dpfp nu=2 with n_keys=6 and 60 steps'),
    'lazylab train retrieval n_keys=40 replace=true update_rule=delta':
        ('tests/experiments/test_retrieval.py::test_a_short_run_learns_and_writes_loss_valid_and_accuracy',
         'its setting2-delta case: replace=true update_rule=delta, tiny'),
    'lazylab train retrieval n_keys=60 model=softmax':
        ('tests/experiments/test_retrieval.py::test_a_short_run_learns_and_writes_loss_valid_and_accuracy',
         'its softmax case: model=softmax, tiny'),
    'lazylab options retrieval':
        ('tests/experiments/test_retrieval.py::test_options_lists_the_retrieval_keys', 'the listing itself'),
    'python scripts/retrieval_capacity.py':
        ('tests/experiments/test_retrieval.py::test_capacity_script_runs_and_writes_the_figure_and_numbers',
         'the script with --quick and one variant, writing its PNG and JSON'),
    # Running labml and labml_nn experiments
    'lazylab labml labml_nn.transformers.feedback.experiment d_model=64 heads=4 n_layers=2 seq_len=64 --steps 200':
        ('tests/labml/test_labml_runs.py::test_labml_nn_experiment_trains_30_steps_and_loss_falls',
         'the same module with key=value sizes (tiny) and --steps 30'),
    'lazylab labml labml_nn.transformers.fast_weights.experiment optimizer.optimizer=Adam '
    'optimizer.learning_rate=3e-3':
        ('tests/labml/test_labml_runs.py::test_labml_nn_experiment_trains_30_steps_and_loss_falls',
         'the fast-weights module with optimizer.optimizer=Adam optimizer.learning_rate=0.003 (tiny sizes)'),
    'lazylab labml my_experiment.py --config runs/labml/my_experiment/RUN_ID/configs.yaml':
        ('tests/labml/test_labml_runs.py::test_configs_yaml_replays', 'a script file replayed from its configs.yaml'),
    'lazylab labml labml_nn.transformers.fast_weights.experiment --options':
        ('tests/labml/test_labml_runs.py::test_options_lists_keys_and_the_scripts_dict', 'the same command'),
    'lazylab labml my_experiment.py --dashboard http://127.0.0.1:5005':
        ('tests/labml/test_labml_runs.py::test_run_appears_in_dashboard_with_its_configs',
         'a script file with --dashboard http://127.0.0.1:PORT of a `lazylab dashboard` it starts'),
}

#: README sections whose every command a test of their own checks is run (by the test named)
SECTIONS_COVERED = {
    'Sweeps and comparisons': 'tests/sweeps/test_sweep.py::test_every_readme_command_is_run_by_a_test',
    'Your own experiment': 'tests/test_readme_commands.py::test_own_experiment_section_commands_run',
}


def readme_commands() -> list[tuple[str, str]]:
    """(section title, command) for every command line of the README's bash blocks (comments dropped,
    continuation lines joined)."""
    out, section = [], ''
    text = README.read_text(encoding='utf-8')
    for part in re.split(r'(?m)^(## .*)$', text):
        if part.startswith('## '):
            section = part[3:].strip()
            continue
        for block in re.findall(r'```bash\n(.*?)```', part, re.S):
            for line in re.sub(r'\\\n\s*', ' ', block).splitlines():
                command = re.sub(r'\s+#.*$', '', line).strip()
                if command and not command.startswith('#'):
                    out.append((section, ' '.join(command.split())))
    return out


def train_section_commands() -> list[str]:
    return [c for s, c in readme_commands() if s == 'Train' and c.startswith('lazylab ')]


def _node_exists(node: str) -> bool:
    path, name = node.split('::')
    tree = ast.parse((ROOT / path).read_text(encoding='utf-8'))
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def test_every_readme_command_is_run_by_a_test():
    commands = [c for section, c in readme_commands() if section not in SECTIONS_COVERED]
    ours = set(train_section_commands())
    assert ours, 'the Train section has no lazylab commands'
    for section, node in SECTIONS_COVERED.items():
        assert any(s == section for s, _ in readme_commands()), f'the README has no section {section!r}'
        assert _node_exists(node), f'{section}: {node} is not a test'
    missing = [c for c in commands if c not in ours and c not in COVERED]
    assert missing == [], f'README commands no test runs (add them to COVERED with their test): {missing}'
    stale = [c for c in COVERED if c not in commands]
    assert stale == [], f'COVERED names commands the README no longer shows: {stale}'
    for command, (node, _) in COVERED.items():
        assert _node_exists(node), f'{command}: {node} is not a test'


def test_make_targets_are_the_readme_commands():
    makefile = (ROOT / 'Makefile').read_text(encoding='utf-8')
    assert re.search(r'^train: .*\n\t\$\(VENV\)/bin/lazylab train feedback$', makefile, re.M)
    assert re.search(r'^test: .*\n\t\$\(PY\) -m pytest -q$', makefile, re.M)
    assert re.search(r"install -e '\.\[test,dashboard(,\w+)*\]'", makefile)  # (and the postgres extra)
    assert 'lazylab train feedback' in train_section_commands()


def _argv(command: str) -> list[str]:
    """The command's arguments as a shell gives them, with RUN_ID and globs resolved in the working folder and
    tiny sizes put before a `train` command's own keys."""
    words = shlex.split(command)[1:]
    words = [w.replace('RUN_ID', Path(glob.glob(w.split('RUN_ID')[0] + '*')[0]).name) if 'RUN_ID' in w else w
             for w in words]
    words = [m for w in words for m in (sorted(glob.glob(w)) if '*' in w else [w])]
    if words[0] == 'train':
        words = words[:2] + TINY + words[2:]
        if 'device=cuda' in words and not torch.cuda.is_available():
            words.append('device=cpu')  # (this machine has no CUDA: the run happens on the CPU)
    return words


def test_train_section_commands_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'my.yaml').write_text('optimizer.learning_rate: 0.001\n', encoding='utf-8')
    threads = torch.get_num_threads()
    try:
        for command in train_section_commands():
            argv = _argv(command)
            code = cli.main(argv)
            out, err = capsys.readouterr()
            assert code == 0, (command, err)
            assert 'Traceback' not in err, (command, err)
            if argv[0] == 'train':
                assert out.splitlines()[-1].startswith('done: step 2, valid loss '), (command, out[-500:])
            elif argv[0] == 'options':
                assert 'feedback.d_model: int = 16 (follows d_model)' not in out  # the listing is the defaults'
                assert 'feedback.d_model: int = 128 (follows d_model)' in out
            elif argv[0] == 'generate' and '--help' not in argv:
                assert out.startswith('ROMEO:') and len(out.rstrip('\n')) == len('ROMEO:') + 200
            elif argv[0] == 'plot':
                assert (tmp_path / 'losses.png').read_bytes()[:4] == b'\x89PNG'
    finally:
        torch.set_num_threads(threads)
    runs = sorted(p.parent.parent.name for p in tmp_path.glob('runs/*/*/run.json'))
    assert runs == ['fast_weights', 'fast_weights', 'feedback', 'feedback', 'feedback', 'transformer']


@pytest.mark.parametrize('command', ['lazylab train transformer ffn.glu_variant=SwiGLU --config my.yaml'])
def test_the_short_key_of_the_readme_reaches_the_nested_key(tmp_path, monkeypatch, command):
    from lazylab.configs import explain
    from lazylab.experiments.configure import make_configs
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'my.yaml').write_text('optimizer.learning_rate: 0.001\n', encoding='utf-8')
    assert command in train_section_commands()
    a, settings = cli.command('train').parser().parse_with_settings(shlex.split(command)[2:])
    conf = make_configs(a.experiment, settings, config=a.config)
    assert conf.transformer.ffn.glu_variant == 'SwiGLU' and conf.transformer.ffn.is_gated is True
    assert conf.optimizer.learning_rate == 0.001
    assert explain(conf)['transformer.ffn.glu_variant']['source'] == 'override'


#: tiny sizes for the "Your own experiment" section's lstm.py (it has no heads or d_ff)
OWN_TINY = ['d_model=16', 'seq_len=16', 'batch_size=4', 'max_steps=2', 'valid_interval=1', 'valid_batches=1',
            'final_valid_batches=1', 'sample_tokens=5', 'device=cpu', 'threads=1']


def test_own_experiment_section_commands_run(tmp_path, monkeypatch, capsys):
    """The section's commands in order, in a scratch folder: `lazylab …` in this process (tiny sizes before a
    train's own keys), `python lstm.py …` as the process it is; both runs land in runs/lstm."""
    import subprocess
    import sys
    monkeypatch.chdir(tmp_path)
    commands = [c for s, c in readme_commands() if s == 'Your own experiment']
    assert commands[0] == 'lazylab new lstm' and any(c.startswith('python lstm.py') for c in commands)
    for command in commands:
        words = shlex.split(command)
        if words[:2] == ['lazylab', 'train']:
            words = words[:3] + OWN_TINY + words[3:]
        elif words[0] == 'python':
            words = words[:2] + OWN_TINY + words[2:]
        if words[0] == 'python':
            done = subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, timeout=300,
                                  env={**os.environ, 'PYTHONPATH': str(ROOT)})
            assert done.returncode == 0, (command, done.stderr[-2000:])
            continue
        argv = [w.replace('RUN_ID', sorted(Path('runs/lstm').iterdir())[0].name) if 'RUN_ID' in w else w
                for w in words[1:]]
        assert cli.main(argv) == 0, (command, capsys.readouterr().err[-2000:])
    assert len(list(Path('runs/lstm').glob('*/run.json'))) == 2
