"""The structure of lazylab.configs, read from the source with `ast`: no import circle inside the package
(module-level and function-level imports both count), every function-level import says why in a comment, no
function over 80 lines and no file over 600; and `lazylab.errors` is the leaf the engine's errors build on (it
imports nothing of lazylab but the bottom leaf `lazylab.redaction`, and no torch)."""
import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import lazylab
from lazylab.configs import (
    AlreadyComputedError,
    BadValueError,
    BaseConfigs,
    CalculatorError,
    ConfigError,
    CycleError,
    DeclarationError,
    NoValueError,
    OverrideSyntaxError,
    UnknownItemError,
    UnknownOptionError,
    option,
)
from lazylab.errors import DataError, LazylabError, UsageError, WrapsUserError, user_error_message
from lazylab.testing import find_cycle, import_graph, imports_of, module_name, package_imports

ROOT = Path(lazylab.__file__).parent.parent  # the directory holding the `lazylab` package


CONFIGS_DIR = ROOT / 'lazylab' / 'configs'


def test_lazylab_configs_has_no_import_circle():
    graph = import_graph(package_imports(CONFIGS_DIR, ROOT), 'lazylab.configs')
    assert find_cycle(graph) == []
    # the graph is the real one: the engine's modules are in it with the edges the cuts left
    engine = 'lazylab.configs.engine.'
    assert {engine + 'constraints', engine + 'typing_tools'} <= graph[engine + 'coerce']
    assert engine + 'coerce' not in graph[engine + 'constraints']
    assert graph[engine + 'typing_tools'] == set()
    assert engine + 'resolver' not in graph[engine + 'report']
    assert engine + 'overrides' in graph[engine + 'resolver']  # module-level now that the circle is cut


def test_every_function_level_import_in_lazylab_configs_says_why():
    imports = package_imports(CONFIGS_DIR, ROOT)
    late = [i for i in imports if i.in_function]
    assert late, 'the check found no function-level import at all (yaml and annotated_types are imported late)'
    assert [f'{i.module}:{i.line}' for i in late if not i.commented] == []
    # none of lazylab's own modules is imported late inside lazylab.configs: no circle left to hide
    assert [f'{i.module}:{i.line}' for i in late if any(t.startswith('lazylab') for t in i.targets)] == []


def test_the_checks_find_a_circle_and_an_unexplained_late_import(tmp_path):
    pkg = tmp_path / 'pkg'
    pkg.mkdir()
    (pkg / '__init__.py').write_text('')
    (pkg / 'a.py').write_text('from .b import f\n')
    (pkg / 'b.py').write_text('def f():\n    from . import c\n    return c\n')
    (pkg / 'c.py').write_text('import json\n\n\ndef g():\n    # why: the circle a -> b -> c -> a\n'
                              '    from pkg.a import f\n    import yaml\n    return f, yaml\n')
    imports = package_imports(pkg, tmp_path)
    assert find_cycle(import_graph(imports, 'pkg')) == ['pkg.a', 'pkg.b', 'pkg.c', 'pkg.a']
    late = {(i.module, i.line): i.commented for i in imports if i.in_function}
    assert late == {('pkg.b', 2): False, ('pkg.c', 6): True, ('pkg.c', 7): False}
    (pkg / 'c.py').write_text('')
    assert find_cycle(import_graph(package_imports(pkg, tmp_path), 'pkg')) == []


def test_no_function_over_80_lines_and_no_file_over_600_in_lazylab_configs():
    long = []
    for path in sorted(CONFIGS_DIR.rglob('*.py')):
        source = path.read_text(encoding='utf-8')
        name = module_name(path, ROOT)
        if len(source.splitlines()) > 600:
            long.append(f'{name}: {len(source.splitlines())} lines')
        long += [f'{name}.{f.name}: {f.end_lineno - f.lineno + 1} lines' for f in ast.walk(ast.parse(source))
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno + 1 > 80]
    assert long == []


# --- lazylab.errors is the leaf ---------------------------------------------------------------------------------

def test_importing_lazylab_errors_imports_only_the_redaction_leaf_of_lazylab_and_no_torch():
    script = textwrap.dedent('''
        import json, sys
        import lazylab.errors
        print(json.dumps({'lazylab': sorted(m for m in sys.modules if m.split('.')[0] == 'lazylab'),
                          'torch': 'torch' in sys.modules}))
    ''')
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {'lazylab': ['lazylab', 'lazylab.errors', 'lazylab.redaction'],
                                       'torch': False}


def test_errors_py_imports_only_the_redaction_leaf_and_that_imports_no_module_of_lazylab():
    imports = imports_of(ROOT / 'lazylab' / 'errors.py', ROOT)
    assert imports and {t for i in imports for t in i.targets} == {'lazylab.redaction'}
    assert all(i.targets == () for i in imports_of(ROOT / 'lazylab' / 'redaction.py', ROOT))


@pytest.mark.parametrize('error, builtins', [
    (UnknownItemError, (AttributeError, KeyError)),
    (NoValueError, (AttributeError,)),
    (AlreadyComputedError, (ValueError,)),
    (UnknownOptionError, (ValueError,)),
    (BadValueError, (ValueError,)),
    (OverrideSyntaxError, (ValueError,)),
    (CycleError, (RuntimeError,)),
    (CalculatorError, (RuntimeError,)),
    (DeclarationError, (TypeError,)),
])
def test_each_config_error_is_a_lazylab_error_and_keeps_its_builtin_bases(error, builtins):
    assert issubclass(error, ConfigError) and issubclass(error, LazylabError)
    for b in builtins:
        assert issubclass(error, b)
    assert not issubclass(ConfigError, (ValueError, AttributeError, RuntimeError, TypeError))


class _Data(BaseConfigs):
    text: str = 'a.txt'
    size: int


@option(_Data.size)
def _size(c: _Data):
    if c.text == 'missing.txt':
        raise DataError('text file not found: missing.txt')
    if c.text == 'bug.txt':
        raise ZeroDivisionError('division by zero')
    return len(c.text)


def _failure(text: str) -> CalculatorError:
    conf = _Data()
    conf.text = text
    with pytest.raises(CalculatorError) as info:
        conf.size
    return info.value


def test_a_user_error_raised_inside_an_option_is_shown_as_itself():
    e = _failure('missing.txt')
    assert isinstance(e, WrapsUserError) and isinstance(e.cause_for_user(), DataError)
    assert user_error_message(e) == 'text file not found: missing.txt'


def test_a_programming_error_inside_an_option_is_shown_as_the_calculator_error():
    e = _failure('bug.txt')
    assert e.cause_for_user() is None
    assert user_error_message(e) == "size: option '_size' failed: ZeroDivisionError: division by zero"


def test_user_error_message_of_config_usage_and_other_errors():
    assert user_error_message(BadValueError('bad value for d_model: must be ≥ 1, got 0\nmore')) == \
        'bad value for d_model: must be ≥ 1, got 0'
    assert user_error_message(UsageError('unknown experiment x')) == 'unknown experiment x'
    assert user_error_message(ValueError('a bug')) is None
