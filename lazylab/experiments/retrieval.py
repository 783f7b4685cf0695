"""Associative retrieval: the capacity experiment of the fast-weights paper (Schlag, Irie & Schmidhuber 2021,
section 6.1 and figures 2-3), on the CPU in minutes.

    lazylab train retrieval n_keys=60 phi=dpfp nu=2          ≡  python -m lazylab.experiments.retrieval …
    lazylab train retrieval n_keys=40 replace=true update_rule=delta
    lazylab train retrieval n_keys=60 model=softmax           (the softmax-attention baseline)
    lazylab train retrieval replace=true update_rule=gated_delta    (the delta rule's successors: gated_delta,
    lazylab train retrieval update_rule=delta_product gated=true     delta_product with householder_steps and gated,
                                                                     negative_eigenvalues=true, phi=l2)

Data (the authors' `synthetic/associativeRetrievalDataset.py`): S keys and S values. Setting 1 (`replace=false`):
a sequence is the S keys, each once, in random order, paired with the S values in random order (seq_len S).
Setting 2 (`replace=true`): 2S pairs whose keys and values are drawn with replacement, so later pairs overwrite
earlier ones. Then one query: the key of a random pair; the target is the value last paired with that key. Every
training batch is fresh, drawn from (seed, epoch, batch index); evaluation uses fixed sequences (from the seed)
and asks every key that occurs in each of them.

Model (`lazylab.models.fast_weights.retrieval`): one fast-weight layer (`model=fast_weights`: feature map `phi`,
`update_rule`, `hidden_size`) or softmax attention (`model=softmax`) over the pairs; the values are fixed one-hot
vectors. Loss ½‖y − ŷ‖² per query, averaged over the batch; Adam 10⁻³, batch 32. Training stops when the evaluation
loss reaches `stop_loss` (0.001) or after `max_steps`. The run directory is the trainer's: `metrics.jsonl` has
`loss.valid` (the evaluation loss) and `accuracy.valid` (retrieval accuracy: the argmax of ŷ is the target).

The normalisations default to the authors' choices for each rule: the sum rule reads with linear attention's
normaliser and raw features (`attention_normalization=true`, `sum_normalization=false`), the delta rule (and its
successors, the gated delta rule and DeltaProduct) with sum-normalised features (`sum_normalization=true`,
`attention_normalization=false`); either can be set (attention normalisation only for the sum and delta rules).
"""
import sys
from collections.abc import Iterator
from typing import Literal, Optional

import torch
from torch import nn

from lazylab.configs import inspect, option
from lazylab.configs.fast_weights import check_rule_keys
from lazylab.configs.types import NonNegativeFloat, NonNegativeInt, PositiveInt
from lazylab.errors import UsageError
from lazylab.experiments import Batch, BatchLoss, Task, TrainerConfigs, device_of, distributed, evaluate, main
from lazylab.experiments.memory import FLOAT, LONG, Need, feature_size, selected_option
from lazylab.experiments.optimizers import OptimizerConfigs
from lazylab.models import fast_weights
from lazylab.models.fast_weights.retrieval import FastWeightsRetrieval, SoftmaxRetrieval

#: an "epoch" of fresh random batches (the trainer's epoch and valid_interval count in them)
BATCHES_PER_EPOCH = 1000


def retrieval_batch(n_keys: int, replace: bool, batch_size: int, generator: torch.Generator
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` random sequences of pairs and, for each, the value last paired with every key.

    Returns:
        pairs: LongTensor [n_pairs, batch_size, 2] (key id, value id), n_pairs = n_keys (setting 1) or 2·n_keys
            (setting 2, `replace`);
        last_value: LongTensor [batch_size, n_keys]: the value last paired with each key, −1 where the key does
            not occur (only possible with `replace`).
    """
    n_pairs = 2 * n_keys if replace else n_keys
    if replace:
        keys = torch.randint(0, n_keys, (batch_size, n_pairs), generator=generator)
        values = torch.randint(0, n_keys, (batch_size, n_pairs), generator=generator)
    else:
        keys = torch.rand(batch_size, n_keys, generator=generator).argsort(-1)  # a permutation per sequence
        values = torch.rand(batch_size, n_keys, generator=generator).argsort(-1)
    positions = torch.arange(n_pairs).expand(batch_size, n_pairs)
    last = torch.full((batch_size, n_keys), -1).scatter_reduce(1, keys, positions, reduce='amax')
    last_value = torch.where(last >= 0, values.gather(1, last.clamp_min(0)), -1)
    return torch.stack([keys, values], dim=-1).transpose(0, 1), last_value


class RetrievalTask(Task):
    """The trainer's view of the experiment (see the module docstring).

    Its sequences are pairs (and a query); its loss is the squared error of the values predicted for the queries.

    Batches are x = [pairs; queries] as one LongTensor [n_pairs + n_queries, batch, 2] (a query row holds the
    query key and −1) and y = the target value of each query [n_queries, batch] (−1: no such key, not counted).
    Training batches have one query per sequence; evaluation batches ask every key (n_queries = n_keys).

    Args:
        n_keys, replace: the data (S, setting 2).
        batch_size: sequences per step (per process).
        seed: the training batches (with epoch and index) and the evaluation sequences.
        valid_batches, final_valid_batches: evaluation batches (of batch_size sequences) at each validation and
            at the end (0: as many as valid_batches).
        stop_loss: training ends once a validation's loss is at most this (0: never early).
        device: where evaluation batches go.
    """
    position_unit, loss_unit, loss_label = 'pairs', '(½‖y − ŷ‖² per query)', 'squared error ½‖y − ŷ‖² per query'

    def __init__(self, *, n_keys: int, replace: bool, batch_size: int, seed: int, valid_batches: int,
                 final_valid_batches: int, stop_loss: float, device: torch.device,
                 rank: Optional[int] = None, world_size: Optional[int] = None):
        self.n_keys, self.replace, self.batch_size, self.seed = n_keys, replace, batch_size, seed
        self.n_pairs = 2 * n_keys if replace else n_keys
        self.stop_loss, self.device = stop_loss, device
        self.rank = distributed.get_rank() if rank is None else rank
        self.world_size = distributed.get_world_size() if world_size is None else world_size
        self.batches_per_epoch = BATCHES_PER_EPOCH
        self.valid_quick = self._evaluation_batches(valid_batches, stream=1)
        self.valid_full = self._evaluation_batches(max(final_valid_batches, valid_batches), stream=2)
        self.final_valid_ratio = len(self.valid_full) / len(self.valid_quick)

    def _generator(self, *parts: int) -> torch.Generator:
        value = self.seed
        for part in parts:
            value = value * 1_000_003 + part
        return torch.Generator().manual_seed(value % (2 ** 63))

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """One query per sequence: the key of a random pair (so a key that occurs more often is asked more)."""
        for index in range(start, self.batches_per_epoch):
            g = self._generator(0, epoch, index, self.rank)
            pairs, last_value = retrieval_batch(self.n_keys, self.replace, self.batch_size, g)
            query = pairs[torch.randint(0, self.n_pairs, (self.batch_size,), generator=g),
                          torch.arange(self.batch_size), 0]
            target = last_value.gather(1, query.unsqueeze(1)).squeeze(1)
            yield self._pack(pairs, query.unsqueeze(0)), target.unsqueeze(0)

    def _pack(self, pairs: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        query_rows = torch.stack([queries, torch.full_like(queries, -1)], dim=-1)
        return torch.cat([pairs, query_rows])

    def _evaluation_batches(self, count: int, stream: int) -> list[Batch]:
        """`count` batches of batch_size · world_size sequences (each process takes its columns), every key asked."""
        batches = []
        for index in range(count):
            g = self._generator(stream, index)
            pairs, last_value = retrieval_batch(self.n_keys, self.replace, self.batch_size * self.world_size, g)
            every_key = torch.arange(self.n_keys).unsqueeze(1).expand(-1, pairs.shape[1])
            batches.append((self._pack(pairs, every_key), last_value.T.contiguous()))
        return batches

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str = 'mean') -> BatchLoss:
        """½‖one_hot(y) − ŷ‖² per query (float32), the mean (or sum) over the queries whose key occurs."""
        pairs, queries = x[:self.n_pairs], x[self.n_pairs:, :, 0]
        prediction = model(pairs, queries).float()
        asked = y >= 0
        target = nn.functional.one_hot(y.clamp_min(0), prediction.shape[-1]).float()
        per_query = 0.5 * (prediction - target).square().sum(-1)[asked]
        correct = int((prediction.detach().argmax(-1) == y)[asked].sum())
        loss = per_query.mean() if reduction == 'mean' else per_query.sum()
        return BatchLoss(loss, correct, int(asked.sum()))

    def evaluate(self, model: nn.Module, final: bool) -> dict[str, float]:
        return evaluate(model, self.valid_full if final else self.valid_quick, self.device, loss=self.loss)

    def converged(self, valid: dict[str, float]) -> bool:
        """The paper's stopping rule: the evaluation loss is at most `stop_loss`."""
        return self.stop_loss > 0 and valid['loss'] <= self.stop_loss


class Configs(TrainerConfigs):
    """Associative retrieval (see the module docstring). `lazylab options retrieval` lists every key."""
    max_steps: NonNegativeInt = 20_000   # at most this many steps (the paper: 100k), unless stop_loss is reached
    batch_size: PositiveInt = 32         # sequences per step (per process)
    valid_interval: NonNegativeInt = 100  # steps between evaluations (the authors' test_every)
    valid_batches: PositiveInt = 1       # evaluation batches (of batch_size sequences, every key asked) ...
    final_valid_batches: NonNegativeInt = 4  # ... and at the end (0: as many as valid_batches)
    log_interval: PositiveInt = 100      # steps between metric records
    grad_norm_clip: NonNegativeFloat = 0.0  # the authors do not clip
    n_keys: PositiveInt = 20             # S: keys (and values)
    replace: bool = False                # setting 2: 2S pairs drawn with replacement (later ones overwrite)
    seq_len: PositiveInt = 'pairs'       # pairs per sequence: S, or 2S with replace
    stop_loss: NonNegativeFloat = 0.001  # stop once the evaluation loss is at most this (0: never)
    model: nn.Module = 'fast_weights'    # fast_weights, or softmax (the softmax-attention baseline)
    phi: nn.Module = 'dpfp'              # feature map φ': dpfp (with nu), linear (ELU + 1), favor (FAVOR+), l2
    nu: PositiveInt = 1                  # ν of DPFP: d_dot = 2 · hidden_size · ν
    favor_features: PositiveInt = 64     # m, random features of FAVOR+ (d_dot = 2m)
    # fast-weight update: sum (linear attention), delta, gated_delta (Gated DeltaNet) or delta_product (DeltaProduct)
    update_rule: Literal['sum', 'delta', 'gated_delta', 'delta_product'] = 'sum'
    householder_steps: PositiveInt = 2   # n_h, writes per pair of delta_product
    gated: bool = False                  # delta_product with the gated delta rule's decay gate
    negative_eigenvalues: bool = False   # β = 2σ(·) ∈ (0, 2) (rules with a β)
    sum_normalization: bool              # φ' = φ / Σφ (default: the delta rule's, not the sum rule's)
    attention_normalization: bool        # ŷ / (z · φ'(q)) (default: the sum rule's, not the delta rule's)
    hidden_size: PositiveInt = 64        # keys and queries before φ'
    embedding_size: PositiveInt          # key embedding (default ⌊1.1 · 2S⌋, the authors')
    kernel: Literal['chunked', 'loop', 'step'] = 'chunked'  # how the update rule is computed (equal results)
    chunk_size: PositiveInt = 64         # tokens per chunk for 'chunked'
    task: Task                           # what the trainer trains on
    optimizer: OptimizerConfigs          # Adam, 10⁻³, constant
    total_steps: PositiveInt             # max_steps (or epochs of 1000 batches)


@option(Configs.seq_len, 'pairs')
def _seq_len(c: Configs):
    return 2 * c.n_keys if c.replace else c.n_keys


@option(Configs.embedding_size, 'authors')
def _embedding_size(c: Configs):
    return int(1.1 * 2 * c.n_keys)


@option(Configs.sum_normalization, 'by_rule')
def _sum_normalization(c: Configs):
    return c.update_rule != 'sum'


@option(Configs.attention_normalization, 'by_rule')
def _attention_normalization(c: Configs):
    return c.update_rule == 'sum'


def _phi(c: Configs, name: str):
    return fast_weights.make_feature_map(name, c.hidden_size, nu=c.nu, features=c.favor_features,
                                         sum_normalization=c.sum_normalization)


@option(Configs.phi, 'dpfp')
def _dpfp(c: Configs):
    return _phi(c, 'dpfp')


@option(Configs.phi, 'linear')
def _linear(c: Configs):
    return _phi(c, 'linear')


@option(Configs.phi, 'favor')
def _favor(c: Configs):
    # FAVOR+'s raw features start near exp(−‖x‖²/2) ≈ 1e-30 here: denormal floats, which the CPU computes with
    # 10-100× slower; flushing them to zero (this process only) changes nothing that the loss can see
    torch.set_flush_denormal(True)
    return _phi(c, 'favor')


@option(Configs.phi, 'l2')
def _l2(c: Configs):
    return _phi(c, 'l2')


@option(Configs.model, 'fast_weights')
def _fast_weights_model(c: Configs):
    check_rule_keys(c.update_rule, c.gated, c.negative_eigenvalues, c.attention_normalization)
    model = FastWeightsRetrieval(c.n_keys, c.n_keys, c.embedding_size, c.hidden_size, c.phi,
                                 update_rule=c.update_rule, attention_normalization=c.attention_normalization,
                                 kernel=c.kernel, chunk_size=c.chunk_size, householder_steps=c.householder_steps,
                                 gated=c.gated, negative_eigenvalues=c.negative_eigenvalues)
    return model.to(device_of(c))


#: the keys only the fast-weight model reads (softmax attention has no feature map and no update rule)
FAST_WEIGHT_KEYS = ('phi', 'nu', 'favor_features', 'update_rule', 'sum_normalization', 'attention_normalization',
                    'kernel', 'chunk_size', 'householder_steps', 'gated', 'negative_eigenvalues')


def check_softmax_keys(c: Configs) -> None:
    """With model=softmax the fast-weight keys change nothing: one given on the command line, in a --config file
    or by a sweep is a mistake (a preset's, e.g. setting2's update_rule, is not: it sets both models up; nor are the
    values code gives, e.g. the feature map a sweep's check of its points hands from a fast-weight point to a softmax
    one).

    Raises:
        UsageError: naming the keys (and where each came from, when not the command line).
    """
    given = {k: label for k, label in inspect.given(c).items()
             if k in FAST_WEIGHT_KEYS and (label in ('user', 'sweep') or str(label).startswith('--config'))}
    if given:
        keys = ', '.join(k if label == 'user' else f'{k} (from {label})' for k, label in given.items())
        them = 'it' if len(given) == 1 else 'them'
        raise UsageError(f'{keys} {"has" if len(given) == 1 else "have"} no effect with model=softmax (only the '
                         f'fast-weight model reads {them}); leave {them} out, or use model=fast_weights')


@option(Configs.model, 'softmax')
def _softmax_model(c: Configs):
    check_softmax_keys(c)
    return SoftmaxRetrieval(c.n_keys, c.n_keys, c.embedding_size, c.hidden_size).to(device_of(c))


@option(Configs.task, 'associative_retrieval')
def _task(c: Configs):
    return RetrievalTask(n_keys=c.n_keys, replace=c.replace, batch_size=c.batch_size, seed=c.seed,
                         valid_batches=c.valid_batches, final_valid_batches=c.final_valid_batches,
                         stop_loss=c.stop_loss, device=device_of(c))


@option(Configs.total_steps, 'max_steps_or_epochs')
def _total_steps(c: Configs):
    return c.max_steps if c.max_steps > 0 else c.epochs * BATCHES_PER_EPOCH


@option(Configs.optimizer, 'OptimizerConfigs')
def _optimizer(c: Configs):
    """Adam at 10⁻³, constant, no warm-up (the authors'); `optimizer.*` keys change it."""
    conf = OptimizerConfigs()
    conf.parameters = c.model.parameters()
    conf.total_steps = c.total_steps
    conf.set_default(OptimizerConfigs.optimizer, value='Adam')
    conf.set_default(OptimizerConfigs.learning_rate, value=1e-3)
    conf.set_default(OptimizerConfigs.warmup, value=0)
    conf.set_default(OptimizerConfigs.schedule, value='constant')
    return conf


def memory_needs(c: Configs) -> list[Need]:
    """The least memory a run takes (`lazylab.experiments.memory`): the parameters and their gradients (key
    embedding n_keys × embedding_size, the key and query projections to hidden_size), the fixed one-hot values
    [n_keys, n_keys], the evaluation batches, and for one evaluation batch (every key asked) the predictions
    [n_keys, batch_size, n_keys] with, for fast weights, the features φ of its pairs and queries and the fast
    weights [batch_size, n_keys, d_dot], or for softmax the attention scores [n_keys, batch_size, n_pairs]."""
    n_keys, embedding, hidden, batch = c.n_keys, c.embedding_size, c.hidden_size, c.batch_size
    n_pairs = 2 * n_keys if c.replace else n_keys
    size = (('n_keys', n_keys), ('batch_size', batch))
    n_eval = c.valid_batches + max(c.final_valid_batches, c.valid_batches)
    parameters = n_keys * embedding + (n_keys + 2 * embedding) * hidden
    needs = [Need('parameters and their gradients', 2 * FLOAT * parameters,
                  (('n_keys', n_keys), ('embedding_size', embedding), ('hidden_size', hidden))),
             Need('the one-hot values', FLOAT * n_keys * n_keys, size[:1]),
             Need('the evaluation batches', LONG * n_eval * batch * (2 * (n_pairs + n_keys) + n_keys),
                  (*size, ('valid_batches', c.valid_batches), ('final_valid_batches', c.final_valid_batches))),
             Need('the predictions for every key of a batch', FLOAT * n_keys * batch * n_keys, size)]
    model = selected_option(c, 'model')
    if model == 'fast_weights':
        phi = selected_option(c, 'phi')
        d_dot = hidden if phi == 'l2' else feature_size(phi, hidden, c.nu, c.favor_features)  # (L2-SiLU: hidden)
        phi_keys = {'dpfp': (('nu', c.nu), ('hidden_size', hidden)), 'linear': (('hidden_size', hidden),),
                    'favor': (('favor_features', c.favor_features),), 'l2': (('hidden_size', hidden),)}.get(phi, ())
        if d_dot is not None:
            needs += [Need('fast-weight features φ(k), φ(q)', FLOAT * batch * (n_pairs + n_keys) * d_dot,
                           (*phi_keys, *size)),
                      Need('the fast weights', FLOAT * batch * n_keys * d_dot, (*phi_keys, *size))]
    elif model == 'softmax':
        needs.append(Need('the attention scores', FLOAT * n_keys * batch * n_pairs, (*size, ('replace', c.replace))))
    return needs


#: named settings applied before the user's
PRESETS = {
    'setting2': {'replace': True, 'update_rule': 'delta'},  # the paper's figure 3, delta rule
}


if __name__ == '__main__':
    sys.exit(main(Configs))
