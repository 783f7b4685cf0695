"""The structure of lazylab.configs, read from the source with `ast`: no import circle inside the package
(module-level and function-level imports both count), every function-level import says why in a comment, no
function over 80 lines and no file over 600; and `lazylab.errors` is the leaf the engine's errors build on (it
imports nothing of lazylab, and no torch)."""
import ast
import io
import json
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import NamedTuple

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

ROOT = Path(lazylab.__file__).parent.parent  # the directory holding the `lazylab` package


class Import(NamedTuple):
    """One import statement of one module, resolved to the modules it names."""
    module: str              # the importing module, dotted
    targets: tuple[str, ...]  # the modules it imports (a package's name for a name defined in its __init__)
    line: int
    in_function: bool        # inside a def (runs when called) rather than at import time
    commented: bool          # a comment on its line or on the line above


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix('').parts)
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _is_module(name: str, root: Path) -> bool:
    base = root.joinpath(*name.split('.'))
    return base.with_suffix('.py').is_file() or (base / '__init__.py').is_file()


def _comment_lines(source: str) -> set[int]:
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}


def imports_of(path: Path, root: Path) -> list[Import]:
    """Every import in the file at `path`, with the modules under `root` it resolves to (others are dropped, but
    the statement is kept, so that third-party function-level imports are checked for their comment too)."""
    source = path.read_text(encoding='utf-8')
    name = module_name(path, root)
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    comments = _comment_lines(source)
    found: list[Import] = []

    def resolve(node) -> tuple[str, ...]:
        if isinstance(node, ast.Import):
            return tuple(a.name for a in node.names if _is_module(a.name, root))
        if node.level:
            base = package.rsplit('.', node.level - 1)[0] if node.level > 1 else package
            base = f'{base}.{node.module}' if node.module else base
        else:
            base = node.module
        if not _is_module(base, root):
            return ()
        # `from pkg import mod` imports the module pkg.mod; `from pkg import name` the package that defines name
        return tuple(dict.fromkeys(f'{base}.{a.name}' if _is_module(f'{base}.{a.name}', root) else base
                                   for a in node.names))

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(Import(name, resolve(child), child.lineno, in_function,
                                    child.lineno in comments or child.lineno - 1 in comments))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def package_imports(package_dir: Path, root: Path) -> list[Import]:
    return [i for path in sorted(package_dir.rglob('*.py')) for i in imports_of(path, root)]


def import_graph(imports: list[Import], prefix: str) -> dict[str, set[str]]:
    """module -> the modules it imports, both inside `prefix` (a dotted package name)."""
    inside = lambda m: m == prefix or m.startswith(prefix + '.')  # noqa: E731
    graph: dict[str, set[str]] = {}
    for i in imports:
        graph.setdefault(i.module, set()).update(t for t in i.targets if inside(t))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of `graph` as [a, b, …, a], or [] when there is none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = dfs(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = dfs(node)
            if cycle:
                return cycle
    return []


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

def test_importing_lazylab_errors_imports_nothing_else_of_lazylab_and_no_torch():
    script = textwrap.dedent('''
        import json, sys
        import lazylab.errors
        print(json.dumps({'lazylab': sorted(m for m in sys.modules if m.split('.')[0] == 'lazylab'),
                          'torch': 'torch' in sys.modules}))
    ''')
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {'lazylab': ['lazylab', 'lazylab.errors'], 'torch': False}


def test_errors_py_imports_no_module_of_lazylab():
    imports = imports_of(ROOT / 'lazylab' / 'errors.py', ROOT)
    assert imports and all(i.targets == () for i in imports)


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
