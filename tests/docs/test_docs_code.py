"""Every shell command and Python block on the site's guide and tutorial pages is run by a test, with tiny sizes.

The pages are every Markdown page under docs/ but the reference (generated from the code) and the results page
(whose commands are the measurements it reports, with their dates). A page's blocks run in the page's order, in
one scratch folder, so later blocks use what earlier ones made (a `lazylab resume runs/NAME/RUN_ID` after a
`lazylab train NAME`):

- ```` ```python ```` blocks run in one namespace per page (`exec`), so a block uses the names of the ones before;
- ```` ```bash ```` lines and ```` ```console ```` `$ ` lines are commands (comments dropped, continuation lines
  joined; `NAME=VALUE …` before the command sets those environment variables for it, as a shell does). `lazylab …`
  runs in this process through `lazylab.cli.main`, a `train` (or `sweep`) with tiny sizes put
  before its own keys (as tests/test_readme_commands.py does for the README), its output into FILE after ` > FILE`;
  a few plain shell commands (`printf … > FILE`, `ls`, …) run in bash. A console block's other lines are the output:
  each must appear in what the command printed (`…` stands for anything), and an output with a `lazylab: error:`
  line means the command must fail with exit code 2.
- a command that cannot run in a test (several machines, a long run, a server) is in COVERED with the test that
  runs it, as in the README's test; a block the tests deliberately do not run has `<!-- not-run: REASON -->` on the
  line before it. A command in neither place fails `test_every_page_command_is_run_or_covered`.

Every fenced block names its language, so that no command hides in an unmarked block.
"""
import ast
import glob
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
import torch

from lazylab import cli
from lazylab.testing import tiny

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / 'docs'

#: pages whose code is documentation of the measurements, not steps to follow (see the module docstring)
NOT_TUTORIAL = ('reference/', 'results.md')

#: the shared tiny sizes (lazylab.testing), two steps long
TINY = tiny('max_steps=2')

#: the plain shell commands a page may run (in bash, in the scratch folder): they only write files there
SHELL = ('printf', 'echo', 'cat', 'ls', 'mkdir', 'cp')

#: page command → the test that runs it (file::function) and why that test is the command
COVERED = {
    # index.md
    'make train': ('tests/test_readme_commands.py::test_make_targets_are_the_readme_commands',
                   'the target is `lazylab train feedback`, which the README test runs with tiny sizes'),
    'make test': ('tests/test_readme_commands.py::test_make_targets_are_the_readme_commands',
                  'the target is `pytest -q`: the suite these tests are in (CI runs it, .ci/run)'),
    # guide/torchrun.md
    'torchrun --standalone --nproc_per_node=4 -m lazylab.experiments.feedback batch_size=16':
        ('tests/experiments/test_distributed.py::test_two_processes_train_like_one_process_on_the_combined_batches',
         'torchrun --standalone -m lazylab.experiments.NAME, with 2 processes'),
    'torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --rdzv-id=shakespeare '
    '-m lazylab.experiments.feedback batch_size=16':
        ('tests/experiments/test_distributed.py::test_two_processes_train_like_one_process_on_the_combined_batches',
         'the same launcher and module; several machines cannot be a test, the c10d rendezvous is torchrun\'s own'),
    'torchrun --standalone --nproc_per_node=4 -m lazylab.cli resume runs/feedback/RUN_ID':
        ('tests/experiments/test_distributed.py::test_killing_one_rank_ends_the_job_and_the_run_resumes_exactly',
         'torchrun --standalone -m lazylab.cli resume RUN_DIR, with 2 processes'),
    # guide/dashboard.md
    "pip install 'lazylab[dashboard]'":
        ('tests/test_readme_commands.py::test_make_targets_are_the_readme_commands',
         'make install installs the dashboard extra the same way (.[test,dashboard,…]); the tests import it'),
    'lazylab dashboard --port 5005':
        ('tests/dashboard/test_end_to_end.py::test_run_streams_configs_metrics_and_sample_to_dashboard',
         'its server fixture runs `lazylab dashboard --port PORT --store DIR` (a server: it does not return)'),
    'lazylab train feedback dashboard=http://127.0.0.1:5005':
        ('tests/dashboard/test_end_to_end.py::test_run_streams_configs_metrics_and_sample_to_dashboard',
         'a training run with dashboard=http://127.0.0.1:PORT of the server it started (the transformer, tiny)'),
    # guide/labml.md
    'lazylab labml labml_nn.transformers.feedback.experiment d_model=64 heads=4 n_layers=2 seq_len=64 --steps 200':
        ('tests/labml/test_labml_runs.py::test_labml_nn_experiment_trains_30_steps_and_loss_falls',
         'the same module with key=value sizes (tiny) and --steps 30'),
    'lazylab labml labml_nn.transformers.fast_weights.experiment optimizer.optimizer=Adam '
    'optimizer.learning_rate=3e-3':
        ('tests/labml/test_labml_runs.py::test_labml_nn_experiment_trains_30_steps_and_loss_falls',
         'the fast-weights module with optimizer.optimizer=Adam optimizer.learning_rate=0.003 (tiny sizes)'),
    'lazylab labml my_experiment.py --config runs/labml/my_experiment/RUN_ID/configs.yaml':
        ('tests/labml/test_labml_runs.py::test_configs_yaml_replays', 'a script file replayed from its configs.yaml'),
    'lazylab labml my_experiment.py --dashboard http://127.0.0.1:5005':
        ('tests/labml/test_labml_runs.py::test_run_appears_in_dashboard_with_its_configs',
         'a script file with --dashboard http://127.0.0.1:PORT of a `lazylab dashboard` it starts'),
    # guide/models.md
    'python scripts/retrieval_capacity.py':
        ('tests/experiments/test_retrieval.py::test_capacity_script_runs_and_writes_the_figure_and_numbers',
         'the script with --quick and one variant, writing its PNG and JSON (the whole sweep takes an hour)'),
    # guide/sweeps.md: its bash blocks are the sweep tests' commands (tests/sweeps/conftest.readme_commands reads
    # them, and tests/sweeps/test_sweep.py::test_every_readme_command_is_run_by_a_test checks each is run)
    'lazylab sweep transformer transformer.ffn.glu_variant=GEGLU,SwiGLU optimizer.learning_rate=3e-3,1e-2 d_model=64 '
    'n_layers=2 max_minutes=0 max_steps=400 valid_interval=50 --workers 2':
        ('tests/sweeps/test_sweep.py::test_grid_sweep_with_two_workers_runs_every_point_once',
         'the same grid with tiny sizes, 2 workers (a sweep of four 400-step runs takes minutes)'),
    'lazylab compare runs/transformer/sweep-ID --plot docs/sweep_glu.png':
        ('tests/sweeps/test_sweep.py::test_compare_shows_exactly_the_swept_keys', 'compare --plot of that sweep'),
    'lazylab diff runs/transformer/sweep-ID/trial-0000 runs/transformer/sweep-ID/trial-0003':
        ('tests/sweeps/test_sweep.py::test_diff_names_the_keys_both_values_and_their_sources',
         'diff of trials 0000 and 0003 of that sweep'),
    "lazylab sweep transformer 'optimizer.learning_rate=tag(log, interval(1e-4, 3e-2))' --sampler tpe --trials 20 "
    '--prune median --workers 2 max_minutes=2':
        ('tests/sweeps/test_sweep.py::test_readme_tpe_sweep_draws_log_uniform_learning_rates',
         'the same command with tiny sizes and fewer trials'),
    'lazylab sweep --resume runs/transformer/sweep-ID':
        ('tests/sweeps/test_sweep.py::test_sigkill_of_the_sweep_then_resume_runs_every_point_once',
         'a sweep killed with SIGKILL, then --resume'),
    'lazylab sweep transformer transformer.ffn.glu_variant=GEGLU,SwiGLU optimizer.learning_rate=3e-3,1e-2 d_model=64 '
    'n_layers=2 max_minutes=0 max_steps=400 valid_interval=50 --storage postgresql://USER@HOST/DB --study glu '
    '--workers 2':
        ('tests/sweeps/test_sweep.py::test_two_sweeps_on_one_postgresql_study_split_the_grid',
         'two sweeps at once on one study of a throw-away PostgreSQL on 127.0.0.1'),
    'lazylab sweep transformer transformer.ffn.glu_variant=GEGLU,SwiGLU optimizer.learning_rate=3e-3,1e-2 d_model=64 '
    'n_layers=2 max_minutes=0 max_steps=400 valid_interval=50 --storage /shared/glu.journal --study glu --workers 2':
        ('tests/sweeps/test_sweep.py::test_two_sweeps_on_one_journal_file_split_the_grid',
         'two sweeps at once on one journal file'),
    # guide/slurm.md: its commands need a Slurm cluster; the tests on the one-node cluster of tests/slurm/conftest.py
    # read them from the page (guide_command) and run them with tiny sizes and the options that cluster can take
    "pip install 'lazylab[slurm]'":
        ('tests/slurm/test_slurm_options.py::test_the_job_script_passes_the_signal_on_and_keeps_submitits_surprises_out',
         'make install installs the slurm extra the same way (.[…,slurm]); the test imports submitit'),
    'lazylab train transformer d_model=256 n_layers=4 --slurm partition=gpu,time=4:00:00,gpus_per_node=1':
        ('tests/slurm/test_slurm_runs.py::test_a_submitted_run_completes_and_equals_a_run_here',
         'the command with tiny sizes, time=10 and --wait (the test cluster has one partition and no GPUs)'),
    'scancel --signal=USR1 --batch 4242':
        ('tests/slurm/test_slurm_runs.py::'
         'test_the_warning_signal_to_the_batch_shell_requeues_and_the_run_ends_as_if_never_stopped',
         'the command on the test job mid-run: it requeues and ends equal to an uninterrupted run'),
    'lazylab resume runs/transformer/RUN_ID --slurm partition=gpu,time=4:00:00,gpus_per_node=1':
        ('tests/slurm/test_slurm_runs.py::test_a_run_stopped_here_resumes_as_a_slurm_job_and_ends_as_if_never_stopped',
         'a run stopped here by Ctrl-C, resumed with the command as a job (time=10, --wait), equal to an uninterrupted '
         'run'),
    'lazylab sweep transformer d_model=128,256 optimizer.learning_rate=1e-3,3e-3 --workers 2 --launcher slurm --slurm '
    'partition=gpu,time=60,gpus_per_node=1':
        ('tests/slurm/test_slurm_sweep.py::'
         'test_a_sweep_keeps_two_jobs_in_the_queue_reruns_a_cancelled_trial_and_reattaches_after_a_kill',
         'the same grid with tiny sizes (d_model=16,24), time=10, on the test cluster'),
    'lazylab sweep --resume runs/transformer/sweep-ID --workers 2':
        ('tests/slurm/test_slurm_sweep.py::'
         'test_a_sweep_keeps_two_jobs_in_the_queue_reruns_a_cancelled_trial_and_reattaches_after_a_kill',
         'after a cancelled trial and a SIGKILL of the sweep: reattaches, reruns, every trial completes'),
    'lazylab train transformer batch_size=16 --slurm nodes=2,ntasks_per_node=4,gpus_per_node=4,time=12:00:00':
        ('tests/slurm/test_slurm_runs.py::test_two_processes_in_a_job_train_as_under_torchrun_and_requeue_once',
         'what one machine gives: nodes=1, ntasks_per_node=2 on the CPU, equal to torchrun --nproc_per_node=2 here'),
    # guide/notebooks.md
    'make notebooks':
        ('tests/test_notebooks.py::test_notebook_equals_jupytext_conversion_of_its_py_source',
         'the target is `jupytext --sync notebooks/*.py`; the test checks each .ipynb is that conversion of its .py'),
    '.venv/bin/python -m pytest -q tests/test_notebooks.py':
        ('tests/test_notebooks.py::test_feedback_notebook_runs', 'the notebooks\' tests themselves (CI runs them)'),
    # contributing/docs.md
    'make docs':
        ('tests/docs/test_site.py::test_site_builds_strictly_and_loads_nothing_from_other_hosts',
         'the target is `mkdocs build --strict`, which the test runs'),
    '.venv/bin/mkdocs serve':
        ('tests/docs/test_site.py::test_site_builds_strictly_and_loads_nothing_from_other_hosts',
         'a server that rebuilds on each change: the build it serves is the one the test makes'),
    '.venv/bin/python -m pytest -q tests/docs':
        ('tests/docs/test_docs_code.py::test_every_page_command_is_run_or_covered', 'the tests of this folder'),
}


@dataclass
class Block:
    page: str         # relative to docs/
    line: int         # of the opening fence, 1-based
    language: str
    code: str
    not_run: Optional[str]   # the reason given in <!-- not-run: REASON -->, or None
    output: bool = False     # a ```text block marked <!-- output -->: what the Python block before it prints

    def commands(self) -> list[tuple[str, list[str]]]:
        """(command, expected output lines) of a bash or console block, comments dropped, lines joined."""
        if self.language == 'bash':
            text = re.sub(r'\\\n\s*', ' ', self.code)
            return [(c, []) for c in (_strip_comment(line) for line in text.splitlines()) if c]
        out: list[tuple[str, list[str]]] = []
        text = re.sub(r'\\\n\s*', ' ', self.code)
        for line in text.splitlines():
            if line.startswith('$ '):
                out.append((_strip_comment(line[2:]), []))
            elif line.strip():
                assert out, f'{self.where}: console output before any `$ ` command'
                out[-1][1].append(line.strip())
        return out

    @property
    def where(self) -> str:
        return f'docs/{self.page}:{self.line}'


def _strip_comment(line: str) -> str:
    line = line.strip()
    if line.startswith('#'):
        return ''
    return ' '.join(re.sub(r'\s+#\s.*$', '', line).split())


_FENCE = re.compile(r'^(\s*)```(\S*)\s*$')
_NOT_RUN = re.compile(r'^\s*<!--\s*not-run:(.*?)-->\s*$')
_OUTPUT = re.compile(r'^\s*<!--\s*output\s*-->\s*$')


def page_blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, in order (a fence may be indented, as in a list item)."""
    lines = page.read_text(encoding='utf-8').splitlines()
    blocks, i = [], 0
    name = page.relative_to(DOCS).as_posix() if page.is_relative_to(DOCS) else page.name
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, language, start = m.group(1), m.group(2), i
        j = i + 1
        while j < len(lines) and lines[j].strip() != '```':
            j += 1
        assert j < len(lines), f'docs/{name}:{start + 1}: a code block that is never closed'
        code = '\n'.join(line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:j])
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = _NOT_RUN.match(lines[k]) if k >= 0 else None
        output = k >= 0 and bool(_OUTPUT.match(lines[k]))
        blocks.append(Block(name, start + 1, language, code + '\n', marker.group(1).strip() if marker else None,
                            output))
        i = j + 1
    return blocks


def tutorial_pages() -> list[Path]:
    pages = sorted(DOCS.rglob('*.md'))
    return [p for p in pages if not p.relative_to(DOCS).as_posix().startswith(NOT_TUTORIAL)]


def _node_exists(node: str) -> bool:
    path, name = node.split('::')
    file = ROOT / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text(encoding='utf-8'))
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


_ASSIGNMENT = re.compile(r'[A-Za-z_][A-Za-z0-9_]*=')


def environment_prefix(command: str) -> tuple[dict[str, str], str]:
    """({NAME: VALUE} of the `NAME=VALUE` words a command starts with, the command after them)."""
    env, rest = {}, command
    while True:
        words = shlex.split(rest)
        if not words or not _ASSIGNMENT.match(words[0]):
            return env, rest
        name, _, value = words[0].partition('=')
        env[name] = value
        rest = rest.split(None, 1)[1] if len(words) > 1 else ''


def runs_here(command: str) -> bool:
    """Whether the test runs `command` itself (a lazylab command or one of the plain shell commands)."""
    words = shlex.split(environment_prefix(command)[1])
    return bool(words) and (words[0] == 'lazylab' or words[0] in SHELL) and command not in COVERED


def test_every_page_command_is_run_or_covered():
    pages = tutorial_pages()
    names = [p.relative_to(DOCS).as_posix() for p in pages]
    assert 'guide/configs.md' in names and 'guide/models.md' in names, names
    shown, problems = set(), []
    for page in pages:
        for b in page_blocks(page):
            if not b.language:
                problems.append(f'{b.where}: a code block without a language (```bash, ```python, ```text, …)')
            elif b.language in ('sh', 'shell', 'zsh', 'py', 'python3', 'pycon', 'shell-session'):
                problems.append(f'{b.where}: ```{b.language}: write ```bash, ```console or ```python')
            if b.not_run is not None:
                if not b.not_run:
                    problems.append(f'{b.where}: <!-- not-run: --> needs its reason')
                continue
            if b.language in ('bash', 'console'):
                for command, _ in b.commands():
                    shown.add(command)
                    if not runs_here(command) and command not in COVERED:
                        problems.append(f'{b.where}: {command!r} is neither run here nor in COVERED with its test')
    assert problems == [], '\n'.join(problems)
    stale = [c for c in COVERED if c not in shown]
    assert stale == [], f'COVERED names commands no page shows any more: {stale}'
    for command, (node, _) in COVERED.items():
        assert _node_exists(node), f'{command}: {node} is not a test'


def _argv(command: str) -> list[str]:
    """The command's arguments as a shell gives them, with RUN_ID and globs resolved in the working folder and
    tiny sizes put before a `train` or `sweep` command's own keys."""
    words = shlex.split(command)[1:]
    resolved = []
    for w in words:
        if 'RUN_ID' in w:
            head = w.split('RUN_ID')[0]
            found = sorted(glob.glob(head + '*'))
            assert found, f'{command}: no run matches {head}* (an earlier block should have made it)'
            w = w.replace('RUN_ID', Path(found[0]).name)
        resolved += sorted(glob.glob(w)) if '*' in w else [w]
    if resolved[0] == 'train' or (resolved[0] == 'sweep' and not resolved[1].startswith('-')):
        resolved = resolved[:2] + _tiny_for(resolved[1], resolved[2:]) + resolved[2:]  # a sweep's, for every trial
    return resolved


def _tiny_for(experiment: str, own: list[str]) -> list[str]:
    """The TINY sizes the experiment has keys for (an experiment of the reader's own, such as the tutorial's LSTM,
    has no `heads`), but those the command's own arguments `own` give (a key is given once); all of them when it
    cannot be loaded (the command is then a mistake the page shows)."""
    given = {a.split('=', 1)[0] for a in own if '=' in a and not a.startswith('-')}
    from lazylab.errors import LazylabError
    from lazylab.experiments.configure import declared_keys
    from lazylab.experiments.discovery import load_experiment
    try:
        keys = declared_keys(load_experiment(experiment).Configs)
    except LazylabError:
        return [a for a in TINY if a.split('=')[0] not in given]
    return [a for a in TINY if a.split('=')[0] in keys and a.split('=')[0] not in given]


def _matches(expected: str, lines: list[str]) -> bool:
    pattern = '.*'.join(re.escape(part) for part in expected.split('…'))
    return any(re.fullmatch(pattern, line) for line in lines)


def _run_command(block: Block, command: str, expected: list[str], capsys, folder: Path, monkeypatch):
    env, command = environment_prefix(command)
    words = shlex.split(command)
    if words[0] in SHELL:
        done = subprocess.run(['bash', '-c', command], cwd=folder, capture_output=True, text=True, timeout=60,
                              env={**os.environ, **env})
        assert done.returncode == 0, (block.where, command, done.stderr)
        out, err, code = done.stdout, done.stderr, 0
    else:
        command, _, target = command.partition(' > ')  # `lazylab … > FILE`: its output into FILE, as a shell does
        capsys.readouterr()
        with monkeypatch.context() as m:  # the command's own variables, for it alone
            for name, value in env.items():
                m.setenv(name, value)
            code = cli.main(_argv(command))
        out, err = capsys.readouterr()
        if target:
            (folder / target.strip()).write_text(out, encoding='utf-8')
    fails = any(line.startswith('lazylab: error:') for line in expected)
    assert code == (2 if fails else 0), (block.where, command, code, err[-2000:])
    assert 'Traceback' not in err, (block.where, command, err)
    printed = [line.strip() for line in (out + err).splitlines()]
    missing = [line for line in expected if not _matches(line, printed)]
    assert missing == [], (block.where, command, 'the page shows output the command did not print', missing,
                           out[-2000:], err[-2000:])


def _runnable(page: Path) -> list[Block]:
    return [b for b in page_blocks(page)
            if (b.not_run is None and b.language in ('python', 'bash', 'console')) or b.output]


def _runs_something(page: Path) -> bool:
    return any(b.language == 'python' or any(runs_here(c) for c, _ in b.commands())
               for b in _runnable(page) if not b.output)


@pytest.mark.parametrize('page', [p.relative_to(DOCS).as_posix() for p in tutorial_pages() if _runs_something(p)])
def test_page_code_runs(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace = {'__name__': 'docs_' + re.sub(r'\W', '_', page[:-3])}
    threads = torch.get_num_threads()
    printed = None  # what the last Python block printed
    try:
        for block in _runnable(DOCS / page):
            if block.output:
                assert printed is not None, f'{block.where}: <!-- output --> follows no Python block'
                assert printed.rstrip('\n') == block.code.rstrip('\n'), (block.where, 'the block printed', printed)
                printed = None
                continue
            if block.language == 'python':
                code = compile('\n' * block.line + block.code, f'docs/{page}', 'exec')  # the page's line numbers
                capsys.readouterr()
                exec(code, namespace)  # noqa: S102 - the page's own code, the point of the test
                printed = capsys.readouterr().out
                continue
            printed = None
            for command, expected in block.commands():
                if runs_here(command):
                    _run_command(block, command, expected, capsys, tmp_path, monkeypatch)
    finally:
        torch.set_num_threads(threads)


def test_page_blocks_reads_fences_markers_and_console_output(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text('Text.\n\n```bash\nlazylab options feedback   # every key\nlazylab train feedback \\\n'
                    '    d_model=64\n```\n\n<!-- not-run: it needs a GPU -->\n```python\nimport torch\n```\n\n'
                    '- in a list:\n\n    ```console\n    $ lazylab train nope\n    lazylab: error: unknown …\n    ```\n'
                    '\n<!-- output -->\n```text\nhello\n```\n', encoding='utf-8')
    bash, python, console, text = page_blocks(page)
    assert (bash.language, bash.line, bash.not_run) == ('bash', 3, None)
    assert bash.commands() == [('lazylab options feedback', []), ('lazylab train feedback d_model=64', [])]
    assert (python.language, python.not_run) == ('python', 'it needs a GPU')
    assert console.commands() == [('lazylab train nope', ['lazylab: error: unknown …'])]
    assert text.output and not bash.output
    assert _matches('lazylab: error: unknown …', ["lazylab: error: unknown experiment 'nope'"])
    assert not _matches('lazylab: error: unknown …', ['lazylab: error: bad value'])


def test_a_commands_environment_assignments_are_split_off():
    assert environment_prefix("LR=3e-4 A= lazylab options t 'x=${env:LR}' > f.txt") == \
        ({'LR': '3e-4', 'A': ''}, "lazylab options t 'x=${env:LR}' > f.txt")
    assert environment_prefix('lazylab train t a=1') == ({}, 'lazylab train t a=1')
    assert runs_here("LR=1 lazylab options t 'x=${env:LR}' --resolved") and not runs_here('LR=1 make train')
