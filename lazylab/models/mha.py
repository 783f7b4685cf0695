"""Multi-head attention (Vaswani et al. 2017, "Attention Is All You Need", section 3.2).

    Attention(Q, K, V) = softmax_j(Q Kᵀ / √d_k) V                     (eq. 1)
    MultiHead(Q, K, V) = Concat(head₁, …, head_h) W^O,  headᵢ = Attention(Q Wᵢ^Q, K Wᵢ^K, V Wᵢ^V)

Layout is sequence-first, `[seq_len, batch_size, d_model]`, and the modules keep labml-nn 0.5.1's names and
state-dict keys (`query.linear`, `key.linear`, `value.linear`, `output`), so weights load both ways.

Masks follow labml-nn: `mask[i, j, b]` is true (non-zero) when query i of batch element b may attend to key j.
Its shape is `[seq_len_q, seq_len_k, batch_size]`, and the first and last axes may be 1 to broadcast.
`subsequent_mask(seq_len)` gives the causal mask `[seq_len, seq_len, 1]`.

Two ways to compute the same thing:
- the explicit path: scores, mask, softmax, dropout, weighted sum of values, written out with `einsum` exactly
  as labml-nn does (so results are bit-for-bit equal), and used by subclasses that override `get_scores`
  (e.g. relative attention);
- `torch.nn.functional.scaled_dot_product_attention` (SDPA), used by this class itself when `use_sdpa=True`
  (the default): the same maths in a fused kernel, equal to the explicit path within float rounding
  (≤ 1e-6 in float32 at unit-scale inputs). Two cases fall back to the explicit path so semantics never change:
  a mask with a query row that allows no key (the reference gives NaN there, SDPA gives 0), and subclasses
  that override `get_scores`. With dropout active (training, p > 0) SDPA drops attention weights just as the
  reference does, with the same 1/(1 − p) scaling, but draws its own random numbers; set `use_sdpa=False` to
  reproduce the reference's dropout masks from the same seed.

Attention weights: after each forward, `self.attn` is `[seq_len_q, seq_len_k, batch_size, heads]`, detached.
On the explicit path it is the tensor used (after dropout, as in labml-nn). On the SDPA path it is computed
lazily from the detached queries and keys on first read (softmax of the masked, scaled scores, before dropout),
so inference pays nothing unless someone looks.
"""
import math
from collections.abc import Sequence
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lazylab.models.utils import check_heads


def subsequent_mask(seq_len: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """Causal mask: query i may attend to keys j ≤ i.

    Returns a bool tensor of shape [seq_len, seq_len, 1] (the batch axis broadcasts), equal to labml-nn's
    `labml_nn.transformers.utils.subsequent_mask`.

    Args:
        seq_len: the sequence length (≥ 0).
        device: where to make the mask (None: the default device).

    Raises:
        ValueError: seq_len is negative.
    """
    if seq_len < 0:
        raise ValueError(f"subsequent_mask needs seq_len >= 0, got {seq_len}")
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril().unsqueeze(-1)


class PrepareForMultiHeadAttention(nn.Module):
    """Linear projection split into heads: x W + b, reshaped to [..., heads, d_k].

    Args:
        d_model: input features.
        heads: number of heads h.
        d_k: features per head.
        bias: learn the bias b.

    Shapes:
        x: [..., d_model] → [..., heads, d_k] (usually [seq_len, batch_size, d_model] → [seq_len, batch_size, h, d_k]).

    Raises:
        ValueError: the input's last dimension is not d_model (on forward).
    """

    def __init__(self, d_model: int, heads: int, d_k: int, bias: bool):
        super().__init__()
        self.linear = nn.Linear(d_model, heads * d_k, bias=bias)
        self.heads = heads
        self.d_k = d_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.linear.in_features:
            raise ValueError(f"PrepareForMultiHeadAttention expects [..., d_model={self.linear.in_features}], "
                             f"got {tuple(x.shape)}")
        return self.linear(x).view(*x.shape[:-1], self.heads, self.d_k)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product multi-head attention (see the module docstring for the equations and the two paths).

    Args:
        heads: number of heads h; d_model must be divisible by it.
        d_model: width of query, key and value vectors; d_k = d_model / h.
        dropout_prob: dropout on the attention weights softmax(Q Kᵀ / √d_k).
        bias: learn biases of the query and key projections (the value and output projections always have one,
            as in labml-nn).
        use_sdpa: compute with `F.scaled_dot_product_attention` when that gives the same result (see above).

    Shapes:
        query: [seq_len_q, batch_size, d_model]; key, value: [seq_len_k, batch_size, d_model]
        mask (optional): [seq_len_q or 1, seq_len_k, batch_size or 1], true/non-zero = may attend
        output: [seq_len_q, batch_size, d_model]

    Raises:
        ValueError: d_model % heads != 0 (names both); inputs not of rank 3 or with the wrong width; key and value
            lengths or batch sizes that differ; a mask whose shape does not fit the rules above.
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, bias: bool = True, *,
                 use_sdpa: bool = True):
        super().__init__()
        check_heads(d_model, heads, type(self).__name__)
        self.d_k = d_model // heads
        self.heads = heads
        self.d_model = d_model
        # Creation order (query, key, value, output) follows labml-nn, so the same seed gives the same weights.
        self.query = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=bias)
        self.key = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=bias)
        self.value = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=True)
        self.softmax = nn.Softmax(dim=1)  # over keys j of scores [i, j, b, h]
        self.output = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout_prob)
        self.scale = 1 / math.sqrt(self.d_k)
        self.use_sdpa = use_sdpa
        self.attn = None

    # --- attention weights kept for inspection -------------------------------------------------------------

    @property
    def attn(self) -> Optional[torch.Tensor]:
        """Attention weights of the last forward, [seq_len_q, seq_len_k, batch_size, heads], detached (or None)."""
        if self._attn is None and self._attn_inputs is not None:
            query, key, mask = self._attn_inputs
            with torch.no_grad():
                self._attn = self._softmax_scores(query, key, mask)
            self._attn_inputs = None
        return self._attn

    @attn.setter
    def attn(self, value: Optional[torch.Tensor]):
        self._attn = value
        self._attn_inputs = None

    # --- the pieces of eq. 1, overridable by variants --------------------------------------------------------

    def get_scores(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """Unscaled scores Q Kᵀ per head: [i, b, h, d] × [j, b, h, d] → [i, j, b, h]. Variants override this."""
        return torch.einsum('ibhd,jbhd->ijbh', query, key)

    def prepare_mask(self, mask: torch.Tensor, query_shape: Sequence[int], key_shape: Sequence[int]) -> torch.Tensor:
        """Check a mask [seq_len_q or 1, seq_len_k, batch_size or 1] and add the heads axis → [..., 1]."""
        seq_q, batch = query_shape[0], query_shape[1]
        seq_k = key_shape[0]
        if (mask.dim() != 3 or mask.shape[0] not in (1, seq_q) or mask.shape[1] != seq_k
                or mask.shape[2] not in (1, batch)):
            raise ValueError(f"{type(self).__name__}: mask of shape {tuple(mask.shape)} does not fit "
                             f"[seq_len_q={seq_q} or 1, seq_len_k={seq_k}, batch_size={batch} or 1]")
        return mask.unsqueeze(-1)

    def _softmax_scores(self, query: torch.Tensor, key: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        scores = self.get_scores(query, key)
        scores *= self.scale
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float('-inf'))
        return self.softmax(scores)

    def _check_inputs(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        name = type(self).__name__
        for what, x in (('query', query), ('key', key), ('value', value)):
            if x.dim() != 3 or x.shape[-1] != self.d_model:
                raise ValueError(f"{name} expects {what} of shape [seq_len, batch_size, d_model={self.d_model}], "
                                 f"got {tuple(x.shape)}")
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"{name}: key {tuple(key.shape)} and value {tuple(value.shape)} differ in "
                             f"seq_len or batch_size")
        if query.shape[1] != key.shape[1]:
            raise ValueError(f"{name}: query batch_size={query.shape[1]} differs from key batch_size={key.shape[1]}")

    def _sdpa_applies(self, mask: Optional[torch.Tensor]) -> bool:
        if not self.use_sdpa or type(self).get_scores is not MultiHeadAttention.get_scores:
            return False
        # A query row with no allowed key: the reference yields NaN there, SDPA yields 0; keep the reference's.
        return mask is None or bool((mask != 0).any(dim=1).all())

    def forward(self, *,
                query: torch.Tensor,
                key: torch.Tensor,
                value: torch.Tensor,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """query [i, b, d_model], key/value [j, b, d_model], mask [i or 1, j, b or 1] → [i, b, d_model]."""
        self._check_inputs(query, key, value)
        seq_len, batch_size, _ = query.shape
        if mask is not None:
            mask = self.prepare_mask(mask, query.shape, key.shape)  # [i or 1, j, b or 1, 1]

        query = self.query(query)  # [i, b, h, d_k]
        key = self.key(key)  # [j, b, h, d_k]
        value = self.value(value)  # [j, b, h, d_k]

        if self._sdpa_applies(mask):
            x = self._sdpa(query, key, value, mask)
        else:
            attn = self._softmax_scores(query, key, mask)  # [i, j, b, h]
            attn = self.dropout(attn)
            x = torch.einsum('ijbh,jbhd->ibhd', attn, value)
            self.attn = attn.detach()

        return self.output(x.reshape(seq_len, batch_size, -1))

    def _sdpa(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              mask: Optional[torch.Tensor]) -> torch.Tensor:
        """The fused kernel, in its [batch, heads, seq, d_k] layout; returns [i, b, h, d_k]."""
        attn_mask = None
        if mask is not None:
            # [i or 1, j, b or 1, 1] → [b or 1, 1, i or 1, j], true = may attend
            attn_mask = (mask if mask.dtype == torch.bool else mask != 0).permute(2, 3, 0, 1)
        dropout_p = self.dropout.p if self.training else 0.0
        x = F.scaled_dot_product_attention(query.permute(1, 2, 0, 3), key.permute(1, 2, 0, 3),
                                           value.permute(1, 2, 0, 3), attn_mask=attn_mask,
                                           dropout_p=dropout_p, scale=self.scale)
        self.attn = None
        self._attn_inputs = (query.detach(), key.detach(), mask)
        return x.permute(2, 0, 1, 3)
