#!/usr/bin/env bash
# The recipe searches of issue 29: one TPE search with median pruning per experiment, for a better 10-minute run on
# a 2-core CPU. Short trials first (5 minutes each, two at a time, one thread each); the best few are then confirmed
# as full 10-minute runs of `lazylab train EXPERIMENT …`, on an otherwise idle machine.
#
#     scripts/recipes.sh fast_weights            # one search: 32 trials of 5 minutes, at most 80 minutes of this machine
#     RECIPE_TRIALS=80 RECIPE_MINUTES=2 scripts/recipes.sh transformer   # the transformer's search (2026-12-03)
#     scripts/recipes.sh fast_weights --dry-run  # check the command and print the plan; nothing runs
#     lazylab sweep --resume runs/fast_weights/sweep-…   # go on with a search that was stopped
#     lazylab compare runs/fast_weights/sweep-… --sort final   # its table; `lazylab dashboard` shows the study
#
# Every key below is one a researcher would turn first: the learning rate and its warm-up, width, depth, heads, the
# FFN's width and kind, batch and sequence length, dropout, and each experiment's own (the fast-weight update rule,
# the transformer's FFN activation). Extra arguments go to `lazylab sweep` (e.g. --dry-run, --trials 20).
#
# Why 5 minutes: the transformer's search ran 80 trials of 2 minutes, and its winner (a quarter of the default's size,
# the model that learns fastest) overfitted in 10 minutes and lost to the default. A trial half as long as the run
# it stands for ranks models closer to how they end; 32 of them, half pruned, fit the same 80 minutes.
set -euo pipefail

experiment=${1:?usage: scripts/recipes.sh feedback|fast_weights|transformer [lazylab sweep flags…]}
shift
lazylab=${LAZYLAB:-lazylab}

trials=${RECIPE_TRIALS:-32}
minutes=${RECIPE_MINUTES:-5}
common=(--sampler tpe --prune median --trials "$trials" --workers 2 --seed 0
        "max_minutes=$minutes" threads=1 valid_interval=100
        'optimizer.learning_rate=tag(log, interval(1e-3, 1e-2))' 'optimizer.warmup=choice(0, 100, 300)'
        'd_model=choice(96, 128, 192, 256)' 'n_layers=choice(2, 3, 4, 6)' 'heads=choice(2, 4, 8)'
        'd_ff=choice(256, 512, 1024)' 'batch_size=choice(16, 32, 64)' 'dropout=choice(0.0, 0.1)')

case "$experiment" in
  feedback)
    # short sequences first (seq_len_start=16 seq_len_warmup=300) are left to the confirming 10-minute runs, with
    # and without: a 2-minute trial is over before such a warm-up would pay, and TPE cannot move the pair together
    exec "$lazylab" sweep feedback "${common[@]}" 'seq_len=choice(32, 64, 128)' "$@" ;;
  fast_weights)
    exec "$lazylab" sweep fast_weights "${common[@]}" 'seq_len=choice(64, 128, 256)' \
      'fast_weights.update_rule=choice(delta, gated_delta, delta_product)' 'fast_weights.ffn.is_gated=choice(false, true)' \
      "$@" ;;
  transformer)
    exec "$lazylab" sweep transformer "${common[@]}" 'seq_len=choice(64, 128, 256)' \
      'transformer.ffn.activation=choice(ReLU, GELU, SiLU)' 'transformer.ffn.is_gated=choice(false, true)' "$@" ;;
  *)
    echo "scripts/recipes.sh: unknown experiment '$experiment' (feedback, fast_weights or transformer)" >&2
    exit 2 ;;
esac
