"""TAB completion's latency in bash: a key of a built-in experiment and of a .py experiment, first call (no cached
key listing: a child process imports the experiment, torch included) and cached (the listing read back).

    python benchmarks/completion.py [--reps 9]

Each TAB is a real bash with `lazylab completion bash` loaded, calling the completion function as bash does on
TAB (COMP_LINE, COMP_POINT, COMP_WORDS set); the time is bash's own wall time around the function, so the Python
process start is counted, not bash's. Medians of --reps; wall and CPU seconds (CPU is steadier on a shared machine).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / 'lazylab' / 'experiments' / 'templates' / 'text.py'

BASH = '''source ./lazylab.bash
COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<< "$COMP_LINE"; COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
TIMEFORMAT='%R %U %S'
{ time _python_argcomplete lazylab 2>/dev/null; } 2> time.txt
printf '%s\\n' "${COMPREPLY[@]}"
'''


def tab(line: str, folder: Path, env: dict) -> tuple[float, float, list[str]]:
    """(wall seconds, CPU seconds, candidates) of one TAB at the end of `line`."""
    done = subprocess.run(['bash', '-c', BASH, 'bash', line], cwd=folder, env=env, capture_output=True, text=True,
                          check=True)
    wall, user, system = map(float, (folder / 'time.txt').read_text().split())
    return wall, user + system, done.stdout.split('\n')[:-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--reps', type=int, default=9)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        bin_dir = folder / 'bin'
        bin_dir.mkdir()
        (bin_dir / 'lazylab').write_text(f'#!/bin/sh\nexec {sys.executable} -m lazylab.cli "$@"\n')
        (bin_dir / 'lazylab').chmod(0o755)
        shutil.copy(FILE, folder / 'char_lstm.py')
        env = {**os.environ, 'PYTHONPATH': str(ROOT), 'PATH': f'{bin_dir}{os.pathsep}{os.environ["PATH"]}',
               'XDG_CACHE_HOME': str(folder / 'cache')}
        script = subprocess.run([sys.executable, '-m', 'lazylab.cli', 'completion', 'bash'], env=env,
                                capture_output=True, text=True, check=True).stdout
        (folder / 'lazylab.bash').write_text(script)
        print(f'TAB completion in bash (median of {a.reps}; wall / CPU seconds of the completion function)')
        for what, line in (('built-in', 'lazylab train transformer d_mo'), ('.py file', 'lazylab train '
                                                                                        'char_lstm.py hidd')):
            shutil.rmtree(folder / 'cache', ignore_errors=True)
            wall, cpu, first = tab(line, folder, env)
            cached = [tab(line, folder, env) for _ in range(a.reps)]
            print(f'  {what:<9} {line!r:<40} first {wall * 1000:6.0f} ms wall {cpu * 1000:6.0f} ms CPU   '
                  f'cached {statistics.median(c[0] for c in cached) * 1000:4.0f} ms wall '
                  f'{statistics.median(c[1] for c in cached) * 1000:4.0f} ms CPU   → {" ".join(first)}')


if __name__ == '__main__':
    main()
