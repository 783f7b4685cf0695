"""The Colab notebooks in notebooks/: stored clean, in sync with scripts/make_notebooks.py, and each one runs top to
bottom on the CPU with tiny parameters (nbclient, a kernel on this interpreter, a temporary working directory).

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
NAMES = ['configs_tour.ipynb']

# Tiny settings per notebook: every value the notebook's parameters cell defines is replaced.
TINY = {
    'configs_tour.ipynb': dict(D_MODEL=16, HEADS=2, N_LAYERS=1, D_FF=32, SEQ_LEN=16),
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
    names = _parameter_names(nb.cells[code_cells[1]].source)
    assert sorted(TINY[name]) == sorted(names)


def test_notebooks_match_their_generator():
    result = subprocess.run([sys.executable, str(ROOT / 'scripts' / 'make_notebooks.py'), '--check'],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


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
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='', MPLBACKEND='module://matplotlib_inline.backend_inline',
               PYTHONDONTWRITEBYTECODE='1')
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


def test_configs_tour_runs(tmp_path):
    nb, seconds = _execute('configs_tour.ipynb', tmp_path)
    text = _text(nb)
    print(f'configs_tour.ipynb ran in {seconds:.1f} s')
    assert "did you mean 'd_model'" in text
    assert "did you mean 'GELU'" in text
    assert 'exit code 2: lazylab: error:' in text
    assert 'replayed model has identical parameters: True' in text
    assert 'device cpu' in text
