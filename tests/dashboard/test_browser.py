"""`lazylab dashboard` in a real browser: Debian's headless Chromium driven by Selenium (Debian's chromium-driver).

What a user sees, not what the API answers: the runs list shows every run of the runs folder; a run's page draws
its loss chart (SVG paths of many points) for train and valid and lists the configuration; a live run's chart grows
on the open page; optuna-dashboard's study page draws its history plot; the page's third-party files are the
versions lazylab installs (lazylab.dashboard.assets). The browser resolves every host but this machine's to nothing
(--host-resolver-rules), and its performance log must show no request off the machine. The screenshots are the
docs' pictures (docs/dashboard*.png).

Without chromium and chromedriver the tests skip with one line; with LAZYLAB_REQUIRE_BROWSER=1 (set by .ci/run) or
CI set they fail instead: a skip there would hide a broken install.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
import uuid as uuids
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from lazylab import testing
from lazylab.testing import tiny

REPO = Path(__file__).resolve().parents[2]
DOCS_IMAGES = REPO / 'docs'
CHROMIUM, CHROMEDRIVER = '/usr/bin/chromium', '/usr/bin/chromedriver'
DEADLINE_S = 30
LOCAL_HOSTS = {'127.0.0.1', 'localhost'}


def _require_browser():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401  (the test extra)
    except ImportError:
        missing.append('selenium')
    if missing:
        if os.environ.get('LAZYLAB_REQUIRE_BROWSER') or os.environ.get('CI'):
            pytest.fail(f'browser tests: {", ".join(missing)} missing (apt-get install chromium chromium-driver)')
        pytest.skip(f'browser tests need {", ".join(missing)} (apt-get install chromium chromium-driver)')


@pytest.fixture(scope='module')
def browser(tmp_path_factory):
    """Headless Chromium as root on this machine only: every host but loopback resolves to nothing."""
    _require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ('--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                 '--disable-background-networking', '--disable-component-update', '--disable-sync',
                 '--hide-scrollbars', '--window-size=1280,1100',
                 f'--user-data-dir={tmp_path_factory.mktemp("chromium-profile")}',
                 '--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE localhost'):
        options.add_argument(flag)
    options.set_capability('goog:loggingPrefs', {'performance': 'ALL'})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def requests_off_machine(driver) -> list[str]:
    """The URLs the page asked for (its performance log since the last call) that are not this machine's."""
    off = []
    for entry in driver.get_log('performance'):
        message = json.loads(entry['message'])['message']
        if message['method'] == 'Network.requestWillBeSent':
            url = message['params']['request']['url']
            if urlsplit(url).scheme in ('http', 'https', 'ws', 'wss') and urlsplit(url).hostname not in LOCAL_HOSTS:
                off.append(url)
    return off


def wait_until(condition, what: str, deadline_s: float = DEADLINE_S):
    """Poll `condition` until it returns something truthy (an element replaced while it was read, as the page
    redraws, counts as not yet); fail naming `what` after the deadline."""
    return testing.wait_until(condition, deadline_s, what, every=0.25, retry=(Exception,))


def _points(d: str) -> int:
    """The points of an SVG path's `d` (its coordinate pairs)."""
    return len(re.findall(r'-?\d+(?:\.\d+)?(?:e-?\d+)?', d)) // 2


def _charts(driver) -> list[int]:
    """The points of each smoothed line drawn on the page's metrics chart (not its sparklines)."""
    return [_points(p.get_attribute('d') or '')
            for p in driver.find_elements('css selector', 'svg:not(.sparkline) path.smoothed-line')]


def _api(url: str, path: str):
    with urllib.request.urlopen(url + path, timeout=30) as answer:
        return json.loads(answer.read())


def _env():
    env = dict(os.environ, LABML_DISABLE_GIT='1', PYTHONUNBUFFERED='1')
    env['PYTHONPATH'] = os.pathsep.join([str(REPO), env.get('PYTHONPATH', '')])
    return env


def _study(sweep_dir: Path, values: list[float]):
    """A sweep folder with a study of finished trials (as `lazylab sweep` leaves one)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    sweep_dir.mkdir(parents=True)
    storage = JournalStorage(JournalFileBackend(str(sweep_dir / 'study.journal')))
    study = optuna.create_study(storage=storage, study_name=sweep_dir.name)
    for v in values:
        trial = study.ask({'optimizer.learning_rate': optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
        study.tell(trial, v)
    (sweep_dir / 'sweep.yaml').write_text(f'study: {sweep_dir.name}\nstorage_url: null\n')


@pytest.fixture(scope='module')
def site(tmp_path_factory, ports):
    """A runs folder (a 60-step run, two copies of it, a sweep's study) and `lazylab dashboard` on it."""
    import torch

    from lazylab import cli
    root = tmp_path_factory.mktemp('browser')
    runs_dir = root / 'runs'
    threads = torch.get_num_threads()
    try:
        assert cli.main(['train', 'transformer', *tiny('max_steps=60', 'valid_interval=3', 'log_interval=1'),
                         f'runs_dir={runs_dir}']) == 0
    finally:
        torch.set_num_threads(threads)
    run_dir, = (runs_dir / 'transformer').iterdir()
    for i in range(2):
        copy = runs_dir / 'elsewhere' / f'copy{i}'
        shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns('labml', 'checkpoint.pt'))
        info = json.loads((copy / 'run.json').read_text())
        (copy / 'run.json').write_text(json.dumps({**info, 'uuid': uuids.uuid4().hex}))
    _study(runs_dir / 'transformer' / 'sweep-lr', [1.9, 1.7, 1.75, 1.6, 1.62])
    port, studies_port = ports.free(), ports.free()
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', 'dashboard', '--port', str(port),
                             '--studies-port', str(studies_port), '--store', str(root / 'store'),
                             '--runs-dir', str(runs_dir)],
                            cwd=root, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ports.wait(port, proc, 'the dashboard')
    try:
        yield {'url': f'http://127.0.0.1:{port}', 'studies': f'http://127.0.0.1:{studies_port}', 'runs': runs_dir,
               'run': run_dir, 'uuid': json.loads((run_dir / 'run.json').read_text())['uuid'], 'root': root}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_runs_list_shows_every_run(browser, site):
    browser.get(f'{site["url"]}/runs')
    wait_until(lambda: len(browser.find_elements('css selector', '.list-item')) == 3, 'the 3 runs listed')
    assert not requests_off_machine(browser)
    browser.save_screenshot(str(DOCS_IMAGES / 'dashboard-runs.png'))


def test_run_page_draws_train_and_valid_loss_and_lists_the_configuration(browser, site):
    browser.get(f'{site["url"]}/run/{site["uuid"]}')
    # the chart is drawn, not merely served: a line of ~60 points (loss.train) and one of ~20 (loss.valid)
    lines = wait_until(lambda: sorted(_charts(browser)) if len(_charts(browser)) >= 2 else None, 'two loss lines')
    assert len(lines) == 2 and lines[0] >= 15 and lines[1] >= 50, lines
    titles = [e.text for e in browser.find_elements('css selector', '.sparkline-list-item .title')]
    assert {'loss.train', 'loss.valid'} <= set(titles), titles
    keys = [e.text for e in browser.find_elements('css selector', '.configs span.key')]
    assert {'max_steps', 'valid_interval', 'd_model'} <= set(keys), keys
    assert 'Default configurations' not in browser.page_source
    # the third-party files are the ones lazylab installs, in the versions chosen
    assert browser.execute_script('return d3.version') == '6.7.0'
    css = browser.execute_async_script(
        'const done = arguments[0]; Promise.all(["/vendor/bootstrap.min.css", "/vendor/fontawesome/css/all.css"]'
        '.map(u => fetch(u).then(r => r.text()))).then(t => done(t.map(s => s.slice(0, 200))))')
    assert 'Bootstrap v5.0.0-beta2' in css[0] and 'Font Awesome Free 5.15.4' in css[1], css
    assert browser.execute_script('return document.fonts.check("900 16px \\"Font Awesome 5 Free\\"")')
    assert not requests_off_machine(browser)
    browser.save_screenshot(str(DOCS_IMAGES / 'dashboard.png'))


def test_a_live_runs_chart_grows_on_the_open_page(browser, site):
    train = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', 'train', 'transformer',
                              # at most 1,000 points: labml-app merges a longer series, and its chart would stop growing
                              *tiny('max_steps=20000', 'valid_interval=20', 'log_interval=20'),
                              f'runs_dir={site["runs"] / "live"}'],
                             cwd=site['root'], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        run_dir = wait_until(lambda: next((site['runs'] / 'live' / 'transformer').iterdir()), 'the run directory')
        uuid = wait_until(lambda: json.loads((run_dir / 'run.json').read_text())['uuid'], 'its run.json')
        wait_until(lambda: _api(site['url'], f'/api/v1/run/status/{uuid}')['run_status']['status'] == 'in progress',
                   'the dashboard following it')
        browser.get(f'{site["url"]}/run/{uuid}')
        first = wait_until(lambda: max(_charts(browser) or [0]), 'its first chart')
        # the page reloads a running run's cards by itself (every 5 s): no click, no reload
        wait_until(lambda: max(_charts(browser) or [0]) > first + 5, 'the chart growing', deadline_s=60)
        assert not requests_off_machine(browser)
    finally:
        train.send_signal(signal.SIGINT)
        train.wait(timeout=120)


def test_study_page_draws_its_history_plot(browser, site):
    browser.get(f'{site["studies"]}/dashboard/')
    link = wait_until(lambda: browser.find_element('partial link text', 'sweep-lr'), 'the study listed')
    link.click()
    # optuna-dashboard's history plot: plotly's SVG with a point per trial
    wait_until(lambda: len(browser.find_elements('css selector', '.js-plotly-plot .scatterlayer .point')) >= 5,
               'the history plot with its 5 trials')
    assert not requests_off_machine(browser)
    browser.save_screenshot(str(DOCS_IMAGES / 'dashboard-study.png'))
