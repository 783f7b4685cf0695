"""The growing key/value memory of the Feedback Transformer (the fast path, `sequence.py`, reads and writes it; the
incremental state `FeedbackState` carries it between calls).

The memory never changes once written, so the keys and values of each memory vector m_τ are computed **once**,
when m_τ is made (the plain loop of `reference.py` re-stacks the memory at every step, and for
`FeedbackTransformer` re-projects all of it in every layer), and written into a buffer
`[groups, batch·heads, capacity, d_k]` that only grows (capacity at least doubles; no 512-step stack). Each step's
attention reads a view of the slots it attends to; nothing is re-stacked.
"""
import copy

import torch

__all__ = ['Memory']


class Memory:
    """Keys and values of the memory steps written so far: `data [groups, batch·heads, capacity, d_k]`.

    groups = 2 (k, v) for the KV variant and 2·n_layers (k¹, v¹, k², v², …) for the original. Slot τ of group g
    holds that projection of m_τ with the batch-major head index b·heads + h. Only slots < n are valid.

    Args:
        groups, batch, heads, d_k: the sizes above.
        capacity: slots to allocate (at least 1).
        dtype, device: of the buffer (the dtype of the attention's matrix products).
    """

    def __init__(self, groups: int, batch: int, heads: int, d_k: int, capacity: int, dtype: torch.dtype,
                 device: torch.device):
        self.groups, self.batch, self.heads, self.d_k = groups, batch, heads, d_k
        self.n = 0
        self._set(torch.zeros(groups, batch * heads, max(capacity, 1), d_k, dtype=dtype, device=device))

    def _set(self, data: torch.Tensor):
        self.data = data
        # slot τ of every group at once, [groups, batch, heads, d_k], is slots.select(3, τ)
        self.slots = data.view(self.groups, self.batch, self.heads, -1, self.d_k)

    @property
    def capacity(self) -> int:
        return self.data.shape[2]

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    def reserve(self, capacity: int):
        """Make room for `capacity` slots (at least doubling), keeping the n written ones. A reallocation leaves
        the old buffer to whoever still reads it (a pending backward pass)."""
        if capacity > self.capacity:
            old = self.data
            self._set(old.new_zeros(self.groups, self.batch * self.heads, max(capacity, 2 * self.capacity),
                                    self.d_k))
            self.data[:, :, :self.n] = old[:, :, :self.n]

    def fork(self, n: int, dtype: torch.dtype) -> 'Memory':
        """A copy holding only the first n slots, in `dtype` (used when an older state is continued a second
        time, or under another autocast dtype)."""
        other = copy.copy(self)
        other.n = n
        other._set(self.data.new_zeros(self.data.shape, dtype=dtype))
        other.data[:, :, :n] = self.data[:, :, :n]
        return other

    def write(self, kv: torch.Tensor):
        """Store slot n from kv [batch, groups·heads·d_k] (group-major features), then n += 1."""
        self.slots.select(3, self.n).copy_(kv.view(self.batch, self.groups, self.heads, self.d_k).transpose(0, 1))
        self.n += 1
