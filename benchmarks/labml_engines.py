"""Seconds per optimizer step of labml_nn experiments on labml's own engine and under `lazylab labml`, side by side.

    python benchmarks/labml_engines.py [--steps 4] [--rounds 1] [--threads 2] [--cpu-time] [--quick]

Each run is a fresh process, the two engines alternated round-robin (labml, lazylab, labml, …) so that load on the
machine hits them alike. labml's run is tests/labml/labml_reference.py (labml's engine, labml 0.5.3's missing
functions filled, the same offline data and sizes given as labml's own overrides); lazylab's is `lazylab labml
MODULE key=value … --steps N`. A torch optimizer hook in the child stamps the end of each update; seconds per step
are the time from the end of the first update to the end of the last over steps − 1, so start-up, data loading and
the first step's warm-up are left out (the process's wall time is shown beside them). ``--cpu-time`` stamps the
process's CPU seconds instead: steadier where other processes share the machine (use it with ``--threads 1``).

The experiments: glu_variants.simple at its own size (the issue's case: a dataclass config, no key reaches it) and
gpt with a small transformer (its own is 512 wide, 6 layers, 128 × 128 tokens a step: minutes a step on a CPU).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / 'tests' / 'labml' / 'labml_reference.py'

GPT_SMALL = {'seq_len': 64, 'batch_size': 8, 'transformer.d_model': 128, 'transformer.ffn.d_ff': 256,
             'transformer.n_heads': 4, 'transformer.n_layers': 2}
GPT_TINY = {'seq_len': 16, 'batch_size': 2, 'transformer.d_model': 16, 'transformer.ffn.d_ff': 32,
            'transformer.n_heads': 2, 'transformer.n_layers': 1}
CASES = {  # title: (module, settings)
    'glu_variants.simple (its own size)': ('labml_nn.transformers.glu_variants.simple', {}),
    'gpt (d_model 128, 2 layers, 64 x 8 tokens)': ('labml_nn.transformers.gpt', GPT_SMALL),
}
QUICK = {'gpt (tiny)': ('labml_nn.transformers.gpt', GPT_TINY)}

# The child: stamps each optimizer update, runs the module on one engine, writes the stamps as JSON.
CHILD = '''
import atexit, json, sys, time
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
engine, module, steps, settings, out, work = sys.argv[1:7]
torch.set_num_threads(int(sys.argv[7]))
stamps = []
clock = time.process_time if sys.argv[9] == 'cpu' else time.perf_counter
register_optimizer_step_post_hook(lambda *args: stamps.append(clock()))
atexit.register(lambda: open(out, 'w').write(json.dumps(stamps)))
settings = json.loads(settings)
if engine == 'labml':
    sys.path.insert(0, sys.argv[8])
    import labml_reference
    labml_reference.main(module, work, work + '/runs/data', steps, json.dumps(settings))
else:
    from lazylab.labml.runner import run_labml
    run_labml(module, [f'{k}={v}' for k, v in settings.items()], steps=int(steps), runs_dir=work + '/runs')
'''


def _run(engine: str, module: str, settings: dict, steps: int, threads: int, clock: str) -> tuple[float, float]:
    """(seconds per step, wall seconds of the process) of one run in a fresh process."""
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / 'stamps.json'
        env = dict(os.environ, LABML_DISABLE_GIT='1', PYTHONPATH=os.pathsep.join(
            [str(ROOT), os.environ.get('PYTHONPATH', '')]))
        started = time.perf_counter()
        subprocess.run([sys.executable, '-c', CHILD, engine, module, str(steps), json.dumps(settings), str(out), work,
                        str(threads), str(REFERENCE.parent), clock], cwd=work, env=env, check=True,
                       capture_output=True)
        wall = time.perf_counter() - started
        stamps = json.loads(out.read_text())
    if len(stamps) != steps:
        raise SystemExit(f'{engine} made {len(stamps)} optimizer steps of {module}, not {steps}')
    return (stamps[-1] - stamps[0]) / (steps - 1), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=4)
    parser.add_argument('--rounds', type=int, default=1)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--cpu-time', action='store_true', help="the process's CPU seconds, not wall time")
    parser.add_argument('--quick', action='store_true', help='tiny gpt only, 3 steps')
    args = parser.parse_args()
    cases, steps = (QUICK, 3) if args.quick else (CASES, args.steps)
    if steps < 2:
        raise SystemExit('--steps must be at least 2 (seconds per step are measured between updates)')
    for title, (module, settings) in cases.items():
        times: dict[str, list[tuple[float, float]]] = {'labml': [], 'lazylab': []}
        for _ in range(args.rounds):
            for engine in times:
                times[engine].append(_run(engine, module, settings, steps, args.threads,
                                          'cpu' if args.cpu_time else 'wall'))
        clock = ', CPU time' if args.cpu_time else ''
        print(f'{title}: seconds per optimizer step, {steps} steps (CPU, {args.threads} threads, '
              f'median of {args.rounds}{clock})')
        base = statistics.median(t for t, _ in times['labml'])
        for engine, runs in times.items():
            per_step = statistics.median(t for t, _ in runs)
            wall = statistics.median(w for _, w in runs)
            print(f'  {engine:8s} {per_step / base:5.2f}x   {per_step:7.3f} s/step   process {wall:6.1f} s')


if __name__ == '__main__':
    main()
