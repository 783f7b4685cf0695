"""KDA and the DPLR rule: lazylab's chunked kernels vs their token loops and flash-linear-attention's own pure-PyTorch
chunked references, side by side in one process (on the CPU; fla's fast kernels are Triton, for GPUs only).

For each seq_len, forward + backward of the kernel alone (loss = Σ y), rows timed round-robin (median of --reps):

    KDA
    lazylab KDA loop                   `kda_loop`, the token loop (the reference; the 1.00x row)
    lazylab KDA chunked (C)            `kda_chunked`, for each C of --chunk-sizes (8 16)
    fla naive_chunk_kda (64)           fla-core 0.6.0's `naive_chunk_kda`, chunk 64 (needs seq_len a multiple of it)
    lazylab gated delta chunked (16)   `gated_delta_rule_chunked` on the first channel's decay: what a decay per
                                       channel costs
    DPLR
    lazylab DPLR loop                  `dplr_loop` (the 1.00x row)
    lazylab DPLR chunked (C)           `dplr_chunked` (its backward is autograd's)
    fla dplr_chunkwise (32)            fla-core 0.6.0's `dplr_chunkwise`, chunk 32

Inputs as the layers feed them: KDA with L2-normalised q and k, β = σ(·), g = log σ(· + 2) per key channel; DPLR as
RWKV-7's, a = −κ̂, b = κ̂ ⊙ σ(·) for a unit key κ̂, g = −e^(−1/2) σ(·). fla is called with scale = 1 where it has
one (`dplr_chunkwise` scales q by d^(-1/2) whatever it is told, a cost of one multiplication) and its own layouts,
made before the clock starts. fla-core is loaded by file path (`lazylab.models.fast_weights.fla_reference`), so
Triton is never imported; without fla-core its rows are left out.

    python benchmarks/kda_dplr.py                    # seq_len 256 and 1024, batch 16, 4 heads, d 32, 1 thread
    python benchmarks/kda_dplr.py --cpu-time         # CPU time (steadier under load)
    python benchmarks/kda_dplr.py --quick            # tiny smoke run
"""
import argparse
import math

import torch

from lazylab.models.fast_weights.dplr import dplr_chunked, dplr_loop
from lazylab.models.fast_weights.fla_reference import FlaMissing, load_naive
from lazylab.models.fast_weights.gated_delta_rule import gated_delta_rule_chunked
from lazylab.models.fast_weights.kda import kda_chunked, kda_loop

from _harness import add_common_options, conditions, configure, median_rates, report


def kda_inputs(seq_len, batch, heads, d, seed=0):
    """Sequence-first q, k, v, β, g for KDA."""
    gen = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    q = torch.nn.functional.normalize(normal(seq_len, batch, heads, d), dim=-1)
    k = torch.nn.functional.normalize(normal(seq_len, batch, heads, d), dim=-1)
    v = normal(seq_len, batch, heads, d)
    beta = torch.sigmoid(normal(seq_len, batch, heads))
    g = torch.nn.functional.logsigmoid(normal(seq_len, batch, heads, d) + 2)
    return q, k, v, beta, g


def dplr_inputs(seq_len, batch, heads, d, seed=1):
    """Sequence-first q, k, v, a, b, g for the DPLR rule, as RWKV-7 makes them."""
    gen = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    q, k, v = (normal(seq_len, batch, heads, d) for _ in range(3))
    unit = torch.nn.functional.normalize(normal(seq_len, batch, heads, d), dim=-1)
    a, b = -unit, unit * torch.sigmoid(normal(seq_len, batch, heads, d))
    g = -math.exp(-0.5) * torch.sigmoid(normal(seq_len, batch, heads, d))
    return q, k, v, a, b, g


def fwd_bwd(fn, tensors):
    """A callable: fresh leaves, forward, Σ y backward."""
    def run():
        leaves = [t.detach().requires_grad_() for t in tensors]
        y = fn(*leaves)[0]
        y.sum().backward()
    return run


def bench_kda(seq_len, batch, heads, d, chunk_sizes, reps, naive, fla_chunk):
    q, k, v, beta, g = kda_inputs(seq_len, batch, heads, d)
    fns = {'lazylab KDA loop': fwd_bwd(kda_loop, (q, k, v, beta, g))}
    for c in chunk_sizes:
        fns[f'lazylab KDA chunked ({c})'] = fwd_bwd(lambda *a, c=c: kda_chunked(*a, chunk_size=c), (q, k, v, beta, g))
    if naive is not None and seq_len % fla_chunk == 0:
        first = lambda x: x.transpose(0, 1).contiguous()  # noqa: E731  (fla's [batch, seq_len, heads, d])
        fns[f'fla naive_chunk_kda ({fla_chunk})'] = fwd_bwd(
            lambda q, k, v, g, b: naive.naive_chunk_kda(q, k, v, g, b, scale=1.0, chunk_size=fla_chunk),
            [first(x) for x in (q, k, v, g, beta)])
    fns['lazylab gated delta chunked (16)'] = fwd_bwd(
        lambda *a: gated_delta_rule_chunked(*a, chunk_size=16), (q, k, v, beta, g[..., 0].contiguous()))
    rates = median_rates(fns, reps, seq_len * batch)
    report(f"KDA forward+backward, seq_len {seq_len}, batch {batch}, {heads} heads, d {d} {conditions(reps)}",
           rates, 'tok/s')
    return rates


def bench_dplr(seq_len, batch, heads, d, chunk_sizes, reps, naive, fla_chunk):
    q, k, v, a, b, g = dplr_inputs(seq_len, batch, heads, d)
    fns = {'lazylab DPLR loop': fwd_bwd(dplr_loop, (q, k, v, a, b, g))}
    for c in chunk_sizes:
        fns[f'lazylab DPLR chunked ({c})'] = fwd_bwd(lambda *x, c=c: dplr_chunked(*x, chunk_size=c),
                                                     (q, k, v, a, b, g))
    if naive is not None and seq_len % fla_chunk == 0:
        heads_first = lambda x: x.permute(1, 2, 0, 3).contiguous()  # noqa: E731  (fla's [batch, heads, seq_len, d])
        fns[f'fla dplr_chunkwise ({fla_chunk})'] = fwd_bwd(
            lambda *x: naive.dplr_chunkwise(*x, chunk_size=fla_chunk), [heads_first(x) for x in (q, k, v, a, b, g)])
    rates = median_rates(fns, reps, seq_len * batch)
    report(f"DPLR forward+backward, seq_len {seq_len}, batch {batch}, {heads} heads, d {d} {conditions(reps)}",
           rates, 'tok/s')
    return rates


def load(op):
    """fla-core's reference module of `op`, or None (its rows are left out) with a note saying why."""
    try:
        return load_naive(op)
    except FlaMissing as e:
        print(f'kda_dplr: fla-core rows left out: {e}')
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser, threads=1)
    parser.add_argument('--seq-lens', type=int, nargs='+', default=[256, 1024])
    parser.add_argument('--chunk-sizes', type=int, nargs='+', default=[8, 16], help="our kernels' chunk sizes")
    args = parser.parse_args(argv)
    configure(args, reference_loaded=True)  # (labml_nn is not needed here)
    kda_naive, dplr_naive = load('kda'), load('dplr')
    if args.quick:
        bench_kda(32, 2, 2, 8, [8], 1, kda_naive, 16)
        bench_dplr(32, 2, 2, 8, [8], 1, dplr_naive, 16)
        return
    for seq_len in args.seq_lens:
        bench_kda(seq_len, 16, 4, 32, args.chunk_sizes, args.reps, kda_naive, 64)
        bench_dplr(seq_len, 16, 4, 32, args.chunk_sizes, args.reps, dplr_naive, 32)


if __name__ == '__main__':
    main()
