"""`lazylab dashboard --runs-dir DIR` shows every run under DIR from its run directory, without `dashboard=URL`:
finished runs imported (metrics equal to metrics.jsonl, configuration with provenance, samples, status, command),
a live run followed as it trains, new runs within seconds, a restart that duplicates nothing, and no byte written in
a run directory.

The real server in a child process, its HTTP API read back; needs the `dashboard` extra (CI installs it).
"""
import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
import uuid as uuids
from pathlib import Path

import numpy as np

from lazylab.testing import tiny, wait_until

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 30  # for what the follower sees within seconds (RESCAN_S is 2 s): loose, for a loaded CI machine


def _env():
    env = dict(os.environ, LABML_DISABLE_GIT='1', PYTHONUNBUFFERED='1')
    env['PYTHONPATH'] = os.pathsep.join([str(REPO), env.get('PYTHONPATH', '')])
    return env


def _start(ports, tmp_path: Path, runs_dir: Path, store: Path):
    port = ports.free()
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', 'dashboard', '--port', str(port),
                             '--studies-port', str(ports.free()), '--store', str(store),
                             '--runs-dir', str(runs_dir)],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ports.wait(port, proc, 'the dashboard')
    return f'http://127.0.0.1:{port}', proc


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out[-3000:]
    return out


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _runs(url: str) -> dict[str, dict]:
    return {r['run_uuid']: r for r in _get(f'{url}/api/v1/runs/null')['runs']}


def _series(url: str, uuid: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name → (steps, values) as the page gets them (float32)."""
    got = _post(f'{url}/api/v1/metrics/{uuid}', {'get_all': True, 'indicators': [], 'current_uuid': ''})
    return {s['name']: (_f32(s['step']), _f32(s['value'])) for s in got['series']}


def _f32(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype='<f4')


def _jsonl(run_dir: Path, key: str) -> tuple[np.ndarray, np.ndarray]:
    rows = [json.loads(line) for line in (run_dir / 'metrics.jsonl').read_text().splitlines() if line.strip()]
    rows = [r for r in rows if key in r]
    return np.array([r['step'] for r in rows], dtype=np.float32), np.array([r[key] for r in rows], dtype=np.float32)


def _wait(condition, what: str, deadline_s: float = DEADLINE_S):
    """Poll `condition` until it returns something truthy; fail naming `what` after the deadline."""
    return wait_until(condition, deadline_s, what)


def _fingerprint(folder: Path) -> dict[str, tuple]:
    """Every file and folder under `folder`: its bytes' hash, size and modification time (what a writer changes)."""
    out = {}
    for p in sorted(folder.rglob('*')):
        st = p.stat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else 'dir'
        out[str(p.relative_to(folder))] = (digest, st.st_size, st.st_mtime_ns)
    return out


def _copy_run(run: Path, dest: Path, **record) -> str:
    """A copy of the run directory `run` at `dest` with a new uuid (and run.json's `record` fields); its uuid."""
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns('labml', 'checkpoint.pt'))
    info = json.loads((dest / 'run.json').read_text())
    info.update(uuid=uuids.uuid4().hex, **record)
    (dest / 'run.json').write_text(json.dumps(info))
    return info['uuid']


def _assert_same_series(url: str, uuid: str, run_dir: Path, keys=('loss.train', 'loss.valid', 'accuracy.train')):
    series = _series(url, uuid)
    for key in keys:
        steps, values = _jsonl(run_dir, key)
        assert len(steps) > 0, key
        np.testing.assert_array_equal(series[key][0], steps, err_msg=key)
        np.testing.assert_array_equal(series[key][1], values, err_msg=key)


def test_every_run_under_runs_dir_is_imported_once_without_writing_to_it(short_run, tmp_path, ports):
    runs_dir = tmp_path / 'runs'
    real = runs_dir / 'transformer' / short_run.name
    shutil.copytree(short_run, real)
    uuid = json.loads((real / 'run.json').read_text())['uuid']
    deep_uuid = _copy_run(real, runs_dir / 'mine' / 'a' / 'b' / 'conv_lm' / 'r1', experiment='conv_lm')
    trial = runs_dir / 'transformer' / 'sweep-x' / 'trial-0003'
    trial_uuid = _copy_run(real, trial)
    (trial / 'trial.json').write_text(json.dumps({'number': 3, 'state': 'completed', 'params': {'d_model': 16}}))
    run_dirs = (real, runs_dir / 'mine' / 'a' / 'b' / 'conv_lm' / 'r1', trial)
    before = [_fingerprint(d) for d in run_dirs]

    store = tmp_path / 'store'
    url, proc = _start(ports, tmp_path, runs_dir, store)
    try:
        listed = _wait(lambda: len(_runs(url)) == 3 and _runs(url), '3 runs listed')
        assert set(listed) == {uuid, deep_uuid, trial_uuid}
        _assert_same_series(url, uuid, real)
        run = _get(f'{url}/api/v1/run/{uuid}')
        info = json.loads((real / 'run.json').read_text())
        assert run['name'] == 'transformer'
        assert run['comment'] == 'lazylab train transformer ' + ' '.join(info['argv'])
        assert listed[uuid]['run_status']['status'] == 'completed'
        configs = {c['key']: c for c in run['configs']}
        # provenance: a key the user gave is "explicitly specified" and selected for the summary card; a computed
        # option shows its option's name; a default is neither
        assert configs['d_model']['computed'] == 16 and configs['d_model']['is_explicitly_specified']
        assert 'd_model' in run['selected_configs'] and 'dropout' not in run['selected_configs']
        assert configs['model']['value'] == 'transformer' and configs['model']['options'] == ['transformer']
        assert not configs['dropout']['is_explicitly_specified'] and configs['dropout']['computed'] == 0.0
        stdout = _post(f'{url}/api/v1/logs/stdout/{uuid}', {'page': -2})
        sample = (real / 'samples.txt').read_text(encoding='utf-8').split('--- step')[-1].split('\n', 1)[1].strip()
        assert sample.split('\n')[0] in ''.join(stdout['pages'].values())
        trial_run = _get(f'{url}/api/v1/run/{trial_uuid}')
        assert trial_run['tags'] == ['trial 0003', 'sweep-x'] and trial_run['python_file'] == str(
            trial.relative_to(runs_dir))
        assert _get(f'{url}/api/v1/run/{deep_uuid}')['name'] == 'conv_lm'

        # a run that appears while the server is up is shown within seconds
        later = _copy_run(real, runs_dir / 'transformer' / 'later')
        _wait(lambda: later in _runs(url), 'a new run listed')
    finally:
        _stop(proc)
    assert [_fingerprint(d) for d in run_dirs] == before  # not a byte, not a time stamp

    # a restart sends nothing twice: the same runs, the same points
    url, proc = _start(ports, tmp_path, runs_dir, store)
    try:
        _wait(lambda: len(_runs(url)) == 4, '4 runs listed after the restart')
        ledger = json.loads((store / 'imported.json').read_text())
        assert set(ledger) == {uuid, deep_uuid, trial_uuid, later}
        _assert_same_series(url, uuid, real)
        assert len(_runs(url)) == 4

        # a metrics.jsonl cut back (as `lazylab resume` does to its checkpoint's step) is sent again whole
        lines = (real / 'metrics.jsonl').read_text().splitlines(keepends=True)
        (real / 'metrics.jsonl').write_text(''.join(lines[:2]))
        _wait(lambda: len(_series(url, uuid)['loss.train'][0]) == 2, 'the cut-back series')
        _assert_same_series(url, uuid, real, keys=('loss.train', 'loss.valid'))
    finally:
        _stop(proc)


def test_a_live_run_is_followed_as_it_trains(tmp_path, ports):
    """A run trained while the dashboard is up, without dashboard=URL: listed in progress, its points grow while it
    trains; stopped (Ctrl-C), its status is interrupted and its series equal its metrics.jsonl."""
    runs_dir = tmp_path / 'runs'
    url, proc = _start(ports, tmp_path, runs_dir, tmp_path / 'store')
    try:
        # labml-app merges a series past 1,024 points (MAX_BUFFER_LENGTH), so the run logs at most 1,000: however long
        # a loaded machine takes to see it grow, its series is compared point for point
        train = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', 'train', 'transformer',
                                  *tiny('max_steps=50000', 'valid_interval=50', 'log_interval=50'),
                                  f'runs_dir={runs_dir}'],
                                 cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
        try:
            uuid, = _wait(lambda: _runs(url), 'the live run listed')
            first = _wait(lambda: len(_series(url, uuid).get('loss.valid', ((),))[0]), 'its first validation')
            assert _runs(url)[uuid]['run_status']['status'] == 'in progress'
            _wait(lambda: len(_series(url, uuid)['loss.valid'][0]) > first, 'more points while it trains')
        finally:
            train.send_signal(signal.SIGINT)
            assert train.wait(timeout=300) in (0, 130), train.stderr.read()[-3000:]
        run_dir, = (runs_dir / 'transformer').iterdir()
        _wait(lambda: _runs(url)[uuid]['run_status']['status'] == 'interrupted', 'its status interrupted')
        steps = len(_jsonl(run_dir, 'loss.train')[0])
        assert train.returncode == 130, 'the run ended before it was stopped: its max_steps is too small'
        _wait(lambda: len(_series(url, uuid)['loss.train'][0]) == steps, f'its {steps} points')
        _assert_same_series(url, uuid, run_dir)
        # both losses are drawn on the run's page (labml-app alone hid a series that came after the first packet)
        names = sorted(_series(url, uuid))
        shown = _get(f'{url}/api/v1/metrics/preferences/{uuid}')['series_preferences']
        assert {n for n, p in zip(names, shown) if p == 1} == {'loss.train', 'loss.valid'}
    finally:
        _stop(proc)


def test_a_run_streamed_to_the_dashboard_and_followed_has_each_point_once_and_a_quiet_console(tmp_path, ports):
    """`dashboard=URL` on a run under the followed folder: its files are the truth, the stream's points dropped.
    Off a terminal, labml's client prints plain lines: the run's page, and one when all is sent."""
    runs_dir = tmp_path / 'runs'
    url, proc = _start(ports, tmp_path, runs_dir, tmp_path / 'store')
    try:
        res = subprocess.run([sys.executable, '-m', 'lazylab.cli', 'train', 'transformer',
                              *tiny('max_steps=30', 'valid_interval=10'), f'runs_dir={runs_dir}', f'dashboard={url}'],
                             cwd=tmp_path, env=_env(), check=True, capture_output=True, text=True, timeout=300)
        run_dir, = (runs_dir / 'transformer').iterdir()
        uuid = json.loads((run_dir / 'run.json').read_text())['uuid']
        assert '\x1b' not in res.stdout + res.stderr and '\r' not in res.stdout + res.stderr
        assert '  ' not in ''.join(line for line in res.stdout.splitlines() if 'dashboard' in line)
        dashboard_lines = [line for line in res.stdout.splitlines() if line.startswith('labml dashboard')]
        assert dashboard_lines == [f'labml dashboard: {url}/run/{uuid}',
                                   'labml dashboard: caught up: all of the run is sent'], res.stdout
        assert res.stderr == '', res.stderr
        _wait(lambda: _runs(url).get(uuid, {}).get('run_status', {}).get('status') == 'completed', 'completed')
        _wait(lambda: uuid in json.loads((tmp_path / 'store' / 'imported.json').read_text()), 'followed')
        _assert_same_series(url, uuid, run_dir)
        assert _get(f'{url}/api/v1/run/{uuid}')['comment'].startswith('lazylab train transformer')
    finally:
        _stop(proc)
