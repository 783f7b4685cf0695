"""`lazylab dashboard` end to end: the real labml app over a file store, a real run streamed to it, numbers checked;
a training run whose dashboard is not there; the web page served with local copies of its CDN files.

Needs the `dashboard` extra (labml-app, labml-db); CI installs it, so a missing extra fails here rather than skipping.
"""
import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from lazylab import dashboard

REPO = Path(__file__).resolve().parents[2]
STEPS = 30
# A tiny model on the first 20,000 characters of Tiny Shakespeare: seconds per run, a loss.train record every step.
TINY = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=32', 'batch_size=4', 'log_interval=1',
        'valid_batches=2', 'sample_tokens=40', 'device=cpu', 'seed=1', 'optimizer.optimizer=Adam']


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
    """`lazylab train transformer` with `dashboard=url` ('' for none); returns (run dir, labml uuid, stderr,
    seconds)."""
    text = tmp_path / 'tiny.txt'
    if not text.exists():
        text.write_text((REPO / 'lazylab' / 'data' / 'tiny_shakespeare.txt').read_text(encoding='utf-8')[:20_000],
                        encoding='utf-8')
    runs = tmp_path / ('runs_' + (url.rsplit(':', 1)[-1] if url else 'none'))
    start = time.monotonic()
    res = subprocess.run([sys.executable, '-m', 'lazylab.cli', 'train', 'transformer', f'max_steps={steps}', *TINY,
                          f'text={text}', f'runs_dir={runs}', f'dashboard={url}'],
                         cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - start
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir, = (runs / 'transformer').iterdir()
    return run_dir, json.loads((run_dir / 'run.json').read_text())['uuid'], res.stderr, seconds


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


def _start_dashboard(ports, tmp_path: Path, store: Path, *flags: str):
    """`lazylab dashboard` on a free loopback port over `store`; returns (url, process, port) once it accepts
    (`ports`: the fixture of tests/conftest.py)."""
    port = ports.free()
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', 'dashboard', '--port', str(port),
                             '--studies-port', str(ports.free()), '--store', str(store), *flags],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ports.wait(port, proc, 'the dashboard')
    return f'http://127.0.0.1:{port}', proc, port


def _stop_dashboard(proc: subprocess.Popen, port: int, sig=signal.SIGTERM) -> int:
    """Send `sig` (SIGTERM, or SIGINT as Ctrl-C does) and wait; the process is gone afterwards either way."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@pytest.fixture
def server(tmp_path, ports):
    """A dashboard over a temporary store; stopped with SIGTERM afterwards, which must end it cleanly (exit 0)."""
    store = tmp_path / 'store'
    url, proc, port = _start_dashboard(ports, tmp_path, store)
    try:
        yield url, proc, store
    finally:
        returncode = _stop_dashboard(proc, port)
    assert returncode == 0, f'dashboard exited with {returncode}: {proc.stdout.read()[-2000:]}'
    assert not ports.is_open(port), 'the dashboard port is still open after it stopped'


def test_run_streams_configs_metrics_and_sample_to_dashboard(server, tmp_path, ports):
    url, proc, store = server
    run_dir, uuid, _, _ = _train(tmp_path, url)

    status, run = _get(f'{url}/api/v1/run/{uuid}')
    assert status == 200
    assert run['name'] == 'transformer'
    configs = {c['key']: c['value'] for c in run['configs']}
    assert (configs['d_model'], configs['heads'], configs['n_layers'], configs['max_steps']) == (16, 2, 1, STEPS)
    assert configs['model'] == 'transformer' and configs['optimizer.optimizer'] == 'Adam'

    status, metrics = _post(f'{url}/api/v1/metrics/{uuid}', {'get_all': True, 'indicators': [], 'current_uuid': ''})
    assert status == 200
    series = {s['name']: s for s in metrics['series']}
    for key in ('loss.train', 'accuracy.train', 'loss.valid'):
        want_steps, want_values = _metrics_jsonl(run_dir, key)
        np.testing.assert_array_equal(_f32(series[key]['step']), want_steps, err_msg=key)
        np.testing.assert_allclose(_f32(series[key]['value']), want_values, rtol=0, atol=1e-6, err_msg=key)
    assert len(_metrics_jsonl(run_dir, 'loss.train')[0]) == STEPS

    # The sampled text arrives with the run's standard output.
    _, stdout = _post(f'{url}/api/v1/logs/stdout/{uuid}', {'page': -2})
    last_sample = (run_dir / 'samples.txt').read_text(encoding='utf-8').split('\n--- step')[-1].split('\n', 1)[1]
    assert last_sample.strip().replace('\n', ' ⏎ ') in ''.join(stdout['pages'].values())

    # The run is listed on the home page, claimed by the local user, and lives in the file store.
    _, runs = _get(f'{url}/api/v1/runs/null')
    assert [r['run_uuid'] for r in runs['runs']] == [uuid]
    assert run['is_claimed'] and run['is_project_run']  # not "will be deleted in 12 hours"
    assert (store / 'indexes' / 'RunIndex.yaml').read_text().count(uuid) == 1
    assert not (tmp_path / 'browser-opened').exists()

    # The store outlives the server: a second dashboard on it (stopped with Ctrl-C's SIGINT) serves the same run.
    url2, proc2, port2 = _start_dashboard(ports, tmp_path, store)
    try:
        assert _get(f'{url2}/api/v1/run/{uuid}')[1]['configs'] == run['configs']
        _, metrics2 = _post(f'{url2}/api/v1/metrics/{uuid}', {'get_all': True, 'indicators': [], 'current_uuid': ''})
        assert {s['name']: s['value'] for s in metrics2['series']} == {k: s['value'] for k, s in series.items()}
    finally:
        assert _stop_dashboard(proc2, port2, signal.SIGINT) == 0
    assert not ports.is_open(port2)


def test_closed_port_warns_once_and_trains_normally(tmp_path, ports):
    closed = f'http://127.0.0.1:{ports.free()}'
    dir_none, _, err_none, t_none = _train(tmp_path, '', steps=20)
    dir_closed, _, err_closed, t_closed = _train(tmp_path, closed, steps=20)
    warnings = [line for line in err_closed.splitlines() if 'warning' in line.lower()]
    assert warnings == [f'lazylab: warning: labml dashboard at {closed} is not reachable; training without it '
                        f'(start one with: lazylab dashboard --port {closed.rsplit(":", 1)[1]})']
    assert 'Retrying' not in err_closed
    # The same local record: the same files, and the same numbers in them (same seed, CPU).
    assert sorted(p.name for p in dir_closed.iterdir()) == sorted(p.name for p in dir_none.iterdir())
    for key in ('loss.train', 'accuracy.train', 'loss.valid'):
        assert _metrics_jsonl(dir_closed, key)[1].tolist() == _metrics_jsonl(dir_none, key)[1].tolist()
    assert (dir_closed / 'samples.txt').read_text() == (dir_none / 'samples.txt').read_text()
    # No waiting on the dead server: labml alone would retry every 10, 20, 30 ... seconds, forever. The bound is
    # loose (twice the plain run, plus 10 s) because CI machines are noisy; a retry loop would still break it.
    assert t_closed < 2 * t_none + 10, (t_closed, t_none)


def _get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode('utf-8')


def test_assets_folder_replaces_the_pages_cdn_files(tmp_path, ports):
    """`--assets DIR`: index.html loads d3, Bootstrap and Font Awesome from /vendor/ (DIR), without integrity
    hashes of the CDN's bytes, and /vendor/ serves DIR's files."""
    assets = tmp_path / 'assets'
    files = {'d3.v6.min.js': '/* local d3 */', 'bootstrap.min.css': '/* local bootstrap */',
             'fontawesome/css/all.css': '/* local font awesome */', 'fontawesome/webfonts/fa-solid-900.woff2': 'f'}
    for name, text in files.items():
        (assets / name).parent.mkdir(parents=True, exist_ok=True)
        (assets / name).write_text(text)
    url, proc, port = _start_dashboard(ports, tmp_path, tmp_path / 'store', '--assets', str(assets))
    try:
        html = _get_text(f'{url}/')
        for cdn_url, name in dashboard.CDN_ASSETS.items():
            assert cdn_url not in html and f'/vendor/{name}' in html
            assert _get_text(f'{url}/vendor/{name}') == files[name]
        assert 'integrity=' not in html and 'crossorigin=' not in html
    finally:
        assert _stop_dashboard(proc, port) == 0
