"""`lazylab generate RUN_DIR --prompt TEXT --tokens N`: text sampled from a run's latest checkpoint.

The model is rebuilt from the run's configs.yaml (its experiment found again from run.json, `replay.reopen`) and
its weights and vocabulary come from the checkpoint: the training text is not needed. A model with an incremental
`generate` (`lazylab.models.autoregressive.AutoregressiveModel`) costs one step per new character; any other text
model is re-run on the last `seq_len` characters for each (`nlp_autoregression.generate_ids`).
"""
import os
from typing import Callable, Optional

import torch

from lazylab.configs import apply_overrides
from lazylab.data import CharTokenizer
from lazylab.errors import CheckpointError, TrainingError, UsageError
from lazylab.experiments.checkpoint import load_checkpoint
from lazylab.experiments.nlp_autoregression import NLPAutoRegressionConfigs, generate_ids
from lazylab.experiments.replay import reopen
from lazylab.models.sampling import NonFiniteLogitsError, check_generate_arguments
from lazylab.runs import CHECKPOINT_PT


def generate(run_dir: str, prompt: str, tokens: int, temperature: float = 1.0, top_k: Optional[int] = None,
             seed: Optional[int] = None, on_text: Optional[Callable[[str], None]] = None) -> str:
    """Text sampled from the run's latest checkpoint: the prompt followed by `tokens` new characters.

    Args:
        run_dir: a run directory of a text experiment (an `NLPAutoRegressionConfigs`).
        prompt: the start of the text (characters of the run's vocabulary); tokens: characters to add.
        temperature: ≥ 0, 0 greedy; top_k: sample among the K most likely; seed: for a reproducible sample.
        on_text: called with the prompt once the checks are done, then with each new character as it is
            sampled (their concatenation is the text returned).

    Raises:
        UsageError: an argument out of range, an empty prompt, a run that is no text model's, a checkpoint that
            does not fit the run's configs.yaml; CheckpointError: no usable checkpoint or vocabulary; DataError:
            a prompt character outside the vocabulary; TrainingError: the model's logits are not finite.
    """
    try:
        check_generate_arguments(tokens, temperature, top_k, names=('--tokens', '--temperature', '--top-k'))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if seed is not None and not 0 <= seed < 2**64:
        raise UsageError(f'--seed must be in 0 … 2**64 − 1, got {seed}')
    if not prompt:
        raise UsageError('--prompt must not be empty')
    run = reopen(run_dir)
    conf, path = run.conf, run.path
    ck = load_checkpoint(path / CHECKPOINT_PT)
    if 'vocabulary' not in ck and not isinstance(conf, NLPAutoRegressionConfigs):  # retrieval: no text
        raise UsageError(f'{run_dir} is a {run.experiment.name} run, which does not generate text; lazylab generate '
                         f'takes a run of a text model (an NLPAutoRegressionConfigs experiment)')
    try:
        tokenizer = CharTokenizer(ck['vocabulary'])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f'{path / CHECKPOINT_PT} has no usable vocabulary') from None
    ids = tokenizer.encode(prompt)
    apply_overrides(conf, {'n_tokens': tokenizer.n_tokens})
    model = conf.model
    try:
        model.load_state_dict(ck['model'])
    except RuntimeError:
        raise UsageError(f'{path / CHECKPOINT_PT} does not match the model in configs.yaml') from None
    device = next(model.parameters()).device
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), 'little'))
    stream = None
    if on_text is not None:
        on_text(tokenizer.decode(ids))
        stream = lambda token: on_text(tokenizer.decode(token.cpu()))  # noqa: E731
    try:
        out = generate_ids(model, ids.to(device), tokens, context=conf.seq_len, temperature=temperature,
                           top_k=top_k, generator=g, on_token=stream)
    except NonFiniteLogitsError as e:
        raise TrainingError(f'{path / CHECKPOINT_PT}: {e}') from None
    return tokenizer.decode(out.cpu())
