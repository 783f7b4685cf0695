"""Run a labml experiment module's main() on labml's OWN configuration engine, as the reference the tests compare
`lazylab labml` against: the same overrides (given the way labml's own command line gives them, through
`global_params_singleton().configs`), the same offline data, stopped after a few optimizer steps.

    python labml_reference.py MODULE OUT_DIR DATA_DIR STEPS JSON_OVERRIDES

writes the path of labml's configs.yaml of the run to OUT_DIR/configs_path.txt.

MODULE is a dotted module name or a .py file; DATA_DIR is labml's data path (the tests pass the one `lazylab labml`
used, so that the text dataset, whose description names its file, is the same).

`lazylab.labml.install(engine=False)` fills only labml 0.5.3's gaps for labml_nn 0.5.1 (add_pytorch_models, text
indicators, tracker.debug) and leaves labml.configs labml's own.
"""
import importlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path

from labml.internal.experiment import global_params_singleton

import lazylab.labml
from lazylab.data import bundled_text_path
from lazylab.labml import adapter


def _import(spec: str):
    if not spec.endswith('.py'):
        return importlib.import_module(spec)
    path = Path(spec).resolve()
    sys.path.insert(0, str(path.parent))
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[path.stem] = module
    module_spec.loader.exec_module(module)
    return module


def main(module_name: str, out_dir: str, data_dir: str, steps: str, overrides: str) -> None:
    lazylab.labml.install(engine=False)
    assert not lazylab.labml.is_installed()
    out, data = Path(out_dir).resolve(), Path(data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    if not (data / 'tiny_shakespeare.txt').exists():
        shutil.copyfile(bundled_text_path(), data / 'tiny_shakespeare.txt')
    adapter.configure_lab(out / 'labml', data)
    global_params_singleton().configs = json.loads(overrides)
    module = _import(module_name)
    limit = adapter.StepLimit(int(steps))
    try:
        module.main()
    except adapter.StepLimitReached:
        pass
    limit.remove()
    adapter.save_configs()
    (out / 'configs_path.txt').write_text(str(adapter.experiment_run().configs_path), encoding='utf-8')


if __name__ == '__main__':
    main(*sys.argv[1:])
