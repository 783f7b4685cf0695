"""The structure of the whole package, read from the source with `ast` (the import contracts themselves are
import-linter's, in pyproject.toml, run by `make lint`): no import circle, at most 28 function-level imports of
lazylab's own modules, every function-level import with its reason in a comment, no function over 80 lines and
no file over 600 outside lazylab/models (the kernels). See docs/contributing/architecture.md."""
import ast

from lazylab.testing import ROOT, find_cycle, import_graph, module_name, package_imports

PACKAGE = ROOT / 'lazylab'
IMPORTS = package_imports(PACKAGE, ROOT)
#: a module may give the reason of its function-level imports of other packages once, on a line of its own
MODULE_REASON = '# late imports: '


def _has_module_reason(module: str) -> bool:
    path = ROOT.joinpath(*module.split('.'))
    path = path / '__init__.py' if path.is_dir() else path.with_suffix('.py')
    return any(line.startswith(MODULE_REASON) for line in path.read_text(encoding='utf-8').splitlines())


def _own(i) -> bool:
    return any(t == 'lazylab' or t.startswith('lazylab.') for t in i.targets)


def test_lazylab_has_no_import_circle_even_through_function_level_imports():
    assert find_cycle(import_graph(IMPORTS, 'lazylab')) == []


#: the most function-level imports of lazylab's own modules: 12 at the end of 2026-12-02, 24 after the shell's tab
#: completion (a TAB answers in under 150 ms, so the command line imports each command's layer only when it runs)
#: and the Slurm jobs (their pickled calls import the trainer only in the job's process); a bound that still makes a
#: new one argue for itself
MAX_LATE_OWN_IMPORTS = 28


def test_few_function_level_imports_of_lazylabs_own_modules_each_with_its_reason():
    late = [i for i in IMPORTS if i.in_function and _own(i)]
    assert [f'{i.module}:{i.line}' for i in late if not i.commented] == []
    assert len(late) <= MAX_LATE_OWN_IMPORTS, '\n'.join(f'{i.module}:{i.line} {i.targets}' for i in late)


def test_every_function_level_import_of_another_package_says_why():
    silent = [f'{i.module}:{i.line}' for i in IMPORTS
              if i.in_function and not _own(i) and not i.commented and not _has_module_reason(i.module)]
    assert silent == []


def test_no_function_over_80_lines_and_no_file_over_600_outside_the_models():
    long = []
    for path in sorted(PACKAGE.rglob('*.py')):
        if 'models' in path.relative_to(PACKAGE).parts:
            continue
        source = path.read_text(encoding='utf-8')
        name = module_name(path, ROOT)
        if len(source.splitlines()) > 600:
            long.append(f'{name}: {len(source.splitlines())} lines')
        long += [f'{name}.{f.name}: {f.end_lineno - f.lineno + 1} lines' for f in ast.walk(ast.parse(source))
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno + 1 > 80]
    assert long == []


def test_the_checks_see_the_real_package():
    # the graph is the real one: the layers' modules are in it with their edges
    graph = import_graph(IMPORTS, 'lazylab')
    assert 'lazylab.experiments.lifecycle' in graph['lazylab.cli.train']
    assert 'lazylab.errors' in graph['lazylab.runs']
    assert {i.module for i in IMPORTS} >= {'lazylab.cli', 'lazylab.models.fast_weights.delta_rule',
                                           'lazylab.sweeps.sweep', 'lazylab.configs.engine.resolver'}
