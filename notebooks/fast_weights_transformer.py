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
# # Fast-weights transformer on Tiny Shakespeare
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/lazylab/lazylab/blob/main/notebooks/fast_weights_transformer.ipynb)
#
# A linear transformer whose attention is a *fast weight programmer* (Schlag, Irie & Schmidhuber 2021,
# "Linear Transformers Are Secretly Fast Weight Programmers"): each layer keeps a matrix of fast weights that
# it updates with the delta rule at every token, instead of attending over all past tokens. Its memory has a
# fixed size, so generating each new character costs the same, however long the text.
#
# This notebook installs lazylab, configures the `fast_weights` experiment, trains it on Tiny Shakespeare with
# a live loss plot, reports the validation loss, generates text incrementally, compares the chunkwise-parallel
# and step-by-step delta rule, and reloads the run's checkpoint. With a GPU (Runtime → Change runtime type)
# it trains a larger model; on a CPU it uses small settings and finishes in a few minutes.

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
STEPS = 1500 if GPU else 600          # optimizer steps
BATCH_SIZE = 32 if GPU else 16        # sequences per step
SEQ_LEN = 256 if GPU else 64          # characters per sequence
D_MODEL = 256 if GPU else 64          # model width
HEADS = 4                             # attention heads
D_FF = 1024 if GPU else 128           # feed-forward hidden width
N_LAYERS = 4 if GPU else 2            # layers
LEARNING_RATE = 3e-3                  # peak learning rate (AdamW, warm-up, then cosine decay)
VALID_EVERY = 250 if GPU else 150     # steps between validations (and checkpoints)
LOG_EVERY = 10                        # steps between loss records (plot updates)
VALID_BATCHES = 0 if GPU else 20      # batches per validation (0: the whole validation split)
SAMPLE_TOKENS = 300 if GPU else 150   # characters to generate
KERNEL_SEQ_LEN = 2048 if GPU else 512 # delta-rule comparison: tokens …
KERNEL_BATCH = 16 if GPU else 4       # … sequences
CHUNK_SIZE = 64 if GPU else 16        # … and tokens per chunk of the chunkwise kernel
RUNS_DIR = ''                         # where runs go ('' → a new temporary folder)

# %% [markdown]
# ## Configure
#
# The experiment's config is built exactly as `lazylab train fast_weights key=value …` builds it: the same keys,
# the same checks. `prepare` then computes everything a run needs (data, model, optimizer), so a mistake in an
# override fails here, before anything is written. The run directory goes under `RUNS_DIR`.

# %%
import tempfile
import time

from lazylab.experiments.configure import make_configs, prepare
from lazylab.experiments.lifecycle import parameter_count, start_run

EXPERIMENT = 'fast_weights'
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
    'fast_weights.kernel=chunked', f'fast_weights.chunk_size={CHUNK_SIZE}',
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
# `lazylab.experiments.trainer.train` is the same loop `lazylab train` runs: forward, cross-entropy, backward,
# gradient clipping, an optimizer and scheduler step. It validates every `VALID_EVERY` steps (printing a sample of
# generated text) and writes `checkpoint.pt` then.

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
# `model.generate` carries the core transformer's state (each layer's fast weights) from one character to the next, so
# each new character costs one step instead of a pass over the whole prefix. The next cell checks that the
# step-by-step path gives the same logits as one pass over the whole text, and times both ways of generating.

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
# ## The delta rule: chunkwise-parallel vs. step by step
#
# Each head keeps fast weights W (a d_v × d_dot matrix) and, for every token, writes the value vᵢ under the key
# φ'(kᵢ), replacing a β-weighted part of what was stored there, then reads with the query:
#
#     v̄ᵢ = W⁽ⁱ⁻¹⁾ φ'(kᵢ),   W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + βᵢ (vᵢ − v̄ᵢ) ⊗ φ'(kᵢ),   yᵢ = W⁽ⁱ⁾ φ'(qᵢ)
#
# `delta_rule_step` does one token (what generation uses); `delta_rule_loop` is the same equations over a
# sequence, the slow reference; `delta_rule_chunked` computes the same outputs chunk by chunk (Yang et al. 2024,
# WY/UT form), carrying W only between chunks. Below: the same random input through all three; outputs and final
# fast weights agree to float32 rounding (and to float64 rounding in float64); then their speed, side by side.

# %%
from lazylab.models.fast_weights import DPFP
from lazylab.models.fast_weights.delta_rule import delta_rule_chunked, delta_rule_loop, delta_rule_step


def step_by_step(q, k, v, beta):
    """The recurrent form: one `delta_rule_step` per token, carrying the fast weights."""
    state, ys = None, []
    for i in range(q.shape[0]):
        y, state = delta_rule_step(q[i], k[i], v[i], beta[i], state)
        ys.append(y)
    return torch.stack(ys), state


torch.manual_seed(0)
d_k = D_MODEL // HEADS
shape = (KERNEL_SEQ_LEN, KERNEL_BATCH, HEADS, d_k)  # sequence first: [seq_len, batch, heads, d_k]
phi = DPFP(nu=1)                                     # the feature map φ' (d_dot = 2·d_k), sums to one
q, k = phi(torch.randn(shape, device=DEVICE)), phi(torch.randn(shape, device=DEVICE))
v = torch.randn(shape, device=DEVICE)
beta = torch.sigmoid(torch.randn(shape[:3], device=DEVICE))

y_step, w_step = step_by_step(q, k, v, beta)
y_loop, w_loop = delta_rule_loop(q, k, v, beta)
y_chunk, w_chunk = delta_rule_chunked(q, k, v, beta, chunk_size=CHUNK_SIZE)
print(f'float32, {KERNEL_SEQ_LEN} tokens × {KERNEL_BATCH} sequences × {HEADS} heads, d_dot {q.shape[-1]}:')
print(f'  max |chunked − step by step|: outputs {(y_chunk - y_step).abs().max().item():.1e}, '
      f'fast weights {(w_chunk - w_step).abs().max().item():.1e}   (outputs up to {y_step.abs().max().item():.2f})')
print(f'  max |loop − step by step|:    outputs {(y_loop - y_step).abs().max().item():.1e}')
torch.testing.assert_close(y_chunk, y_step, rtol=1e-4, atol=1e-4)
torch.testing.assert_close(w_chunk, w_step, rtol=1e-4, atol=1e-4)
torch.testing.assert_close(y_loop, y_step, rtol=1e-4, atol=1e-4)

q64, k64, v64, beta64 = (t.double() for t in (q, k, v, beta))
diff64 = (delta_rule_chunked(q64, k64, v64, beta64, chunk_size=CHUNK_SIZE)[0]
          - step_by_step(q64, k64, v64, beta64)[0]).abs().max().item()
print(f'float64: max |chunked − step by step| = {diff64:.1e}')
assert diff64 < 1e-10

# %%
import statistics


def median_seconds(fn, repeats=5):
    times = []
    for _ in range(repeats):
        if GPU:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if GPU:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


tokens = KERNEL_SEQ_LEN * KERNEL_BATCH
with torch.no_grad():
    kernels = {'step by step': lambda: step_by_step(q, k, v, beta),
               'loop (reference)': lambda: delta_rule_loop(q, k, v, beta),
               f'chunked ({CHUNK_SIZE})': lambda: delta_rule_chunked(q, k, v, beta, chunk_size=CHUNK_SIZE)}
    times = {name: median_seconds(fn) for name, fn in kernels.items()}
base = times['step by step']
print(f'delta rule, seq_len {KERNEL_SEQ_LEN}, batch {KERNEL_BATCH}, {HEADS} heads, d_k {d_k} '
      f'({DEVICE}, median of 5)')
for name, t in times.items():
    print(f'  {name:<18} {base / t:6.2f}x   {tokens / t:>12,.0f} tokens/s')

# %% [markdown]
# The trained model computes its delta rule with the chunkwise kernel (`fast_weights.kernel=chunked`, the
# default); `set_kernel` switches it, and the logits stay the same:

# %%
from lazylab.data import SequentialLoader

x, _ = next(iter(SequentialLoader(conf.dataset.valid, seq_len=conf.seq_len, batch_size=conf.batch_size,
                                  max_batches=1)))
x = x.to(DEVICE)
model.eval()
logits = {}
with torch.no_grad():
    for kernel in ('chunked', 'loop', 'step'):
        model.transformer.set_kernel(kernel)
        logits[kernel] = model(x)[0]
model.transformer.set_kernel(conf.fast_weights.kernel)
for kernel in ('loop', 'step'):
    print(f"max |logits with {kernel} − with chunked|: {(logits[kernel] - logits['chunked']).abs().max().item():.1e}")
    torch.testing.assert_close(logits[kernel], logits['chunked'], rtol=1e-3, atol=1e-3)  # float32 rounding

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
