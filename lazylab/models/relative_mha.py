"""Relative multi-head attention of Transformer-XL (Dai et al. 2019, "Transformer-XL: Attentive Language Models
Beyond a Fixed-Length Context", section 3.3), in labml-nn 0.5.1's form.

Absolute attention between query i and key j expands into four terms (content/position of each side); the
paper replaces the absolute positions with relative ones:

    A^rel_{i,j} = Q_iᵀ K_j  +  Q_iᵀ R_{i−j}  +  vᵀ K_j  +  S_{i−j}
                  (a)          (b)             (c)         (d)

with R a learned embedding per relative distance and head (`key_pos_embeddings`), S a learned bias per relative
distance and head (`key_pos_bias`), and v a learned vector per head (`query_pos_bias`). (a) + (c) is computed as
(Q_i + v)ᵀ K_j; (b) + (d) is computed for every (query, relative-position) pair and moved into place with the
shifting trick of the paper's appendix B (`shift_right`).

Keys are assumed to end where the queries end (the usual memory-then-current layout), so query i (of n) and key
j (of m) are at relative distance i − j + m − n. Relative positions cover [−P, P) with P = 4096, so both sequence
lengths must be at most P.

State-dict keys: those of MultiHeadAttention (the query and key projections have no bias) plus
`key_pos_embeddings` [2P, heads, d_k], `key_pos_bias` [2P, heads] and `query_pos_bias` [heads, d_k], all
initialised to zero, as in labml-nn.
"""
import torch
from torch import nn

from lazylab.models.mha import MultiHeadAttention


def shift_right(x: torch.Tensor) -> torch.Tensor:
    """Shift row i of x right by i places (the relative-to-absolute trick of Transformer-XL, appendix B).

    Row i is shifted right by i columns; what enters from the left is a zero followed by the tail of row i − 1
    (e.g. [[1, 2, 3], [4, 5, 6], [7, 8, 9]] → [[1, 2, 3], [0, 4, 5], [6, 0, 7]]). The entries that wrap around lie
    in the part the caller discards or masks, as in labml-nn, which this reproduces exactly.

    Shapes:
        x: [rows, cols, ...] → [rows, cols, ...]
    """
    rows, cols = x.shape[0], x.shape[1]
    padded = torch.cat([x, x.new_zeros(rows, 1, *x.shape[2:])], dim=1)  # [rows, cols + 1, ...]
    # Reading the padded rows back as rows of length `cols` moves row i right by i places.
    return padded.reshape(rows * (cols + 1), *x.shape[2:])[:rows * cols].view_as(x)


class RelativeMultiHeadAttention(MultiHeadAttention):
    """Transformer-XL relative multi-head attention (see the module docstring for the equation).

    Args:
        heads: number of heads h; d_model must be divisible by it.
        d_model: width of query, key and value vectors.
        dropout_prob: dropout on the attention weights.

    Shapes:
        as MultiHeadAttention: query [seq_len_q, batch_size, d_model], key/value [seq_len_k, batch_size, d_model],
        optional mask [seq_len_q or 1, seq_len_k, batch_size or 1] → [seq_len_q, batch_size, d_model].

    Raises:
        ValueError: as MultiHeadAttention, and when seq_len_q or seq_len_k exceeds P = 4096 (names both).
    """

    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1):
        super().__init__(heads, d_model, dropout_prob, bias=False)
        self.P = 2 ** 12  # relative positions −P … P − 1
        self.key_pos_embeddings = nn.Parameter(torch.zeros(self.P * 2, heads, self.d_k))  # R
        self.key_pos_bias = nn.Parameter(torch.zeros(self.P * 2, heads))  # S
        self.query_pos_bias = nn.Parameter(torch.zeros(heads, self.d_k))  # v

    def get_scores(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """A^rel for query [i, b, h, d] and key [j, b, h, d] → [i, j, b, h]."""
        n, m = query.shape[0], key.shape[0]
        if n > self.P or m > self.P:
            raise ValueError(f"RelativeMultiHeadAttention covers at most P={self.P} positions, "
                             f"got seq_len_q={n}, seq_len_k={m}")
        # Rows of R and S for relative distances m−1 … −n+1 … (indexes P−m … P+n−1).
        r = self.key_pos_embeddings[self.P - m:self.P + n]  # [m + n, h, d]
        s = self.key_pos_bias[self.P - m:self.P + n]  # [m + n, h]
        ac = torch.einsum('ibhd,jbhd->ijbh', query + self.query_pos_bias[None, None], key)  # (a) + (c)
        b = torch.einsum('ibhd,jhd->ijbh', query, r)  # (b) for every relative row
        bd = shift_right(b + s[None, :, None, :])[:, -m:]  # (b) + (d), moved to key columns
        return ac + bd
