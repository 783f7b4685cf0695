"""The figures of one sweep's study, for docs/results.md: Optuna's plots (the optimization history, the parallel
coordinates of the best trials, the parameters' importances) as PNG files, the importances and the trials' states
as text, and with --dashboard a picture of the study's page in optuna-dashboard, as `lazylab dashboard` serves it
(Debian's headless Chromium through Selenium, the browser tests' set-up: no host but this machine resolves).

    python scripts/study_figures.py runs/transformer/sweep-ID docs/recipes/transformer [--dashboard] [--top 10]

writes OUT-history.png, OUT-parallel.png, OUT-importances.png (and OUT-dashboard.png), and prints

    trials: 80 (62 completed, 18 pruned, 0 failed); machine time 2:41:07 over 1:23:12 of wall clock
    importance (PED-ANOVA, completed trials)  optimizer.learning_rate 0.41  d_model 0.22  …

Importances are Optuna's PED-ANOVA evaluator over the completed trials (numpy only: fANOVA needs scikit-learn).
"""
import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import matplotlib

matplotlib.use('Agg')  # files only: no display on a server
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import optuna  # noqa: E402

from lazylab import runs  # noqa: E402
from lazylab.dashboard.studies import open_storage, sweep_storage  # noqa: E402
from lazylab.testing import wait_until  # noqa: E402


def load_study(sweep_dir: Path) -> optuna.Study:
    """The sweep's Optuna study (sweep.yaml names it and its storage)."""
    record = runs.read_sweep_record(sweep_dir)
    return optuna.load_study(study_name=record['study'], storage=open_storage(sweep_storage(sweep_dir)))


def summary(study: optuna.Study) -> dict:
    """Trial counts by state, the trials' summed seconds (machine time, one worker's) and the study's wall clock."""
    trials = study.get_trials(deepcopy=False)
    states = {}
    for t in trials:
        states[t.state.name.lower()] = states.get(t.state.name.lower(), 0) + 1
    timed = [t for t in trials if t.datetime_start and t.datetime_complete]
    busy = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in timed)
    wall = (max(t.datetime_complete for t in timed) - min(t.datetime_start for t in timed)).total_seconds() \
        if timed else 0.0
    return {'trials': len(trials), 'states': states, 'trial_seconds': busy, 'wall_seconds': wall}


def importances(study: optuna.Study) -> dict[str, float]:
    """PED-ANOVA importance of each swept key (Watanabe et al. 2023: how much the best 10% of the completed trials
    differ from all of them in that key), normalised to sum to 1."""
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    return optuna.importance.get_param_importances(study, evaluator=evaluator)


def write_plots(study: optuna.Study, out: Path, top: int) -> list[Path]:
    """OUT-history.png, OUT-parallel.png (the `top` best completed trials), OUT-importances.png."""
    from optuna.visualization import matplotlib as plots
    best = sorted((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE),
                  key=lambda t: t.value if study.direction == optuna.study.StudyDirection.MINIMIZE else -t.value)
    written = []
    for name, draw in (('history', lambda: plots.plot_optimization_history(study)),
                       ('parallel', lambda: plots.plot_parallel_coordinate(
                           study, params=None, target=lambda t: t.value if t in best[:top] else float('nan'))),
                       ('importances', lambda: plots.plot_param_importances(
                           study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()))):
        ax = draw()
        fig = ax.figure if hasattr(ax, 'figure') else ax.flat[0].figure
        fig.set_size_inches(12, 6)
        fig.tight_layout()
        path = out.with_name(f'{out.name}-{name}.png')
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def dashboard_picture(sweep_dir: Path, study_name: str, path: Path, trials: int) -> None:
    """`lazylab dashboard` on the sweep folder; headless Chromium opens the study's page in optuna-dashboard, waits
    for its history plot to show every trial, and saves a screenshot."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    port, studies_port = _free_port(), _free_port()
    store = Path(tempfile.mkdtemp(prefix='study-figures-'))
    proc = subprocess.Popen([sys.executable, '-m', 'lazylab.cli', 'dashboard', '--port', str(port),
                             '--studies-port', str(studies_port), '--store', str(store / 'store'),
                             '--runs-dir', str(sweep_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    options = webdriver.ChromeOptions()
    options.binary_location = '/usr/bin/chromium'
    for flag in ('--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--hide-scrollbars',
                 '--window-size=1400,1000', f'--user-data-dir={store / "profile"}',
                 '--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE localhost'):
        options.add_argument(flag)
    driver = None
    try:
        def up():
            with socket.socket() as s:
                return s.connect_ex(('127.0.0.1', studies_port)) == 0 or proc.poll() is not None
        wait_until(up, 60, 'the dashboard')
        if proc.poll() is not None:
            raise SystemExit(f'lazylab dashboard ended: {proc.stderr.read().decode()[-2000:]}')
        driver = webdriver.Chrome(options=options, service=Service('/usr/bin/chromedriver'))
        driver.get(f'http://127.0.0.1:{studies_port}/dashboard/')
        wait_until(lambda: driver.find_element('partial link text', study_name), 60, 'the study listed',
                   retry=(Exception,)).click()
        wait_until(lambda: len(driver.find_elements('css selector', '.js-plotly-plot .scatterlayer .point'))
                   >= trials, 120, 'the history plot with every trial')
        driver.save_screenshot(str(path))
    finally:
        if driver is not None:
            driver.quit()
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(store, ignore_errors=True)


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('sweep_dir', type=Path)
    p.add_argument('out', type=Path, help='path prefix of the PNG files (OUT-history.png, …)')
    p.add_argument('--top', type=int, default=10, help='trials in the parallel-coordinates plot (the best)')
    p.add_argument('--dashboard', action='store_true', help="also OUT-dashboard.png: the study's page")
    p.add_argument('--json', action='store_true', help='print the summary and importances as JSON')
    a = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings('ignore', category=optuna.exceptions.ExperimentalWarning)  # the matplotlib plots'
    study = load_study(a.sweep_dir)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    facts = summary(study)
    facts['importances'] = importances(study)
    facts['files'] = [str(p) for p in write_plots(study, a.out, a.top)]
    if a.dashboard:
        picture = a.out.with_name(f'{a.out.name}-dashboard.png')
        dashboard_picture(a.sweep_dir, study.study_name, picture, facts['trials'])
        facts['files'].append(str(picture))
    if a.json:
        print(json.dumps(facts, indent=1))
        return 0
    states = ', '.join(f'{n} {s}' for s, n in sorted(facts['states'].items()))
    print(f'trials: {facts["trials"]} ({states}); machine time {_clock(facts["trial_seconds"])} (the trials\' '
          f'seconds summed) over {_clock(facts["wall_seconds"])} of wall clock')
    print('importance (PED-ANOVA, completed trials): ' +
          '  '.join(f'{k} {v:.2f}' for k, v in facts['importances'].items()))
    for f in facts['files']:
        print(f'wrote {f}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
