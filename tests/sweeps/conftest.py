"""What the sweep tests share: tiny sizes, the sweeps guide's commands, running `lazylab`, a throw-away PostgreSQL.

The PostgreSQL fixture starts a real server for one test module: `initdb` and `pg_ctl` (on PATH, or in
/usr/lib/postgresql/N/bin where Debian's postgresql package puts them; .ci/run installs it when missing) run as the
`postgres` user through `runuser -u postgres --`, because PostgreSQL refuses to run as root, which CI is; the data
folder is a temporary folder that user owns, the server listens on 127.0.0.1 only, on a free port, and is stopped
(`pg_ctl stop -m fast`) and removed afterwards. When any of that is missing the fixture fails the test in CI (the CI
environment variable is set there: a silent skip would hide a broken install step), and skips it elsewhere, saying
why.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, 'PYTHONPATH': str(ROOT)}

#: a run of a few steps: 4 steps of 4 × 16 characters, validation (and a checkpoint) every 2
TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'max_minutes=0',
        'max_steps=4', 'valid_interval=2', 'valid_batches=1', 'final_valid_batches=1', 'log_interval=2',
        'sample_tokens=4', 'device=cpu']


def readme_commands() -> list[str]:
    """Every `lazylab …` command in the bash blocks of the sweeps guide, docs/guide/sweeps.md (continuation lines
    joined, comments dropped): the page that documents the sweep (it was the README's section before the docs
    site; its console blocks are run by tests/docs/test_docs_code.py)."""
    text = (ROOT / 'docs' / 'guide' / 'sweeps.md').read_text(encoding='utf-8')
    commands = []
    for block in re.findall(r'```bash\n(.*?)```', text, re.S):
        for line in block.replace('\\\n', ' ').splitlines():
            line = re.sub(r'\s+#.*$', '', line).strip()
            if line.startswith('lazylab '):
                commands.append(' '.join(line.split()))
    return commands


def tiny(command: str, runs_dir: Path, trials: int = 2, **replace: str) -> list[str]:
    """A README command as arguments after `lazylab`, with tiny sizes: sizes it sets are replaced by TINY's,
    --trials by `trials`, and the placeholders in `replace` (e.g. sweep_dir='runs/transformer/sweep-ID') by the
    test's paths."""
    for old, new in replace.items():
        command = command.replace({'sweep_dir': 'runs/transformer/sweep-ID', 'plot': 'docs/sweep_glu.png',
                                   'postgres': 'postgresql://USER@HOST/DB', 'journal': '/shared/glu.journal'}[old], new)
    args = shlex.split(command)[1:]
    sizes = {t.split('=', 1)[0] for t in TINY}
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == '--trials':
            out += ['--trials', str(trials)]
            skip = True
            continue
        if '=' in a and not a.startswith('-') and a.split('=', 1)[0] in sizes:
            continue
        out.append(a)
    if out[0] == 'sweep' and '--resume' not in out:
        out += TINY + [f'runs_dir={runs_dir}']
    return out


def lazylab(args: list[str], timeout: float = 240, **kwargs) -> subprocess.CompletedProcess:
    """`python -m lazylab.cli ARGS` in a child process."""
    return subprocess.run([sys.executable, '-m', 'lazylab.cli', *args], env=ENV, capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def _tool(name: str):
    """A PostgreSQL or util-linux program: on PATH, or where Debian's postgresql package puts it."""
    found = shutil.which(name)
    if found is None:
        found = next(iter(sorted(Path('/usr/lib/postgresql').glob(f'*/bin/{name}'), reverse=True)), None)
    return str(found) if found else None


def _missing_postgres() -> str:
    for tool in ('initdb', 'pg_ctl', 'runuser'):
        if _tool(tool) is None:
            return f'{tool} is not installed (Debian: apt-get install postgresql util-linux)'
    if os.geteuid() != 0:
        return 'runuser needs root (the fixture runs PostgreSQL as the postgres user)'
    try:
        import pwd
        pwd.getpwnam('postgres')
    except KeyError:
        return 'there is no postgres user'
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install 'lazylab[postgres]')"
    return ''


@pytest.fixture(scope='module')
def postgres_url(ports):
    """postgresql://postgres@127.0.0.1:PORT/postgres of a server that lives for the test module."""
    missing = _missing_postgres()
    if missing:
        if os.environ.get('CI'):
            pytest.fail(f'PostgreSQL test server: {missing}')
        pytest.skip(f'PostgreSQL test server: {missing} (not in CI, so skipped)')
    import pwd
    user = pwd.getpwnam('postgres')
    home = Path(tempfile.mkdtemp(prefix='lazylab-pg-'))
    os.chown(home, user.pw_uid, user.pw_gid)
    data, port = home / 'data', ports.free()
    as_postgres = [_tool('runuser'), '-u', 'postgres', '--']
    initdb, pg_ctl = _tool('initdb'), _tool('pg_ctl')
    try:
        subprocess.run(as_postgres + [initdb, '-D', str(data), '-A', 'trust', '-U', 'postgres', '--no-sync'],
                       check=True, capture_output=True, timeout=120)
        subprocess.run(as_postgres + [pg_ctl, '-D', str(data), '-l', str(home / 'server.log'), '-w', '-t', '60',
                                      '-o', f'-h 127.0.0.1 -p {port} -k {home} -c fsync=off', 'start'],
                       check=True, capture_output=True, timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        log = (home / 'server.log').read_text(errors='replace') if (home / 'server.log').exists() else ''
        shutil.rmtree(home, ignore_errors=True)
        pytest.fail(f'PostgreSQL test server did not start: {e}; {getattr(e, "stderr", b"")!r} {log[-500:]}')
    try:
        yield f'postgresql://postgres@127.0.0.1:{port}/postgres'
    finally:
        subprocess.run(as_postgres + [pg_ctl, '-D', str(data), '-m', 'fast', '-w', 'stop'], capture_output=True,
                       timeout=120)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope='session')
def tools():
    """The helpers above, for the test modules (test files cannot import conftest under importlib mode)."""
    from types import SimpleNamespace
    return SimpleNamespace(TINY=TINY, ROOT=ROOT, ENV=ENV, readme_commands=readme_commands, tiny=tiny,
                           lazylab=lazylab)
