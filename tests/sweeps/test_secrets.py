"""A database password (in the URL's userinfo or a query parameter) never reaches a file or the console.

A real sweep on a throw-away PostgreSQL server (conftest's `postgres_url`) as a role whose password holds an `@`, a
`/`, a `:` and a `%` (the server checks it: a wrong one is refused) with a pruner, so that the storage URL travels to
the trials too; then every file the sweep wrote — sweep.yaml, trial.json, run.json, configs.yaml, output.log,
metrics.jsonl, the labml/ folders — and everything it printed are searched for the secrets, in every form they could
take.

A password written unencoded (`qauser:Sx7k@verylongsecretpart/w%40rdQ9z@127.0.0.1`): SQLAlchemy's parser ends a
password at its first `@`, so the driver was handed `verylongsecretpart` as the host, looked it up and printed it.
Those commands run under a sitecustomize (`recorder`) that records every name lookup the process asks for
(`socket.getaddrinfo` and the `host` libpq is given: libpq resolves in C, beyond Python's socket module), and every
piece of the password is searched for in the console, the files and the lookups.
"""
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from lazylab import cli

PASSWORD = 'S3cr@t/pw:x%7e'    # an @, a /, a : and a % in it: percent-encoded in the URL (%40, %2F, %3A, %25)
TOKEN = 'T0kenQ9zW'
#: the issue's password, written unencoded but for one %40: each piece distinctive, so that a piece found anywhere
#: is a leak
RAW_PASSWORD = 'Sx7k@verylongsecretpart/w%40rdQ9z'
PIECES = ['Sx7k', 'verylongsecretpart', 'w%40rdQ9z', 'w@rdQ9z', 'rdQ9z', 'Sx7k@verylongsecretpart']

#: records each name lookup of the process (and of the trials it starts) as a JSON line in $LOOKUPS
SITECUSTOMIZE = """
import json, os, socket

def _note(kind, name):
    with open(os.environ['LOOKUPS'], 'a') as f:
        f.write(json.dumps([kind, str(name)]) + '\\n')

def _wrap(name):
    real = getattr(socket, name)
    def looked_up(host, *args, **kwargs):
        _note(name, host)
        return real(host, *args, **kwargs)
    setattr(socket, name, looked_up)

for _name in ('getaddrinfo', 'gethostbyname', 'gethostbyname_ex'):
    _wrap(_name)
try:
    import psycopg2
except ImportError:
    pass
else:  # libpq resolves `host` (and reads `dsn`) in C: what it is given is what it looks up
    _connect = psycopg2.connect
    def _recorded_connect(dsn=None, connection_factory=None, cursor_factory=None, **kwargs):
        _note('libpq host', kwargs.get('host'))
        _note('libpq dsn', dsn)
        _note('libpq other', {k: v for k, v in kwargs.items() if k not in ('host', 'password')})
        return _connect(dsn, connection_factory, cursor_factory, **kwargs)
    psycopg2.connect = _recorded_connect
"""


def secret_url(plain_url: str) -> str:
    """`plain_url` (postgresql://USER@HOST:PORT/DB) with the password and a secret query parameter."""
    head, rest = plain_url.split('://', 1)
    user, host = rest.split('@', 1)
    return f'{head}://{user}:{urllib.parse.quote(PASSWORD, safe="")}@{host}?sslpassword={TOKEN}&connect_timeout=10'


def _as_admin(port: int, *statements: tuple) -> list:
    """Run SQL statements (each (sql, args)) as the server's superuser; the last one's rows."""
    import psycopg2
    admin = psycopg2.connect(host='127.0.0.1', port=port, user='postgres', dbname='postgres')
    admin.autocommit = True
    try:
        with admin.cursor() as c:
            for sql, args in statements:
                c.execute(sql, args)
            return c.fetchall() if c.description else []
    finally:
        admin.close()


@pytest.fixture(scope='module')
def qauser_url(postgres_url):
    """postgresql://qauser@127.0.0.1:PORT/qadb on the module's server, where qauser logs in with PASSWORD only
    (scram-sha-256, ahead of the server's `trust` lines), and a wrong password is refused; rawuser likewise, on
    rawdb, with RAW_PASSWORD as the URL means it (its %40 an @)."""
    import psycopg2
    port = int(postgres_url.rsplit(':', 1)[1].split('/')[0])
    hba = Path(_as_admin(port, ('CREATE ROLE qauser LOGIN PASSWORD %s', (PASSWORD,)),
                         ('CREATE DATABASE qadb OWNER qauser', ()),
                         ('CREATE ROLE rawuser LOGIN PASSWORD %s', (urllib.parse.unquote(RAW_PASSWORD),)),
                         ('CREATE DATABASE rawdb OWNER rawuser', ()), ('SHOW hba_file', ()))[0][0])
    hba.write_text('host qadb qauser 127.0.0.1/32 scram-sha-256\nhost rawdb rawuser 127.0.0.1/32 scram-sha-256\n'
                   + hba.read_text())
    _as_admin(port, ('SELECT pg_reload_conf()', ()))
    deadline = time.monotonic() + 60
    while True:  # the postmaster reloads its rules on a signal: wait until they refuse a wrong password
        try:
            psycopg2.connect(host='127.0.0.1', port=port, user='rawuser', dbname='rawdb', password='wrong').close()
        except psycopg2.OperationalError as e:
            if 'password authentication failed' in str(e):
                break
        assert time.monotonic() < deadline, 'the server did not take the scram-sha-256 rules'
        time.sleep(0.1)
    return f'postgresql://qauser@127.0.0.1:{port}/qadb'


@pytest.fixture
def recorder(tmp_path):
    """(the environment that records name lookups, a function returning them as [kind, name] pairs)."""
    site = tmp_path / 'site'
    site.mkdir()
    (site / 'sitecustomize.py').write_text(SITECUSTOMIZE)
    log = tmp_path / 'lookups.jsonl'
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(site), root]), 'LOOKUPS': str(log)}
    return env, lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def lazylab_recorded(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'lazylab.cli', *args], env=env, capture_output=True, text=True,
                          timeout=240)


def forms() -> list[str]:
    """Every form of the secrets that must not appear (as written in the URL, decoded, and JSON-escaped)."""
    quoted = urllib.parse.quote(PASSWORD, safe='')
    return sorted({PASSWORD, quoted, TOKEN, json.dumps(PASSWORD)[1:-1], json.dumps(quoted)[1:-1],
                   quoted.lower(), shlex.quote(PASSWORD)})


def files_with_secrets(folder: Path) -> list[str]:
    found = []
    for p in sorted(folder.rglob('*')):
        if p.is_file():
            data = p.read_bytes()
            found += [f'{p.relative_to(folder)}: {s!r}' for s in forms() if s.encode() in data]
    return found


def test_a_sweep_on_a_database_with_a_password_writes_and_prints_no_secret(tools, tmp_path, qauser_url):
    url = secret_url(qauser_url)
    runs = tmp_path / 'runs'
    args = ['sweep', 'transformer', *tools.TINY, 'optimizer.learning_rate=3e-3,1e-2', f'runs_dir={runs}',
            '--storage', url, '--study', 'secret', '--prune', 'median', '--workers', '2']
    done = tools.lazylab(args)
    assert done.returncode == 0, done.stdout + done.stderr
    d = runs / 'transformer' / 'sweep-secret'
    assert len(list(d.glob('trial-*/labml'))) == 2 and len(list(d.rglob('*'))) > 20  # it wrote what a sweep does
    assert files_with_secrets(tmp_path) == []
    console = done.stdout + done.stderr
    assert [s for s in forms() if s in console] == []
    shown = qauser_url.replace('qauser@', 'qauser:***@', 1) + '?sslpassword=***&connect_timeout=10'
    assert f'({shown})' in done.stdout.splitlines()[0]
    record = yaml.safe_load((d / 'sweep.yaml').read_text())
    assert record['storage_url'] == shown
    assert record['argv'][record['argv'].index('--storage') + 1] == shown
    assert shlex.split(record['command'])[2:] == record['argv']
    # each trial's command line (its output.log's first line, what `ps` shows) holds no storage at all
    for log in d.glob('trial-*/output.log'):
        assert '--storage' not in log.read_text().splitlines()[0] and '127.0.0.1' not in log.read_text()
    # the study is in the database, as given
    import optuna

    from lazylab.sweeps.study import open_storage
    study = optuna.load_study(study_name='secret', storage=open_storage(url))
    assert [t.state.name for t in study.trials] == ['COMPLETE'] * 2

    # sweep.yaml hides the password, so a resume asks for it; given, it finishes (nothing left) without a word of it
    again = tools.lazylab(['sweep', '--resume', str(d)])
    assert again.returncode == 2 and 'give --storage URL' in again.stderr
    again = tools.lazylab(['sweep', '--resume', str(d), '--storage', url])
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f'nothing to do: every trial of the sweep in {d} has ended (2 completed)')
    assert [s for s in forms() if s in again.stdout + again.stderr] == [] and files_with_secrets(tmp_path) == []


def test_a_database_that_cannot_be_reached_is_one_line_without_the_password(tmp_path, capsys, ports):
    port = ports.free()  # nothing listens there
    url = f'postgresql://qa:{urllib.parse.quote(PASSWORD, safe="")}@127.0.0.1:{port}/db?password={TOKEN}'
    runs = tmp_path / 'runs'
    for extra in ([], ['--dry-run']):
        assert cli.main(['sweep', 'transformer', 'd_model=16,32', '--storage', url, f'runs_dir={runs}', *extra]) == 2
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f'lazylab: error: cannot open the study storage postgresql://qa:'
                                                   f'***@127.0.0.1:{port}/db?password=***: '), err
        assert [s for s in forms() if s in captured.err + captured.out] == [] and not runs.exists()


@pytest.mark.parametrize('storage', ['postgresql://qa:p@ss@127.0.0.1:1/db', 'postgresql://qa:S3c/ret@127.0.0.1:1/db',
                                     'postgresql://qa@127.0.0.1:1/db?password=PWsecret'],
                         ids=['an @ in the password', 'a / in the password', 'a query password'])
def test_the_dry_run_shows_the_storage_redacted(tmp_path, capsys, storage, monkeypatch):
    import lazylab.sweeps.study as study
    monkeypatch.setattr(study, 'check_storage', lambda url: None)  # (no server: the URL is only shown)
    runs = tmp_path / 'runs'
    assert cli.main(['sweep', 'transformer', 'd_model=16,32', '--storage', storage, f'runs_dir={runs}',
                     '--dry-run']) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith('storage: '))
    head = 'postgresql://qa:***@127.0.0.1:1/db' if '?' not in storage else 'postgresql://qa@127.0.0.1:1/db?password=***'
    assert line == f'storage: database {head}'
    assert all(s not in out for s in ('p@ss', 'S3c/ret', 'PWsecret', 'ss@127')) and not runs.exists()


def test_the_issues_unencoded_password_runs_a_sweep_and_a_wrong_one_is_one_line(tools, tmp_path, qauser_url,
                                                                                 recorder):
    """The password written as the issue did (an @ and a / unencoded, an encoded @) is read whole: the server
    checks it, so the sweep (its trials report to the study: a pruner) runs only with it; no piece of it in the
    console, a file or a lookup; a wrong one is the server's one line."""
    port = int(qauser_url.rsplit(':', 1)[1].split('/')[0])
    env, lookups = recorder
    runs = tmp_path / 'runs'
    url = f'postgresql://rawuser:{RAW_PASSWORD}@127.0.0.1:{port}/rawdb'
    done = lazylab_recorded(['sweep', 'transformer', *tools.TINY, 'optimizer.learning_rate=3e-3,1e-2',
                             f'runs_dir={runs}', '--storage', url, '--study', 'raw', '--prune', 'median'], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'(postgresql://rawuser:***@127.0.0.1:{port}/rawdb)' in done.stdout.splitlines()[0]
    assert len(list((runs / 'transformer' / 'sweep-raw').glob('trial-*/run.json'))) == 2
    found = [f'{p.relative_to(tmp_path)}: {s}' for p in runs.rglob('*') if p.is_file() for s in PIECES
             if s.encode() in p.read_bytes()]
    assert found == [] and [p for p in PIECES if p in done.stdout + done.stderr] == []

    wrong = url.replace('w%40rdQ9z', 'wrongQ9z')
    done = lazylab_recorded(['sweep', 'transformer', 'd_model=16,32', f'runs_dir={tmp_path / "none"}', '--storage',
                             wrong, '--dry-run'], env)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f'lazylab: error: cannot open the study storage postgresql://rawuser:***@127.0.0.1:{port}/rawdb: '
        f'(psycopg2.OperationalError) connection to server at "127.0.0.1", port {port} failed: FATAL:  '
        f'password authentication failed for user "rawuser"'], done.stdout + done.stderr
    assert [p for p in PIECES + ['wrongQ9z'] if p in done.stdout + done.stderr] == []
    # the sweep, its trials and the dry run asked libpq for the URL's host only; no piece of the password looked up
    hosts = [name for kind, name in lookups() if kind == 'libpq host']
    assert set(hosts) == {'127.0.0.1'} and len(hosts) >= 4  # the sweep, two trials, the dry run
    assert [x for x in lookups() if any(p in x[1] for p in PIECES)] == []


@pytest.mark.parametrize('dry_run', [False, True], ids=['sweep', 'dry run'])
def test_an_unencoded_at_and_slash_in_the_password_reach_no_output_file_or_lookup(tmp_path, ports, recorder,
                                                                                   dry_run):
    port = ports.free()  # nothing listens there
    url = f'postgresql://qauser:{RAW_PASSWORD}@127.0.0.1:{port}/qadb'
    env, lookups = recorder
    runs = tmp_path / 'runs'
    done = lazylab_recorded(['sweep', 'transformer', 'd_model=16,32', f'runs_dir={runs}', '--storage', url,
                             *(['--dry-run'] if dry_run else [])], env)
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith(f'lazylab: error: cannot open the study storage postgresql://qauser:'
                                               f'***@127.0.0.1:{port}/qadb: ') and f'port {port} failed' in err[0], err
    assert [p for p in PIECES if p in done.stdout + done.stderr] == [] and not runs.exists()
    # the one host looked up is the URL's; no piece of the password in any lookup
    assert [name for kind, name in lookups() if kind == 'libpq host'] and \
        {name for kind, name in lookups() if kind in ('libpq host', 'getaddrinfo')} == {'127.0.0.1'}
    assert [x for x in lookups() if any(p in x[1] for p in PIECES)] == []


@pytest.mark.parametrize('storage', ['postgresql://qauser@127.0.0.1:{port}/qadb?password=p@ssHostPiece/Tail9k',
                                     'postgresql://127.0.0.1:{port}/qadb?password=p@ssHostPiece/Tail9k',
                                     'postgresql://qauser:Pw?ssHostPiece@127.0.0.1:{port}/qadb'],
                         ids=['an @ in a query password', 'the same without a user', 'a ? in the password'])
def test_a_url_that_reads_two_ways_is_refused_before_any_lookup_without_a_word_of_it(tmp_path, ports, recorder,
                                                                                    storage):
    url = storage.format(port=ports.free())
    env, lookups = recorder
    runs = tmp_path / 'runs'
    for extra in ([], ['--dry-run']):
        done = lazylab_recorded(['sweep', 'transformer', 'd_model=16,32', f'runs_dir={runs}', '--storage', url,
                                 *extra], env)
        assert done.returncode == 2 and done.stdout == '', done.stdout + done.stderr
        assert done.stderr.splitlines() == [
            "lazylab: error: --storage: the database URL has a '?' before its last '@', so it reads two ways (is "
            "that '@' the password's or a query value's?); percent-encode the password and the query values (@ → "
            "%40, / → %2F, ? → %3F, : → %3A, % → %25: urllib.parse.quote(value, safe=''))"]
        assert not runs.exists()
    assert [x for x in lookups() if x[0].startswith('libpq') or 'HostPiece' in x[1] or 'ssHost' in x[1]] == []
