"""flash-linear-attention's plain-PyTorch references, loaded by file path: what the tests and benchmarks of the
gated delta rule, DeltaProduct, the gated sum rule, GLA, KDA and the DPLR rule compare against. Not used by any
model.

fla-core (the ops of flash-linear-attention) is a test reference only: `make install` installs fla-core==0.6.0
with --no-deps (its kernels are Triton, for GPUs; lazylab needs only a few pure-PyTorch functions from it):

    fla/ops/gated_delta_rule/naive.py             naive_recurrent_gated_delta_rule, naive_chunk_gated_delta_rule
    fla/ops/gated_delta_product/naive.py          naive_recurrent_gated_delta_product
    fla/ops/simple_gla/naive.py                   naive_recurrent_simple_gla, naive_chunk_simple_gla (gated sum)
    fla/ops/gla/naive.py                          naive_recurrent_gla
    fla/ops/kda/naive.py                          naive_recurrent_kda, naive_chunk_kda
    fla/ops/generalized_delta_rule/dplr/naive.py  dplr_recurrence, dplr_chunkwise

Importing `fla` (or `fla.ops…`) would run its package `__init__` files, which import Triton. So the files are found
through the installed distribution's record (`importlib.metadata`, which reads files and imports nothing) and each
is executed on its own (`importlib.util.spec_from_file_location`). Their imports are checked first: torch and
einops only, never fla itself (a later version that imported fla from them is refused, not half-loaded).

fla's references compute in float32 whatever the inputs (`.to(torch.float32)`, `dtype=torch.float32`,
`.float()`); with `float64=True` the module's global `torch` is a view of torch in which the names float32 and
float mean float64, and the file is executed with every call `x.float()` read as `x.to(torch.float32)` (the same
cast, written so that the view reaches it: the GLA references cast q, k, v and g with `.float()` before any
arithmetic, and the DPLR reference casts with `.float()` and then fills float32 outputs), so the same code runs in
float64 (its arithmetic is unchanged). Draw the inputs in float32 and widen them all the same: a reference then
sees the numbers it would see in float32.
"""
import ast
import importlib.metadata
import importlib.util
import types
from pathlib import Path

import torch

__all__ = ['FLA_VERSION', 'NAIVE_FILES', 'FlaMissing', 'naive_file', 'load_naive']

FLA_VERSION = '0.6.0'
#: the reference files, inside the fla-core distribution
NAIVE_FILES = {'gated_delta_rule': 'fla/ops/gated_delta_rule/naive.py',
               'gated_delta_product': 'fla/ops/gated_delta_product/naive.py',
               'simple_gla': 'fla/ops/simple_gla/naive.py',
               'gla': 'fla/ops/gla/naive.py',
               'kda': 'fla/ops/kda/naive.py',
               'dplr': 'fla/ops/generalized_delta_rule/dplr/naive.py'}
#: what those files may import
ALLOWED_IMPORTS = ('torch', 'einops')


class FlaMissing(LookupError):
    """fla-core 0.6.0, or one of its reference files, is not installed (the message says which and how to install)."""


def naive_file(op: str) -> Path:
    """The installed path of the reference file of `op` (a key of NAIVE_FILES: 'gated_delta_rule', 'gla', …).

    Raises:
        FlaMissing: fla-core is not installed, has another version, or lacks the file.
    """
    install = f'pip install --no-deps fla-core=={FLA_VERSION} (what `make install` does)'
    try:
        dist = importlib.metadata.distribution('fla-core')
    except importlib.metadata.PackageNotFoundError:
        raise FlaMissing(f'fla-core is not installed; {install}') from None
    if dist.version != FLA_VERSION:
        raise FlaMissing(f'fla-core {dist.version} is installed, the references are pinned to {FLA_VERSION}; '
                         f'{install}')
    relative = NAIVE_FILES[op]
    if not any(str(f) == relative for f in dist.files or ()):
        raise FlaMissing(f'fla-core {FLA_VERSION} has no {relative}')
    return Path(dist.locate_file(relative))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding='utf-8'))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add('.' * node.level + (node.module or ''))
    return names


class _Float64Torch(types.ModuleType):
    """torch, but for the names float32 and float, which are float64 here (see the module docstring)."""

    def __getattr__(self, name):
        return torch.float64 if name in ('float32', 'float') else getattr(torch, name)


class _FloatCallsAsCasts(ast.NodeTransformer):
    """x.float() → x.to(torch.float32): the same cast, but one that the float64 view of torch reaches."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == 'float' and not node.args and not node.keywords:
            float32 = ast.Attribute(value=ast.Name(id='torch', ctx=ast.Load()), attr='float32', ctx=ast.Load())
            return ast.copy_location(ast.Call(func=ast.Attribute(value=func.value, attr='to', ctx=ast.Load()),
                                              args=[float32], keywords=[]), node)
        return node


def load_naive(op: str, float64: bool = False) -> types.ModuleType:
    """fla-core's reference module of `op` (a key of NAIVE_FILES), executed from its file without importing fla
    (see the module docstring); with `float64`, computing in float64.

    Raises:
        FlaMissing: see `naive_file`.
        ImportError: the file imports something other than torch and einops.
    """
    path = naive_file(op)
    bad = {name for name in _imports(path) if name.split('.')[0] not in ALLOWED_IMPORTS}
    if bad:
        raise ImportError(f'{path} imports {sorted(bad)}: only {", ".join(ALLOWED_IMPORTS)} can be loaded without fla')
    name = f'_lazylab_fla_{op}_naive{"_float64" if float64 else ""}'
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if float64:
        tree = ast.fix_missing_locations(_FloatCallsAsCasts().visit(ast.parse(path.read_text(encoding='utf-8'))))
        exec(compile(tree, str(path), 'exec'), module.__dict__)  # fla's own file, rewritten as above
        module.torch = _Float64Torch('torch')
    else:
        spec.loader.exec_module(module)
    return module
