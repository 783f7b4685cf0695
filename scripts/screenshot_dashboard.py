"""Screenshot of a real run's page in the labml dashboard, after a longer run than the tests train.

The docs' pictures (docs/dashboard*.png) are the browser tests' screenshots (tests/dashboard/test_browser.py), and
the page's third-party files are installed with lazylab (lazylab/dashboard/assets.py): `--assets` and npm below are
only for other versions of them.

Starts `lazylab dashboard` on a free loopback port over a temporary store, trains a small transformer on Tiny
Shakespeare with `dashboard=URL`, and has headless Chromium (Debian's `chromium` package) capture the run's page.

    python scripts/screenshot_dashboard.py [--out docs/dashboard.png] [--assets DIR] [--steps 300]

The labml page loads d3, Bootstrap's CSS and Font Awesome from CDNs. Without internet (as on our build machines)
pass `--assets DIR`, or let the script fetch the same files from the npm registry with `npm pack` (needs npm).
Needs: the `dashboard` extra, chromium (`apt-get install -y chromium`).
"""
import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lazylab.dashboard import missing_assets  # noqa: E402

# npm package, file inside its tarball → file under the assets folder (the layout `lazylab dashboard --assets` reads)
NPM_FILES = [
    ('d3@6.7.0', 'package/dist/d3.min.js', 'd3.v6.min.js'),
    ('bootstrap@5.0.0-beta2', 'package/dist/css/bootstrap.min.css', 'bootstrap.min.css'),
    ('@fortawesome/fontawesome-free@5.9.0', 'package/css/all.css', 'fontawesome/css/all.css'),
    ('@fortawesome/fontawesome-free@5.9.0', 'package/webfonts/', 'fontawesome/webfonts/'),
]
CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                  '--disable-background-networking', '--disable-component-update', '--disable-sync',
                  '--hide-scrollbars']


def fetch_assets(dest: Path) -> Path:
    """Fill `dest` with the page's CDN files, taken from their npm packages with `npm pack`."""
    if shutil.which('npm') is None:
        raise SystemExit('screenshot_dashboard: npm is needed to fetch the page assets (or pass --assets DIR)')
    with tempfile.TemporaryDirectory() as tmp:
        tarballs = {}
        for package in dict.fromkeys(p for p, _, _ in NPM_FILES):
            out = subprocess.run(['npm', 'pack', '--json', package], cwd=tmp, check=True, capture_output=True,
                                 text=True).stdout
            tarballs[package] = Path(tmp) / json.loads(out)[0]['filename']
        for package, inner, target in NPM_FILES:
            with tarfile.open(tarballs[package]) as tar:
                for member in tar.getmembers():
                    if member.isfile() and (member.name == inner or inner.endswith('/') and
                                            member.name.startswith(inner)):
                        path = dest / target / member.name[len(inner):] if inner.endswith('/') else dest / target
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_bytes(tar.extractfile(member).read())
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f'screenshot_dashboard: the dashboard exited with {proc.returncode}')
        try:
            with socket.create_connection(('127.0.0.1', port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit('screenshot_dashboard: the dashboard did not start')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', default=str(REPO / 'docs' / 'dashboard.png'))
    parser.add_argument('--assets', default=None, help='folder with the page assets (default: fetch with npm)')
    parser.add_argument('--steps', type=int, default=300, help='training steps of the run shown')
    parser.add_argument('--window', default='1280,1260', help='browser window WIDTH,HEIGHT in pixels')
    args = parser.parse_args()
    chromium = shutil.which('chromium') or shutil.which('chromium-browser')
    if chromium is None:
        raise SystemExit('screenshot_dashboard: chromium not found (Debian: apt-get install -y chromium)')

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        assets = Path(args.assets) if args.assets else fetch_assets(tmp / 'assets')
        if missing_assets(assets):
            raise SystemExit(f'screenshot_dashboard: {assets} lacks {", ".join(missing_assets(assets))}')
        port = free_port()
        url = f'http://127.0.0.1:{port}'
        server = subprocess.Popen([sys.executable, '-m', 'lazylab', 'dashboard', '--port', str(port),
                                   '--studies-port', str(free_port()), '--store', str(tmp / 'store'),
                                   '--assets', str(assets)], cwd=REPO)
        try:
            wait_for_port(port, server)
            # A small model on Tiny Shakespeare: a real loss curve in a minute or two on a laptop CPU.
            subprocess.run([sys.executable, '-m', 'lazylab.experiments.transformer', f'max_steps={args.steps}',
                            'd_model=64', 'heads=4', 'd_ff=128', 'n_layers=2', 'seq_len=64', 'batch_size=16',
                            'log_interval=5', 'sample_tokens=80', 'device=cpu', f'runs_dir={tmp / "runs"}',
                            f'dashboard={url}'], cwd=tmp, check=True)
            run = json.loads(next((tmp / 'runs').glob('transformer/*/run.json')).read_text())
            out = Path(args.out).resolve()
            out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([chromium, *CHROMIUM_FLAGS, f'--user-data-dir={tmp / "chromium"}',
                            f'--window-size={args.window}', '--virtual-time-budget=20000', f'--screenshot={out}',
                            f'{url}/run/{run["uuid"]}'], check=True, capture_output=True, timeout=120)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    size = out.stat().st_size
    if size > 500_000:  # keep the repository light: a palette of 256 colours is plenty for this page
        from PIL import Image
        Image.open(out).convert('RGB').quantize(256).save(out, optimize=True)
    print(f'wrote {out} ({out.stat().st_size // 1024} KB) for run {run["uuid"]}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
