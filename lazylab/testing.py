"""Helpers lazylab's tests share, in one importable place (under pytest's --import-mode=importlib a test file cannot
import another test file or a conftest).

    assert_close(actual, expected, rtol, what, floor=…)  max |actual − expected| ≤ rtol · max(max |expected|, floor)
    max_relative_error(actual, expected, floor=…)         the ratio assert_close bounds
    TINY, tiny(*changes)                                 the sizes of a run that takes a second
    replaced(settings, *changes)                         key=value settings with some keys replaced (no key twice)
    as_stopped(run_dir)                                  a finished run made to look stopped short of its end
    wait_until(condition, timeout, what)                 poll until a condition holds (never a fixed sleep)
    keep_threads()                                       torch's thread count put back after a block
    lazylab_argv(*args), start_lazylab(*args), run_lazylab(*args)
                                                         `python -m lazylab.cli ARGS` in a child process
    imports_of(path, root), package_imports(folder, root), import_graph(imports, prefix), find_cycle(graph)
                                                         the import statements of a package, read with ast

Importing it imports no torch (`keep_threads` does, when called), so the import-structure helpers load fast.
"""
import ast
import contextlib
import io
import json
import os
import subprocess
import sys
import time
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ['assert_close', 'max_relative_error', 'TINY', 'tiny', 'replaced', 'as_stopped', 'keep_threads', 'ROOT',
           'lazylab_env', 'lazylab_argv', 'start_lazylab', 'run_lazylab', 'Import', 'module_name', 'imports_of',
           'package_imports', 'import_graph', 'find_cycle']

#: the folder that holds the `lazylab` package (the repository's root in a checkout)
ROOT = Path(__file__).resolve().parent.parent


# ---- numbers ---------------------------------------------------------------------------------------------------

def max_relative_error(actual: Any, expected: Any, floor: float = 1e-30) -> float:
    """max |actual − expected| / max(max |expected|, floor), for tensors of one shape.

    The floor is the scale below which an error is no longer measured against the tensor itself: a gradient that
    is small by cancellation carries the rounding of the terms that cancelled, so its error is judged against
    (say) a thousandth of the largest gradient's scale instead."""
    scale = max(float(expected.abs().max()) if expected.numel() else 0.0, floor)
    return float((actual - expected).abs().max()) / scale if actual.numel() else 0.0


def assert_close(actual: Any, expected: Any, rtol: float, what: str = 'value', floor: float = 1e-30) -> None:
    """Assert max |actual − expected| ≤ rtol · max(max |expected|, floor), naming `what` in the message.

    Raises:
        AssertionError: the shapes differ, or the relative error is larger than `rtol`.
    """
    assert actual.shape == expected.shape, f'{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}'
    err = max_relative_error(actual, expected, floor)
    assert err <= rtol, f'{what}: relative error {err:.3g} > {rtol}'


# ---- tiny runs -------------------------------------------------------------------------------------------------

#: a transformer-sized experiment of 3 steps of 4 × 16 characters, validated (and checkpointed) after each step,
#: on one CPU thread: about a second
TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'sample_tokens=5',
        'valid_batches=1', 'final_valid_batches=1', 'device=cpu', 'threads=1', 'max_steps=3', 'valid_interval=1']


def tiny(*changes: str, drop: tuple[str, ...] = ()) -> list[str]:
    """TINY with `changes` (`key=value`, in order) replacing the same keys or added after them, and the keys in
    `drop` left out: tiny('max_steps=600', 'valid_interval=5', 'log_interval=5')."""
    return replaced(TINY, *changes, drop=drop)


def replaced(settings: list[str], *changes: str, drop: tuple[str, ...] = ()) -> list[str]:
    """`settings` (`key=value` tokens) with `changes` replacing the same keys or added after them, and the keys in
    `drop` left out: a command line gives each key once (a key given twice is an error), so a test that changes a
    base list of settings replaces its keys: replaced(BASE, 'max_steps=2')."""
    out = {k: v for k, v in (s.split('=', 1) for s in settings) if k not in drop}
    for change in changes:
        key, _, value = change.partition('=')
        out[key] = value
    return [f'{k}={v}' for k, v in out.items()]


def wait_until(condition: Any, timeout: float, what: str, every: float = 0.2, retry: tuple = ()) -> Any:
    """Poll `condition()` every `every` seconds until it returns something true, and return that; a test waits on a
    condition, never for a fixed time. Exceptions of the types in `retry` count as "not yet" (a page element
    replaced while it was read).

    Raises:
        AssertionError: `timed out after TIMEOUT s waiting for WHAT`.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except retry:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f'timed out after {timeout:g} s waiting for {what}')
        time.sleep(every)


def as_stopped(run_dir: Path, steps_left: int = 7) -> Path:
    """A finished run's folder made to look like one a signal stopped at its last step, `steps_left` steps short
    of its end (its checkpoint's position and run.json's status), so that `lazylab resume` has work to do and checks
    the run (a finished run's resume has nothing to do, and checks nothing). Returns `run_dir`."""
    import torch  # here, not at the top: the module's other helpers need no torch
    ck = torch.load(Path(run_dir) / 'checkpoint.pt', weights_only=True)
    ck['position'].update(total_steps=ck['position']['step'] + steps_left, finished='')
    torch.save(ck, Path(run_dir) / 'checkpoint.pt')
    record = json.loads((Path(run_dir) / 'run.json').read_text(encoding='utf-8'))
    (Path(run_dir) / 'run.json').write_text(json.dumps({**record, 'status': 'interrupted'}), encoding='utf-8')
    return Path(run_dir)


@contextlib.contextmanager
def keep_threads() -> Iterator[None]:
    """torch's intra-op thread count as it was before the block, after it (a run's `threads=1` sets it for the
    whole process)."""
    import torch  # here, not at the top: the module's other helpers need no torch

    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# ---- child processes -------------------------------------------------------------------------------------------

def lazylab_env(**extra: str) -> dict[str, str]:
    """The environment of a child lazylab process: this checkout first on the path, unbuffered output."""
    return {**os.environ, 'PYTHONPATH': str(ROOT), 'PYTHONUNBUFFERED': '1', **extra}


def lazylab_argv(*args: str) -> list[str]:
    """`python -m lazylab.cli ARGS` with this interpreter."""
    return [sys.executable, '-m', 'lazylab.cli', *args]


def start_lazylab(*args: str, **popen: Any) -> subprocess.Popen:
    """`lazylab ARGS` started in a child process, its stdout and stderr as text pipes (overridable by `popen`)."""
    options = {'env': lazylab_env(), 'stdout': subprocess.PIPE, 'stderr': subprocess.PIPE, 'text': True, **popen}
    return subprocess.Popen(lazylab_argv(*args), **options)


def run_lazylab(*args: str, timeout: float = 300, **run: Any) -> subprocess.CompletedProcess:
    """`lazylab ARGS` run to its end in a child process (its output captured as text)."""
    options = {'env': lazylab_env(), 'capture_output': True, 'text': True, 'timeout': timeout, **run}
    return subprocess.run(lazylab_argv(*args), **options)


# ---- the import structure --------------------------------------------------------------------------------------

class Import(NamedTuple):
    """One import statement of one module, resolved to the modules it names."""
    module: str               # the importing module, dotted
    targets: tuple[str, ...]  # the modules it imports (a package's name for a name defined in its __init__)
    line: int
    in_function: bool         # inside a def (runs when called) rather than at import time
    commented: bool           # a comment on its line or on the line above


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module in file `path` under the folder `root`."""
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
    the statement is kept, so that third-party function-level imports can be checked for their comment too)."""
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
    """The imports of every module under the folder `package_dir` (`root`: the folder its top package is in)."""
    return [i for path in sorted(package_dir.rglob('*.py')) for i in imports_of(path, root)]


def import_graph(imports: list[Import], prefix: str) -> dict[str, set[str]]:
    """module -> the modules it imports, both inside `prefix` (a dotted package name)."""
    def inside(m: str) -> bool:
        return m == prefix or m.startswith(prefix + '.')
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
