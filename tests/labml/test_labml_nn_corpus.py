"""labml_nn 0.5.1's own experiments as lazylab's compatibility suite (issue 37): material nobody here wrote.

labml_nn 0.5.1 has 59 modules whose ``main()`` runs an experiment over ``experiment.configs``. The 27 that can run
offline (Tiny Shakespeare, which ``lazylab labml`` places in labml's data path, or data they make up) are
:data:`CORPUS`; each runs under ``lazylab labml MODULE … --steps 2`` in a process of its own, with tiny sizes, and
its run directory must say completed, after exactly 2 optimizer steps, with their metrics and configs.yaml. The
one whose own code is broken (:data:`BROKEN`) must fail the same way on labml's own engine (``labml_reference.py``):
when it starts to run there, its test fails, so that it moves into the corpus. The 32 that need a download are
:data:`NEEDS_DOWNLOAD`; a test checks that the three lists cover every such module of the installed labml_nn once.

Every process these tests start refuses to reach a host other than the loopback one (``offline_site/
sitecustomize.py``) and records the attempt; a test fails on any attempt, so no run depends on the network (the
issue found ``--options`` downloading Tiny Shakespeare).

Time: about 4 minutes on two loaded cores, one process at a time (each run 3-12 s, most of it imports).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import labml_nn
import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
OFFLINE_SITE = HERE / 'offline_site'
GLU_SIMPLE_TINY = HERE / 'glu_simple_tiny.py'
REFERENCE = HERE / 'labml_reference.py'
STEPS = 2

#: sizes most of the text experiments share: a 16-character context, 2 sequences a batch
TEXT = ('seq_len=16', 'batch_size=2')
#: a one-layer transformer of width 16 (labml_nn's TransformerConfigs, as `transformer.*`)
TRANSFORMER = ('transformer.ffn.d_ff=32', 'transformer.n_heads=2', 'transformer.n_layers=1')


class Experiment(NamedTuple):
    module: str                    # under labml_nn.
    settings: tuple[str, ...]      # key=value: tiny sizes
    why: str = ''                  # what the settings need beyond "tiny", or what else the run shows
    records: int = STEPS           # metrics.jsonl records of the run
    steps: int = STEPS             # optimizer steps (--steps)
    old_writer: str = ''           # a writer name of earlier labml it asks for (labml 0.5.3 refuses it)


CORPUS = [
    Experiment('activations.fta.experiment', (*TEXT, 'd_model=16', 'n_layers=1', 'n_heads=2', 'd_k=8', 'd_ff=8'),
               "writers={'screen', 'labml'}: a writer name labml 0.5.3 refuses", old_writer='labml'),
    Experiment('adaptive_computation.ponder_net.experiment',
               ('batch_size=4', 'n_hidden=8', 'max_steps=3', 'n_batches=4'),
               'synthetic parity data; its optimizer.* keys wait for the model its init() sets inside the run'),
    Experiment('cfr.kuhn', ('epochs=2',),
               "no optimizer: 2 CFR iterations, one record each; writers={'sqlite'}", steps=0, old_writer='sqlite'),
    Experiment('hypernetworks.experiment', (*TEXT, 'd_model=16', 'n_rhn=4', 'n_z=4')),
    Experiment('normalization.deep_norm.experiment', (*TEXT, 'd_model=16', 'n_layers=2', 'n_heads=2', 'd_k=8'),
               "writers={'screen', 'web_api'}: a writer name labml 0.5.3 refuses", old_writer='web_api'),
    Experiment('transformers.aft.experiment',
               ('seq_len=32', 'batch_size=2', 'd_model=16', 'local_window_size=4', *TRANSFORMER),
               'seq_len 32: its mask is made for seq_len, and sampling feeds a prompt of up to 31 characters'),
    Experiment('transformers.alibi.experiment', (*TEXT, 'valid_seq_len=20', 'transformer.d_model=16', *TRANSFORMER)),
    Experiment('transformers.basic.autoregressive_experiment', (*TEXT, 'd_model=16', *TRANSFORMER)),
    Experiment('transformers.basic.with_sophia', (*TEXT, 'd_model=16', *TRANSFORMER)),
    Experiment('transformers.compressive.experiment',
               ('seq_len=8', 'batch_size=2', 'mem_len=8', 'c_mem_len=8', 'd_model=16', 'heads=2', 'd_ff=32',
                'n_layers=1'),
               "imports SimpleStateModule, which labml_nn 0.5.1 lacks: lazylab's stands in"),
    Experiment('transformers.fast_weights.experiment', (*TEXT, 'd_model=16', 'heads=2', 'd_ff=32', 'n_layers=1')),
    Experiment('transformers.feedback.experiment', (*TEXT, 'd_model=16', 'heads=2', 'd_ff=32', 'n_layers=1')),
    Experiment('transformers.glu_variants.experiment',
               (*TEXT, 'transformer.d_model=16', 'optimizer.d_model=16', *TRANSFORMER)),
    Experiment('transformers.glu_variants.simple', (),
               'a dataclass, not a config class: glu_simple_tiny.py gives it tiny defaults; it saves every 10 '
               'steps, so the stop saves the 2 steps as one record', records=1),
    Experiment('transformers.gmlp.experiment', ('batch_size=2', 'd_model=16', 'd_ffn=32', 'transformer.n_layers=1'),
               'its own seq_len (256): its spatial gating is made for seq_len, and sampling feeds a longer prompt '
               'than 16'),
    Experiment('transformers.gpt', (*TEXT, 'transformer.d_model=16', *TRANSFORMER)),
    Experiment('transformers.hour_glass.experiment',
               (*TEXT, 'd_model=16', 'n_heads=2', 'd_ff=32', 'shortening_factors=[2, 2]'),
               'shortening factors whose product divides seq_len'),
    Experiment('transformers.knn.train_model', (*TEXT, 'transformer.d_model=16', 'optimizer.d_model=16', *TRANSFORMER)),
    # 8 sequences, not 2: the loss is over the masked 15% of the tokens, and 32 tokens have none with probability
    # 0.85^32 = 0.5% (a NaN loss; ci-fresh met it once); 128 tokens, 1e-9
    Experiment('transformers.mlm.experiment', ('seq_len=16', 'batch_size=8', 'd_model=16', *TRANSFORMER)),
    Experiment('transformers.mlp_mixer.experiment', (*TEXT, 'd_model=16', 'mix_mlp.d_ff=16', *TRANSFORMER)),
    Experiment('transformers.primer_ez.experiment', (*TEXT, 'd_model=16', *TRANSFORMER)),
    Experiment('transformers.rope.experiment', (*TEXT, 'd_model=16', *TRANSFORMER)),
    Experiment('transformers.rope.value_pe.arithmetic_experiment',
               ('batch_size=2', 'seq_len=32', 'max_digits=2', 'n_tests=2', 'd_model=16', *TRANSFORMER),
               "made-up sums; writers={'screen', 'labml'}", old_writer='labml'),
    Experiment('transformers.rope.value_pe.experiment', (*TEXT, 'd_model=16', *TRANSFORMER),
               "writers={'screen', 'labml'}", old_writer='labml'),
    Experiment('transformers.switch.experiment',
               (*TEXT, 'd_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'n_experts=2')),
    Experiment('transformers.xl.experiment',
               ('seq_len=4', 'batch_size=2', 'mem_len=4', 'd_model=16', 'heads=2', 'd_ff=32', 'n_layers=1'),
               "imports SimpleStateModule, which labml_nn 0.5.1 lacks: lazylab's stands in"),
]


class Broken(NamedTuple):
    """An offline experiment whose own code fails, on labml's engine as on lazylab's."""
    settings: tuple[str, ...]
    cause: str
    labml_error: str               # the last line of labml's traceback
    lazylab_error: str             # lazylab labml's one line


BROKEN = {
    'rwkv.experiment': Broken(
        TEXT, "its model reads rwkv.vocab_size (and n_layer, n_embd, block_size), which RWKVConfigs never declares",
        'AttributeError: RWKVConfigs has no attribute `vocab_size`',
        "lazylab: error: RWKVConfigs has no config item 'rwkv.vocab_size'"),
}

#: the experiments that need data from outside (or an earlier trained run), with what they need
NEEDS_DOWNLOAD = {
    'capsule_networks.mnist': 'MNIST',
    'conv_mixer.experiment': 'CIFAR-10',
    'diffusion.ddpm.evaluate': 'a trained DDPM run',
    'diffusion.ddpm.experiment': 'CelebA-HQ (or MNIST)',
    'distillation': 'CIFAR-10 and a trained large model',
    'distillation.large': 'CIFAR-10',
    'distillation.small': 'CIFAR-10',
    'gan.dcgan': 'MNIST',
    'gan.original.experiment': 'MNIST',
    'gan.stylegan.experiment': 'CelebA-HQ',
    'gan.wasserstein.experiment': 'MNIST',
    'gan.wasserstein.gradient_penalty.experiment': 'MNIST',
    'graphs.gat.experiment': 'Cora',
    'graphs.gatv2.experiment': 'Cora',
    'neox.samples.finetune': 'the GPT-NeoX weights (and fairscale)',
    'normalization.batch_norm.cifar10': 'CIFAR-10',
    'normalization.batch_norm.mnist': 'MNIST',
    'normalization.group_norm.experiment': 'CIFAR-10',
    'normalization.instance_norm.experiment': 'CIFAR-10',
    'normalization.weight_standardization.experiment': 'CIFAR-10',
    'optimizers.mnist_experiment': 'MNIST',
    'resnet.experiment': 'CIFAR-10',
    'rl.dqn.experiment': 'gym and the Atari Breakout ROM',
    'rl.ppo.experiment': 'gym and the Atari Breakout ROM',
    'sampling.experiment_tiny': 'a trained run',
    'scaling.zero3.finetune_neox': 'the GPT-NeoX weights (and fairscale)',
    'sketch_rnn': 'QuickDraw',
    'transformers.fnet.experiment': 'AG News (and torchtext)',
    'transformers.knn.build_index': 'a trained knn_lm run',
    'transformers.vit.experiment': 'CIFAR-10',
    'uncertainty.evidence.experiment': 'MNIST',
    'unet.experiment': 'the Carvana images',
}


def _env(network_log: Path) -> dict[str, str]:
    # one torch thread: the models are tiny, and on a shared 2-core machine a second thread mostly waits
    return dict(os.environ, LABML_DISABLE_GIT='1', PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1',
                LAZYLAB_NETWORK_LOG=str(network_log),
                PYTHONPATH=os.pathsep.join([str(OFFLINE_SITE), str(REPO), os.environ.get('PYTHONPATH', '')]))


def _run(cwd: Path, argv: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=_env(cwd / 'network.jsonl'), capture_output=True,
                          text=True, timeout=timeout)


def _network_attempts(cwd: Path) -> list:
    log = cwd / 'network.jsonl'
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _lazylab_labml(cwd: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    return _run(cwd, ['-m', 'lazylab.cli', 'labml', module, *args, '--runs-dir', 'runs'])


def _target(experiment: Experiment) -> str:
    return str(GLU_SIMPLE_TINY) if experiment.module == 'transformers.glu_variants.simple' \
        else f'labml_nn.{experiment.module}'


@pytest.mark.parametrize('experiment', CORPUS, ids=[e.module for e in CORPUS])
def test_offline_experiment_runs_two_steps_under_lazylab_labml(tmp_path, experiment):
    target = _target(experiment)
    steps = ['--steps', str(experiment.steps)] if experiment.steps else []
    res = _lazylab_labml(tmp_path, target, *experiment.settings, *steps)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _network_attempts(tmp_path) == []
    name = Path(target).stem if target.endswith('.py') else target
    run_dir, = (tmp_path / 'runs' / name).iterdir()
    info = json.loads((run_dir / 'run.json').read_text())
    assert (info['status'], info['steps']) == ('completed', experiment.steps or None)
    records = [json.loads(line) for line in (run_dir / 'metrics.jsonl').read_text().splitlines()]
    assert len(records) == experiment.records, records
    assert [r['step'] for r in records] == sorted({r['step'] for r in records})  # one record a step, in order
    if experiment.steps:
        assert f'completed after {experiment.steps} optimizer steps' in res.stdout.splitlines()[-1]
        assert all(r['loss.train'] > 0 for r in records)
    has_config_class = experiment.module != 'transformers.glu_variants.simple'
    assert (run_dir / 'configs.yaml').is_file() == has_config_class
    warnings = [line for line in res.stderr.splitlines() if line.startswith('lazylab: warning:')]
    assert warnings == ([f"lazylab: warning: labml 0.5.3 has no writer '{experiment.old_writer}' (a name of earlier "
                         f"labml); recording with '{'file' if experiment.old_writer == 'sqlite' else 'app'}' and "
                         f"lazylab's tracking instead"] if experiment.old_writer else [])


@pytest.mark.parametrize('module', list(BROKEN))
def test_broken_experiment_fails_the_same_way_on_labml_own_engine(tmp_path, module):
    """labml's engine, with the same data and sizes (given as labml's command-line overrides): when this starts to
    pass, the experiment was fixed upstream and moves into CORPUS."""
    broken = BROKEN[module]
    overrides = json.dumps({k: v for k, v in (s.split('=', 1) for s in broken.settings)})
    reference = _run(tmp_path, [str(REFERENCE), f'labml_nn.{module}', 'out', 'runs/data', str(STEPS), overrides])
    assert reference.returncode != 0, f'{module} now runs on labml: move it to CORPUS'
    assert reference.stderr.strip().splitlines()[-1] == broken.labml_error
    res = _lazylab_labml(tmp_path, f'labml_nn.{module}', *broken.settings, '--steps', str(STEPS))
    assert res.returncode == 2 and 'Traceback' not in res.stderr
    assert [line for line in res.stderr.splitlines() if line.startswith('lazylab:')] == [broken.lazylab_error]
    assert _network_attempts(tmp_path) == []


@pytest.mark.parametrize('target, error', [
    ('labml_nn.rwkv.experiment', BROKEN['rwkv.experiment'].lazylab_error),  # reads its text before configs
    ('labml_nn.transformers.glu_variants.simple', 'lazylab: error: labml_nn.transformers.glu_variants.simple '
                                                  'passes a dict to experiment.configs, not a config class: there '
                                                  'are no keys to list'),
], ids=['rwkv', 'glu_variants.simple'])
def test_options_downloads_nothing_and_writes_nothing(tmp_path, target, error):
    """The issue's case: `--options` ran script code that tried to download Tiny Shakespeare (seven look-ups of
    outside hosts). The bundled text is in place before the script runs, and taken back after."""
    res = _lazylab_labml(tmp_path, target, '--options')
    assert [line for line in res.stderr.splitlines() if line.startswith('lazylab:')] == [error]
    assert _network_attempts(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _experiment_modules() -> set[str]:
    """labml_nn's modules (dotted, under labml_nn., a package by its own name) whose main() runs an experiment over
    experiment.configs."""
    root = Path(labml_nn.__file__).parent
    found = set()
    for path in root.rglob('*.py'):
        source = path.read_text(encoding='utf-8')
        if 'experiment.configs' not in source:
            continue
        if not re.search(r'^def main\(', source, re.M):
            continue
        parts = path.relative_to(root).with_suffix('').parts
        found.add('.'.join(parts[:-1] if parts[-1] == '__init__' else parts))
    return found


def test_the_lists_cover_every_labml_nn_experiment_once():
    listed = [e.module for e in CORPUS] + list(BROKEN) + list(NEEDS_DOWNLOAD)
    assert len(listed) == len(set(listed)) == 59
    assert set(listed) == _experiment_modules()
    assert len(CORPUS) + len(BROKEN) == 27


def test_the_labml_guide_tables_the_corpus():
    """docs/guide/labml.md's table: one row per offline experiment, saying whether it runs on each engine."""
    text = (REPO / 'docs' / 'guide' / 'labml.md').read_text(encoding='utf-8')
    rows = dict(re.findall(r'^\| `([\w.]+)` \| (.*) \|$', text, re.M))
    assert set(rows) == {e.module for e in CORPUS} | set(BROKEN)
    for module in BROKEN:
        assert rows[module].split(' | ')[:2] == ['no', 'no']
    for experiment in CORPUS:
        assert rows[experiment.module].split(' | ')[1] == 'yes'
