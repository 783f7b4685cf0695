"""`lazylab options EXPERIMENT key=value … --graph dot|mermaid|svg` (issue 36, item 4): the resolved configuration's
lazy graph, its edges what each item read (as `lazylab.configs.inspect` records it), user-set keys marked, the model
not built; SVG through graphviz's dot."""
import os
import re
import shutil
import xml.etree.ElementTree as ET

import pytest
from torch import nn

from lazylab import cli
from lazylab.configs import inspect
from lazylab.experiments.resolved import resolve
from lazylab.testing import ROOT


def _dot(capsys, argv: list[str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """({node: its label's attributes}, [(from, to)]) of `lazylab options ARGV --graph dot`."""
    assert cli.main(['options', *argv, '--graph', 'dot']) == 0
    out = capsys.readouterr().out
    nodes = dict(re.findall(r'^  "([^"]+)" \[(.*)\];$', out, re.M))
    edges = re.findall(r'^  "([^"]+)" -> "([^"]+)";$', out, re.M)
    return nodes, edges


def test_the_graph_of_transformer_has_inspects_reads_as_edges_and_marks_user_set_keys(tmp_path, capsys):
    (tmp_path / 'a.yaml').write_text('heads: 2\n', encoding='utf-8')
    argv = ['transformer', 'd_model=48', 'seq_len=32', '--config', str(tmp_path / 'a.yaml')]
    nodes, edges = _dot(capsys, argv)
    conf, _ = resolve('transformer', ['d_model=48', 'seq_len=32'], [str(tmp_path / 'a.yaml')])
    reads = {item.path: [r for r in item.reads if r != item.path] for item in inspect.items(conf)}
    assert list(nodes) == list(reads)  # one node per item, in inspect's order
    for path in ('n_tokens', 'total_steps', 'transformer.ffn.d_model', 'dataset'):
        assert [a for a, b in edges if b == path] == reads[path]
    assert [a for a, b in edges if b == 'n_tokens'] == ['dataset']
    assert [a for a, b in edges if b == 'total_steps'] == ['dataset', 'seq_len', 'batch_size', 'epochs', 'max_steps']
    assert [a for a, b in edges if b == 'transformer.ffn.d_model'] == ['transformer.d_model']
    filled = {path for path, attributes in nodes.items() if 'filled' in attributes}
    assert filled == {'d_model', 'seq_len', 'heads'}
    assert nodes['d_model'].startswith('label="d_model = 48\\ncommand line"')
    assert nodes['heads'].startswith(f'label="heads = 2\\n{tmp_path / "a.yaml"}:1"')
    assert nodes['n_tokens'] == 'label="n_tokens = 65\\noption vocabulary_size"'
    assert nodes['model'] == 'label="model\\noption transformer, built when the run starts"'
    assert not [item.path for item in inspect.items(conf) if item.computed and isinstance(item.value, nn.Module)]


def test_the_mermaid_graph_marks_the_user_set_keys(capsys):
    assert cli.main(['options', 'feedback', 'd_model=64', '--graph', 'mermaid']) == 0
    out = capsys.readouterr().out
    ids = dict(re.findall(r'^  (n\d+)\["([^"<]+?) = ', out, re.M))
    assert out.startswith('flowchart LR\n') and ids['n0'] == 'seed'
    user, = re.findall(r'^  class (\S+) user$', out, re.M)
    assert [ids[n] for n in user.split(',')] == ['d_model']
    by_path = {path: n for n, path in ids.items()}
    assert f'  {by_path["d_model"]} --> {by_path["feedback.d_model"]}\n' in out


def test_the_svg_has_one_node_per_item(tmp_path, capsys):
    if shutil.which('dot') is None:
        if os.environ.get('LAZYLAB_REQUIRE_GRAPHVIZ') or os.environ.get('CI'):  # .ci/run: a skip would hide it
            pytest.fail("graphviz's dot is not installed (.ci/run installs graphviz)")
        pytest.skip("graphviz's dot is not installed: apt-get install graphviz")
    assert cli.main(['options', 'feedback', 'heads=2', '--graph', 'svg']) == 0
    root = ET.fromstring(capsys.readouterr().out)
    svg = '{http://www.w3.org/2000/svg}'
    nodes = [g for g in root.iter(f'{svg}g') if g.get('class') == 'node']
    titles = [g.find(f'{svg}title').text for g in nodes]
    conf, _ = resolve('feedback', ['heads=2'])
    assert sorted(titles) == sorted(item.path for item in inspect.items(conf))  # one each (dot orders them)
    assert len([g for g in root.iter(f'{svg}g') if g.get('class') == 'edge']) == \
        sum(len([r for r in item.reads if r != item.path]) for item in inspect.items(conf))


@pytest.mark.parametrize('argv, message', [
    (['--graph', 'png'], "argument --graph: invalid choice: 'png' (choose from 'dot', 'mermaid', 'svg') (see: "
                         "lazylab options --help)"),
    (['--graph'], 'argument --graph: expected one argument (see: lazylab options --help)'),
    (['--graph', 'dot', '--resolved'], '--graph dot and --resolved are two outputs: give one'),
    (['--graph', 'mermaid', '--format', 'yaml'], '--graph mermaid and --format are two outputs: give one'),
])
def test_a_bad_graph_flag_is_one_line(cli_error, argv, message):
    assert cli_error(['options', 'transformer', *argv]) == message


def test_svg_without_graphviz_is_one_line(cli_error, monkeypatch, tmp_path):
    monkeypatch.setenv('PATH', str(tmp_path))
    assert cli_error(['options', 'transformer', '--graph', 'svg']) == (
        "--graph svg needs graphviz's dot program, which is not installed: install graphviz (apt-get install "
        "graphviz, brew install graphviz), or use --graph dot or --graph mermaid")


def test_the_graph_refuses_what_train_refuses(cli_error, tmp_path):
    runs = f'runs_dir={tmp_path / "runs"}'
    assert cli_error(['options', 'transformer', 'd_model=0', runs, '--graph', 'dot']) == \
        cli_error(['train', 'transformer', 'd_model=0', runs])


def test_the_config_guide_shows_the_graph_the_command_prints(capsys):
    """The config guide's ```mermaid block is what `lazylab options feedback d_model=64 --graph mermaid` prints."""
    page = (ROOT / 'docs' / 'guide' / 'configs.md').read_text(encoding='utf-8')
    assert '$ lazylab options feedback d_model=64 --graph mermaid\n' in page
    shown, = re.findall(r'^```mermaid\n(.*?)^```$', page, re.M | re.S)
    assert cli.main(['options', 'feedback', 'd_model=64', '--graph', 'mermaid']) == 0
    assert shown == capsys.readouterr().out
