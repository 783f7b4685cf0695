"""Build the Colab notebooks in notebooks/ from the cell sources below (no outputs, no execution counts).

    python scripts/make_notebooks.py            # write notebooks/*.ipynb
    python scripts/make_notebooks.py --check    # exit 1 if a committed notebook differs from what this builds

Each notebook starts with the same two code cells:
  1. setup: installs lazylab when it is not importable (in Colab: `pip install git+REPO_URL`, or a local checkout
     found next to the notebook, or whatever LAZYLAB_SOURCE names) and picks the device (GPU when present);
  2. parameters (cell tag `parameters`, papermill's convention): the sizes of the run. The tests insert a cell
     right after it that replaces these values with tiny ones and runs everything on the CPU.

REPO_URL is a placeholder until the project has a public home; change it here and regenerate.
"""
import argparse
import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO_URL = 'https://github.com/lazylab/lazylab'  # placeholder: the repository's URL once published
BRANCH = 'main'
ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'


def colab_badge(name: str) -> str:
    slug = REPO_URL.split('github.com/', 1)[1]
    url = f'https://colab.research.google.com/github/{slug}/blob/{BRANCH}/notebooks/{name}'
    return f'[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})'


def md(text: str):
    return new_markdown_cell(textwrap.dedent(text).strip('\n'))


def code(text: str, tags=()):
    cell = new_code_cell(textwrap.dedent(text).strip('\n'))
    if tags:
        cell.metadata['tags'] = list(tags)
    return cell


SETUP = '''
# Setup: install lazylab if this kernel cannot import it, then pick the device.
# REPO_URL is a placeholder until the project is published: put the repository's URL here, or set
# LAZYLAB_SOURCE to a local checkout (e.g. '/content/lazylab' after `!git clone URL` or an upload).
REPO_URL = '__REPO_URL__'
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
        if (folder / 'setup.py').is_file() and (folder / 'lazylab' / '__init__.py').is_file():
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
'''.replace('__REPO_URL__', REPO_URL)


# ----------------------------------------------------------------------------------------------- configs tour

def configs_tour():
    name = 'configs_tour.ipynb'
    return [
        md(f'''
        # A tour of lazylab's lazy configs

        {colab_badge(name)}

        `lazylab.configs` is a lazy configuration engine (a drop-in for `labml.configs`): a config class declares
        *items* with types and defaults; *options* are named functions that compute an item from other items; and
        nothing is computed until it is read. This notebook walks through:

        1. lazy options: only what you read gets built;
        2. aggregates: one choice (`glu_variant='SwiGLU'`) that sets several items (the GLU variants of Shazeer 2020);
        3. sub-configs and dotted overrides (`transformer.ffn.glu_variant=SwiGLU`), typed from text;
        4. provenance: where every value came from;
        5. mistakes: a typo gets a one-line error with a suggestion;
        6. dumping a configuration to YAML and replaying it.

        It runs on a CPU in well under a minute.
        '''),
        code(SETUP),
        code('''
        # Parameters: sizes of the models built below (tests replace these with tiny values).
        D_MODEL = 64    # model width
        HEADS = 4       # attention heads
        N_LAYERS = 2    # transformer layers
        D_FF = 128      # feed-forward hidden width
        SEQ_LEN = 64    # characters per sequence
        ''', tags=['parameters']),
        md('''
        ## 1. Items, options, and laziness

        A config class lists its items as annotated attributes. An item whose default is a string names one of its
        *options*; an item without a default is computed by its first option. The options below print when they run,
        so you can see that reading `conf.layer` builds the activation and the layer, and nothing else.
        '''),
        code('''
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
        '''),
        md('''
        ## 2. Aggregates: the GLU variants

        `FeedForwardConfigs.glu_variant` is an *aggregate* selector: choosing `'SwiGLU'` sets `is_gated=True`, turns
        off the three biases and picks the SiLU activation, in one go (Shazeer 2020, "GLU Variants Improve
        Transformer"). An item you set yourself wins over the aggregate.
        '''),
        code('''
        from lazylab.configs.transformer import FeedForwardConfigs

        print(f'{"glu_variant":<11} {"activation":<26} gated  bias1  bias2  parameters')
        for variant in ['none', 'GLU', 'Bilinear', 'ReGLU', 'GEGLU', 'SwiGLU']:
            ffn_conf = FeedForwardConfigs()
            ffn_conf._set_values({'d_model': D_MODEL, 'd_ff': D_FF, 'glu_variant': variant})
            ffn = ffn_conf.ffn
            n = sum(p.numel() for p in ffn.parameters())
            print(f'{variant:<11} {str(ffn.activation):<26} {ffn_conf.is_gated!s:<6} {ffn_conf.bias1!s:<6} '
                  f'{ffn_conf.bias2!s:<6} {n:,}')
        '''),
        code('''
        from lazylab.configs import explain, format_explain

        ffn_conf = FeedForwardConfigs()
        ffn_conf._set_values({'d_model': D_MODEL, 'glu_variant': 'SwiGLU', 'bias1': True})  # bias1 set explicitly
        ffn_conf.ffn
        print(format_explain(explain(ffn_conf)))
        assert ffn_conf.bias1 is True and ffn_conf.bias2 is False  # the explicit value wins, the rest follow SwiGLU
        '''),
        md('''
        ## 3. Sub-configs and dotted overrides

        An experiment's config holds sub-configs: the `transformer` experiment has `transformer` (a
        `TransformerConfigs`, which has `ffn`, a `FeedForwardConfigs`) and `optimizer`. Dotted keys reach into them,
        exactly as on the command line (`lazylab train transformer transformer.ffn.glu_variant=SwiGLU …`).
        Text is typed by each item's declared type; `parse_overrides` shows the typed values without applying them.
        '''),
        code('''
        from lazylab.configs import parse_overrides
        from lazylab.experiments.runner import make_configs

        OVERRIDES = [f'd_model={D_MODEL}', f'heads={HEADS}', f'n_layers={N_LAYERS}', f'd_ff={D_FF}',
                     f'seq_len={SEQ_LEN}', 'device=cpu',
                     'transformer.ffn.glu_variant=SwiGLU',      # two levels down
                     'transformer.encoder_attn=relative',       # an option of a sub-config
                     'optimizer.learning_rate=3e-4']
        print('equivalent command line:\\n  lazylab train transformer ' + ' '.join(OVERRIDES))

        conf = make_configs('transformer', OVERRIDES)
        print('typed:', parse_overrides(['d_model=256', 'dropout=0.1', 'transformer.ffn.glu_variant=GEGLU'], conf))

        torch.manual_seed(0)
        model = conf.model   # builds the data vocabulary, the transformer sub-config, its FFN sub-config, …
        print(f'{type(model).__name__}: {sum(p.numel() for p in model.parameters()):,} parameters')
        print('first layer FFN:', model.encoder.layers[0].feed_forward)
        print('first layer attention:', type(model.encoder.layers[0].self_attn).__name__)
        '''),
        md('''
        ## 4. Provenance of every value

        `explain(conf)` tells, for every computed item (sub-config items by their dotted path), where its value came
        from — an override, an option (and what selected it), an aggregate, a `set_default` of the parent config, a
        class default — and which items its calculator read.
        '''),
        code('''
        report = explain(conf)
        print(format_explain(report))
        '''),
        code('''
        # the same information as data
        for key in ['d_model', 'transformer.ffn.activation', 'transformer.ffn.d_model', 'transformer.src_embed']:
            row = report[key]
            print(f'{key:<28} source={row["source"]:<12} detail={row["detail"]!s:<22} value={row["value"]}')
        assert report['transformer.ffn.activation']['source'] == 'aggregate'
        assert report['d_model']['source'] == 'override'
        '''),
        md('''
        ## 5. Mistakes get one-line errors with suggestions

        Unknown keys, unknown option names and values of the wrong type raise a `ConfigError` subclass whose message
        names the full config path and suggests the nearest name. Overrides are all-or-nothing: when one is wrong,
        none is applied. On the command line the same message is printed as `lazylab: error: …` with exit code 2.
        '''),
        code('''
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
        '''),
        code('''
        # all-or-nothing: the last batch above had a valid d_model=256, but it was not applied
        print('d_model is still the default:', fresh.d_model)
        assert fresh.d_model == 128

        # a key inside a sub-config that is not built yet is checked when the sub-config is built
        later = make_configs('transformer', ['device=cpu', 'transformer.n_heds=2'])
        try:
            later.transformer
        except ConfigError as e:
            print(f'{type(e).__name__}: {e}')

        # a value that was already computed cannot change under you
        try:
            apply_overrides(conf, {'d_model': 512})
        except ConfigError as e:
            print(f'{type(e).__name__}: {e}')

        # what the command line prints (run_cli is the CLI's error handler)
        from lazylab.experiments.runner import run_cli
        import contextlib, io
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            exit_code = run_cli(make_configs, 'transformer', ['d_modle=128'])
        print(f'exit code {exit_code}:', err.getvalue().strip())
        assert exit_code == 2
        '''),
        md('''
        Every key, with its type, default, options and help (the comment beside its declaration), is listed by
        `lazylab options NAME`; here the keys of the FFN sub-config:
        '''),
        code('''
        from lazylab.configs import describe, format_description
        from lazylab.experiments.runner import options_text

        rows = describe(type(conf))   # one row per key, sub-config keys by dotted path
        print(format_description([r for r in rows if r['name'].startswith('transformer.ffn.')]))
        n_lines = len(options_text('transformer').splitlines())
        print(f'… {len(rows)} keys in all; `lazylab options transformer` prints {n_lines} lines')
        '''),
        md('''
        ## 6. Dump and replay

        `dump(conf)` writes every computed value as YAML: plain values as themselves and option-computed values by
        their option's name, so `load(fresh_conf, text)` replays the same selections. Objects that cannot be written
        as text (the aggregate's activation module) are listed under `objects` for reading only; replay recomputes
        them from the same selections. Every training run writes such a `configs.yaml` to its run directory.
        '''),
        code('''
        from lazylab.configs import dump, load

        text = dump(conf)
        print('\\n'.join(text.splitlines()[:20]) + '\\n…')
        '''),
        code('''
        replayed = type(conf)()
        load(replayed, text)
        torch.manual_seed(0)          # same seed as the original build
        model_again = replayed.model

        same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model_again.state_dict().values()))
        print('replayed model has identical parameters:', same)
        print('replayed dump is identical:', dump(replayed) == text)
        assert same and dump(replayed) == text
        print('provenance after replay:', explain(replayed)['transformer.ffn.glu_variant']['source'])
        '''),
    ]


# -------------------------------------------------------------------------------------- training (shared part)

LIVE_PLOT = '''
import matplotlib.pyplot as plt
from IPython.display import display


class LiveLossPlot:
    """Train and validation loss, redrawn in place in one output.

    The trainer hands every metrics record to `log(step, values)`: this object is passed as the `labml_run`
    argument of `lazylab.experiments.trainer.train`, whose only use of it is that call.
    """

    def __init__(self, title: str):
        self.fig, self.ax = plt.subplots(figsize=(7.5, 3.6))
        plt.close(self.fig)  # shown only through the display handle below, not again at the end of the cell
        self.title = title
        self.train, self.valid = ([], []), ([], [])
        self.updates = 0
        self.handle = display(self.fig, display_id=True)

    def log(self, step: int, values: dict) -> None:
        for key, (steps, losses) in (('loss.train', self.train), ('loss.valid', self.valid)):
            if key in values:
                steps.append(step)
                losses.append(values[key])
        ax = self.ax
        ax.clear()
        ax.plot(*self.train, linewidth=1, alpha=0.7, label='train')
        ax.plot(*self.valid, marker='o', markersize=3, label='validation')
        ax.set_xlabel('step')
        ax.set_ylabel('cross-entropy (nats/char)')
        last = f'train {self.train[1][-1]:.3f}' if self.train[1] else ''
        if self.valid[1]:
            last += f', valid {self.valid[1][-1]:.3f}'
        ax.set_title(f'{self.title} — step {step}: {last}', fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(loc='upper right')
        self.fig.tight_layout()
        self.handle.update(self.fig)
        self.updates += 1
'''


def training_cells(experiment: str, model_overrides: str, what: str):
    """Configure, train with a live plot, validate, generate incrementally, save and reload: the cells both model
    notebooks share. `model_overrides` is Python source of a list of extra key=value strings."""
    return [
        md(f'''
        ## Configure

        The experiment's config is built exactly as `lazylab train {experiment} key=value …` builds it: the same keys,
        the same checks. `prepare` then computes everything a run needs (data, model, optimizer), so a mistake in an
        override fails here, before anything is written. The run directory goes under `RUNS_DIR`.
        '''),
        code(f'''
        import json
        import tempfile
        import time

        from lazylab.configs import dump, explain
        from lazylab.experiments.runner import make_configs, new_run_dir, parameter_count, prepare

        EXPERIMENT = '{experiment}'
        if not RUNS_DIR:
            RUNS_DIR = tempfile.mkdtemp(prefix='lazylab-runs-')

        OVERRIDES = [
            f'device={{DEVICE}}', f'runs_dir={{RUNS_DIR}}', 'seed=0',
            f'max_steps={{STEPS}}', 'epochs=1000', 'max_minutes=0',  # stop after STEPS steps, no time budget
            f'batch_size={{BATCH_SIZE}}', f'seq_len={{SEQ_LEN}}',
            f'd_model={{D_MODEL}}', f'heads={{HEADS}}', f'd_ff={{D_FF}}', f'n_layers={{N_LAYERS}}',
            f'valid_interval={{VALID_EVERY}}', f'log_interval={{LOG_EVERY}}',
            f'valid_batches={{VALID_BATCHES}}', f'final_valid_batches={{VALID_BATCHES}}',
            f'sample_tokens={{SAMPLE_TOKENS}}', f'optimizer.learning_rate={{LEARNING_RATE}}',
        ] + {model_overrides}
        print(f'lazylab train {{EXPERIMENT}} ' + ' '.join(OVERRIDES))

        conf = make_configs(EXPERIMENT, OVERRIDES)
        prepare(conf)  # seeds torch, then builds the data, the model and the optimizer
        model = conf.model
        print(f'{{type(getattr(model, "transformer", model)).__name__}}: {{parameter_count(model):,}} parameters on {{DEVICE}}; '
              f'{{conf.total_steps}} steps of {{conf.batch_size}}×{{conf.seq_len}} characters')
        '''),
        md(f'''
        ## Train, with a live loss plot

        `lazylab.experiments.trainer.train` is the same loop `lazylab train` runs: {what}. It validates every
        `VALID_EVERY` steps (printing a sample of generated text) and writes `checkpoint.pt` then.
        '''),
        code(LIVE_PLOT),
        code('''
        from lazylab.experiments.trainer import train

        run_dir = new_run_dir(conf, EXPERIMENT)
        dump(conf, run_dir / 'configs.yaml')  # what `lazylab train` writes: the replayable configuration …
        (run_dir / 'run.json').write_text(json.dumps(  # … and the run's identity
            {'experiment': EXPERIMENT, 'run_id': run_dir.name, 'argv': OVERRIDES,
             'created': time.strftime('%Y-%m-%dT%H:%M:%S')}, indent=1) + '\\n')

        plot = LiveLossPlot(f'{EXPERIMENT}, d_model {D_MODEL}, {N_LAYERS} layers')
        started = time.time()
        last = train(conf, run_dir, labml_run=plot)
        print(f'{conf.total_steps} steps in {time.time() - started:.0f} s; the plot was redrawn {plot.updates} times')
        '''),
        md('''
        ## Validation loss

        The last record holds the final validation (over `VALID_BATCHES` batches of the validation split, or all of it
        when 0). Cross-entropy in nats per character; divided by ln 2 it is bits per character.
        '''),
        code('''
        import math

        print(f"validation loss {last['loss.valid']:.4f} nats/char = {last['loss.valid'] / math.log(2):.3f} bits/char, "
              f"accuracy {last['accuracy.valid']:.3f}  (a uniform guess: {math.log(conf.n_tokens):.3f} nats/char)")
        assert math.isfinite(last['loss.valid'])
        '''),
    ]


def generation_cells(state_words: str):
    return [
        md(f'''
        ## Generate text, incrementally

        `model.generate` carries the core transformer's state ({state_words}) from one character to the next, so
        each new character costs one step instead of a pass over the whole prefix. The next cell checks that the
        step-by-step path gives the same logits as one pass over the whole text, and times both ways of generating.
        '''),
        code('''
        tokenizer = conf.dataset.tokenizer
        prompt = tokenizer.encode(conf.prompt).to(DEVICE)
        g = torch.Generator(device=DEVICE).manual_seed(0)
        ids = model.generate(prompt, SAMPLE_TOKENS, temperature=0.8, top_k=20, generator=g)
        print(tokenizer.decode(ids.cpu()))
        '''),
        code('''
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
        '''),
    ]


CHECKPOINT_CELLS = [
    md('''
    ## Save and reload a checkpoint

    At every validation the trainer wrote `checkpoint.pt` (model, optimizer, scheduler, random-number states and
    data position; written to a temporary file, then renamed), next to `configs.yaml`, `metrics.jsonl` and
    `samples.txt`. Reloading needs nothing else: `open_run` replays `configs.yaml` into a fresh config, and the
    checkpoint's weights go into the model it builds. The reloaded model gives the same validation loss.
    This is what `lazylab generate RUN_DIR …` and `lazylab resume RUN_DIR` do. (In Colab, copy `run_dir` to your
    Drive to keep it.)
    '''),
    code('''
    from contextlib import nullcontext

    from lazylab.data import SequentialLoader
    from lazylab.experiments.runner import generate, open_run
    from lazylab.experiments.trainer import CHECKPOINT, evaluate, load_checkpoint

    print(run_dir)
    for path in sorted(run_dir.iterdir()):
        if path.is_file():
            print(f'  {path.name:<14} {path.stat().st_size:>10,} bytes')

    name, conf2, _ = open_run(run_dir)        # a fresh config, replayed from configs.yaml
    checkpoint = load_checkpoint(run_dir / CHECKPOINT)
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
    '''),
    code('''
    # the command-line path: `lazylab generate RUN_DIR --prompt "It is" --tokens N --temperature 0.8 --seed 0`
    print(generate(str(run_dir), conf.prompt, SAMPLE_TOKENS, temperature=0.8, seed=0))
    '''),
]


# ------------------------------------------------------------------------------------------------ fast weights

FAST_WEIGHTS_PARAMETERS = '''
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
'''

DELTA_RULE_CELLS = [
    md('''
    ## The delta rule: chunkwise-parallel vs. step by step

    Each head keeps fast weights W (a d_v × d_dot matrix) and, for every token, writes the value vᵢ under the key
    φ'(kᵢ), replacing a β-weighted part of what was stored there, then reads with the query:

        v̄ᵢ = W⁽ⁱ⁻¹⁾ φ'(kᵢ),   W⁽ⁱ⁾ = W⁽ⁱ⁻¹⁾ + βᵢ (vᵢ − v̄ᵢ) ⊗ φ'(kᵢ),   yᵢ = W⁽ⁱ⁾ φ'(qᵢ)

    `delta_rule_step` does one token (what generation uses); `delta_rule_loop` is the same equations over a
    sequence, the slow reference; `delta_rule_chunked` computes the same outputs chunk by chunk (Yang et al. 2024,
    WY/UT form), carrying W only between chunks. Below: the same random input through all three; outputs and final
    fast weights agree to float32 rounding (and to float64 rounding in float64); then their speed, side by side.
    '''),
    code('''
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
    '''),
    code('''
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
    '''),
    md('''
    The trained model computes its delta rule with the chunkwise kernel (`fast_weights.kernel=chunked`, the
    default); `set_kernel` switches it, and the logits stay the same:
    '''),
    code('''
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
    '''),
]


def fast_weights():
    name = 'fast_weights_transformer.ipynb'
    return [
        md(f'''
        # Fast-weights transformer on Tiny Shakespeare

        {colab_badge(name)}

        A linear transformer whose attention is a *fast weight programmer* (Schlag, Irie & Schmidhuber 2021,
        "Linear Transformers Are Secretly Fast Weight Programmers"): each layer keeps a matrix of fast weights that
        it updates with the delta rule at every token, instead of attending over all past tokens. Its memory has a
        fixed size, so generating each new character costs the same, however long the text.

        This notebook installs lazylab, configures the `fast_weights` experiment, trains it on Tiny Shakespeare with
        a live loss plot, reports the validation loss, generates text incrementally, compares the chunkwise-parallel
        and step-by-step delta rule, and reloads the run's checkpoint. With a GPU (Runtime → Change runtime type)
        it trains a larger model; on a CPU it uses small settings and finishes in a few minutes.
        '''),
        code(SETUP),
        code(FAST_WEIGHTS_PARAMETERS, tags=['parameters']),
        *training_cells('fast_weights', "['fast_weights.kernel=chunked', f'fast_weights.chunk_size={CHUNK_SIZE}']",
                        'forward, cross-entropy, backward, gradient clipping, an optimizer and scheduler step'),
        *generation_cells("each layer's fast weights"),
        *DELTA_RULE_CELLS,
        *CHECKPOINT_CELLS,
    ]


# ---------------------------------------------------------------------------------------------------- feedback

FEEDBACK_PARAMETERS = '''
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
'''

FEEDBACK_MEMORY_CELLS = [
    md('''
    ## The feedback memory

    At every step the model stores one memory vector, a softmax-weighted mix of the token's embedding and all of its
    layer outputs, m_τ = Σₗ softmax(w)ₗ x_τˡ (paper eq. 4); every layer of later steps attends to these vectors. The
    mixing weights w are learned: here is where the trained model takes its memory from.
    '''),
    code('''
    core = model.transformer
    mix = torch.softmax(core.weights.detach().float(), dim=0).cpu()
    labels = ['embedding'] + [f'layer {i + 1}' for i in range(len(mix) - 1)]
    for label, w in zip(labels, mix.tolist()):
        print(f'  {label:<10} {w:.3f}  ' + '█' * round(40 * w))
    assert abs(mix.sum().item() - 1) < 1e-5
    '''),
    md('''
    The memory never changes once written, so lazylab computes the keys and values of each memory vector once and
    writes them into a growing buffer; `forward_reference` is the plain loop of the reference implementation, which
    re-stacks the memory at every step. Both give the same outputs on a validation batch; the buffer is faster.
    '''),
    code('''
    import statistics

    from lazylab.data import SequentialLoader

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
        t_ref, reference = median_seconds(lambda: core.forward_reference(embedded))
    print(f'max |buffered memory − reference loop| over a {tuple(x.shape)} batch: '
          f'{(fast - reference).abs().max().item():.1e}')
    torch.testing.assert_close(fast, reference, rtol=1e-3, atol=1e-3)  # float32 rounding
    tokens = x.numel()
    print(f'reference loop {tokens / t_ref:,.0f} tokens/s, buffered memory {tokens / t_fast:,.0f} tokens/s '
          f'({t_ref / t_fast:.1f}x)')
    '''),
]


def feedback():
    name = 'feedback_transformer.ipynb'
    return [
        md(f'''
        # Feedback transformer on Tiny Shakespeare

        {colab_badge(name)}

        The Feedback Transformer (Fan, Lavril, Grave, Joulin & Sukhbaatar 2020, "Addressing Some Limitations of
        Transformers with Feedback Memory") lets every layer attend to a memory of the *top* layers' representations
        of earlier tokens, not just the layer below. The price is that it runs token by token; the gain is a
        shallow model that can keep and update a state over the whole text.

        This notebook installs lazylab, configures the `feedback` experiment, trains it on Tiny Shakespeare with a
        live loss plot, reports the validation loss, generates text incrementally (the memory is carried, so each
        character costs one step), looks at the learned memory, and reloads the run's checkpoint. With a GPU
        (Runtime → Change runtime type) it trains a larger model; on a CPU it uses small settings.
        '''),
        code(SETUP),
        code(FEEDBACK_PARAMETERS, tags=['parameters']),
        *training_cells('feedback', "['model=feedback_transformer_kv']  # or 'model=feedback_transformer'",
                        'forward (token by token through the feedback memory), cross-entropy, backward, '
                        'gradient clipping, an optimizer and scheduler step'),
        *generation_cells('the keys and values of the feedback memory'),
        *FEEDBACK_MEMORY_CELLS,
        *CHECKPOINT_CELLS,
    ]


# ------------------------------------------------------------------------------------------------- notebooks

def build(cells, gpu: bool = True):
    nb = new_notebook(cells=cells)
    nb.metadata = {
        'kernelspec': {'display_name': 'Python 3', 'language': 'python', 'name': 'python3'},
        'language_info': {'name': 'python'},
        'colab': {'provenance': []},
    }
    if gpu:
        nb.metadata['accelerator'] = 'GPU'  # Colab opens it on a GPU runtime (the notebook falls back to the CPU)
    # stable cell ids, so regenerating gives the same files
    for i, cell in enumerate(nb.cells):
        cell['id'] = f'cell-{i:02d}'
    nbformat.validate(nb)
    return nb


BUILDERS = {
    'configs_tour.ipynb': configs_tour,
    'fast_weights_transformer.ipynb': fast_weights,
    'feedback_transformer.ipynb': feedback,
}


def render(name: str) -> str:
    return nbformat.writes(build(BUILDERS[name](), gpu=name != 'configs_tour.ipynb'), version=4) + '\n'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--check', action='store_true', help='compare instead of writing; exit 1 on a difference')
    args = parser.parse_args(argv)
    NOTEBOOKS.mkdir(exist_ok=True)
    stale = []
    for name in BUILDERS:
        path = NOTEBOOKS / name
        text = render(name)
        if args.check:
            if not path.is_file() or path.read_text(encoding='utf-8') != text:
                stale.append(name)
        else:
            path.write_text(text, encoding='utf-8')
            print(f'wrote {path.relative_to(ROOT)}')
    if stale:
        print('out of date (run python scripts/make_notebooks.py): ' + ', '.join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
