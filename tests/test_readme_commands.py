"""Every shell command the README shows is run by a test, with tiny sizes.

The README's `lazylab` commands run here, in this process, in a scratch folder, in the README's order (the
`generate` and `compare` lines use the runs and the sweep the lines before them made; `lazylab train lstm.py` the
file `lazylab new lstm` wrote): each keeps its own keys, and tiny sizes go before them (so a run takes seconds; a
preset is applied before any key, so the tiny sizes shrink it too). A command that cannot run here (a server, a
long labml run, the make targets) must be in COVERED, naming the test that runs it; a command in neither place
fails `test_every_readme_command_is_run_by_a_test`, so a new README command needs a test.
"""
import ast
import glob
import re
import shlex
from pathlib import Path

import pytest
import torch

from lazylab import cli
from lazylab.testing import tiny

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / 'README.md'

#: the shared tiny sizes (lazylab.testing), two steps long
TINY = tiny('max_steps=2')

#: README command → the test that runs it (file::function), for the commands that do not run here, and why that
#: test is the command.
COVERED = {
    'make train': ('tests/test_readme_commands.py::test_make_targets_are_the_readme_commands',
                   'the target is `lazylab train feedback`, whose code path the train commands here run'),
    'make test': ('tests/test_readme_commands.py::test_make_targets_are_the_readme_commands',
                  'the target is `pytest -q`: the suite these tests are in (CI runs it, .ci/run)'),
    'lazylab labml labml_nn.transformers.feedback.experiment --steps 200':
        ('tests/labml/test_labml_runs.py::test_labml_nn_experiment_trains_30_steps_and_loss_falls',
         'the same module with tiny key=value sizes and --steps 30 (200 steps of labml_nn\'s sizes take minutes)'),
    'lazylab dashboard':
        ('tests/dashboard/test_end_to_end.py::test_run_streams_configs_metrics_and_sample_to_dashboard',
         'its server fixture runs `lazylab dashboard --port PORT --store DIR` (a server: it does not return)'),
}


def readme_commands() -> list[str]:
    """Every command line of the README's bash blocks, in order (comments dropped, continuation lines joined)."""
    out = []
    text = README.read_text(encoding='utf-8')
    for block in re.findall(r'```bash\n(.*?)```', text, re.S):
        for line in re.sub(r'\\\n\s*', ' ', block).splitlines():
            command = re.sub(r'\s+#.*$', '', line).strip()
            if command and not command.startswith('#'):
                out.append(' '.join(command.split()))
    return out


def run_here() -> list[str]:
    """The README commands this module runs itself: the `lazylab` ones not in COVERED."""
    return [c for c in readme_commands() if c.startswith('lazylab ') and c not in COVERED]


def _node_exists(node: str) -> bool:
    path, name = node.split('::')
    tree = ast.parse((ROOT / path).read_text(encoding='utf-8'))
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def test_every_readme_command_is_run_by_a_test():
    commands = readme_commands()
    ours = set(run_here())
    assert {'lazylab train transformer max_minutes=1', 'lazylab new lstm'} <= ours, ours
    missing = [c for c in commands if c not in ours and c not in COVERED]
    assert missing == [], f'README commands no test runs (add them to COVERED with their test): {missing}'
    stale = [c for c in COVERED if c not in commands]
    assert stale == [], f'COVERED names commands the README no longer shows: {stale}'
    for command, (node, _) in COVERED.items():
        assert _node_exists(node), f'{command}: {node} is not a test'


def test_the_readme_is_at_most_150_lines_and_shows_the_two_commands_first():
    lines = README.read_text(encoding='utf-8').splitlines()
    assert len(lines) <= 150, len(lines)
    assert readme_commands()[:2] == ['make train', 'make test']
    after = '\n'.join(lines[next(i for i, line in enumerate(lines) if line.startswith('make test')):][:8])
    assert 'source .venv/bin/activate' in after and '.venv/bin/lazylab' in after  # how to use the command, right after


def test_make_targets_are_the_readme_commands():
    makefile = (ROOT / 'Makefile').read_text(encoding='utf-8')
    assert re.search(r'^train: .*\n\t\$\(VENV\)/bin/lazylab train feedback$', makefile, re.M)
    assert re.search(r'^test: .*\n\t\$\(PY\) -m pytest -q -n \$\(TEST_WORKERS\)$', makefile, re.M)
    assert re.search(r"install -e '\.\[test,dashboard(,\w+)*\]'", makefile)  # (and the postgres and docs extras)


def _tiny_for(experiment: str, own: list[str]) -> list[str]:
    """The TINY sizes the experiment has keys for (the README's lstm.py has no heads or d_ff), but those the
    command's own arguments `own` give (a key is given once)."""
    given = {a.split('=', 1)[0] for a in own if '=' in a and not a.startswith('-')}
    from lazylab.experiments.configure import declared_keys
    from lazylab.experiments.discovery import load_experiment
    keys = declared_keys(load_experiment(experiment).Configs)
    return [a for a in TINY if a.split('=')[0] in keys and a.split('=')[0] not in given]


def _argv(command: str) -> list[str]:
    """The command's arguments as a shell gives them, with RUN_ID and globs resolved in the working folder and
    tiny sizes put before a `train` or `sweep` command's own keys."""
    words = shlex.split(command)[1:]
    words = [w.replace('RUN_ID', Path(sorted(glob.glob(w.split('RUN_ID')[0] + '[0-9]*'))[0]).name)
             if 'RUN_ID' in w else w for w in words]
    words = [m for w in words for m in (sorted(glob.glob(w)) if '*' in w else [w])]
    if words[0] in ('train', 'sweep'):
        words = words[:2] + _tiny_for(words[1], words[2:]) + words[2:]
    return words


def _shape(line: str) -> str:
    """A console line with its numbers, run directory and the reason the run stopped taken out: what any run of the
    same kind prints alike."""
    line = re.sub(r'runs/\S+', 'RUN_DIR', line)
    line = re.sub(r'\d[\d,.]*\d|\d', '#', line)
    return re.sub(r'; stopped .*?; run dir', '; stopped …; run dir', line)


def quick_start_output() -> tuple[str, str]:
    """The first and last lines of the output the README shows for its quick start."""
    text = README.read_text(encoding='utf-8')
    shown = re.search(r'lazylab train transformer max_minutes=1\n```\n.*?```text\n(.*?)```', text, re.S).group(1)
    return shown.splitlines()[0], shown.splitlines()[-1]


FIRST_LINE = ('transformer: # parameters, ', 'on cpu → RUN_DIR')
LAST_LINE = ("done: step #, valid loss # nats/char, accuracy #, # tokens/s (the run's average), MFU #%; "
             'stopped …; run dir RUN_DIR')


def test_the_quick_start_output_has_the_shape_of_a_run():
    """The README's quick-start lines have the shape a run prints (test_readme_commands_run checks a run does)."""
    first, last = quick_start_output()
    assert _shape(first).startswith(FIRST_LINE[0]) and _shape(first).endswith(FIRST_LINE[1]), _shape(first)
    assert _shape(last) == LAST_LINE, _shape(last)


def test_readme_commands_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'my.yaml').write_text('optimizer.learning_rate: 0.001\n', encoding='utf-8')
    threads = torch.get_num_threads()
    try:
        for command in run_here():
            argv = _argv(command)
            code = cli.main(argv)
            out, err = capsys.readouterr()
            assert code == 0, (command, err[-2000:])
            assert 'Traceback' not in err, (command, err)
            lines = out.splitlines()
            if command == 'lazylab train transformer max_minutes=1':  # the quick start: the lines the README shows
                assert _shape(lines[0]).startswith(FIRST_LINE[0]) and _shape(lines[0]).endswith(FIRST_LINE[1])
                assert _shape(lines[-1]) == LAST_LINE, lines[-1]
            if argv[0] == 'train':
                assert lines[-1].startswith('done: step 2, valid loss '), (command, out[-500:])
            elif argv[0] == 'options':
                assert "fast_weights.phi: Module = 'dpfp'  options: dpfp, linear, favor, l2" in lines, out[-2000:]
            elif argv[0] == 'generate':
                # the text, then the one newline generate ends its output with (a sampled character may be one too)
                assert out.startswith('ROMEO:') and out.endswith('\n') and len(out) - 1 == len('ROMEO:') + 200
            elif argv[0] == 'sweep':
                assert lines[0].startswith('sweep runs/transformer/sweep-') and 'grid of 4' in lines[0], lines[0]
                assert sum(' completed ' in line for line in lines) == 4, out
            elif argv[0] == 'compare':
                header = next(line for line in lines if line.startswith('trial '))
                assert header.split()[1:4] == ['transformer.ffn.glu_variant', 'optimizer.learning_rate',
                                               'loss.valid'], header
                assert sum(line.endswith('completed') for line in lines) == 4, out
            elif argv[0] == 'new':
                assert (tmp_path / 'lstm.py').is_file()
    finally:
        torch.set_num_threads(threads)
    runs = sorted(p.parent.parent.name for p in tmp_path.glob('runs/*/*/run.json'))
    assert runs == ['fast_weights', 'lstm', 'transformer', 'transformer'], runs
    assert len(list(tmp_path.glob('runs/transformer/sweep-*/trial-*/run.json'))) == 4


@pytest.mark.parametrize('command', ['lazylab train transformer ffn.glu_variant=SwiGLU --config my.yaml'])
def test_the_short_key_of_the_readme_reaches_the_nested_key(tmp_path, monkeypatch, command):
    from lazylab.configs import explain
    from lazylab.experiments.configure import make_configs
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'my.yaml').write_text('optimizer.learning_rate: 0.001\n', encoding='utf-8')
    assert command in run_here()
    a, settings = cli.command('train').parser().parse_with_settings(shlex.split(command)[2:])
    conf = make_configs(a.experiment, settings, config=a.config)
    assert conf.transformer.ffn.glu_variant == 'SwiGLU' and conf.transformer.ffn.is_gated is True
    assert conf.optimizer.learning_rate == 0.001
    assert explain(conf)['transformer.ffn.glu_variant']['source'] == 'override'


def _anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the headings of a page (Python-Markdown's toc slugs, as mkdocs.yml configures it)."""
    from markdown.extensions.toc import slugify
    text = re.sub(r'```.*?```', '', page.read_text(encoding='utf-8'), flags=re.S)
    return {slugify(re.sub(r'[`*]', '', m), '-') for m in re.findall(r'^#{1,6} (.+?)\s*$', text, re.M)}


def test_the_readme_links_to_files_and_headings_that_exist():
    links = re.findall(r'\]\(([^)\s]+)\)', README.read_text(encoding='utf-8'))
    local = [link for link in links if not link.startswith(('http://', 'https://'))]
    assert len(local) >= 10, local
    for link in local:
        path, _, anchor = link.partition('#')
        assert (ROOT / path).is_file(), link
        if anchor:
            assert anchor in _anchors(ROOT / path), (link, sorted(_anchors(ROOT / path)))
