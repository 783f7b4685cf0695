"""Config engine speed: lazylab.configs vs labml.configs, side by side in one process.

Two workloads, each: create a fresh config object, give it overrides, read the result (so every run computes
everything anew):

1. a 200-item dependency chain: x0 = 0, x_i = x_{i-1} + 1 computed by an option; read x199;
2. a realistic experiment config (no torch, so only the engine is timed): 30 items, an optimizer sub-config with
   ``_primary``, a feed-forward sub-config with GLU aggregates whose defaults read the parent, 8 overrides
   (4 dotted), read the model and the optimizer, then ``_to_json()``.

labml.configs prints a "Prepare <item>" line per computed item through ``labml.monit``; output is sent to
/dev/null for every engine, and a second labml row stubs ``monit.section`` out so the engines are also compared
without that logging cost.

Usage: python benchmarks/configs_resolve.py [--quick]
"""
import argparse
import contextlib
import io
import statistics
import sys
import time
from typing import Callable

import labml.configs
import labml.internal.configs.base as labml_base

import lazylab.configs


def chain_factory(engine, n: int = 200) -> Callable[[], int]:
    annotations = {f'x{i}': int for i in range(n)}
    cls = type('Chain', (engine.BaseConfigs,), {'__annotations__': annotations, 'x0': 0})
    def successor(prev: str):
        return lambda c: getattr(c, prev) + 1

    for i in range(1, n):
        engine.calculate(getattr(cls, f'x{i}'), 'next', successor(f'x{i - 1}'))
    last = f'x{n - 1}'

    def run() -> int:
        conf = cls()
        return getattr(conf, last)

    return run


def experiment_factory(engine) -> Callable[[], object]:
    class OptimizerConfigs(engine.BaseConfigs):
        optimizer: tuple
        learning_rate: float = 0.01
        betas: tuple = (0.9, 0.999)
        eps: float = 1e-8
        weight_decay: float = 0.0
        warmup: int = 2000
        d_model: int
        parameters: object

        def __init__(self):
            super().__init__(_primary='optimizer')

    @engine.option(OptimizerConfigs.optimizer, 'Adam')
    def _adam(c):
        return ('Adam', c.parameters, c.learning_rate, c.betas, c.eps, c.weight_decay)

    @engine.option(OptimizerConfigs.optimizer, 'Noam')
    def _noam(c):
        return ('Noam', c.parameters, c.learning_rate, c.warmup, c.d_model)

    class FFNConfigs(engine.BaseConfigs):
        d_model: int
        d_ff: int = 2048
        dropout: float = 0.1
        activation: object = 'ReLU'
        is_gated: bool = False
        bias1: bool = True
        bias2: bool = True
        glu_variant: str = 'none'
        ffn: tuple

    engine.calculate(FFNConfigs.activation, 'ReLU', lambda: 'relu')
    engine.calculate(FFNConfigs.activation, 'GELU', lambda: 'gelu')
    engine.calculate(FFNConfigs.activation, 'SiLU', lambda: 'silu')
    engine.aggregate(FFNConfigs.glu_variant, 'SwiGLU', (FFNConfigs.is_gated, True), (FFNConfigs.bias1, False),
                     (FFNConfigs.bias2, False), (FFNConfigs.activation, 'SiLU'))
    engine.aggregate(FFNConfigs.glu_variant, 'GEGLU', (FFNConfigs.is_gated, True), (FFNConfigs.bias1, False),
                     (FFNConfigs.bias2, False), (FFNConfigs.activation, 'GELU'))

    @engine.option(FFNConfigs.ffn, 'default')
    def _ffn(c):
        return ('FFN', c.d_model, c.d_ff, c.dropout, c.activation, c.is_gated, c.bias1, c.bias2)

    class Experiment(engine.BaseConfigs):
        seed: int = 5
        device: str = 'cpu'
        seq_len: int = 512
        batch_size: int = 16
        epochs: int = 32
        n_tokens: int = 65
        d_model: int = 512
        heads: int = 8
        n_layers: int = 6
        dropout: float = 0.1
        tokenizer: str = 'character'
        text: str = 'tiny_shakespeare'
        ffn: FFNConfigs
        attention: tuple = 'mha'
        layer: tuple
        model: tuple = 'transformer'
        optimizer: OptimizerConfigs
        inner_iterations: int = 10
        log_every: int = 100
        save_every: int = 1000
        grad_clip: float = 1.0
        train_loader: tuple
        valid_loader: tuple
        is_save_models: bool = True
        mode: str = 'train'
        max_steps: int = 10000
        checkpoint_dir: str = 'runs'
        sample_every: int = 500
        prompt: str = 'It is'
        trainer: tuple

    @engine.option(Experiment.ffn, 'default')
    def _exp_ffn(c):
        conf = FFNConfigs()
        conf.set_default(FFNConfigs.d_model, func=lambda: c.d_model)
        conf.set_default(FFNConfigs.dropout, func=lambda: c.dropout)
        return conf

    engine.calculate(Experiment.attention, 'mha', lambda c: ('MHA', c.heads, c.d_model, c.dropout))
    engine.calculate(Experiment.layer, 'default', lambda c: ('Layer', c.attention, c.ffn.ffn, c.dropout))
    engine.calculate(Experiment.model, 'transformer',
                     lambda c: ('Model', c.n_tokens, c.d_model, [c.layer] * c.n_layers))

    @engine.option(Experiment.optimizer, 'default')
    def _exp_optimizer(c):
        conf = OptimizerConfigs()
        conf.parameters = c.model
        conf.set_default(OptimizerConfigs.d_model, func=lambda: c.d_model)
        return conf

    engine.calculate(Experiment.train_loader, 'default',
                     lambda c: ('Loader', c.text, c.tokenizer, c.seq_len, c.batch_size))
    engine.calculate(Experiment.valid_loader, 'default',
                     lambda c: ('Loader', c.text, c.tokenizer, c.seq_len, c.batch_size))
    engine.calculate(Experiment.trainer, 'default',
                     lambda c: ('Trainer', c.model, c.optimizer, c.train_loader, c.valid_loader, c.grad_clip,
                                c.epochs, c.inner_iterations))

    overrides = {'d_model': 256, 'heads': 4, 'n_layers': 4, 'seq_len': 256, 'ffn.glu_variant': 'SwiGLU',
                 'ffn.d_ff': 1024, 'optimizer.optimizer': 'Noam', 'optimizer.learning_rate': 1.0}

    def run() -> object:
        conf = Experiment()
        conf._set_values(overrides)
        result = conf.trainer
        conf._to_json()
        return result

    return run


@contextlib.contextmanager
def labml_logging_stubbed():
    original = labml_base.monit.section
    labml_base.monit.section = lambda *args, **kwargs: contextlib.nullcontext()
    try:
        yield
    finally:
        labml_base.monit.section = original


def timed(run: Callable[[], object], iterations: int, repeats: int, stub: bool = False) -> tuple[float, object]:
    """Median seconds per run over ``repeats`` batches of ``iterations`` runs (stdout discarded)."""
    times: list[float] = []
    result = None
    context = labml_logging_stubbed() if stub else contextlib.nullcontext()
    with context, contextlib.redirect_stdout(io.StringIO()):
        run()  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(iterations):
                result = run()
            times.append((time.perf_counter() - start) / iterations)
    return statistics.median(times), result


def compare(title: str, factory, iterations: int, repeats: int, logged_iterations: int):
    """``logged_iterations``: runs per batch for labml with its logging on (its nested monit sections make a
    deep chain very slow, so fewer runs keep the benchmark short)."""
    rows = [('labml.configs', labml.configs, False),
            ('labml.configs (monit logging stubbed)', labml.configs, True),
            ('lazylab.configs', lazylab.configs, False)]
    results = []
    for name, engine, stub in rows:
        n = iterations if stub or engine is lazylab.configs else min(iterations, logged_iterations)
        seconds, value = timed(factory(engine), n, repeats, stub)
        results.append((name, seconds, value))
    values = {repr(v) for _, _, v in results}
    assert len(values) == 1, f'engines disagree: {values}'
    base = results[0][1]
    print(f'{title} (CPU, median of {repeats})')
    for name, seconds, _ in results:
        print(f'  {name:<40} {base / seconds:6.2f}x   {1 / seconds:10.1f} resolves/s')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='a tiny smoke run')
    args = parser.parse_args(argv)
    # labml.configs nests ~5 Python frames per chain level and exceeds the default limit (1000) at 200 items;
    # lazylab.configs nests 3 and resolves ~300 levels within it. Raise it so both can run the chain.
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    repeats = 2 if args.quick else 5
    compare('config resolve: 200-item dependency chain', chain_factory, 1 if args.quick else 20, repeats, 1)
    compare('config resolve: experiment config, 30 items + 2 sub-configs, 8 overrides, _to_json',
            experiment_factory, 2 if args.quick else 100, repeats, 100)


if __name__ == '__main__':
    sys.exit(main())
