"""The diagonal-gate rules, the gated sum rule (Mamba-2's SSD, RetNet with a learned decay) and GLA: lazylab's chunked
kernels against their own token loops and flash-linear-attention's pure-PyTorch references, side by side in one
process (on the CPU; fla's fast kernels are Triton, for GPUs only).

For each seq_len and rule, forward + backward of the kernel alone (loss = Σ y), rows timed round-robin (median of
--reps), the token loop first (the 1.00x row: every other ratio is a speed-up over it):

    lazylab gated sum loop              `gated_sum_loop`, the token loop (the reference)
    lazylab gated sum chunked (C)       `gated_sum_chunked`, for each C of --chunk-sizes
    fla naive_chunk_simple_gla (64)     fla-core 0.6.0's chunked reference for the same rule, chunk 64
    fla naive_recurrent_simple_gla      its token loop
    lazylab GLA loop                    `gla_loop`, the token loop (the reference)
    lazylab GLA chunked (C)             `gla_chunked`, for each C of --chunk-sizes
    fla naive_recurrent_gla             fla-core's GLA reference, a token loop (fla has no pure-PyTorch chunked GLA)

Inputs: L2-normalised q and k, g = log σ(·) < 0 (per head for the gated sum rule, per key channel for GLA); fla is
called with scale = 1 where it has the argument (its GLA reference always scales q by d^-1/2: the same work) and
its [batch, seq_len, heads, d] layout, made before the clock starts. fla-core is loaded by file path
(`lazylab.models.fast_weights.fla_reference`), so Triton is never imported; without fla-core its rows are left out.

    python benchmarks/diagonal_gates.py                # seq_len 256 and 1024, batch 16, 4 heads, d 32, 1 thread
    python benchmarks/diagonal_gates.py --cpu-time     # CPU time (steadier under load)
    python benchmarks/diagonal_gates.py --quick        # tiny smoke run
"""
import argparse

import torch

from lazylab.models.fast_weights.fla_reference import FlaMissing, load_naive
from lazylab.models.fast_weights.gated_sum import gated_sum_chunked, gated_sum_loop
from lazylab.models.fast_weights.gla import gla_chunked, gla_loop

from _harness import add_common_options, conditions, configure, median_rates, report


def inputs(seq_len, batch, heads, d, per_channel, seed=0):
    """Sequence-first q, k, v, g: g [seq_len, batch, heads] (the gated sum rule) or with d (GLA)."""
    gen = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    q = torch.nn.functional.normalize(normal(seq_len, batch, heads, d), dim=-1)
    k = torch.nn.functional.normalize(normal(seq_len, batch, heads, d), dim=-1)
    v = normal(seq_len, batch, heads, d)
    g = torch.nn.functional.logsigmoid(normal(seq_len, batch, heads, *((d,) if per_channel else ())) + 2)
    return q, k, v, g


def fwd_bwd(fn, tensors):
    """A callable: fresh leaves, forward, Σ y backward."""
    def run():
        leaves = [t.detach().requires_grad_() for t in tensors]
        y = fn(*leaves)[0]
        y.sum().backward()
    return run


def rows(rule, seq_len, batch, heads, d, chunk_sizes, naive):
    """{row name: callable} for one rule, the token loop first."""
    gla = rule == 'GLA'
    tensors = inputs(seq_len, batch, heads, d, per_channel=gla)
    loop, chunked = (gla_loop, gla_chunked) if gla else (gated_sum_loop, gated_sum_chunked)
    fns = {f'lazylab {rule} loop': fwd_bwd(loop, tensors)}
    for c in chunk_sizes:
        fns[f'lazylab {rule} chunked ({c})'] = fwd_bwd(lambda *a, c=c: chunked(*a, chunk_size=c), tensors)
    if naive is None:
        return fns
    fla_tensors = [x.transpose(0, 1).contiguous() for x in tensors]  # fla's [batch, seq_len, heads, d]
    if gla:
        fns['fla naive_recurrent_gla'] = fwd_bwd(naive.naive_recurrent_gla, fla_tensors)
    else:
        fns['fla naive_chunk_simple_gla (64)'] = fwd_bwd(
            lambda q, k, v, g: naive.naive_chunk_simple_gla(q, k, v, g, chunk_size=64, scale=1.0), fla_tensors)
        fns['fla naive_recurrent_simple_gla'] = fwd_bwd(
            lambda q, k, v, g: naive.naive_recurrent_simple_gla(q, k, v, g, scale=1.0), fla_tensors)
    return fns


def bench(seq_len, batch, heads, d, chunk_sizes, reps, naive):
    for rule, op in (('gated sum', 'simple_gla'), ('GLA', 'gla')):
        fns = rows(rule, seq_len, batch, heads, d, chunk_sizes, naive.get(op))
        rates = median_rates(fns, reps, seq_len * batch)
        report(f"{rule} forward+backward, seq_len {seq_len}, batch {batch}, {heads} heads, d {d} {conditions(reps)}",
               rates, 'tok/s')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser, threads=1)
    parser.add_argument('--seq-lens', type=int, nargs='+', default=[256, 1024])
    parser.add_argument('--chunk-sizes', type=int, nargs='+', default=[16, 32, 64], help="our kernels' chunk sizes")
    args = parser.parse_args(argv)
    configure(args, reference_loaded=True)  # (labml_nn is not needed here)
    naive = {}
    for op in ('simple_gla', 'gla'):
        try:
            naive[op] = load_naive(op)
        except FlaMissing as e:
            print(f'diagonal_gates: fla rows left out: {e}')
    if args.quick:
        bench(40, 2, 2, 8, [16], 1, naive)
        return
    for seq_len in args.seq_lens:
        bench(seq_len, 16, 4, 32, args.chunk_sizes, args.reps, naive)


if __name__ == '__main__':
    main()
