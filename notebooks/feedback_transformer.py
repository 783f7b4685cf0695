# ---
# jupyter:
#   accelerator: GPU
#   colab:
#     provenance: []
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: accelerator,colab
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Feedback transformer on Tiny Shakespeare
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/lazylab/lazylab/blob/main/notebooks/feedback_transformer.ipynb)
#
# The Feedback Transformer (Fan, Lavril, Grave, Joulin & Sukhbaatar 2020, "Addressing Some Limitations of
# Transformers with Feedback Memory") lets every layer attend to a memory of the *top* layers' representations
# of earlier tokens, not just the layer below. The price is that it runs token by token; the gain is a
# shallow model that can keep and update a state over the whole text.
#
# This notebook installs lazylab, configures the `feedback` experiment, trains it on Tiny Shakespeare with a
# live loss plot, reports the validation loss, generates text incrementally (the memory is carried, so each
# character costs one step), looks at the learned memory, and reloads the run's checkpoint. With a GPU
# (Runtime → Change runtime type) it trains a larger model; on a CPU it uses small settings.

# %%
# Setup: install lazylab if this kernel cannot import it, then pick the device.
# REPO_URL is a placeholder until the project is published: put the repository's URL here, or set
# LAZYLAB_SOURCE to a local checkout (e.g. '/content/lazylab' after `!git clone URL` or an upload).
REPO_URL = 'https://github.com/lazylab/lazylab'
LAZYLAB_SOURCE = ''  # '' → a checkout around this notebook if there is one, else git+REPO_URL

import importlib.util
import subprocess
import sys
from pathlib import Path

IN_COLAB = 'google.colab' in sys.modules


def _lazylab_source() -> str:
    if LAZYLAB_SOURCE:
        return LAZYLAB_SOURCE
    for folder in (Path.cwd(), Path.cwd().parent):  # the repository root, or its notebooks/ folder
        if (folder / 'pyproject.toml').is_file() and (folder / 'lazylab' / '__init__.py').is_file():
            return str(folder)
    return 'git+' + REPO_URL


if importlib.util.find_spec('lazylab') is None:
    source = _lazylab_source()
    print(f'installing lazylab from {source} …')
    # a regular (not editable) install: it is importable in this kernel without a restart
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', source], check=True)
    importlib.invalidate_caches()

import torch

import lazylab

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
GPU = DEVICE == 'cuda'
where = 'Colab' if IN_COLAB else 'local'
print(f'lazylab from {Path(lazylab.__file__).parent} ({where}); torch {torch.__version__}; device {DEVICE}'
      + (f' ({torch.cuda.get_device_name(0)})' if GPU else ' (no GPU: small CPU settings)'))

# %% tags=["parameters"]
# Parameters: the run's sizes; GPU values when there is one (the tests replace all of these with tiny ones).
STEPS = 1000 if GPU else 400          # optimizer steps
BATCH_SIZE = 32 if GPU else 16        # sequences per step
SEQ_LEN = 128 if GPU else 64          # characters per sequence
D_MODEL = 256 if GPU else 64          # model width
HEADS = 4                             # attention heads
D_FF = 1024 if GPU else 128           # feed-forward hidden width
N_LAYERS = 4 if GPU else 2            # layers
LEARNING_RATE = 3e-3                  # peak learning rate (AdamW, warm-up, then cosine decay)
VALID_EVERY = 200 if GPU else 100     # steps between validations (and checkpoints)
LOG_EVERY = 10                        # steps between loss records (plot updates)
VALID_BATCHES = 0 if GPU else 10      # batches per validation (0: the whole validation split)
SAMPLE_TOKENS = 300 if GPU else 150   # characters to generate
RUNS_DIR = ''                         # where runs go ('' → a new temporary folder)

# %% [markdown]
# ## Configure
#
# The experiment's config is built exactly as `lazylab train feedback key=value …` builds it: the same keys,
# the same checks. `prepare` then computes everything a run needs (data, model, optimizer), so a mistake in an
# override fails here, before anything is written. The run directory goes under `RUNS_DIR`.

# %%
import tempfile
import time

from lazylab.experiments.configure import make_configs, prepare
from lazylab.experiments.lifecycle import parameter_count, start_run

EXPERIMENT = 'feedback'
if not RUNS_DIR:
    RUNS_DIR = tempfile.mkdtemp(prefix='lazylab-runs-')

OVERRIDES = [
    f'device={DEVICE}', f'runs_dir={RUNS_DIR}', 'seed=0',
    f'max_steps={STEPS}', 'epochs=1000', 'max_minutes=0',  # stop after STEPS steps, no time budget
    f'batch_size={BATCH_SIZE}', f'seq_len={SEQ_LEN}',
    f'd_model={D_MODEL}', f'heads={HEADS}', f'd_ff={D_FF}', f'n_layers={N_LAYERS}',
    f'valid_interval={VALID_EVERY}', f'log_interval={LOG_EVERY}',
    f'valid_batches={VALID_BATCHES}', f'final_valid_batches={VALID_BATCHES}',
    f'sample_tokens={SAMPLE_TOKENS}', f'optimizer.learning_rate={LEARNING_RATE}',
    'model=feedback_transformer_kv',  # or 'model=feedback_transformer'
]
print(f'lazylab train {EXPERIMENT} ' + ' '.join(OVERRIDES))

conf = make_configs(EXPERIMENT, OVERRIDES)
prepare(conf)  # seeds torch, then builds the data, the model and the optimizer
model = conf.model
print(f'{type(getattr(model, "transformer", model)).__name__}: {parameter_count(model):,} parameters on {DEVICE}; '
      f'{conf.total_steps} steps of {conf.batch_size}×{conf.seq_len} characters')

# %% [markdown]
# ## Train, with a live loss plot
#
# `lazylab.experiments.trainer.train` is the same loop `lazylab train` runs: forward (token by token through the
# feedback memory), cross-entropy, backward, gradient clipping, an optimizer and scheduler step. It validates every
# `VALID_EVERY` steps (printing a sample of generated text) and writes `checkpoint.pt` then.

# %%
from lazylab.experiments.plot import LiveLossPlot  # the loss plot, redrawn at every metrics record
from lazylab.experiments.trainer import train

run_dir = start_run(conf, EXPERIMENT, OVERRIDES)  # as `lazylab train`: configs.yaml and run.json

plot = LiveLossPlot(f'{EXPERIMENT}, d_model {D_MODEL}, {N_LAYERS} layers')
started = time.time()
last = train(conf, run_dir, labml_run=plot)
print(f'{conf.total_steps} steps in {time.time() - started:.0f} s; the plot was redrawn {plot.updates} times')

# %% [markdown]
# ## Validation loss
#
# The last record holds the final validation (over `VALID_BATCHES` batches of the validation split, or all of it
# when 0). Cross-entropy in nats per character; divided by ln 2 it is bits per character.

# %%
import math

print(f"validation loss {last['loss.valid']:.4f} nats/char = {last['loss.valid'] / math.log(2):.3f} bits/char, "
      f"accuracy {last['accuracy.valid']:.3f}  (a uniform guess: {math.log(conf.n_tokens):.3f} nats/char)")
assert math.isfinite(last['loss.valid'])

# %% [markdown]
# ## Generate text, incrementally
#
# `model.generate` carries the core transformer's state (the keys and values of the feedback memory) from one
# character to the next, so each new character costs one step instead of a pass over the whole prefix. The next cell
# checks that the step-by-step path gives the same logits as one pass over the whole text, and times both ways of
# generating.

# %%
tokenizer = conf.dataset.tokenizer
prompt = tokenizer.encode(conf.prompt).to(DEVICE)
g = torch.Generator(device=DEVICE).manual_seed(0)
ids = model.generate(prompt, SAMPLE_TOKENS, temperature=0.8, top_k=20, generator=g)
print(tokenizer.decode(ids.cpu()))

# %%
# one pass over the whole text vs. one character at a time with the carried state
x = ids[:, None]  # [seq_len, batch_size=1]
model.eval()
with torch.no_grad():
    whole, _ = model(x)
    state, pieces = None, []
    for i in range(len(x)):
        logits, state = model.forward_with_state(x[i:i + 1], state)
        pieces.append(logits)
stepwise = torch.cat(pieces)
print(f'max |whole − step by step| over {len(x)} positions: {(whole - stepwise).abs().max().item():.2e}')
torch.testing.assert_close(stepwise, whole, rtol=1e-3, atol=1e-3)  # float32 rounding


n_new = min(SAMPLE_TOKENS, 100)  # re-running the prefix costs O(n²): keep the comparison short


def seconds(**kwargs):
    if GPU:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(prompt, n_new, temperature=0, **kwargs)  # greedy
    if GPU:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


t_state, with_state = seconds(use_state=True)
t_prefix, rerun = seconds(use_state=False)
print(f'{n_new} characters: {n_new / t_state:,.0f} chars/s with the state, '
      f'{n_new / t_prefix:,.0f} chars/s re-running the prefix ({t_prefix / t_state:.1f}× slower); '
      f'same greedy text: {torch.equal(with_state, rerun)}')

# %% [markdown]
# ## The feedback memory
#
# At every step the model stores one memory vector, a softmax-weighted mix of the token's embedding and all of its
# layer outputs, m_τ = Σₗ softmax(w)ₗ x_τˡ (paper eq. 4); every layer of later steps attends to these vectors. The
# mixing weights w are learned: here is where the trained model takes its memory from.

# %%
core = model.transformer
mix = torch.softmax(core.weights.detach().float(), dim=0).cpu()
labels = ['embedding'] + [f'layer {i + 1}' for i in range(len(mix) - 1)]
for label, w in zip(labels, mix.tolist()):
    print(f'  {label:<10} {w:.3f}  ' + '█' * round(40 * w))
assert abs(mix.sum().item() - 1) < 1e-5

# %% [markdown]
# The memory never changes once written, so lazylab computes the keys and values of each memory vector once and
# writes them into a growing buffer; `reference_forward` is the plain loop of the reference implementation, which
# re-stacks the memory at every step. Both give the same outputs on a validation batch; the buffer is faster.

# %%
import statistics

from lazylab.data import SequentialLoader
from lazylab.models.feedback.reference import reference_forward

x, _ = next(iter(SequentialLoader(conf.dataset.valid, seq_len=conf.seq_len, batch_size=conf.batch_size,
                                  max_batches=1)))
x = x.to(DEVICE)
model.eval()


def median_seconds(fn, repeats=3):
    times = []
    for _ in range(repeats):
        if GPU:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if GPU:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


with torch.no_grad():
    embedded = model.src_embed(x)  # [seq_len, batch_size, d_model]
    t_fast, fast = median_seconds(lambda: core(embedded))
    t_ref, reference = median_seconds(lambda: reference_forward(core, embedded))
print(f'max |buffered memory − reference loop| over a {tuple(x.shape)} batch: '
      f'{(fast - reference).abs().max().item():.1e}')
torch.testing.assert_close(fast, reference, rtol=1e-3, atol=1e-3)  # float32 rounding
tokens = x.numel()
print(f'reference loop {tokens / t_ref:,.0f} tokens/s, buffered memory {tokens / t_fast:,.0f} tokens/s '
      f'({t_ref / t_fast:.1f}x)')

# %% [markdown]
# ## Save and reload a checkpoint
#
# At every validation the trainer wrote `checkpoint.pt` (model, optimizer, scheduler, random-number states and
# data position; written to a temporary file, then renamed), next to `configs.yaml`, `metrics.jsonl` and
# `samples.txt`. Reloading needs nothing else: `open_run` replays `configs.yaml` into a fresh config, and the
# checkpoint's weights go into the model it builds. The reloaded model gives the same validation loss.
# This is what `lazylab generate RUN_DIR …` and `lazylab resume RUN_DIR` do. (In Colab, copy `run_dir` to your
# Drive to keep it.)

# %%
from contextlib import nullcontext

from lazylab.data import SequentialLoader
from lazylab.experiments.generation import generate
from lazylab.experiments.replay import open_run
from lazylab.experiments.trainer import evaluate, load_checkpoint
from lazylab.runs import CHECKPOINT_PT

print(run_dir)
for path in sorted(run_dir.iterdir()):
    if path.is_file():
        print(f'  {path.name:<14} {path.stat().st_size:>10,} bytes')

name, conf2, _ = open_run(run_dir)        # a fresh config, replayed from configs.yaml
checkpoint = load_checkpoint(run_dir / CHECKPOINT_PT)
torch.manual_seed(123)                    # a different initialisation, overwritten just below
model2 = conf2.model
model2.load_state_dict(checkpoint['model'])
print(f"reloaded the checkpoint of step {checkpoint['position']['step']} into a new {type(model2).__name__}")

valid = SequentialLoader(conf.dataset.valid, seq_len=conf.seq_len, batch_size=conf.batch_size,
                         max_batches=VALID_BATCHES or None)
trained = evaluate(model, valid, torch.device(DEVICE), nullcontext)
reloaded = evaluate(model2, valid, torch.device(DEVICE), nullcontext)
print(f"validation loss: trained {trained['loss']:.6f}, reloaded {reloaded['loss']:.6f}")
assert math.isclose(reloaded['loss'], trained['loss'], rel_tol=1e-6)
assert math.isclose(trained['loss'], last['loss.valid'], rel_tol=1e-5)

# %%
# the command-line path: `lazylab generate RUN_DIR --prompt "It is" --tokens N --temperature 0.8 --seed 0`
print(generate(str(run_dir), conf.prompt, SAMPLE_TOKENS, temperature=0.8, seed=0))
