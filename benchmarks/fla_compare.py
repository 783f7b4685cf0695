"""Optional: our chunkwise delta rule vs flash-linear-attention's `chunk_delta_rule` (Triton), on a CUDA GPU.

Never part of CI. Needs CUDA and `pip install flash-linear-attention` (package `fla`); without them it prints why
and exits 0.

Matching the two: fla computes oₜ = Sₜᵀ (scale · qₜ) with S = Wᵀ ([d_k, d_v] per head) and scale = 1/√d_k by
default; our delta rule (like labml_nn's) has no scaling, so fla is called with scale=1.0. Inputs are
sum-normalised DPFP-like features for q and k and β ∈ (0, 1). fla works in bf16/fp16 (some versions refuse
float32), so both get the same bf16 inputs; ours computes in float32 from them, and the comparison reports the
max difference relative to max |o| (expected ≲ 1e-2 for bf16).

    python benchmarks/fla_compare.py [--quick] [--dtype bf16|fp16] [--seq-lens 256 1024 4096]
"""
import argparse
import inspect
import statistics
import sys
import time

import torch

from lazylab.models.fast_weights.delta_rule import delta_rule_chunked


def load_fla():
    """fla's chunk_delta_rule, or a reason it cannot run here."""
    if not torch.cuda.is_available():
        return None, 'CUDA is not available'
    try:
        from fla.ops.delta_rule import chunk_delta_rule
    except ImportError as e:
        return None, f'flash-linear-attention is not installed ({e}); pip install flash-linear-attention'
    return chunk_delta_rule, None


def call_fla(fn, q, k, v, beta, state):
    """q, k, v: [seq_len, batch, heads, d] (ours); returns o [seq_len, batch, heads, d_v] and W [b, h, d_v, d_dot]."""
    params = inspect.signature(fn).parameters
    s0 = None if state is None else state.transpose(-1, -2).float().contiguous()  # fla's state is S = Wᵀ
    if 'head_first' in params:  # [B, T, H, K] with head_first=False
        to = lambda x: x.permute(1, 0, *range(2, x.dim())).contiguous()  # noqa: E731
        o, s = fn(to(q), to(k), to(v), to(beta), scale=1.0, initial_state=s0, output_final_state=True,
                  head_first=False)
        o = o.permute(1, 0, 2, 3)
    else:  # oldest API: [B, H, T, K]
        to = lambda x: x.permute(1, 2, 0, *range(3, x.dim())).contiguous()  # noqa: E731
        o, s = fn(to(q), to(k), to(v), to(beta), scale=1.0, initial_state=s0, output_final_state=True)
        o = o.permute(2, 0, 1, 3)
    return o, s.transpose(-1, -2)


def inputs(seq_len, batch, heads, d_dot, d_v, dtype, device):
    g = torch.Generator(device='cpu').manual_seed(seq_len)
    f = lambda: torch.rand(seq_len, batch, heads, d_dot, generator=g)  # noqa: E731
    q, k = f(), f()
    q, k = q / q.sum(-1, keepdim=True), k / k.sum(-1, keepdim=True)
    v = torch.randn(seq_len, batch, heads, d_v, generator=g)
    beta = torch.rand(seq_len, batch, heads, generator=g)
    state = 0.1 * torch.randn(batch, heads, d_v, d_dot, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, beta)] + [state.to(device)]


def timed(fn, reps):
    times = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true')
    parser.add_argument('--dtype', choices=['bf16', 'fp16'], default='bf16')
    parser.add_argument('--seq-lens', type=int, nargs='+', default=[256, 1024, 4096])
    parser.add_argument('--reps', type=int, default=10)
    args = parser.parse_args(argv)
    fla_fn, why = load_fla()
    if fla_fn is None:
        print(f'fla_compare: skipped: {why}')
        return 0
    dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}[args.dtype]
    batch, heads, d_dot, d_v = (2, 2, 64, 64) if args.quick else (16, 4, 64, 64)
    seq_lens = [128] if args.quick else args.seq_lens
    for seq_len in seq_lens:
        q, k, v, beta, state = inputs(seq_len, batch, heads, d_dot, d_v, dtype, 'cuda')
        o_fla, s_fla = call_fla(fla_fn, q, k, v, beta, state)
        o_ours, s_ours = delta_rule_chunked(q.float(), k.float(), v.float(), beta.float(), state, chunk_size=64)
        err_o = ((o_fla.float() - o_ours).abs().max() / o_ours.abs().max()).item()
        err_s = ((s_fla.float() - s_ours).abs().max() / s_ours.abs().max()).item()

        def run(fn, inputs=(q, k, v, beta)):
            def go():
                xs = [t.detach().clone().requires_grad_() for t in inputs]
                o, _ = fn(*xs)
                o.float().sum().backward()
            return go

        t_fla = timed(run(lambda *xs: call_fla(fla_fn, *xs, None)), args.reps)
        t_ours = timed(run(lambda *xs: delta_rule_chunked(*xs, None, chunk_size=64)), args.reps)
        tokens = seq_len * batch
        print(f"delta rule forward+backward, seq_len {seq_len}, batch {batch}, {heads} heads, d_k {d_dot}, "
              f"d_v {d_v}, {args.dtype} ({torch.cuda.get_device_name()}, median of {args.reps})")
        print(f"  fla chunk_delta_rule             1.00x   {tokens / t_fla:12.0f} tok/s")
        print(f"  lazylab delta_rule_chunked (64)  {t_fla / t_ours:5.2f}x   {tokens / t_ours:12.0f} tok/s")
        print(f"  max |o_fla − o_ours| / max |o| = {err_o:.2e};  final state: {err_s:.2e}")
        sys.stdout.flush()
    return 0


if __name__ == '__main__':
    sys.exit(main())
