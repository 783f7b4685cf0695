"""The config engine never imports torch: every module of lazylab/configs/engine, and lazylab.configs itself,
imports and works in a process where ``import torch`` raises."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import lazylab.configs.engine

ENGINE_DIR = Path(lazylab.configs.engine.__file__).parent

# Run in a fresh interpreter: the test process itself has torch loaded already.
SCRIPT = textwrap.dedent('''
    import importlib, json, pkgutil, sys

    class BlockTorch:
        """A meta-path finder that refuses torch, so an import of it anywhere fails loudly."""
        def find_spec(self, name, path=None, target=None):
            if name == 'torch' or name.startswith('torch.'):
                raise ImportError(f'torch is blocked in this test (import of {name!r})')
            return None

    sys.meta_path.insert(0, BlockTorch())
    import lazylab.configs as lc
    import lazylab.configs.engine as engine
    names = sorted(m.name for m in pkgutil.iter_modules(engine.__path__))
    for name in names:
        importlib.import_module(f'lazylab.configs.engine.{name}')

    # Use the engine too, so that imports done lazily inside functions are covered.
    from typing import Annotated, Literal, Optional
    from annotated_types import Ge

    class Sub(lc.BaseConfigs):
        width: int = 4

    class Configs(lc.BaseConfigs):
        batch_size: Annotated[int, Ge(1)] = 8
        mode: Literal['a', 'b'] = 'a'
        limit: Optional[int] = None
        sub: Sub
        doubled: int

    @lc.option(Configs.doubled)
    def _doubled(c):
        return 2 * c.batch_size

    conf = Configs()
    lc.apply_overrides(conf, lc.parse_overrides(['batch_size=3', 'sub.width=5'], conf))
    values = (conf.doubled, conf.sub.width, conf.mode)
    fresh = Configs()
    lc.load(fresh, lc.dump(conf))
    lc.format_explain(lc.explain(conf))
    lc.format_description(lc.describe(Configs))
    conf._to_json()
    from lazylab.configs import inspect
    list(inspect.items(conf)), inspect.given(conf), inspect.selected_option(conf, 'doubled')
    plain = Configs()
    inspect.compute_plain(plain)
    inspect.effective_defaults(plain)
    print(json.dumps({'modules': names, 'values': values, 'replayed': fresh.doubled,
                      'torch_loaded': 'torch' in sys.modules}))
''')


def test_engine_modules_import_and_work_with_torch_blocked():
    done = subprocess.run([sys.executable, '-c', SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report['torch_loaded'] is False
    assert report['values'] == [6, 5, 'a'] and report['replayed'] == 6
    # every module file of the engine was imported (the list is not empty, and none was skipped)
    files = sorted(p.stem for p in ENGINE_DIR.glob('*.py') if p.stem != '__init__')
    assert report['modules'] == files
    assert {'base', 'resolver', 'overrides', 'coerce', 'errors'} <= set(files)


def test_the_torch_blocker_catches_an_import_of_torch():
    # The guard itself must be able to fail: with the same finder, importing torch raises.
    probe = SCRIPT.split("import lazylab.configs as lc")[0] + 'import torch\n'
    done = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert 'torch is blocked in this test' in done.stderr
