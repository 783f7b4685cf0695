"""`lazylab dashboard`'s studies (lazylab/dashboard/studies.py): the sweeps under --runs-dir served by optuna-dashboard
on the next port.

- In this process: SweepStudies over journal files written here with Optuna (and a SQLite database a sweep.yaml
  names): every study listed once with ids that map back, writes forwarded, a sweep that cannot be opened reported
  once with its password hidden, a sweep whose journal appears later picked up, labml_url from the run's run.json.
- End to end: `lazylab dashboard` started on loopback before a real `lazylab sweep` (two 4-step trials); the study
  appears without a restart, its page and its API answer, and each trial's user attrs carry its run directory, its
  status and its page on the labml dashboard; with --token the studies need it too.
- The studies' server in this process (issue 34): its static files without Accept-Encoding, every change but a
  note refused with 403 and the reason, a client's mistakes answered 4xx with one line of JSON (never 500), the
  token and the body limit. (The chunked body limit and the head's deadline of both ports: test_guard.py.)
"""
import gzip
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.client import HTTPConnection
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from lazylab.dashboard.studies import SLOTS, StudiesServer, SweepStudies, find_sweeps, sweep_storage

REPO = Path(__file__).resolve().parents[2]
TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'max_minutes=0',
        'max_steps=4', 'valid_interval=2', 'valid_batches=1', 'final_valid_batches=1', 'log_interval=2',
        'sample_tokens=4', 'device=cpu']
LR = optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _sweep(sweep_dir: Path, name: str, values: list[float], storage_url=None, uuid=None) -> Path:
    """A sweep folder as `lazylab sweep` leaves one: sweep.yaml and a study with a finished trial per value, each
    naming its run directory (trial-NNNN, with a run.json holding `uuid` when given)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    url = storage_url or str(sweep_dir / 'study.journal')
    storage = JournalStorage(JournalFileBackend(url)) if '://' not in url else url
    study = optuna.create_study(storage=storage, study_name=name)
    for i, value in enumerate(values):
        trial = study.ask({'lr': LR})
        run_dir = sweep_dir / f'trial-{i:04d}'
        run_dir.mkdir()
        if uuid is not None:
            (run_dir / 'run.json').write_text(json.dumps({'uuid': f'{uuid}{i}'}))
        trial.set_user_attr('run_dir', str(run_dir))
        trial.set_user_attr('status', 'completed')
        study.tell(trial, value)
    (sweep_dir / 'sweep.yaml').write_text(f'study: {name}\nstorage_url: {json.dumps(storage_url)}\n')
    return sweep_dir


def test_every_sweep_is_one_study_with_ids_that_map_back_and_writes_that_reach_its_storage(tmp_path):
    runs = tmp_path / 'runs'
    a = _sweep(runs / 'transformer' / 'sweep-a', 'sweep-a', [1.5, 1.25], uuid='u')
    b = _sweep(runs / 'deep' / 'er' / 'feedback' / 'sweep-b', 'sweep-b', [2.0],
               storage_url=f'sqlite:///{tmp_path / "b.db"}')
    assert find_sweeps(runs) == sorted([a, b]) and sweep_storage(a) == str(a / 'study.journal')
    studies = SweepStudies(runs, labml_url='http://127.0.0.1:5005/')
    listed = {s.study_name: s._study_id for s in studies.get_all_studies()}
    assert sorted(listed) == ['sweep-a', 'sweep-b'] and len(set(listed.values())) == 2
    assert all(gid % SLOTS < 2 for gid in listed.values())
    trials = studies.get_all_trials(listed['sweep-a'])
    assert [t.value for t in trials] == [1.5, 1.25] and [t.number for t in trials] == [0, 1]
    assert trials[1].user_attrs == {'run_dir': str(a / 'trial-0001'), 'status': 'completed',
                                    'labml_url': 'http://127.0.0.1:5005/run/u1'}
    assert studies.get_trial(trials[1]._trial_id).value == 1.25  # a trial id maps back to its own storage
    assert studies.get_trial_id_from_study_id_trial_number(listed['sweep-a'], 1) == trials[1]._trial_id
    b_trial, = studies.get_all_trials(listed['sweep-b'])
    assert b_trial.value == 2.0 and 'labml_url' not in b_trial.user_attrs  # no run.json: no link
    assert studies.get_study_name_from_id(listed['sweep-b']) == 'sweep-b'
    assert studies.get_study_id_from_name('sweep-b') == listed['sweep-b']
    # a note written from the page (optuna-dashboard keeps notes in study system attrs) lands in sweep-a's journal
    studies.set_study_system_attr(listed['sweep-a'], 'dashboard:note', 'tried on loopback')
    own = JournalStorage(JournalFileBackend(str(a / 'study.journal')))
    assert own.get_study_system_attrs(own.get_study_id_from_name('sweep-a')) == {'dashboard:note': 'tried on loopback'}
    with pytest.raises(NotImplementedError):
        studies.delete_study(listed['sweep-a'])


def test_a_sweep_started_later_is_found_and_one_that_cannot_be_opened_is_reported_once(tmp_path):
    runs = tmp_path / 'runs'
    lines = []
    studies = SweepStudies(runs, rescan_s=0, warn=lines.append)
    assert studies.get_all_studies() == []  # no runs folder yet
    late = runs / 'transformer' / 'sweep-late'
    late.mkdir(parents=True)
    (late / 'sweep.yaml').write_text('study: sweep-late\nstorage_url: null\n')  # its journal is not there yet
    hidden = runs / 'transformer' / 'sweep-db'
    hidden.mkdir()
    (hidden / 'sweep.yaml').write_text('study: x\nstorage_url: postgresql://lab:***@127.0.0.1:9/db\n')
    assert studies.get_all_studies() == []
    assert studies.get_all_studies() == []
    assert lines == [f'lazylab: warning: studies: the sweep {hidden} is not served: {hidden / "sweep.yaml"} hides '
                     f'the password of its storage postgresql://lab:***@127.0.0.1:9/db']
    _sweep(late, 'sweep-late', [3.0])
    assert [s.study_name for s in studies.get_all_studies()] == ['sweep-late']
    assert len(lines) == 1


def _env():
    return dict(os.environ, LABML_DISABLE_GIT='1', PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1',
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get('PYTHONPATH', '')]))


def _get(url: str, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.status, r.headers.get('Content-Type', ''), r.read()


def _dashboard(tmp_path, ports, *flags):
    """`lazylab dashboard` on two free loopback ports over tmp_path/runs; (process, labml URL, studies URL, the
    lines it printed first) once the studies answer."""
    port, studies_port = ports.free(), ports.free()
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab', 'dashboard', '--port', str(port), '--studies-port',
                             str(studies_port), '--store', str(tmp_path / 'store'), '--runs-dir', 'runs', *flags],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ports.wait(port, proc, 'the dashboard')
    ports.wait(studies_port, proc, 'the studies')
    head = [proc.stdout.readline().rstrip('\n') for _ in range(3)]
    return proc, f'http://127.0.0.1:{port}', f'http://127.0.0.1:{studies_port}', head


def _stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def test_a_real_sweep_started_after_the_dashboard_appears_with_its_page_api_and_links(tmp_path, ports):
    _sweep(tmp_path / 'runs' / 'transformer' / 'sweep-before', 'sweep-before', [1.0])
    proc, labml_url, studies_url, head = _dashboard(tmp_path, ports)
    try:
        assert head[1] == (f'studies: {studies_url}  (optuna-dashboard: 1 sweep under runs; sweeps started later '
                           f'appear too)'), head
        _, _, body = _get(f'{studies_url}/api/studies')
        assert [s['study_name'] for s in json.loads(body)['study_summaries']] == ['sweep-before']
        sweep = subprocess.run([sys.executable, '-m', 'lazylab', 'sweep', 'transformer',
                                'optimizer.learning_rate=0.001,0.003', *TINY, 'runs_dir=runs', '--study', 'lr'],
                               cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
        assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
        deadline = time.monotonic() + 30  # the runs folder is searched again at most every 2 s
        while True:
            _, kind, body = _get(f'{studies_url}/api/studies')
            names = {s['study_name']: s['study_id'] for s in json.loads(body)['study_summaries']}
            if 'lr' in names or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert sorted(names) == ['lr', 'sweep-before'] and kind.startswith('application/json')
        status, kind, page = _get(f'{studies_url}/dashboard/studies/{names["lr"]}')
        assert status == 200 and kind.startswith('text/html') and b'<div id="dashboard">' in page
        _, _, body = _get(f'{studies_url}/api/studies/{names["lr"]}')
        trials = json.loads(body)['trials']
        assert [t['state'] for t in trials] == ['Complete', 'Complete']
        sweep_dir = tmp_path / 'runs' / 'transformer' / 'sweep-lr'
        for t in trials:
            attrs = {a['key']: a['value'] for a in t['user_attrs']}
            run_dir = sweep_dir / f'trial-{t["number"]:04d}'
            uuid = json.loads((run_dir / 'run.json').read_text())['uuid']
            assert attrs['run_dir'] == str(run_dir.resolve()) and attrs['status'] == 'completed'
            assert attrs['labml_url'] == f'{labml_url}/run/{uuid}'
            value = json.loads((run_dir / 'trial.json').read_text())['value']
            assert t['values'] == [value]
    finally:
        code = _stop(proc)
    assert code == 0


def test_with_a_token_the_studies_need_it_too(tmp_path, ports):
    token = 'T' * 20
    proc, _, studies_url, _ = _dashboard(tmp_path, ports, '--token', token)
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(f'{studies_url}/api/studies')
        assert e.value.code == 401 and b'needs its token' in e.value.read()
        status, _, body = _get(f'{studies_url}/api/studies', {'X-Lazylab-Token': token})
        assert status == 200 and json.loads(body) == {'study_summaries': []}
        opener = urllib.request.build_opener(type('NoRedirect', (urllib.request.HTTPRedirectHandler,),
                                                  {'redirect_request': lambda *a, **k: None}))
        with pytest.raises(urllib.error.HTTPError) as e:
            opener.open(f'{studies_url}/api/studies?token={token}', timeout=30)
        assert e.value.code == 303 and e.value.headers['Location'] == '/api/studies'
        assert e.value.headers['Set-Cookie'].startswith(f'lazylab_token={token};')
    finally:
        assert _stop(proc) == 0


# ------------------------------------------------------------------ the studies' server, in this process

@pytest.fixture
def studies(tmp_path, ports):
    """A StudiesServer (limit 1 MiB) over one sweep with two trials; yields (server, the study's id, its journal)."""
    sweep = _sweep(tmp_path / 'runs' / 'transformer' / 'sweep-a', 'sweep-a', [1.5, 1.25])
    server = StudiesServer(tmp_path / 'runs', '127.0.0.1', ports.free(), max_body_bytes=1 << 20)
    server.start()
    try:
        study_id, = [s._study_id for s in server.storage.get_all_studies()]
        yield server, study_id, sweep / 'study.journal'
    finally:
        server.stop()


def _ask(server, method: str, path: str, body=None, headers=None):
    """(status, content type, body) of one request, sent as given: no Accept-Encoding unless in `headers`; a body
    that is not bytes as JSON, as the page sends it."""
    connection = HTTPConnection('127.0.0.1', int(server.url.rsplit(':', 1)[1]), timeout=30)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        sent = {} if data is None else {'Content-Length': str(len(data))}
        if body is not None and not isinstance(body, bytes):
            sent['Content-Type'] = 'application/json'
        for name, value in {**sent, **(headers or {})}.items():
            connection.putheader(name, value)
        connection.endheaders(data)
        answer = connection.getresponse()
        return answer.status, answer.getheader('Content-Type', ''), answer.read()
    finally:
        connection.close()


def test_a_static_file_is_served_without_accept_encoding_and_gzipped_when_asked(studies):
    """Before: 500 (a KeyError on the missing header in optuna-dashboard's send_static)."""
    import optuna_dashboard
    public = Path(optuna_dashboard.__file__).parent / 'public'
    server, _, _ = studies
    status, kind, body = _ask(server, 'GET', '/static/bundle.js')
    assert (status, body) == (200, (public / 'bundle.js').read_bytes()) and 'javascript' in kind
    status, _, body = _ask(server, 'GET', '/static/bundle.js', headers={'Accept-Encoding': 'gzip'})
    assert status == 200 and gzip.decompress(body) == (public / 'bundle.js').read_bytes()
    status, _, body = _ask(server, 'GET', '/favicon.ico')
    assert (status, body[:4]) == (200, b'\x00\x00\x01\x00')  # an icon file, not its gzip
    status, kind, body = _ask(server, 'GET', '/static/no-such-file.js')
    assert (status, kind, json.loads(body)) == (404, 'application/json', {'reason': 'File does not exist.'})


def _journal_study(journal: Path):
    own = JournalStorage(JournalFileBackend(str(journal)))
    study_id = own.get_study_id_from_name('sweep-a')
    return own, study_id


@pytest.mark.parametrize('method, path, body, reason', [
    ('DELETE', '/api/studies/{study}', None,
     "a sweep's study is its record: it goes with its sweep folder, not from this dashboard"),
    ('POST', '/api/studies', {'study_name': 'new', 'directions': ['minimize']},
     'a study is started by lazylab sweep, not from this dashboard'),
    ('POST', '/api/studies/{study}/rename', {'study_name': 'renamed'}, 'READ_ONLY'),
    ('POST', '/api/trials/{trial}/tell', {'state': 'Fail'}, 'READ_ONLY'),
    ('POST', '/api/trials/{trial}/user-attrs', {'user_attrs': {'status': 'x'}}, 'READ_ONLY'),
    ('POST', '/api/studies/{study}/{trial}/skip', None, 'READ_ONLY'),
    ('DELETE', '/api/artifacts/{study}/{trial}/0a', None, 'READ_ONLY'),
    ('POST', '/incompatible-rdb-schema', None, 'READ_ONLY'),
    ('PATCH', '/api/studies/{study}', {}, 'READ_ONLY'),
], ids=['delete', 'create', 'rename', 'tell', 'user-attrs', 'skip', 'artifact', 'migrate', 'patch'])
def test_every_change_but_a_note_is_refused_with_403_and_its_reason(studies, method, path, body, reason):
    """The journal is the sweep's record (sweep --resume continues from it; run_dir and status name the runs): the
    page may not change it. Before: DELETE /api/studies/0 was a 500 with the reason in the log only."""
    from lazylab.dashboard.studies import READ_ONLY
    server, study_id, journal = studies
    own, local = _journal_study(journal)
    before = [(t.state, t.values, t.user_attrs) for t in own.get_all_trials(local)]
    trial_id = server.storage.get_all_trials(study_id)[0]._trial_id
    status, kind, answer = _ask(server, method, path.format(study=study_id, trial=trial_id), body)
    assert (status, kind) == (403, 'application/json') and b'\n' not in answer
    assert json.loads(answer) == {'reason': READ_ONLY if reason == 'READ_ONLY' else reason}
    own, local = _journal_study(journal)
    assert [s.study_name for s in own.get_all_studies()] == ['sweep-a']
    assert [(t.state, t.values, t.user_attrs) for t in own.get_all_trials(local)] == before


def test_notes_on_a_study_and_a_trial_are_kept_in_the_studys_journal(studies):
    server, study_id, journal = studies
    trial_id = server.storage.get_all_trials(study_id)[1]._trial_id
    status, _, _ = _ask(server, 'PUT', f'/api/studies/{study_id}/note', {'version': 1, 'body': 'tried on loopback'})
    assert status == 204
    status, _, _ = _ask(server, 'PUT', f'/api/studies/{study_id}/{trial_id}/note', {'version': 1, 'body': 'the best'})
    assert status == 204
    own, local = _journal_study(journal)
    assert {'tried on loopback', 'the best'} <= set(own.get_study_system_attrs(local).values())
    status, _, body = _ask(server, 'GET', f'/api/studies/{study_id}')
    detail = json.loads(body)
    assert status == 200 and detail['note'] == {'version': 1, 'body': 'tried on loopback'}
    assert detail['trials'][1]['note'] == {'version': 1, 'body': 'the best'}


@pytest.mark.parametrize('method, path, body, status', [
    ('GET', '/no-such-page', None, 404),
    ('GET', '/api/studies/999', None, 404),
    ('GET', '/api/studies/abc', None, 404),
    ('GET', '/api/studies/{study}/plot/no-such-plot', None, 404),
    ('GET', '/csv/999', None, 404),
    ('OPTIONS', '/api/studies', None, 405),
    ('GET', '/api/studies/{study}?after=abc', None, 400),
    ('GET', '/api/studies/{study}?after=-1', None, 400),
    ('GET', '/artifacts/{study}/0a', None, 400),  # no artifact store: the app's answer was text
    ('PUT', '/api/studies/{study}/note', b'{"version": ', 415),  # not said to be JSON
    ('PUT', '/api/studies/{study}/note', b'{"version": ', 400),
    ('PUT', '/api/studies/{study}/note', ['a list'], 400),
    ('PUT', '/api/studies/{study}/note', {'version': '1', 'body': 'x'}, 400),
    ('PUT', '/api/studies/{study}/note', {'body': 'no version'}, 400),
    ('PUT', '/api/studies/{study}/note', {'version': 0, 'body': 'an old version'}, 409),
    ('PUT', '/api/studies/999/note', {'version': 1, 'body': 'x'}, 404),
    ('PUT', '/api/studies/{study}/999/note', {'version': 1, 'body': 'x'}, 404),
    ('POST', '/api/studies', b'x', 413),  # the guard's (1 MiB here), by a Content-Length of 2 MiB (see below)
], ids=['no-route', 'no-study', 'not-an-id', 'no-plot', 'no-csv', 'options', 'after-abc', 'after-negative',
        'artifact-text', 'note-not-json', 'note-malformed', 'note-list', 'note-version-text', 'note-no-version',
        'note-old-version', 'note-no-study', 'note-no-trial', 'over-the-limit'])
def test_a_clients_mistake_is_a_4xx_with_one_line_of_json(studies, method, path, body, status):
    """Before: 500 for after=abc and for a note's body that was not a JSON object (or not sent as JSON), and HTML
    or text pages for bottle's and the artifact routes' 4xx."""
    server, study_id, _ = studies
    trial_id = server.storage.get_all_trials(study_id)[0]._trial_id
    headers = {'Content-Type': 'application/json'} if body == b'{"version": ' and status == 400 else {}
    if status == 413:  # announced, not sent: the guard answers before the body, and a client still sending it
        headers = {'Content-Length': str(2 << 20)}  # could meet the closed connection first (a load-dependent race)
    got, kind, answer = _ask(server, method, path.format(study=study_id, trial=trial_id), body, headers)
    assert (got, kind.split(';')[0]) == (status, 'application/json') and b'\n' not in answer.strip(), answer[:300]
    assert isinstance(json.loads(answer)['reason'], str)


def test_the_studies_guard_refuses_a_missing_token_and_a_body_over_the_limit(tmp_path, ports):
    """The labml port's guard, with {"reason": …} (optuna-dashboard's key)."""
    token = 's' * 16
    server = StudiesServer(tmp_path / 'runs', '127.0.0.1', ports.free(), max_body_bytes=10, token=token)
    server.start()
    try:
        status, _, body = _ask(server, 'GET', '/api/studies')
        assert status == 401 and 'needs its token' in json.loads(body)['reason']
        assert _ask(server, 'GET', '/api/studies', headers={'X-Lazylab-Token': 's' * 15 + 't'})[0] == 401
        assert _ask(server, 'GET', '/api/studies', headers={'X-Lazylab-Token': token})[:1] == (200,)
        assert _ask(server, 'GET', '/api/studies', headers={'Cookie': f'lazylab_token={token}'})[0] == 200
        status, _, body = _ask(server, 'PUT', '/api/studies/0/note', b'x' * 11, headers={'X-Lazylab-Token': token})
        assert (status, json.loads(body)) == (413, {'reason': 'request body over the limit of 10 bytes (lazylab '
                                                              'dashboard --max-body-mb)'})
    finally:
        server.stop()
