"""What the side-by-side benchmarks share: common options, the clock, round-robin medians, the training step and the
report format (`python benchmarks/NAME.py`; see fast_weights.py and feedback.py).
"""
import argparse
import statistics
import sys
import time
from typing import Callable

import torch
from torch import nn

CLOCK = time.perf_counter  # --cpu-time switches to time.process_time (this process's CPU seconds)


def add_common_options(parser: argparse.ArgumentParser, reps: int = 5, threads: int = 2):
    parser.add_argument('--quick', action='store_true', help='tiny smoke run')
    parser.add_argument('--reps', type=int, default=reps)
    parser.add_argument('--threads', type=int, default=threads)
    parser.add_argument('--cpu-time', action='store_true',
                        help='time with process CPU seconds instead of wall time: steadier on a loaded machine '
                             '(use with --threads 1, where CPU time is the work done)')


def configure(args: argparse.Namespace, reference_loaded: bool):
    """Apply --cpu-time and --threads; stop with a one-line message when labml-nn is missing."""
    global CLOCK
    if not reference_loaded:
        raise SystemExit('labml-nn 0.5.1 is needed for the side-by-side benchmark (pip install labml-nn==0.5.1)')
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)


def conditions(reps: int) -> str:
    """The bracket every title ends with: '(CPU, 2 threads, median of 5[, CPU time])'."""
    cpu_time = ', CPU time' if CLOCK is time.process_time else ''
    return f"(CPU, {torch.get_num_threads()} threads, median of {reps}{cpu_time})"


def median_rates(fns: dict[str, Callable[[], object]], reps: int, work: float) -> dict[str, float]:
    """{name: work / median seconds}, timing the callables round-robin (so load hits them alike) after one
    warm-up call each."""
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            start = CLOCK()
            fn()
            times[name].append(CLOCK() - start)
    return {name: work / statistics.median(t) for name, t in times.items()}


def train_step(model: nn.Module, seq_len: int, batch: int, n_vocab: int) -> Callable[[], None]:
    """One training step of an AutoregressiveModel on fixed random tokens: forward, cross-entropy, backward, Adam."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    data = torch.randint(0, n_vocab, (seq_len + 1, batch), generator=torch.Generator().manual_seed(1))
    loss_fn = nn.CrossEntropyLoss()

    def step():
        logits, _ = model(data[:-1])
        loss = loss_fn(logits.reshape(-1, n_vocab), data[1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if hasattr(model.transformer, 'free'):  # labml_nn's feedback models keep their memory until freed
            model.transformer.free()

    return step


def report(title: str, rates: dict[str, float], unit: str):
    """The title, then one row per entry: its ratio to the first entry and its rate."""
    print(title)
    base = next(iter(rates.values()))
    for name, value in rates.items():
        print(f"  {name:<34} {value / base:6.2f}x   {value:10.1f} {unit}")
    sys.stdout.flush()
