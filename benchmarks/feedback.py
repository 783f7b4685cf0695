"""Feedback Transformer: training tokens/s and generation tokens/s, lazylab vs labml-nn 0.5.1, in one process.

Training step = forward, cross-entropy loss, backward, Adam step, for an `AutoregressiveModel` (embedding → core
→ logits, 65 tokens) around each core; both sides get identical weights. Models are measured round-robin so load
on the machine hits them alike; each figure is the median over the repetitions.

Memory span: lazylab's KV model attending to every earlier step and to the last N (`--span`, 64) only, at
`--span-seq-lens` (256 and 1024; labml-nn has no span, and its KV model stops at 512 steps).

Generation: 128 new tokens after a 16-token prompt, batch 1, greedy. labml-nn's way re-runs the model on the
whole growing sequence for every token; ours carries the key/value memory (`forward_with_state`).

    python benchmarks/feedback.py            # d_model 128, 4 heads, d_ff 512, 4 layers, batch 16, seq 128 and 256
    python benchmarks/feedback.py --skip-training --skip-generation --span 64 --span-seq-lens 256 1024
    python benchmarks/feedback.py --quick    # tiny smoke run
"""
import argparse

import torch
from torch import nn

from lazylab.models import feedback as ours
from lazylab.models.autoregressive import AutoregressiveModel
from lazylab.models.feed_forward import FeedForward

from _harness import add_common_options, conditions, configure, median_rates, report, train_step

try:
    from labml_nn.transformers import feedback as ref
    from labml_nn.transformers.feed_forward import FeedForward as RefFeedForward

    import _reference  # noqa: F401  (lets labml_nn run on labml 0.5.3)
except ImportError:  # pragma: no cover - the reference is a test/benchmark dependency
    ref = None

N_VOCAB = 65


def build(mod, ff_cls, kv: bool, d_model: int, heads: int, d_ff: int, n_layers: int, **span) -> nn.Module:
    attn = mod.FeedbackAttention(heads, d_model, 0.0, is_kv_precomputed=kv)
    layer = mod.FeedbackTransformerLayer(d_model=d_model, attn=attn, feed_forward=ff_cls(d_model, d_ff, 0.0),
                                         dropout_prob=0.0)
    core = (mod.FeedbackTransformerKV(layer, n_layers, d_model, heads, **span) if kv else
            mod.FeedbackTransformer(layer, n_layers, **span))
    return AutoregressiveModel(N_VOCAB, d_model, core)


def pairs(kv: bool, sizes):
    """(labml-nn model, lazylab model) with the same weights."""
    torch.manual_seed(0)
    r = build(ref, RefFeedForward, kv, *sizes)
    o = build(ours, FeedForward, kv, *sizes)
    o.load_state_dict(r.state_dict())
    return r, o


def bench_training(seq_lens, batch, sizes, reps, variants):
    d_model, heads, d_ff, n_layers = sizes
    tags = {kv: 'FeedbackTransformerKV' if kv else 'FeedbackTransformer' for kv in variants}
    for seq_len in seq_lens:
        steps = {}  # both variants timed in one round-robin, reported apart
        for kv in variants:
            r, o = pairs(kv, sizes)
            if kv or seq_len <= 512:
                steps[f'labml_nn {tags[kv]}'] = train_step(r, seq_len, batch, N_VOCAB)
            steps[f'lazylab {tags[kv]}'] = train_step(o, seq_len, batch, N_VOCAB)
        rates = median_rates(steps, reps, seq_len * batch)
        for tag in tags.values():
            report(f"feedback training (forward+loss+backward+Adam), {tag}, seq_len {seq_len}, batch {batch}, "
                   f"d_model {d_model}, {heads} heads, d_ff {d_ff}, {n_layers} layers {conditions(reps)}",
                   {name: rate for name, rate in rates.items() if name.endswith(' ' + tag)}, 'tok/s')
        if len(variants) == 2:  # the two lazylab variants, from the same round-robin
            report(f"feedback training, lazylab's two variants, seq_len {seq_len} {conditions(reps)}",
                   {f'lazylab {tags[kv]}': rates[f'lazylab {tags[kv]}'] for kv in (False, True)}, 'tok/s')


def bench_span(seq_lens, span, batch, sizes, reps):
    """lazylab's KV model with every earlier step in memory, and with the last `span` only."""
    d_model, heads, d_ff, n_layers = sizes
    for seq_len in seq_lens:
        steps = {}
        for name, kwargs in (('lazylab KV, memory_span 0 (all)', {}),
                             (f'lazylab KV, memory_span {span}', {'memory_span': span})):
            torch.manual_seed(0)
            steps[name] = train_step(build(ours, FeedForward, True, *sizes, **kwargs), seq_len, batch, N_VOCAB)
        report(f"feedback training with a memory span, seq_len {seq_len}, batch {batch}, d_model {d_model}, "
               f"{heads} heads, d_ff {d_ff}, {n_layers} layers {conditions(reps)}",
               median_rates(steps, reps, seq_len * batch), 'tok/s')


def bench_generation(prompt_len, new_tokens, sizes, reps):
    r, o = pairs(True, sizes)
    r.eval()
    o.eval()
    prompt = torch.randint(0, N_VOCAB, (prompt_len,), generator=torch.Generator().manual_seed(2))
    runs = {'labml_nn KV, re-run whole prefix': lambda: r.generate(prompt, new_tokens, 0, use_state=False),
            'lazylab KV, re-run whole prefix': lambda: o.generate(prompt, new_tokens, 0, use_state=False),
            'lazylab KV, incremental state': lambda: o.generate(prompt, new_tokens, 0)}
    if not torch.equal(r.generate(prompt, new_tokens, 0, use_state=False), o.generate(prompt, new_tokens, 0)):
        print('  warning: greedy outputs differ between labml_nn and lazylab')
    d_model, heads, d_ff, n_layers = sizes
    report(f"feedback generation, {new_tokens} new tokens after a {prompt_len}-token prompt, batch 1, d_model "
           f"{d_model}, {heads} heads, d_ff {d_ff}, {n_layers} layers {conditions(reps)}",
           median_rates(runs, reps, new_tokens), 'tok/s')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser)
    parser.add_argument('--seq-lens', type=int, nargs='+', default=[128, 256])
    parser.add_argument('--variant', choices=['kv', 'original', 'both'], default='both')
    parser.add_argument('--skip-generation', action='store_true')
    parser.add_argument('--skip-training', action='store_true')
    parser.add_argument('--span', type=int, default=0, help='also time memory_span SPAN against the full memory')
    parser.add_argument('--span-seq-lens', type=int, nargs='+', default=[256, 1024])
    args = parser.parse_args(argv)
    configure(args, ref is not None)
    variants = {'kv': [True], 'original': [False], 'both': [True, False]}[args.variant]
    if args.quick:
        sizes, batch, seq_lens, reps, gen, span_lens = (32, 4, 64, 2), 4, [16], 1, (4, 8), [24]
    else:
        sizes, batch, seq_lens, reps, gen, span_lens = (128, 4, 512, 4), 16, args.seq_lens, args.reps, (16, 128), \
            args.span_seq_lens
    if not args.skip_training:
        bench_training(seq_lens, batch, sizes, reps, variants)
    if args.span:
        bench_span(span_lens, args.span, batch, sizes, reps)
    if not args.skip_generation:
        bench_generation(*gen, sizes, reps)


if __name__ == '__main__':
    main()
