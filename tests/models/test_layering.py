"""`lazylab.models` is plain PyTorch: no module under it imports the config engine, the experiments or the sweeps
(the dependency direction of ARCHITECTURE.md), so every model is usable on its own."""
import ast
from pathlib import Path

import pytest

import lazylab.models

MODELS = Path(lazylab.models.__file__).parent
FORBIDDEN = ('lazylab.configs', 'lazylab.experiments', 'lazylab.sweeps')


def imported_modules(path: Path):
    """Every module name `path` imports (relative imports resolved), and `package.name` for `from package import
    name`, which may be a submodule."""
    package = ['lazylab', 'models', *path.parent.relative_to(MODELS).parts]
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = '.'.join(base + ([node.module] if node.module else []))
            yield module
            yield from (f'{module}.{alias.name}' for alias in node.names)


SOURCES = sorted(MODELS.rglob('*.py'))


def test_the_models_package_has_its_modules():
    names = {p.relative_to(MODELS).as_posix() for p in SOURCES}
    assert {'feedback/__init__.py', 'feedback/memory.py', 'feedback/reference.py', 'fast_weights/step.py',
            'fast_weights/feature_maps.py', '_torch_compat.py'} <= names


@pytest.mark.parametrize('path', SOURCES, ids=lambda p: p.relative_to(MODELS).as_posix())
def test_no_model_module_imports_configs_experiments_or_sweeps(path):
    bad = [name for name in imported_modules(path)
           if any(name == f or name.startswith(f + '.') for f in FORBIDDEN)]
    assert not bad, f'{path.relative_to(MODELS)} imports {bad}'


FAST_WEIGHTS = sorted((MODELS / 'fast_weights').glob('*.py'))


@pytest.mark.parametrize('path', FAST_WEIGHTS, ids=lambda p: p.name)
def test_no_fast_weights_module_imports_its_package_back_or_inside_a_function(path):
    # the package's __init__ only re-exports (issue 25): a module that imported `lazylab.models.fast_weights` itself
    # would close a circle through it, and a function-level import would hide one
    tree = ast.parse(path.read_text(encoding='utf-8'))
    if path.name != '__init__.py':
        names = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        names |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert 'lazylab.models.fast_weights' not in names, f'{path.name} imports the package'
    functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    nested = [node.lineno for f in functions for node in ast.walk(f) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not nested, f'{path.name} imports inside a function at lines {nested}'
