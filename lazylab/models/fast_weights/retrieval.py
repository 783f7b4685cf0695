"""The models of the associative-retrieval experiment (Schlag, Irie & Schmidhuber 2021, section 6.1, "Synthetic
Settings"): one attention layer reads the value stored under a query key from a sequence of key-value pairs.

As in the authors' `synthetic/` code: keys have a trainable embedding; values are fixed one-hot vectors (never
trained), so the model can only succeed by storing and retrieving them; a pair is written with a key vector
computed from the pair's input [one_hot(value); embedding(key)], and the query is the query key's embedding.

    x_j = [one_hot(v_j); E k_j],  φ'(W_k x_j + b_k) as the key,  one_hot(v_j) as the value,  β_j = σ(W_β x_j + b_β)
    q = φ'(W_q E k_query + b_q),  ŷ = W q  (W the fast weights after the last pair; optionally / (z · q + eps))

`FastWeightsRetrieval` writes with the sum rule (its sum of one-hot writes, `sum_of_writes`), the delta rule
(`lazylab.models.fast_weights.delta_rule`, any kernel), the gated delta rule (a decay gate gⱼ from the pair's input,
`decay.py`) or DeltaProduct (n_h keys and βs per pair from projections n_h times wider, each step writing the pair's
value; with or without the gate) after any feature map φ'; `SoftmaxRetrieval` is the baseline,
ŷ = softmax(K q / √d) V over the pairs.

Shapes (sequence-first, as the rest of the project):
    pairs: LongTensor [n_pairs, batch, 2] (key id, value id);  queries: LongTensor [n_queries, batch]
    → ŷ: [n_queries, batch, n_values] (every query reads the same memory: its sequence's pairs)
"""
import math

import torch
from torch import nn

from lazylab.models.fast_weights.decay import DecayGate
from lazylab.models.fast_weights.layers import check_rule_options
from lazylab.models.fast_weights.rules import run_update_rule

__all__ = ['FastWeightsRetrieval', 'SoftmaxRetrieval', 'sum_of_writes']


class _PairInputs(nn.Module):
    """The shared part: the key embedding E (N(0, 1), trained) and the fixed one-hot values."""

    def __init__(self, n_keys: int, n_values: int, embedding_size: int):
        super().__init__()
        self.key_embedding = nn.Embedding(n_keys, embedding_size)
        self.register_buffer('values', torch.eye(n_values), persistent=False)  # not trained, not saved

    def embed_keys(self, pairs: torch.Tensor) -> torch.Tensor:
        """E k: [n_pairs, batch, 2] → [n_pairs, batch, embedding_size]."""
        if pairs.dim() != 3 or pairs.shape[-1] != 2:
            raise ValueError(f"pairs must be [n_pairs, batch, 2] (key id, value id), got {tuple(pairs.shape)}")
        return self.key_embedding(pairs[..., 0])

    def project_pairs(self, linear: nn.Linear, pairs: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """linear([one_hot(v); E k]) without the one-hot product: the value's column of the weight, looked up,
        plus the embedding's part (the same sum; O(size) instead of O(n_values · size) per pair)."""
        n_values = self.values.shape[0]
        value_part = nn.functional.embedding(pairs[..., 1], linear.weight[:, :n_values].T)
        return value_part + nn.functional.linear(embedded, linear.weight[:, n_values:], linear.bias)


class FastWeightsRetrieval(_PairInputs):
    """One fast-weight attention layer over the pairs, read once per query (see the module docstring).

    Args:
        n_keys, n_values: vocabulary sizes (the paper: both S).
        embedding_size: size of the key embedding (the authors: ⌊1.1 · (n_keys + n_values)⌋).
        hidden_size: size of keys and queries before φ' (the paper: 64).
        phi: the feature map φ' (e.g. `DPFP(nu)`, `LinearElu()`, `Favor(hidden_size, m)`, `L2NormSiLU()`).
        update_rule: 'sum' (no β), 'delta', 'gated_delta' or 'delta_product'.
        attention_normalization: divide the read-out by z · q + eps, z = Σⱼ φ'(kⱼ) (the authors' sum rule; for
            the sum and delta rules).
        kernel, chunk_size: how the rule is computed ('chunked', 'loop', 'step'; equal results).
        householder_steps, gated: DeltaProduct's n_h and its decay gate.
        negative_eigenvalues: β = 2σ(·) ∈ (0, 2) (Grazzi et al. 2025).
        eps: added to the denominator of the attention normalisation.

    Shapes:
        pairs: LongTensor [n_pairs, batch, 2] (key id, value id).
        queries: LongTensor [n_queries, batch] (key ids) → ŷ [n_queries, batch, n_values].

    Initialisation as the authors': W_k, W_q uniform in ±1/√hidden_size, E standard normal; biases PyTorch's; the
    gate's as Gated DeltaNet's (`DecayGate`).

    Raises:
        ValueError: an unknown rule, householder_steps < 1, or an option the rule does not have
            (`check_rule_options`).
    """

    def __init__(self, n_keys: int, n_values: int, embedding_size: int, hidden_size: int, phi: nn.Module, *,
                 update_rule: str = 'sum', attention_normalization: bool = False, kernel: str = 'chunked',
                 chunk_size: int = 64, eps: float = 1e-6, householder_steps: int = 2, gated: bool = False,
                 negative_eigenvalues: bool = False):
        super().__init__(n_keys, n_values, embedding_size)
        check_rule_options(update_rule, householder_steps, gated, negative_eigenvalues, attention_normalization)
        n_h = self.householder_steps = householder_steps if update_rule == 'delta_product' else 1
        self.key = nn.Linear(n_values + embedding_size, n_h * hidden_size)
        self.query = nn.Linear(embedding_size, hidden_size)
        self.beta = nn.Linear(n_values + embedding_size, n_h) if update_rule != 'sum' else None
        bound = 1 / math.sqrt(hidden_size)
        nn.init.uniform_(self.key.weight, -bound, bound)
        nn.init.uniform_(self.query.weight, -bound, bound)
        self.phi = phi
        self.update_rule, self.attention_normalization, self.eps = update_rule, attention_normalization, eps
        self.kernel, self.chunk_size = kernel, chunk_size
        self.negative_eigenvalues = negative_eigenvalues
        gate = update_rule == 'gated_delta' or (update_rule == 'delta_product' and gated)
        self.decay = DecayGate(n_values + embedding_size, 1) if gate else None

    def forward(self, pairs: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        embedded = self.embed_keys(pairs)
        n_pairs, batch, _ = pairs.shape
        keys = self.project_pairs(self.key, pairs, embedded).view(n_pairs, batch, self.householder_steps, -1)
        keys = self.phi(keys).unsqueeze(-2)  # [n_pairs, batch, n_h, 1, d_dot]
        query = self.phi(self.query(self.key_embedding(queries)))  # [n_queries, batch, d_dot]
        if self.update_rule == 'sum':
            weights = sum_of_writes(keys[:, :, 0, 0], pairs[..., 1], self.values.shape[0])
        else:
            weights = self._write(pairs, embedded, keys)
        query = query.to(weights.dtype)
        y = torch.einsum('bvd,qbd->qbv', weights, query)
        if self.attention_normalization:
            z = keys[:, :, 0, 0].to(weights.dtype).sum(0)  # Σⱼ φ'(kⱼ): [batch, d_dot]
            y = y / ((query * z).sum(-1, keepdim=True) + self.eps)
        return y

    def _write(self, pairs: torch.Tensor, embedded: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """The fast weights [batch, n_values, d_dot] after the last pair, written by the delta rule, the gated delta
        rule or DeltaProduct (keys [n_pairs, batch, n_h, 1, d_dot] after φ'). Only they are read: the keys stand in
        for the queries the kernels want, whose outputs are not used."""
        beta = torch.sigmoid(self.project_pairs(self.beta, pairs, embedded))  # [n_pairs, batch, n_h]
        if self.negative_eigenvalues:
            beta = 2 * beta
        g = None if self.decay is None else self.decay.log_decay(self.project_pairs(self.decay.projection, pairs,
                                                                                    embedded))
        values = self.values[pairs[..., 1]].unsqueeze(2)  # [n_pairs, batch, 1, n_values]
        if self.update_rule == 'delta_product':  # every step of a pair writes its value, under its own key
            k, beta = keys.transpose(1, 2), beta.transpose(1, 2).unsqueeze(-1)  # [n_pairs, n_h, batch, 1, …]
            v = values.unsqueeze(1).expand(-1, self.householder_steps, -1, -1, -1)
            _, weights = run_update_rule('delta_product', self.kernel, self.chunk_size, k[:, 0], k, v, beta, None, g)
        else:
            _, weights = run_update_rule(self.update_rule, self.kernel, self.chunk_size, keys[:, :, 0],
                                         keys[:, :, 0], values, beta, None, g)
        return weights[:, 0]


def sum_of_writes(keys: torch.Tensor, value_ids: torch.Tensor, n_values: int) -> torch.Tensor:
    """The sum rule's fast weights after the last pair, W = Σⱼ one_hot(vⱼ) ⊗ φ'(kⱼ), as row vⱼ += φ'(kⱼ): the
    same sum as the sum rule's kernels (`sum_rule.py`) but O(n_pairs · d_dot) instead of O(n_pairs · n_values ·
    d_dot), since with one-hot values each write touches one row and no per-pair read-out is needed.

    Shapes: keys [n_pairs, batch, d_dot], value_ids [n_pairs, batch] → W [batch, n_values, d_dot] (float32 or
    float64, like the kernels' states).
    """
    n_pairs, batch, d_dot = keys.shape
    exact = torch.promote_types(keys.dtype, torch.float32)
    rows = (torch.arange(batch, device=keys.device) * n_values + value_ids).reshape(-1)  # row of W, batch-major
    weights = keys.new_zeros(batch * n_values, d_dot, dtype=exact)
    return weights.index_add(0, rows, keys.reshape(-1, d_dot).to(exact)).view(batch, n_values, d_dot)


class SoftmaxRetrieval(_PairInputs):
    """The softmax-attention baseline: ŷ = Σⱼ softmax_j(kⱼ · q / √hidden_size) one_hot(vⱼ) (the authors'
    `SoftmaxAttentionModel`; W_k, W_q Xavier-uniform).

    Args:
        n_keys, n_values: vocabulary sizes (the paper: both S).
        embedding_size: size of the key embedding.
        hidden_size: size of keys and queries.

    Shapes:
        pairs: LongTensor [n_pairs, batch, 2] (key id, value id).
        queries: LongTensor [n_queries, batch] (key ids) → ŷ [n_queries, batch, n_values].
    """

    def __init__(self, n_keys: int, n_values: int, embedding_size: int, hidden_size: int):
        super().__init__(n_keys, n_values, embedding_size)
        self.key = nn.Linear(n_values + embedding_size, hidden_size)
        self.query = nn.Linear(embedding_size, hidden_size)
        nn.init.xavier_uniform_(self.key.weight)
        nn.init.xavier_uniform_(self.query.weight)
        self.hidden_size = hidden_size

    def forward(self, pairs: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        embedded, values = self.embed_keys(pairs), self.values[pairs[..., 1]]
        keys = self.project_pairs(self.key, pairs, embedded)  # [n_pairs, batch, hidden]
        query = self.query(self.key_embedding(queries))  # [n_queries, batch, hidden]
        scores = torch.einsum('pbh,qbh->qbp', keys, query) / math.sqrt(self.hidden_size)
        return torch.einsum('qbp,pbv->qbv', scores.softmax(-1), values.to(scores.dtype))
