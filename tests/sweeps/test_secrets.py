"""A database password (in the URL's userinfo or a query parameter) never reaches a file or the console.

A real sweep on a throw-away PostgreSQL server (conftest's `postgres_url`; its server trusts loopback connections,
so any password is accepted) with a pruner, so that the storage URL travels to the trials too; then every file the
sweep wrote — sweep.yaml, trial.json, run.json, configs.yaml, output.log, metrics.jsonl, the labml/ folders — and
everything it printed are searched for the secrets, in every form they could take.
"""
import json
import shlex
import urllib.parse
from pathlib import Path

import pytest
import yaml

from lazylab import cli

PASSWORD = 'S3cr@t/pw:x'    # an @, a / and a : in it: percent-encoded in the URL, as SQLAlchemy needs
TOKEN = 'T0kenQ9zW'


def secret_url(plain_url: str) -> str:
    """`plain_url` (postgresql://postgres@HOST:PORT/DB) with the password and a secret query parameter."""
    head, rest = plain_url.split('://', 1)
    user, host = rest.split('@', 1)
    return f'{head}://{user}:{urllib.parse.quote(PASSWORD, safe="")}@{host}?sslpassword={TOKEN}&connect_timeout=10'


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


def test_a_sweep_on_a_database_with_a_password_writes_and_prints_no_secret(tools, tmp_path, postgres_url):
    url = secret_url(postgres_url)
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
    shown = postgres_url.replace('postgres@', 'postgres:***@', 1) + '?sslpassword=***&connect_timeout=10'
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
