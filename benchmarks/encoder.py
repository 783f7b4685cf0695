"""Transformer encoder forward + backward throughput: lazylab vs labml-nn 0.5.1, side by side in one process.

Both encoders are built from the same seed (so they hold the same weights) and run the same causal-masked batch
in training mode; the timed step is forward, a sum-of-squares loss, and backward. Runs alternate between the
models, in a rotating order, so that load on a shared machine affects all alike.

    python benchmarks/encoder.py            # seq_len 256, batch 8, d_model 128, 4 heads, 4 layers
    python benchmarks/encoder.py --quick    # tiny smoke run
"""
import argparse
import statistics
import time

import torch
from labml_nn.transformers import feed_forward as ref_ff  # noqa: E402
from labml_nn.transformers import mha as ref_mha
from labml_nn.transformers import models as ref_models

from lazylab.models import feed_forward, mha, transformer  # noqa: E402

import _reference  # noqa: F401  (lets labml_nn run on labml 0.5.3)


def build(lib_mha, lib_ff, lib_models, args, dropout, seed=0, **mha_kwargs):
    torch.manual_seed(seed)
    layer = lib_models.TransformerLayer(
        d_model=args.d_model,
        self_attn=lib_mha.MultiHeadAttention(args.heads, args.d_model, dropout, **mha_kwargs),
        feed_forward=lib_ff.FeedForward(args.d_model, 4 * args.d_model, dropout),
        dropout_prob=dropout)
    return lib_models.Encoder(layer, args.n_layers).train()


def step(model, x, mask):
    model(x, mask).pow(2).mean().backward()
    model.zero_grad(set_to_none=True)


def measure(models, x, mask, steps, repeats):
    """Median tokens/s of each model over `repeats` rounds of `steps` steps, rounds interleaved."""
    for model in models.values():  # warm up
        step(model, x, mask)
    times = {name: [] for name in models}
    names = list(models)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order each round
            model = models[name]
            start = time.perf_counter()
            for _ in range(steps):
                step(model, x, mask)
            times[name].append(time.perf_counter() - start)
    tokens = x.shape[0] * x.shape[1] * steps
    return {name: tokens / statistics.median(t) for name, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='tiny smoke run')
    parser.add_argument('--seq-len', type=int, default=256)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--d-model', type=int, default=128)
    parser.add_argument('--heads', type=int, default=4)
    parser.add_argument('--n-layers', type=int, default=4)
    parser.add_argument('--steps', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--threads', type=int, default=2)
    args = parser.parse_args(argv)
    if args.quick:
        args.seq_len, args.batch_size, args.d_model, args.heads, args.n_layers = 16, 2, 32, 4, 1
        args.steps, args.repeats = 1, 3
    torch.set_num_threads(args.threads)

    x = torch.randn(args.seq_len, args.batch_size, args.d_model)
    mask = mha.subsequent_mask(args.seq_len)
    for dropout in (0.0, 0.1):
        models = {
            'labml_nn': build(ref_mha, ref_ff, ref_models, args, dropout),
            'lazylab (SDPA)': build(mha, feed_forward, transformer, args, dropout),
            'lazylab (explicit, use_sdpa=False)': build(mha, feed_forward, transformer, args, dropout,
                                                        use_sdpa=False),
        }
        rates = measure(models, x, mask, args.steps, args.repeats)
        print(f"encoder fwd+bwd, seq_len {args.seq_len}, batch {args.batch_size}, d_model {args.d_model}, "
              f"{args.heads} heads, {args.n_layers} layers, causal mask, dropout {dropout} "
              f"(CPU, {args.threads} threads, median of {args.repeats})")
        base = rates['labml_nn']
        for name, rate in rates.items():
            print(f"  {name:<36} {rate / base:5.2f}x   {rate:,.0f} tok/s")


if __name__ == '__main__':
    main()
