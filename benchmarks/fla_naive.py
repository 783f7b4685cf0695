"""The gated delta rule and DeltaProduct: lazylab's chunked kernels vs flash-linear-attention's own pure-PyTorch
chunked reference, side by side in one process (on the CPU; fla's fast kernels are Triton, for GPUs only).

For each seq_len, forward + backward of the kernel alone (loss = Σ y), rows timed round-robin (median of --reps):

    fla naive_chunk_gated_delta (64)   fla-core 0.6.0's `naive_chunk_gated_delta_rule`, chunk 64 (the 1.00x row)
    lazylab gated delta chunked (C)    `gated_delta_rule_chunked`, for each C of --chunk-sizes (16)
    lazylab delta rule chunked (C)     `delta_rule_chunked`: ours without the gate (what the gate costs)
    lazylab DeltaProduct n_h 2 (C)     `delta_product_chunked` with the gate, two writes per token (C per chunk)
    lazylab gated delta loop           `gated_delta_rule_loop`, the token loop (the reference), with --loop
    lazylab DeltaProduct loop          `delta_product_loop` with the gate, its token loop, with --loop

Inputs as Gated DeltaNet feeds them: L2-normalised q and k, β = σ(·), g = log σ(·) < 0; fla is called with
scale = 1 (ours has no scaling of q) and its [batch, seq_len, heads, d] layout, made before the clock starts.
fla-core is loaded by file path (`lazylab.models.fast_weights.fla_reference`), so Triton is never imported.

    python benchmarks/fla_naive.py                    # seq_len 256 and 1024, batch 16, 4 heads, d 32, 1 thread
    python benchmarks/fla_naive.py --loop --cpu-time  # with the token loop; CPU time (steadier under load)
    python benchmarks/fla_naive.py --quick            # tiny smoke run
"""
import argparse

import torch

from lazylab.models.fast_weights.delta_product import delta_product_chunked, delta_product_loop
from lazylab.models.fast_weights.delta_rule import delta_rule_chunked
from lazylab.models.fast_weights.fla_reference import FlaMissing, load_naive
from lazylab.models.fast_weights.gated_delta_rule import gated_delta_rule_chunked, gated_delta_rule_loop

from _harness import add_common_options, conditions, configure, median_rates, report


def inputs(seq_len, batch, heads, d, seed=0, householder_steps=2):
    """Sequence-first q, k, v, β, g (ours), and DeltaProduct's keys, values and βs."""
    g = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    q = torch.nn.functional.normalize(normal(seq_len, batch, heads, d), dim=-1)
    k = torch.nn.functional.normalize(normal(seq_len, batch, heads, d), dim=-1)
    v = normal(seq_len, batch, heads, d)
    beta = torch.sigmoid(normal(seq_len, batch, heads))
    log_decay = torch.nn.functional.logsigmoid(normal(seq_len, batch, heads) + 2)
    n_h = householder_steps
    product = (torch.nn.functional.normalize(normal(seq_len, n_h, batch, heads, d), dim=-1),
               normal(seq_len, n_h, batch, heads, d), torch.sigmoid(normal(seq_len, n_h, batch, heads)))
    return (q, k, v, beta, log_decay), product


def fwd_bwd(fn, tensors):
    """A callable: fresh leaves, forward, Σ y backward."""
    def run():
        leaves = [t.detach().requires_grad_() for t in tensors]
        y = fn(*leaves)[0]
        y.sum().backward()
    return run


def bench(seq_len, batch, heads, d, chunk_sizes, reps, naive, with_loop):
    (q, k, v, beta, g), (k_p, v_p, beta_p) = inputs(seq_len, batch, heads, d)
    first = lambda x: x.transpose(0, 1).contiguous()  # noqa: E731  (fla's [batch, seq_len, heads, d])
    fla_inputs = [first(x) for x in (q, k, v, g, beta)]
    fns = {
        'fla naive_chunk_gated_delta (64)': fwd_bwd(
            lambda q, k, v, g, b: naive.naive_chunk_gated_delta_rule(q, k, v, g, b, chunk_size=64, scale=1.0),
            fla_inputs),
    }
    for c in chunk_sizes:
        fns[f'lazylab gated delta chunked ({c})'] = fwd_bwd(
            lambda *a, c=c: gated_delta_rule_chunked(*a, chunk_size=c), (q, k, v, beta, g))
    for c in chunk_sizes:
        fns[f'lazylab delta rule chunked ({c})'] = fwd_bwd(
            lambda *a, c=c: delta_rule_chunked(*a, chunk_size=c), (q, k, v, beta))
    for c in chunk_sizes:
        fns[f'lazylab DeltaProduct n_h 2 ({c})'] = fwd_bwd(
            lambda *a, c=c: delta_product_chunked(*a, chunk_size=c), (q, k_p, v_p, beta_p, g))
    if with_loop:
        fns['lazylab gated delta loop'] = fwd_bwd(gated_delta_rule_loop, (q, k, v, beta, g))
        fns['lazylab DeltaProduct loop'] = fwd_bwd(delta_product_loop, (q, k_p, v_p, beta_p, g))
    rates = median_rates(fns, reps, seq_len * batch)
    report(f"gated delta rule forward+backward, seq_len {seq_len}, batch {batch}, {heads} heads, d {d} "
           f"{conditions(reps)}", rates, 'tok/s')
    return rates


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser, threads=1)
    parser.add_argument('--seq-lens', type=int, nargs='+', default=[256, 1024])
    parser.add_argument('--chunk-sizes', type=int, nargs='+', default=[16], help="our kernels' chunk sizes")
    parser.add_argument('--loop', action='store_true', help='also time the token loop (slow)')
    args = parser.parse_args(argv)
    configure(args, reference_loaded=True)  # (labml_nn is not needed here)
    try:
        naive = load_naive('gated_delta_rule')
    except FlaMissing as e:
        raise SystemExit(f'fla_naive: {e}') from None
    if args.quick:
        bench(40, 2, 2, 8, [16], 1, naive, args.loop)
        return
    for seq_len in args.seq_lens:
        bench(seq_len, 16, 4, 32, args.chunk_sizes, args.reps, naive, args.loop)


if __name__ == '__main__':
    main()
