# ---
# jupyter:
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
# # A tour of lazylab's lazy configs
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/lazylab/lazylab/blob/main/notebooks/configs_tour.ipynb)
#
# `lazylab.configs` is a lazy configuration engine (a drop-in for `labml.configs`): a config class declares
# *items* with types and defaults; *options* are named functions that compute an item from other items; and
# nothing is computed until it is read. This notebook walks through:
#
# 1. lazy options: only what you read gets built;
# 2. aggregates: one choice (`glu_variant='SwiGLU'`) that sets several items (the GLU variants of Shazeer 2020);
# 3. sub-configs and dotted overrides (`transformer.ffn.glu_variant=SwiGLU`), typed from text;
# 4. provenance: where every value came from;
# 5. mistakes: a typo gets a one-line error with a suggestion;
# 6. dumping a configuration to YAML and replaying it.
#
# It runs on a CPU in well under a minute.

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
# Parameters: sizes of the models built below (tests replace these with tiny values).
D_MODEL = 64    # model width
HEADS = 4       # attention heads
N_LAYERS = 2    # transformer layers
D_FF = 128      # feed-forward hidden width
SEQ_LEN = 64    # characters per sequence

# %% [markdown]
# ## 1. Items, options, and laziness
#
# A config class lists its items as annotated attributes. An item whose default is a string names one of its
# *options*; an item without a default is computed by its first option. The options below print when they run,
# so you can see that reading `conf.layer` builds the activation and the layer, and nothing else.

# %%
from torch import nn

from lazylab.configs import BaseConfigs, option


class Toy(BaseConfigs):
    d_model: int = 16
    activation: nn.Module = 'ReLU'   # names one of the options below
    layer: nn.Module                 # no default: computed by its (first) option
    report: str = 'expensive'        # never read below, so never computed

@option(Toy.activation, 'ReLU')
def _relu():
    print('  computing activation: ReLU')
    return nn.ReLU()

@option(Toy.activation, 'GELU')
def _gelu():
    print('  computing activation: GELU')
    return nn.GELU()

@option(Toy.layer, 'linear')
def _linear(c: Toy):
    activation = c.activation   # reading an item computes it (once)
    print(f'  computing layer from d_model={c.d_model} and {activation}')
    return nn.Sequential(nn.Linear(c.d_model, c.d_model), activation)

@option(Toy.report, 'expensive')
def _report(c: Toy):
    raise RuntimeError('never called: nothing reads `report`')

toy = Toy()
print('created Toy() — nothing computed yet')
toy._set_values({'activation': 'GELU', 'd_model': 8})   # choose an option by name, override a number
print('reading toy.layer:')
print(toy.layer)
print('reading it again (cached, nothing recomputed):', type(toy.layer).__name__)

# %% [markdown]
# ## 2. Aggregates: the GLU variants
#
# `FeedForwardConfigs.glu_variant` is an *aggregate* selector: choosing `'SwiGLU'` sets `is_gated=True`, turns
# off the three biases and picks the SiLU activation, in one go (Shazeer 2020, "GLU Variants Improve
# Transformer"). An item you set yourself wins over the aggregate.

# %%
from lazylab.configs.transformer import FeedForwardConfigs

print(f'{"glu_variant":<11} {"activation":<26} gated  bias1  bias2  parameters')
for variant in ['none', 'GLU', 'Bilinear', 'ReGLU', 'GEGLU', 'SwiGLU']:
    ffn_conf = FeedForwardConfigs()
    ffn_conf._set_values({'d_model': D_MODEL, 'd_ff': D_FF, 'glu_variant': variant})
    ffn = ffn_conf.ffn
    n = sum(p.numel() for p in ffn.parameters())
    print(f'{variant:<11} {str(ffn.activation):<26} {ffn_conf.is_gated!s:<6} {ffn_conf.bias1!s:<6} '
          f'{ffn_conf.bias2!s:<6} {n:,}')

# %%
from lazylab.configs import explain, format_explain

ffn_conf = FeedForwardConfigs()
ffn_conf._set_values({'d_model': D_MODEL, 'glu_variant': 'SwiGLU', 'bias1': True})  # bias1 set explicitly
ffn = ffn_conf.ffn  # reading it computes it and the items it reads
print(format_explain(explain(ffn_conf)))
assert ffn_conf.bias1 is True and ffn_conf.bias2 is False  # the explicit value wins, the rest follow SwiGLU

# %% [markdown]
# ## 3. Sub-configs and dotted overrides
#
# An experiment's config holds sub-configs: the `transformer` experiment has `transformer` (a
# `TransformerConfigs`, which has `ffn`, a `FeedForwardConfigs`) and `optimizer`. Dotted keys reach into them,
# exactly as on the command line (`lazylab train transformer transformer.ffn.glu_variant=SwiGLU …`).
# Text is typed by each item's declared type; `parse_overrides` shows the typed values without applying them.

# %%
from lazylab.configs import parse_overrides
from lazylab.experiments.configure import make_configs

OVERRIDES = [f'd_model={D_MODEL}', f'heads={HEADS}', f'n_layers={N_LAYERS}', f'd_ff={D_FF}',
             f'seq_len={SEQ_LEN}', 'device=cpu',
             'transformer.ffn.glu_variant=SwiGLU',      # two levels down
             'transformer.encoder_attn=relative',       # an option of a sub-config
             'optimizer.learning_rate=3e-4']
print('equivalent command line:\n  lazylab train transformer ' + ' '.join(OVERRIDES))

conf = make_configs('transformer', OVERRIDES)
print('typed:', parse_overrides(['d_model=256', 'dropout=0.1', 'transformer.ffn.glu_variant=GEGLU'], conf))

torch.manual_seed(0)
model = conf.model   # builds the data vocabulary, the transformer sub-config, its FFN sub-config, …
print(f'{type(model).__name__}: {sum(p.numel() for p in model.parameters()):,} parameters')
print('first layer FFN:', model.encoder.layers[0].feed_forward)
print('first layer attention:', type(model.encoder.layers[0].self_attn).__name__)

# %% [markdown]
# ## 4. Provenance of every value
#
# `explain(conf)` tells, for every computed item (sub-config items by their dotted path), where its value came
# from — an override, an option (and what selected it), an aggregate, a `set_default` of the parent config, a
# class default — and which items its calculator read.

# %%
report = explain(conf)
print(format_explain(report))

# %%
# the same information as data
for key in ['d_model', 'transformer.ffn.activation', 'transformer.ffn.d_model', 'transformer.src_embed']:
    row = report[key]
    print(f'{key:<28} source={row["source"]:<12} detail={row["detail"]!s:<22} value={row["value"]}')
assert report['transformer.ffn.activation']['source'] == 'aggregate'
assert report['d_model']['source'] == 'override'

# %% [markdown]
# ## 5. Mistakes get one-line errors with suggestions
#
# Unknown keys, unknown option names and values of the wrong type raise a `ConfigError` subclass whose message
# names the full config path and suggests the nearest name. Overrides are all-or-nothing: when one is wrong,
# none is applied. On the command line the same message is printed as `lazylab: error: …` with exit code 2.

# %%
from lazylab.configs import ConfigError, apply_overrides

fresh = make_configs('transformer', ['device=cpu'])
for bad in [{'d_modle': 128},                              # a typo in a key
            {'transformer.ffn.activation': 'gleu'},        # a typo in an option name
            {'heads': 'four'},                             # not an int
            {'d_model': 256, 'dropout': 'high'}]:          # the good one is not applied either
    try:
        apply_overrides(fresh, bad)
    except ConfigError as e:
        print(f'{type(e).__name__}: {e}')

# %%
# all-or-nothing: the last batch above had a valid d_model=256, but it was not applied
print('d_model is still the default:', fresh.d_model)
assert fresh.d_model == 128

# a key inside a sub-config that is not built yet is checked when the sub-config is built
later = make_configs('transformer', ['device=cpu', 'transformer.n_heds=2'])
try:
    _ = later.transformer  # building the sub-config applies its overrides
except ConfigError as e:
    print(f'{type(e).__name__}: {e}')

# a value that was already computed cannot change under you
try:
    apply_overrides(conf, {'d_model': 512})
except ConfigError as e:
    print(f'{type(e).__name__}: {e}')

# what the command line prints (run_cli is the CLI's error handler)
import contextlib
import io

from lazylab.errors import run_cli

err = io.StringIO()
with contextlib.redirect_stderr(err):
    exit_code = run_cli(make_configs, 'transformer', ['d_modle=128'])
print(f'exit code {exit_code}:', err.getvalue().strip())
assert exit_code == 2

# %% [markdown]
# Every key, with its type, default, options and help (the comment beside its declaration), is listed by
# `lazylab options NAME`; here the keys of the FFN sub-config:

# %%
from lazylab.configs import describe, format_description
from lazylab.experiments.listing import options_text

rows = describe(type(conf))   # one row per key, sub-config keys by dotted path
print(format_description([r for r in rows if r['name'].startswith('transformer.ffn.')]))
n_lines = len(options_text('transformer').splitlines())
print(f'… {len(rows)} keys in all; `lazylab options transformer` prints {n_lines} lines')

# %% [markdown]
# ## 6. Dump and replay
#
# `dump(conf)` writes every computed value as YAML: plain values as themselves and option-computed values by
# their option's name, so `load(fresh_conf, text)` replays the same selections. Objects that cannot be written
# as text (the aggregate's activation module) are listed under `objects` for reading only; replay recomputes
# them from the same selections. Every training run writes such a `configs.yaml` to its run directory.

# %%
from lazylab.configs import dump, load

text = dump(conf)
print('\n'.join(text.splitlines()[:20]) + '\n…')

# %%
replayed = type(conf)()
load(replayed, text)
torch.manual_seed(0)          # same seed as the original build
model_again = replayed.model

same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model_again.state_dict().values()))
print('replayed model has identical parameters:', same)
print('replayed dump is identical:', dump(replayed) == text)
assert same and dump(replayed) == text
print('provenance after replay:', explain(replayed)['transformer.ffn.glu_variant']['source'])
