"""Fast Weights Transformer: lazylab vs labml-nn 0.5.1 (and a softmax transformer of the same size), one process.

Three measurements, each printed as ratios to the first row (medians over the repetitions; models are timed
round-robin so that load on the machine hits them alike):

1. the attention module alone, `FastWeightsAttention` forward + backward: labml_nn's token loop vs our
   reference loop and our chunkwise-parallel kernel;
2. the whole model, training tokens/s (forward, cross-entropy, backward, Adam step) of an `AutoregressiveModel`
   (65 tokens) around: labml_nn's `FastWeightsAttentionTransformer`, ours (chunked), and a softmax transformer
   of the same size (lazylab's pre-norm `TransformerLayer`s with causal `MultiHeadAttention`);
3. generation: 128 new tokens after a 16-token prompt, batch 1, greedy: labml_nn's re-run-the-whole-prefix
   sampling vs ours with the fast weights carried (`generate`: one `step_function` call per token);
4. `rules`: every feature map × update rule of the paper (DPFP ν=1, ELU + 1, FAVOR+ m=32 × delta, sum with
   attention normalisation) and the successors (L2-SiLU × the gated delta rule, DeltaProduct n_h = 2 with and
   without the gate; DPFP × the gated delta rule), `FastWeightsAttention` forward + backward: the token loop
   (`kernel='loop'`) vs the chunked kernel, at each --rules-seq-len (256); --rules picks the rules.

    python benchmarks/fast_weights.py            # d_model 128, 4 heads, d_ff 512, 4 layers, ν 1, batch 16,
                                                 # seq_len 128, 256, 512, 1024
    python benchmarks/fast_weights.py --quick    # tiny smoke run
    python benchmarks/fast_weights.py --skip attention training generation --threads 1 \
        --rules gated_delta delta_product --rules-seq-len 256 1024     # the successors' rows, one thread
"""
import argparse

import torch
from torch import nn

from lazylab.models import fast_weights as ours
from lazylab.models.autoregressive import AutoregressiveModel
from lazylab.models.feed_forward import FeedForward
from lazylab.models.mha import MultiHeadAttention, subsequent_mask
from lazylab.models.transformer import TransformerLayer

from _harness import add_common_options, conditions, configure, median_rates, report, train_step

try:
    from labml_nn.transformers import fast_weights as ref
    from labml_nn.transformers.feed_forward import FeedForward as RefFeedForward

    import _reference  # noqa: F401  (lets labml_nn run on labml 0.5.3)
except ImportError:  # pragma: no cover - the reference is a test/benchmark dependency
    ref = None

N_VOCAB = 65


def build_fast_weights(mod, ff_cls, d_model, heads, d_ff, n_layers, nu, **attn_kwargs):
    attn = mod.FastWeightsAttention(heads, d_model, 0.0, mod.DPFP(nu=nu), **attn_kwargs)
    layer = mod.FastWeightsAttentionTransformerLayer(d_model=d_model, attn=attn,
                                                     feed_forward=ff_cls(d_model, d_ff, 0.0), dropout_prob=0.0)
    return AutoregressiveModel(N_VOCAB, d_model, mod.FastWeightsAttentionTransformer(layer, n_layers))


class CausalSoftmaxTransformer(nn.Module):
    """The baseline: pre-norm softmax-attention layers with a causal mask, and a final LayerNorm."""

    def __init__(self, d_model, heads, d_ff, n_layers):
        super().__init__()
        self.layers = nn.ModuleList(
            TransformerLayer(d_model=d_model, self_attn=MultiHeadAttention(heads, d_model, 0.0),
                             feed_forward=FeedForward(d_model, d_ff, 0.0), dropout_prob=0.0)
            for _ in range(n_layers))
        self.norm = nn.LayerNorm([d_model])

    def forward(self, x):
        mask = subsequent_mask(x.shape[0], x.device)
        for layer in self.layers:
            x = layer(x=x, mask=mask)
        return self.norm(x)


def bench_attention(seq_lens, batch, d_model, heads, nu, chunk_size, reps, ref_max_len):
    for seq_len in seq_lens:
        torch.manual_seed(0)
        theirs = ref.FastWeightsAttention(heads, d_model, 0.0, ref.DPFP(nu=nu))
        loop = ours.FastWeightsAttention(heads, d_model, 0.0, ours.DPFP(nu=nu), kernel='loop')
        chunked = ours.FastWeightsAttention(heads, d_model, 0.0, ours.DPFP(nu=nu), chunk_size=chunk_size)
        for m in (loop, chunked):
            m.load_state_dict(theirs.state_dict())
        x = torch.randn(seq_len, batch, d_model, requires_grad=True)
        fns = {}
        if seq_len <= ref_max_len:
            fns['labml_nn token loop'] = theirs
            fns['lazylab loop'] = loop
        fns[f'lazylab chunked ({chunk_size})'] = chunked

        def fwd_bwd(module, x=x):
            def run():
                module(x).sum().backward()
            return run

        rates = median_rates({name: fwd_bwd(m) for name, m in fns.items()}, reps, seq_len * batch)
        report(f"FastWeightsAttention forward+backward, seq_len {seq_len}, batch {batch}, d_model {d_model}, "
               f"{heads} heads, nu {nu} {conditions(reps)}", rates, 'tok/s')


#: the rows of `bench_rules`: (feature map, update rule, the attention's other arguments)
RULE_ROWS = [(phi, rule, {'attention_normalization': rule == 'sum'}) for phi in ('dpfp', 'linear', 'favor')
             for rule in ('delta', 'sum')]
RULE_ROWS += [('l2', 'gated_delta', {}), ('dpfp', 'gated_delta', {}), ('l2', 'delta_product', {}),
              ('l2', 'delta_product', {'gated': True})]


def bench_rules(seq_lens, batch, d_model, heads, chunk_size, reps, rules):
    """Loop vs chunked for every row of RULE_ROWS whose rule is in `rules` (no labml_nn: it has only DPFP with the
    delta rule)."""
    d_k = d_model // heads
    for seq_len in seq_lens:
        for phi_name, rule, kwargs in RULE_ROWS:
            if rule not in rules:
                continue

            def build(kernel, phi_name=phi_name, rule=rule, kwargs=kwargs):
                torch.manual_seed(0)
                phi = ours.make_feature_map(phi_name, d_k, nu=1, features=32)
                return ours.FastWeightsAttention(heads, d_model, 0.0, phi, kernel=kernel, chunk_size=chunk_size,
                                                 update_rule=rule, **kwargs)
            loop, chunked = build('loop'), build('chunked')
            x = torch.randn(seq_len, batch, d_model, requires_grad=True)

            def fwd_bwd(module, x=x):
                def run():
                    module(x).sum().backward()
                return run

            rates = median_rates({'lazylab loop': fwd_bwd(loop), f'lazylab chunked ({chunk_size})': fwd_bwd(chunked)},
                                 reps, seq_len * batch)
            what = ', '.join([f'{phi_name} × {rule} rule'] + [k if v is True else f'{k}={v}'
                                                              for k, v in kwargs.items() if v])
            report(f"{what}, FastWeightsAttention forward+backward, seq_len {seq_len}, batch {batch}, d_model "
                   f"{d_model}, {heads} heads {conditions(reps)}", rates, 'tok/s')


def bench_training(seq_lens, batch, sizes, nu, chunk_sizes, reps, ref_max_len):
    d_model, heads, d_ff, n_layers = sizes
    for seq_len in seq_lens:
        torch.manual_seed(0)
        theirs = build_fast_weights(ref, RefFeedForward, *sizes, nu)
        models = {}
        if seq_len <= ref_max_len:
            models['labml_nn fast weights'] = theirs
        for chunk_size in chunk_sizes:
            mine = build_fast_weights(ours, FeedForward, *sizes, nu, chunk_size=chunk_size)
            mine.load_state_dict(theirs.state_dict())
            models[f'lazylab fast weights, chunked ({chunk_size})'] = mine
        softmax_model = AutoregressiveModel(N_VOCAB, d_model, CausalSoftmaxTransformer(*sizes))
        models['softmax transformer (lazylab)'] = softmax_model
        rates = median_rates({n: train_step(m, seq_len, batch, N_VOCAB) for n, m in models.items()}, reps,
                             seq_len * batch)
        report(f"fast weights training (forward+loss+backward+Adam), seq_len {seq_len}, batch {batch}, d_model "
               f"{d_model}, {heads} heads, d_ff {d_ff}, {n_layers} layers, nu {nu} {conditions(reps)}", rates, 'tok/s')
        softmax = rates['softmax transformer (lazylab)']
        for name, rate in rates.items():
            if name.startswith('lazylab'):
                print(f"  -> {name} / softmax transformer: {rate / softmax:.2f}x")


def bench_generation(prompt_len, new_tokens, sizes, nu, reps):
    torch.manual_seed(0)
    theirs = build_fast_weights(ref, RefFeedForward, *sizes, nu).eval()
    mine = build_fast_weights(ours, FeedForward, *sizes, nu).eval()
    mine.load_state_dict(theirs.state_dict())
    prompt = torch.randint(0, N_VOCAB, (prompt_len,), generator=torch.Generator().manual_seed(2))

    def rerun_everything():
        # labml_nn's samplers: run the model on the whole sequence so far for every new token
        ids = prompt.unsqueeze(-1)
        with torch.no_grad():
            for _ in range(new_tokens):
                logits, _ = theirs(ids)
                ids = torch.cat([ids, logits[-1].argmax(-1).unsqueeze(0)])
        return ids.squeeze(-1)

    out_ref = rerun_everything()
    out_ours = mine.generate(prompt, new_tokens, temperature=0)
    if not torch.equal(out_ref, out_ours):
        print('  warning: greedy outputs differ between labml_nn and lazylab')
    rates = median_rates({'labml_nn, re-run whole prefix': rerun_everything,
                          'lazylab, carried fast weights': lambda: mine.generate(prompt, new_tokens, temperature=0)},
                         reps, new_tokens)
    d_model, heads, d_ff, n_layers = sizes
    report(f"fast weights generation, {new_tokens} new tokens after a {prompt_len}-token prompt, batch 1, d_model "
           f"{d_model}, {heads} heads, d_ff {d_ff}, {n_layers} layers {conditions(reps)}", rates, 'tok/s')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser)
    parser.add_argument('--seq-lens', type=int, nargs='+', default=[128, 256, 512, 1024])
    parser.add_argument('--chunk-size', type=int, default=ours.DEFAULT_CHUNK_SIZE)
    parser.add_argument('--training-chunk-sizes', type=int, nargs='+', default=None,
                        help='chunk sizes of the training comparison (default: --chunk-size)')
    parser.add_argument('--ref-max-len', type=int, default=1024,
                        help='skip the (slow) labml_nn token loop above this seq_len')
    parser.add_argument('--skip', nargs='*', default=[], choices=['attention', 'training', 'generation', 'rules'])
    parser.add_argument('--rules-seq-len', type=int, nargs='+', default=[256], help='seq_len of the rules comparison')
    parser.add_argument('--rules', nargs='+', default=list(ours.UPDATE_RULES), choices=ours.UPDATE_RULES,
                        help='the update rules of the rules comparison')
    args = parser.parse_args(argv)
    configure(args, ref is not None)
    if args.quick:
        sizes, nu, batch, seq_lens, reps, gen = (32, 4, 64, 2), 1, 4, [16, 40], 1, (4, 8)
    else:
        sizes, nu, batch, seq_lens, reps, gen = (128, 4, 512, 4), 1, 16, args.seq_lens, args.reps, (16, 128)
    if 'attention' not in args.skip:
        bench_attention(seq_lens, batch, sizes[0], sizes[1], nu, args.chunk_size, reps, args.ref_max_len)
    if 'training' not in args.skip:
        bench_training(seq_lens, batch, sizes, nu, args.training_chunk_sizes or [args.chunk_size], reps,
                       args.ref_max_len)
    if 'generation' not in args.skip:
        bench_generation(*gen, sizes, nu, reps)
    if 'rules' not in args.skip:
        bench_rules([16] if args.quick else args.rules_seq_len, batch, sizes[0], sizes[1], args.chunk_size, reps,
                    args.rules)


if __name__ == '__main__':
    main()
