"""The documentation site builds strictly (`make docs`'s command) and works offline.

The site is built once for this module, into a scratch folder, with `mkdocs build --strict`: a warning (a broken
link or anchor, an unresolved reference, a page left out of the navigation) fails the build. The built pages must
load nothing from another host — no script, stylesheet, font, image or frame from a CDN, in the HTML or the CSS —
so that a site/ opened from disk shows everything; ordinary links (`<a href="https://…">`, a paper's address) are
fine. The command-line reference is generated at build time: it must show every command's `--help`.
"""
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lazylab import cli

ROOT = Path(__file__).resolve().parents[2]

#: what loads a resource in HTML: the tags and the attribute that names the resource
_LOADING_TAGS = re.compile(r'<(script|link|img|iframe|source|embed|object|audio|video)\b[^>]*>', re.I | re.S)
_RESOURCE_ATTR = re.compile(r'\b(src|href|data|srcset|poster)\s*=\s*["\']?\s*((?:https?:)?//[^"\'\s>]+)', re.I)
#: CSS that loads a resource: url(…) and @import
_CSS_URL = re.compile(r'(?:url\(\s*["\']?|@import\s+["\'])\s*((?:https?:)?//[^"\')\s]+)', re.I)


def external_resources(text: str) -> list[str]:
    """The addresses on other hosts that a page or stylesheet would load (not the ones it merely links to)."""
    found = []
    for tag in _LOADING_TAGS.finditer(text):
        found += [m.group(2) for m in _RESOURCE_ATTR.finditer(tag.group(0))]
    return found + [m.group(1) for m in _CSS_URL.finditer(text)]


def test_external_resources_finds_what_loads_and_not_what_links():
    page = ('<script src="https://unpkg.com/x/shim"></script><link rel="stylesheet" href="//cdn.example/a.css">'
            '<link rel="preconnect" href="https://fonts.gstatic.com"><img alt="b" src="https://img.example/b.svg">'
            '<a href="https://arxiv.org/abs/2002.09402">paper</a><script src="assets/local.js"></script>'
            '<style>@font-face{src:url("https://fonts.example/f.woff2")}</style>')
    assert external_resources(page) == ['https://unpkg.com/x/shim', '//cdn.example/a.css', 'https://fonts.gstatic.com',
                                        'https://img.example/b.svg', 'https://fonts.example/f.woff2']
    assert external_resources('<a href="https://github.com/lazylab/lazylab">repo</a> url(assets/a.png)') == []


def build(config_dir: Path, out: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the site whose mkdocs.yml is in `config_dir`, into `out` (as `make docs`)."""
    env = {**os.environ, 'NO_MKDOCS_2_WARNING': '1', 'DISABLE_MKDOCS_2_WARNING': 'true'}
    return subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '--strict', '--site-dir', str(out)],
                          cwd=config_dir, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope='module')
def site(tmp_path_factory) -> tuple[Path, str]:
    """The built site and what the build printed."""
    out = tmp_path_factory.mktemp('site')
    done = build(ROOT, out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return out, done.stdout + done.stderr


def test_make_docs_is_the_strict_build_and_make_lint_runs_it():
    makefile = (ROOT / 'Makefile').read_text(encoding='utf-8')
    recipe = re.search(r'^docs: .*\n((?:\t.*\n)+)', makefile, re.M).group(1)
    assert 'mkdocs build --strict' in recipe and '--quiet' not in recipe  # --quiet hides the warnings from --strict
    lint = re.search(r'^lint: .*\n((?:\t.*\n)+)', makefile, re.M).group(1)
    assert 'ruff check .' in lint and '$(MAKE) --no-print-directory docs' in lint
    assert re.search(r"install -e '\.\[[\w,]*\bdocs\b[\w,]*\]'", makefile)


#: a broken link, a missing anchor, an unresolved reference → the warning each gives
BROKEN = {
    '[a page](guide/nope.md)': "contains a link 'guide/nope.md', but the target is not found",
    '[the guide](guide/configs.md#no-such-section)': "does not contain an anchor '#no-such-section'",
    '[`explain`][lazylab.configs.no_such_function]': 'Could not find cross-reference target',
}


def test_a_broken_link_anchor_or_reference_fails_the_build(tmp_path):
    shutil.copy(ROOT / 'mkdocs.yml', tmp_path / 'mkdocs.yml')
    shutil.copytree(ROOT / 'docs', tmp_path / 'docs')
    index = tmp_path / 'docs' / 'index.md'
    index.write_text(index.read_text(encoding='utf-8') + ''.join(f'\nSee {b}.\n' for b in BROKEN), encoding='utf-8')
    done = build(tmp_path, tmp_path / 'site')
    log = done.stdout + done.stderr
    assert done.returncode != 0 and f'Aborted with {len(BROKEN)} warnings in strict mode' in log, log[-3000:]
    for warning in BROKEN.values():
        assert warning in log, (warning, log[-3000:])


def test_site_builds_strictly_and_loads_nothing_from_other_hosts(site):
    out, log = site
    assert 'WARNING' not in log, log[-5000:]
    assert (out / 'index.html').is_file() and (out / 'guide' / 'configs.html').is_file()
    files = [p for p in out.rglob('*') if p.suffix in ('.html', '.css')]
    assert len(files) > 20, files
    loaded = {}
    for path in files:
        found = external_resources(path.read_text(encoding='utf-8', errors='replace'))
        if found:
            loaded[str(path.relative_to(out))] = sorted(set(found))
    assert loaded == {}, f'pages that load from other hosts (they would not show offline): {loaded}'
    # search works from disk: the offline plugin inlines the index into a script, and the shim is the site's own
    assert (out / 'search' / 'search_index.js').read_text(encoding='utf-8').startswith('var __index = ')
    assert 'assets/javascripts/iframe-worker-shim.js' in (out / 'index.html').read_text(encoding='utf-8')


def _help(argv: list[str], capsys) -> str:
    try:
        code = cli.main(argv)
    except SystemExit as e:  # `lazylab dashboard --help` is argparse's own, which exits
        code = e.code
    assert code in (0, None), argv
    return capsys.readouterr().out.rstrip()


def test_cli_reference_is_every_commands_help(site, capsys, monkeypatch):
    out, _ = site
    page = (out / 'reference' / 'cli.html').read_text(encoding='utf-8')
    sections = dict(re.findall(r'<h2 id="([\w-]+)">.*?<code>(.*?)</code>', page, re.S))
    monkeypatch.setenv('COLUMNS', '100')  # the width docs/_gen/cli_reference.py formats the help at
    commands = list(cli.COMMANDS)
    assert list(sections) == ['lazylab'] + [f'lazylab-{c}' for c in commands]
    assert html.unescape(sections['lazylab']).rstrip() == _help(['--help'], capsys)
    for command in commands:
        assert html.unescape(sections[f'lazylab-{command}']).rstrip() == _help([command, '--help'], capsys), command
