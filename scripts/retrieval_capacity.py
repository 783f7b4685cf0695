"""The capacity sweep of the fast-weights paper's associative-retrieval experiment (Schlag, Irie & Schmidhuber 2021,
figures 2 and 3), with `lazylab train retrieval`, and a PNG of the final evaluation loss against S.

Setting 1 (each key once, the sum rule): ELU + 1 ("linear"), DPFP ν = 1, 2, 3 and FAVOR+; setting 2 (2S pairs drawn
with replacement): the sum rule against the delta rule, both with DPFP ν = 1, and the delta rule's successors: the
gated delta rule (Gated DeltaNet: a learnt decay, so that overwritten pairs can fade) and DeltaProduct (two writes
per pair, with and without the gate), with DPFP ν = 1, and the gated delta rule with L2-SiLU keys and β ∈ (0, 2).
Every run is a separate `python -m lazylab.experiments.retrieval …` process with one thread (`--jobs` of them at a
time), stopping at an evaluation loss of 0.001 or after `--max-steps`; its final `loss.valid` (from metrics.jsonl)
is plotted.

    python scripts/retrieval_capacity.py                       # the README's figure (docs/retrieval_capacity.png)
    python scripts/retrieval_capacity.py --quick               # a tiny smoke run (S = 4; 30 steps)
    python scripts/retrieval_capacity.py --variants 'ν=1'      # only the variants whose label has 'ν=1'
    python scripts/retrieval_capacity.py --setting 2           # setting 2 only: the sum, delta and successor rules
    python scripts/retrieval_capacity.py --setting 2 --variants gated --s2 10 20 --max-steps 500   # a short look

It prints one row per run and the wall time, and writes the numbers beside the PNG (retrieval_capacity.json,
after every run): started again with the same --max-steps, it runs only what that file lacks.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SETTING_1 = {  # label → keys (the sum rule, the authors' normalisations: attention normaliser, raw features)
    'linear (ELU + 1), d_dot 64': ['phi=linear'],
    'DPFP ν=1, d_dot 128': ['phi=dpfp', 'nu=1'],
    'DPFP ν=2, d_dot 256': ['phi=dpfp', 'nu=2'],
    'DPFP ν=3, d_dot 384': ['phi=dpfp', 'nu=3'],
    'FAVOR+ m=64, d_dot 128': ['phi=favor', 'favor_features=64'],
    # the raw FAVOR+ features exp(−‖x‖²/2 ± ωᵀx) / √2m underflow in float32 for the key sizes this model starts
    # with (its ½‖x‖² is ~70): sum-normalised, they are a softmax over ±ωᵀx and cannot underflow
    'FAVOR+ m=64 sum-normalised': ['phi=favor', 'favor_features=64', 'sum_normalization=true'],
}
SETTING_2 = {  # setting 2: 2S pairs with replacement
    'sum rule, DPFP ν=1': ['replace=true', 'phi=dpfp', 'nu=1', 'update_rule=sum'],
    'delta rule, DPFP ν=1': ['replace=true', 'phi=dpfp', 'nu=1', 'update_rule=delta'],
    # the successors (issue 28); none of their labels says 'delta rule', so --variants 'delta rule' is one variant
    'gated delta (GDN), DPFP ν=1': ['replace=true', 'phi=dpfp', 'nu=1', 'update_rule=gated_delta'],
    'DeltaProduct n_h=2, DPFP ν=1': ['replace=true', 'phi=dpfp', 'nu=1', 'update_rule=delta_product',
                                     'householder_steps=2'],
    'DeltaProduct n_h=2 gated, DPFP ν=1': ['replace=true', 'phi=dpfp', 'nu=1', 'update_rule=delta_product',
                                           'householder_steps=2', 'gated=true'],
    'gated delta (GDN), L2-SiLU, β<2': ['replace=true', 'phi=l2', 'update_rule=gated_delta',
                                        'negative_eigenvalues=true'],
}


def run_one(keys: list[str], n_keys: int, max_steps: int, runs_dir: str) -> dict:
    """Train one run; its last metrics record with loss.valid, plus the wall time."""
    started = time.time()
    command = [sys.executable, '-m', 'lazylab.experiments.retrieval', f'n_keys={n_keys}', *keys, 'threads=1',
               f'max_steps={max_steps}', f'runs_dir={runs_dir}', 'dashboard=']
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f'run failed: {" ".join(command)}\n{out.stderr[-2000:]}')
    run_dir = out.stdout.strip().splitlines()[-1].rsplit('run dir ', 1)[-1]
    records = [json.loads(line) for line in Path(run_dir, 'metrics.jsonl').read_text().splitlines()]
    last = [r for r in records if 'loss.valid' in r][-1]
    return {'loss': last['loss.valid'], 'accuracy': last['accuracy.valid'], 'step': last['step'],
            'seconds': round(time.time() - started, 1)}


def plot(results: dict, path: Path, paper_note: str):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (title, variants) in zip(axes, results.items()):
        for label, points in variants.items():
            s = sorted(int(k) for k in points)
            ax.plot(s, [max(points[str(n)]['loss'], 1e-4) for n in s], marker='o', label=label)
        ax.set_yscale('log')
        ax.axhline(1e-3, color='grey', lw=0.8, ls=':')
        ax.set_xlabel('S (number of keys)')
        ax.set_ylabel('final evaluation loss ½‖y − ŷ‖²')
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(paper_note, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='tiny smoke run')
    parser.add_argument('--max-steps', type=int, default=2000)
    parser.add_argument('--jobs', type=int, default=2, help='runs at a time (one thread each)')
    parser.add_argument('--s1', type=int, nargs='+', default=[20, 40, 80, 120, 160, 240], help='S of setting 1')
    parser.add_argument('--s2', type=int, nargs='+', default=[10, 20, 40, 60, 80], help='S of setting 2')
    parser.add_argument('--variants', default='', help='only the variants whose label contains this text')
    parser.add_argument('--setting', type=int, choices=[1, 2], default=None, help='only this setting (default: both)')
    parser.add_argument('--out', default='docs/retrieval_capacity.png')
    args = parser.parse_args(argv)
    if args.quick:
        args.s1, args.s2, args.max_steps = [4], [4], 30
    started = time.time()
    plan = [('setting 1: each key once, sum rule', label, keys, n) for label, keys in SETTING_1.items()
            for n in args.s1 if args.variants in label and args.setting in (None, 1)]
    plan += [('setting 2: 2S pairs with replacement', label, keys, n) for label, keys in SETTING_2.items()
             for n in args.s2 if args.variants in label and args.setting in (None, 2)]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    numbers = out.with_suffix('.json')
    # runs already in the numbers file (same max_steps) are kept, not run again: an interrupted sweep goes on
    done = json.loads(numbers.read_text()) if numbers.is_file() else {}
    results: dict = done.get('results', {}) if done.get('max_steps') == args.max_steps else {}
    seconds = done.get('run_seconds', 0.0) if results else 0.0
    plan = [p for p in plan if str(p[3]) not in results.get(p[0], {}).get(p[1], {})]
    with tempfile.TemporaryDirectory() as runs_dir, ThreadPoolExecutor(args.jobs) as pool:
        futures = [(setting, label, n, pool.submit(run_one, keys, n, args.max_steps, runs_dir))
                   for setting, label, keys, n in plan]
        for setting, label, n, future in futures:
            r = future.result()
            results.setdefault(setting, {}).setdefault(label, {})[str(n)] = r
            seconds += r['seconds']
            numbers.write_text(json.dumps({'max_steps': args.max_steps, 'run_seconds': seconds,
                                           'results': results}, indent=1) + '\n')
            print(f"{setting[:9]}  {label:<34} S={n:<4} loss {r['loss']:.4f}  accuracy {r['accuracy']:.3f}  "
                  f"steps {r['step']:<5} {r['seconds']:.0f} s", flush=True)
    minutes = (time.time() - started) / 60
    note = (f'lazylab retrieval capacity sweep: hidden 64, batch 32, Adam 1e-3, stop at 0.001 or {args.max_steps} '
            f'steps; the runs took {seconds / 60:.0f} process-minutes (1 thread each)')
    plot(results, out, note)
    numbers.write_text(json.dumps({'note': note, 'max_steps': args.max_steps, 'run_seconds': seconds,
                                   'results': results}, indent=1) + '\n')
    print(f'{note}; {len(plan)} runs in {minutes:.1f} min wall now\nwrote {out} and {numbers}')


if __name__ == '__main__':
    main()
