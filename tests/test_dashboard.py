"""`lazylab dashboard` end to end: the real labml app over a file store, a real run streamed to it, numbers checked.

Needs the `dashboard` extra (labml-app, labml-db); CI installs it, so a missing extra fails here rather than skipping.
"""
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from lazylab import dashboard

REPO = Path(__file__).resolve().parents[1]
STEPS = 30

# Stand-in for `lazylab train` until the trainer lands: labml's tracker driven the way the trainer drives it.
_TRAIN_SCRIPT = r'''
import json, math, sys
from pathlib import Path
from labml import experiment, tracker
from labml.internal.lab import lab_singleton
from lazylab import dashboard

url, run_root, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
run_root.mkdir(parents=True, exist_ok=True)
lab_singleton().set_configurations({'path': str(run_root), 'experiments_path': '.'})
writers = {'screen', 'file'}
if url and dashboard.configure_app_writer(url):
    writers.add('app')
experiment.create(name='tiny', writers=writers, python_file=str(run_root / 'tiny.py'))
experiment.configs({'d_model': 16, 'heads': 2, 'model': 'transformer', 'optimizer.learning_rate': 0.003})
with experiment.start():
    with open(run_root / 'metrics.jsonl', 'w') as f:
        for step in range(1, steps + 1):
            loss = 4.17 * math.exp(-step / 25) + 0.01 * math.sin(step)
            tracker.save(step, {'loss.train': loss, 'accuracy.train': step / steps})
            f.write(json.dumps({'step': step, 'loss.train': loss}) + '\n')
    print('sample: To be, or not to be')
print('RUN_UUID', experiment.get_uuid())
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _env(tmp_path: Path = None):
    env = dict(os.environ, LABML_DISABLE_GIT='1', PYTHONUNBUFFERED='1')
    if tmp_path is not None:
        # labml opens a web browser on the run's page unless told not to; this "browser" would leave a mark.
        browser = tmp_path / 'fake-browser'
        browser.write_text(f'#!/bin/sh\ntouch {tmp_path / "browser-opened"}\n')
        browser.chmod(0o755)
        env['BROWSER'] = str(browser)

    env['PYTHONPATH'] = os.pathsep.join([str(REPO), env.get('PYTHONPATH', '')])
    return env


def _train(tmp_path: Path, url: str, steps: int = STEPS):
    """Train a tiny run with `dashboard=url` ('' for none); returns (run dir, labml run uuid, stderr, seconds)."""
    script = tmp_path / 'train_tiny.py'
    script.write_text(_TRAIN_SCRIPT)
    run_root = tmp_path / ('runs_' + (url.rsplit(':', 1)[-1] if url else 'none'))
    start = time.monotonic()
    res = subprocess.run([sys.executable, str(script), url, str(run_root), str(steps)], cwd=tmp_path,
                         env=_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - start
    assert res.returncode == 0, res.stderr[-3000:]
    uuid = [line.split()[1] for line in res.stdout.splitlines() if line.startswith('RUN_UUID')][0]
    return run_root, uuid, res.stderr, seconds


def _metrics_jsonl(run_dir: Path, key: str):
    rows = [json.loads(line) for line in (run_dir / 'metrics.jsonl').read_text().splitlines() if line.strip()]
    rows = [r for r in rows if key in r]
    return np.array([r['step'] for r in rows], dtype=np.float64), np.array([r[key] for r in rows])


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, json.loads(r.read())


def _post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())


def _f32(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype='<f4')


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(('127.0.0.1', port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def server(tmp_path):
    """`lazylab dashboard` on a free loopback port over a temporary store; stopped with SIGTERM afterwards."""
    port = _free_port()
    store = tmp_path / 'store'
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.dashboard', '--port', str(port), '--store', str(store)],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _port_open(port):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, 'dashboard did not start within 60 s'
            time.sleep(0.2)
        yield f'http://127.0.0.1:{port}', proc, store
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, f'dashboard exited with {proc.returncode}: {proc.stdout.read()[-2000:]}'
    assert not _port_open(port), 'the dashboard port is still open after SIGTERM'


def test_run_streams_configs_metrics_and_sample_to_dashboard(server, tmp_path):
    url, proc, store = server
    run_root, uuid, _, _ = _train(tmp_path, url)
    run_dir = run_root

    status, run = _get(f'{url}/api/v1/run/{uuid}')
    assert status == 200
    assert run['name'] == 'tiny'
    configs = {c['key']: c['value'] for c in run['configs']}
    assert configs['d_model'] == 16 and configs['heads'] == 2 and configs['model'] == 'transformer'

    status, metrics = _post(f'{url}/api/v1/metrics/{uuid}', {'get_all': True, 'indicators': [], 'current_uuid': ''})
    assert status == 200
    series = {s['name']: s for s in metrics['series']}
    want_steps, want_loss = _metrics_jsonl(run_dir, 'loss.train')
    assert len(want_steps) == STEPS
    np.testing.assert_array_equal(_f32(series['loss.train']['step']), want_steps)
    np.testing.assert_allclose(_f32(series['loss.train']['value']), want_loss, rtol=0, atol=1e-6)

    _, stdout = _post(f'{url}/api/v1/logs/stdout/{uuid}', {'page': -2})
    assert 'To be, or not to be' in ''.join(stdout['pages'].values())

    # The run is listed on the home page (the local user's project) and lives in the file store.
    _, runs = _get(f'{url}/api/v1/runs/null')
    assert [r['run_uuid'] for r in runs['runs']] == [uuid]
    assert (store / 'indexes' / 'RunIndex.yaml').read_text().count(uuid) == 1
    assert run['is_claimed'] and run['is_project_run']  # not "will be deleted in 12 hours"
    assert not (tmp_path / 'browser-opened').exists()


def test_closed_port_warns_once_and_trains_normally(tmp_path):
    closed = f'http://127.0.0.1:{_free_port()}'
    root_none, _, err_none, t_none = _train(tmp_path, '', steps=20)
    root_closed, _, err_closed, t_closed = _train(tmp_path, closed, steps=20)
    warnings = [line for line in err_closed.splitlines() if 'lazylab: warning' in line]
    assert warnings == [f'lazylab: warning: labml dashboard at {closed} is not reachable; training without it '
                        f'(start one with: lazylab dashboard --port {closed.rsplit(":", 1)[1]})']
    assert 'Retrying' not in err_closed
    # Same local record; and no waiting on the dead server (labml alone would retry forever).
    assert _metrics_jsonl(root_closed, 'loss.train')[1].tolist() == _metrics_jsonl(root_none, 'loss.train')[1].tolist()
    assert t_closed < t_none + 10, (t_closed, t_none)


def test_track_url():
    assert dashboard.track_url('http://127.0.0.1:5005') == 'http://127.0.0.1:5005/api/v1/default'
    assert dashboard.track_url('http://localhost:5005/') == 'http://localhost:5005/api/v1/default'
    assert dashboard.track_url('https://x.org/api/v1/TOKEN/') == 'https://x.org/api/v1/TOKEN'
    for bad in ['127.0.0.1:5005', 'ftp://h:1', 'http://h:1/?a=b']:
        with pytest.raises(ValueError, match='dashboard'):
            dashboard.track_url(bad)


def test_configured_app_url_reads_nearest_labml_yaml(tmp_path, monkeypatch):
    monkeypatch.delenv('labml_app_url', raising=False)
    (tmp_path / '.labml.yaml').write_text('app_url: http://127.0.0.1:7777/api/v1/default\n')
    sub = tmp_path / 'a' / 'b'
    sub.mkdir(parents=True)
    assert dashboard.configured_app_url(sub) == 'http://127.0.0.1:7777/api/v1/default'
    monkeypatch.setenv('labml_app_url', 'http://127.0.0.1:8888/api/v1/x')
    assert dashboard.configured_app_url(sub) == 'http://127.0.0.1:8888/api/v1/x'


def test_missing_extra_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, 'labml_app', None)  # makes `import labml_app` raise ImportError
    assert dashboard.main(['--port', str(_free_port())]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'lazylab[dashboard]'" in err[0]


def test_app_writer_returns_labml_url_only_when_reachable(capsys):
    with socket.socket() as listener:
        listener.bind(('127.0.0.1', 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert dashboard.app_writer(f'http://127.0.0.1:{port}') == f'http://127.0.0.1:{port}/api/v1/default'
    assert capsys.readouterr().err == ''
    assert dashboard.app_writer(f'http://127.0.0.1:{port}') is None  # the listener is closed now
    assert capsys.readouterr().err.count('lazylab: warning') == 1


def test_wait_for_app_upload_gives_up_on_a_hung_server(capsys):
    """A finished run whose last upload never completes must not keep the process alive: the wait is bounded."""
    import threading
    import labml.internal.app as labml_client

    class HungUpload(labml_client._AppTrackThread):
        def _process(self, packets):  # a server that accepted the connection and never answers
            threading.Event().wait()

    thread = HungUpload('http://127.0.0.1:9/api/v1/default/track?', timeout_seconds=1, daemon=True)
    thread.push_data_source(labml_client.SimpleAppTrackDataSource({'time': 0.0}))
    thread.start()
    thread.stop()  # what labml does when the run finishes
    assert dashboard.wait_for_app_upload(timeout=0.5, threads=[thread]) is False
    assert 'gave up sending the last metrics' in capsys.readouterr().err
    assert dashboard.wait_for_app_upload(timeout=0.5, threads=[]) is True
