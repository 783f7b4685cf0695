"""The Colab notebooks in notebooks/: each .ipynb is the jupytext pair of its percent-format .py source (the source of
truth), stored clean, and each one runs top to bottom on the CPU with tiny parameters (nbclient, a kernel on this
interpreter, a temporary working directory).

Tiny parameters are injected papermill-style: a cell tagged `injected-parameters` right after the cell tagged
`parameters`. A first injected cell checks the kernel runs on this test's Python (the venv), not another one.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
NAMES = ['configs_tour.ipynb', 'fast_weights_transformer.ipynb', 'feedback_transformer.ipynb']

# Tiny settings per notebook: every value the notebook's parameters cell defines is replaced (RUNS_DIR by the
# test's temporary folder).
_TINY_RUN = dict(STEPS=6, BATCH_SIZE=2, SEQ_LEN=16, D_MODEL=16, HEADS=2, D_FF=32, N_LAYERS=1, VALID_EVERY=3,
                 LOG_EVERY=2, VALID_BATCHES=2, SAMPLE_TOKENS=12, LEARNING_RATE=1e-3)
TINY = {
    'configs_tour.ipynb': dict(D_MODEL=16, HEADS=2, N_LAYERS=1, D_FF=32, SEQ_LEN=16),
    'fast_weights_transformer.ipynb': dict(_TINY_RUN, KERNEL_SEQ_LEN=40, KERNEL_BATCH=2, CHUNK_SIZE=8),
    'feedback_transformer.ipynb': dict(_TINY_RUN),
}

CELL_TIMEOUT_S = 120


def _load(name):
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def _parameters_index(nb):
    tagged = [i for i, c in enumerate(nb.cells) if 'parameters' in c.metadata.get('tags', [])]
    assert len(tagged) == 1, f'expected exactly one cell tagged parameters, found {len(tagged)}'
    return tagged[0]


def _parameter_names(cell_source):
    """Names assigned at the top level of the parameters cell."""
    import ast
    names = []
    for node in ast.parse(cell_source).body:
        if isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


@pytest.mark.parametrize('name', NAMES)
def test_committed_notebook_has_no_outputs(name):
    nb = _load(name)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == 'code':
            assert cell.outputs == [], f'{name} cell {i} has stored outputs'
            assert cell.execution_count is None, f'{name} cell {i} has an execution count'
    assert 'widgets' not in nb.metadata


@pytest.mark.parametrize('name', NAMES)
def test_setup_then_parameters_come_first(name):
    nb = _load(name)
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == 'code']
    setup = nb.cells[code_cells[0]].source
    assert "'google.colab' in sys.modules" in setup and 'pip' in setup and 'torch.cuda.is_available()' in setup
    assert 'https://github.com/lazylab/lazylab' in setup  # the placeholder URL, documented in the README
    assert _parameters_index(nb) == code_cells[1]
    # the tiny settings replace exactly the parameters the notebook has
    names = set(_parameter_names(nb.cells[code_cells[1]].source)) - {'RUNS_DIR'}
    assert sorted(TINY[name]) == sorted(names)


SYNC_HINT = 'the .py source is the truth: run `make notebooks` (jupytext --sync notebooks/*.py)'


def _cells(nb):
    return [(c.cell_type, c.source, dict(c.metadata)) for c in nb.cells]


@pytest.mark.parametrize('name', NAMES)
def test_notebook_equals_jupytext_conversion_of_its_py_source(name):
    import jupytext
    source = jupytext.read(NOTEBOOKS / name.replace('.ipynb', '.py'))
    stored = _load(name)
    want, got = _cells(source), _cells(stored)
    differ = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    assert len(want) == len(got) and not differ, \
        f'{name}: {len(got)} cells stored, {len(want)} in the .py; first differing cell: {differ[:1]}; {SYNC_HINT}'
    # paired both ways, and the notebook metadata Colab reads (GPU runtime, kernel) comes from the .py too
    assert source.metadata['jupytext']['formats'] == stored.metadata['jupytext']['formats'] == 'ipynb,py:percent'
    for key in ('accelerator', 'colab', 'kernelspec'):
        assert stored.metadata.get(key) == source.metadata.get(key), f'{name}: metadata {key!r}; {SYNC_HINT}'
    assert ('accelerator' in stored.metadata) == (name != 'configs_tour.ipynb')  # the model notebooks ask for a GPU


def _code_cell(nb, first_line):
    found = [c.source for c in nb.cells if c.cell_type == 'code' and c.source.startswith(first_line)]
    assert len(found) == 1, f'expected one code cell starting {first_line!r}, found {len(found)}'
    return found[0]


def test_shared_cells_are_the_same_in_every_notebook():
    """The set-up cell (all three) and the live plot and checkpoint cells (both model notebooks) are copies; a fix
    to one copy must reach the others."""
    notebooks = {name: _load(name) for name in NAMES}
    setups = {name: _code_cell(nb, '# Setup: install lazylab') for name, nb in notebooks.items()}
    assert len(set(setups.values())) == 1, 'the set-up cells differ between ' + ', '.join(NAMES)
    models = [notebooks['fast_weights_transformer.ipynb'], notebooks['feedback_transformer.ipynb']]
    for first_line in ['from lazylab.experiments.plot import LiveLossPlot', 'from contextlib import nullcontext',
                       '# the command-line path: `lazylab generate']:
        fast_weights, feedback = (_code_cell(nb, first_line) for nb in models)
        assert fast_weights == feedback, f'the cell starting {first_line!r} differs between the model notebooks'


@pytest.mark.parametrize('name', NAMES)
def test_colab_badge_opens_this_notebook_from_repo_url(name):
    nb = _load(name)
    repo_url = next(line.split("'")[1] for line in _code_cell(nb, '# Setup').splitlines()
                    if line.startswith('REPO_URL = '))
    slug = repo_url.split('github.com/', 1)[1]
    badge = (f'[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]'
             f'(https://colab.research.google.com/github/{slug}/blob/main/notebooks/{name})')
    assert nb.cells[0].cell_type == 'markdown' and badge in nb.cells[0].source


def _with_injected_parameters(nb, params, runs_dir):
    nb = nbformat.from_dict(nb)
    at = _parameters_index(nb)
    values = dict(params, RUNS_DIR=str(runs_dir)) if 'RUNS_DIR' in _parameter_names(nb.cells[at].source) \
        else dict(params)
    lines = ['# injected by tests/test_notebooks.py'] + [f'{k} = {v!r}' for k, v in values.items()]
    lines.append("DEVICE, GPU = 'cpu', False")
    injected = nbformat.v4.new_code_cell('\n'.join(lines))
    injected.metadata['tags'] = ['injected-parameters']
    check = nbformat.v4.new_code_cell(f'import sys\nassert sys.prefix == {sys.prefix!r}, sys.prefix')
    nb.cells.insert(at + 1, injected)
    nb.cells.insert(0, check)
    for i, cell in enumerate(nb.cells):
        cell['id'] = f'run-{i:02d}'
    return nb


def _execute(name, tmp_path):
    from nbclient import NotebookClient
    nb = _with_injected_parameters(_load(name), TINY[name], tmp_path / 'runs')
    work = tmp_path / 'work'
    work.mkdir()
    # one torch thread: on a shared, busy CPU two threads make every small op wait on the other (10-50x slower)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1',
               MPLBACKEND='module://matplotlib_inline.backend_inline', PYTHONDONTWRITEBYTECODE='1')
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name='python3',
                            resources={'metadata': {'path': str(work)}})
    started = time.time()
    client.execute(env=env)  # raises CellExecutionError on the first failing cell
    return nb, time.time() - started


def _text(nb):
    out = []
    for cell in nb.cells:
        for o in cell.get('outputs', []):
            if o.output_type == 'stream':
                out.append(o.text)
            elif 'text/plain' in o.get('data', {}):
                out.append(o.data['text/plain'])
    return '\n'.join(out)


def _assert_shows(text, *snippets):
    """Each snippet appears in the notebook's printed output (the output is shown when one does not)."""
    missing = [snippet for snippet in snippets if snippet not in text]
    assert not missing, f'missing from the output: {missing}\n--- output ---\n{text[-6000:]}'


def test_configs_tour_runs(tmp_path):
    nb, seconds = _execute('configs_tour.ipynb', tmp_path)
    text = _text(nb)
    print(f'configs_tour.ipynb ran in {seconds:.1f} s')
    _assert_shows(text, "did you mean 'd_model'", "did you mean 'GELU'", 'exit code 2: lazylab: error:',
                  'replayed model has identical parameters: True', 'device cpu')


#: the class of each model notebook's trained model (the feedback experiment's checks its memory before generating)
MODEL_CLASS = {'feedback': 'FeedbackLanguageModel', 'fast_weights': 'AutoregressiveModel'}


def _check_training_run(nb, experiment, runs_dir):
    """What every model notebook must have done: a live plot, a finished run in RUNS_DIR, a reloaded checkpoint."""
    from lazylab.experiments.trainer import read_metrics
    text = _text(nb)
    steps = _TINY_RUN['STEPS']
    train_cell = next(c for c in nb.cells if c.cell_type == 'code' and 'labml_run=plot' in c.source)
    assert any('image/png' in o.get('data', {}) for o in train_cell.outputs), 'no loss plot shown'
    runs = list((runs_dir / experiment).iterdir())
    assert len(runs) == 1, runs
    run = runs[0]
    for f in ('checkpoint.pt', 'configs.yaml', 'run.json', 'metrics.jsonl', 'samples.txt'):
        assert (run / f).is_file(), f
    records = read_metrics(run / 'metrics.jsonl')
    assert records[-1]['step'] == steps and 'loss.valid' in records[-1]
    # the plot was redrawn once per metrics record (here steps 2, 3 with validation, 4, 6 with validation)
    assert len(records) >= 2 and sum('loss.valid' in r for r in records) >= 2
    _assert_shows(text, f'the plot was redrawn {len(records)} times')
    _assert_shows(text, f"validation loss {records[-1]['loss.valid']:.4f} nats/char",
                  f'reloaded the checkpoint of step {steps} into a new {MODEL_CLASS[experiment]}',
                  'max |whole − step by step|')
    return text


def test_fast_weights_notebook_runs(tmp_path):
    nb, seconds = _execute('fast_weights_transformer.ipynb', tmp_path)
    print(f'fast_weights_transformer.ipynb ran in {seconds:.1f} s')
    text = _check_training_run(nb, 'fast_weights', tmp_path / 'runs')
    _assert_shows(text, 'max |chunked − step by step|', 'chunked (8)')


def test_feedback_notebook_runs(tmp_path):
    nb, seconds = _execute('feedback_transformer.ipynb', tmp_path)
    print(f'feedback_transformer.ipynb ran in {seconds:.1f} s')
    text = _check_training_run(nb, 'feedback', tmp_path / 'runs')
    _assert_shows(text, 'max |buffered memory − reference loop|')


@pytest.mark.parametrize('cwd, source', [('notebooks', 'checkout'), ('elsewhere', 'git+https://github.com/lazylab/lazylab')])
def test_setup_cell_installs_when_lazylab_is_missing(tmp_path, monkeypatch, cwd, source):
    """The install branch, run without a network: pip is faked; it must be asked for the checkout around the
    notebook (a regular install, importable at once), or else for git+REPO_URL."""
    import importlib.util
    nb = _load('configs_tour.ipynb')
    setup = next(c for c in nb.cells if c.cell_type == 'code').source
    calls = []
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec',
                        lambda name, *a: None if name == 'lazylab' else real_find_spec(name, *a))
    monkeypatch.setattr(subprocess, 'run', lambda cmd, **kw: calls.append((cmd, kw)))
    if cwd == 'notebooks':
        checkout = tmp_path / 'lazylab-checkout'
        (checkout / 'lazylab').mkdir(parents=True)
        (checkout / 'lazylab' / '__init__.py').write_text('')
        (checkout / 'pyproject.toml').write_text('')
        (checkout / 'notebooks').mkdir()
        monkeypatch.chdir(checkout / 'notebooks')
        source = str(checkout)
    else:
        monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(setup, 'setup-cell', 'exec'), namespace)
    assert calls == [([sys.executable, '-m', 'pip', 'install', '-q', source], {'check': True})]
    assert namespace['DEVICE'] in ('cpu', 'cuda')
