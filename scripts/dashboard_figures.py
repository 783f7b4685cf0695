"""The dashboard's two figures (issue 40): how long `lazylab dashboard` takes to list a folder of finished runs, and
its memory then; and the delay from a metric written by a live run to its point on the run's page.

    python scripts/dashboard_figures.py [--runs 200] [--samples 20]

1. One real 60-step run is trained, copied --runs times (each with its own uuid) into a fresh runs folder; the
   dashboard is started on it and timed from its start to the moment /api/v1/runs/null lists them all; its memory is
   the server process's resident set (VmRSS) then.
2. A run directory made to look live (run.json says running, this script holds its training lock, as `lazylab train`
   does) is opened in headless Chromium (Debian's chromium + chromium-driver, Selenium); --samples times, a record
   with a new loss value is appended to its metrics.jsonl (at a random moment), and the delay is measured until
   the value appears on the page (the loss.train line's last value), and until the API has it. Medians are printed.
Loopback only; needs the `dashboard` and `test` extras.
"""
import argparse
import base64
import json
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid as uuids
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lazylab.locks import hold_lock  # noqa: E402

FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync', '--window-size=1280,1000',
         '--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE localhost']


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def until(condition, deadline_s: float = 60.0, pause: float = 0.02, what: str = ""):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            value = condition()
        except Exception:  # not up yet, or an element redrawn while read
            value = None
        if value:
            return value
        time.sleep(pause)
    raise SystemExit(f"dashboard_figures: gave up waiting for {what or condition}")


def start_dashboard(root: Path, runs_dir: Path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', 'dashboard', '--port', str(port), '--studies-port',
                             str(free_port()), '--store', str(root / 'store'), '--runs-dir', str(runs_dir)],
                            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return f'http://127.0.0.1:{port}', proc


def rss_mb(pid: int) -> float:
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
    return float('nan')


def list_time(root: Path, run: Path, n: int) -> None:
    runs_dir = root / 'many'
    for i in range(n):
        copy = runs_dir / 'transformer' / f'run-{i:04d}'
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns('labml', 'checkpoint.pt'))
        info = json.loads((copy / 'run.json').read_text())
        (copy / 'run.json').write_text(json.dumps({**info, 'uuid': uuids.uuid4().hex}))
    start = time.monotonic()
    url, proc = start_dashboard(root, runs_dir)
    try:
        until(lambda: len(get(f'{url}/api/v1/runs/null')['runs']) == n, pause=0.1)
        seconds = time.monotonic() - start
        print(f'{n} finished runs ({len(json.loads((run / "run.json").read_text())["argv"])} settings, '
              f'{sum(1 for _ in open(run / "metrics.jsonl"))} records each): listed in {seconds:.1f} s from the '
              f'dashboard\'s start; server memory then {rss_mb(proc.pid):.0f} MB (VmRSS)')
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def page_delay(root: Path, run: Path, samples: int) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    runs_dir = root / 'live'
    live = runs_dir / 'transformer' / 'live'
    shutil.copytree(run, live, ignore=shutil.ignore_patterns('labml', 'checkpoint.pt'))
    info = json.loads((live / 'run.json').read_text())
    uuid = uuids.uuid4().hex
    (live / 'run.json').write_text(json.dumps({**info, 'uuid': uuid, 'status': 'running'}))
    lock = hold_lock(live, 'live')  # `lazylab train`'s training lock: the dashboard takes the run for a live one
    url, proc = start_dashboard(root, runs_dir)
    options = webdriver.ChromeOptions()
    options.binary_location = '/usr/bin/chromium'
    for flag in FLAGS + [f'--user-data-dir={root / "profile"}']:
        options.add_argument(flag)
    options.set_capability('goog:loggingPrefs', {'performance': 'ALL'})
    driver = webdriver.Chrome(options=options, service=Service('/usr/bin/chromedriver'))
    try:
        until(lambda: get(f'{url}/api/v1/run/status/{uuid}')['run_status']['status'] == 'in progress',
              what='the run in progress')
        driver.get(f'{url}/run/{uuid}')
        until(lambda: driver.find_elements('css selector', '.sparkline-list-item .value-primary'), what='the page')
        step = max(json.loads(line)['step'] for line in (live / 'metrics.jsonl').read_text().splitlines())
        page, api = [], []
        for i in range(samples):
            # written at a random moment of the page's reload period, not just after a reload (which would measure
            # the whole period every time): the delay a user sees on average
            time.sleep(random.uniform(0, 6))
            step += 1
            value = round(9.0 + i / 100, 3)  # the line's last value, as the page shows it ('9', '9.01', …)
            with open(live / 'metrics.jsonl', 'a') as f:
                f.write(json.dumps({'step': step, 'tokens': step * 64, 'loss.train': value}) + '\n')
            written = time.monotonic()
            until(lambda step=step: step in get_steps(url, uuid), what=f'step {step} in the API')
            api.append(time.monotonic() - written)
            until(lambda value=value: any(_number(e.text) == value for e in
                              driver.find_elements('css selector', '.sparkline-list-item .value-secondary')),
                  what=f'{value:.3f} on the page')
            page.append(time.monotonic() - written)
        print(f'a live run\'s metric, written → on the page: median {statistics.median(page):.2f} s '
              f'(min {min(page):.2f}, max {max(page):.2f}, {samples} samples; the page reloads every 5 s); '
              f'written → in the API: median {statistics.median(api):.2f} s')
    finally:
        driver.quit()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        lock.release()


def _number(text: str):
    try:
        return round(float(text), 3)
    except ValueError:
        return None


def get_steps(url: str, uuid: str) -> set:
    req = urllib.request.Request(f'{url}/api/v1/metrics/{uuid}', data=b'{"get_all": true}',
                                 headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=30) as r:
        series = {s['name']: s for s in json.loads(r.read())['series']}
    return set(np.frombuffer(base64.b64decode(series['loss.train']['step']), dtype='<f4').astype(int).tolist())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--runs', type=int, default=200)
    p.add_argument('--samples', type=int, default=20)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        subprocess.run([sys.executable, '-m', 'lazylab.cli', 'train', 'transformer', 'd_model=16', 'heads=2',
                        'd_ff=32', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'device=cpu', 'max_steps=60',
                        'valid_interval=3', 'log_interval=1', f'runs_dir={root / "one"}'],
                       check=True, capture_output=True, cwd=root)
        run, = (root / 'one' / 'transformer').iterdir()
        list_time(root, run, a.runs)
        page_delay(root, run, a.samples)


if __name__ == '__main__':
    main()
