"""The Feedback Transformer as a plain loop: the obviously-correct reference the fast modules are tested against.

labml-nn's algorithm, with nothing cached: at every step t each layer calls its own `forward` on the memory of the
steps before t, stacked afresh, and the step's memory vector m_t = Σ_l softmax(w)_l x_t^l is appended. For
`FeedbackTransformerKV` the memory holds each m_τ's shared key and value W_k m_τ, W_v m_τ; for
`FeedbackTransformer` it holds m_τ itself, which every layer projects with its own key and value weights.
Slow on purpose: the memory is re-stacked (and, for `FeedbackTransformer`, re-projected by every layer) at every
step. With a memory span N (`model.memory_span` > 0) each step sees only the last N memory vectors. No limit on
seq_len but the relative-position tables' `n_positions`.
"""
import torch

from lazylab.models.feedback import FeedbackTransformerKV

__all__ = ['reference_forward']


def reference_forward(model: torch.nn.Module, x_seq: torch.Tensor) -> torch.Tensor:
    """What `model(x_seq)` computes, step by step through the modules' own `forward`.

    Args:
        model: a `FeedbackTransformer` or `FeedbackTransformerKV` (its parameters, mode and `memory_span` are used
            as they are; dropout too, in training mode).
        x_seq: [seq_len, batch_size, d_model].

    Returns:
        [seq_len, batch_size, d_model]: the final LayerNorm of the last layer's output at every step.
    """
    w = model.softmax(model.weights)
    span = getattr(model, 'memory_span', 0)
    memory: list[tuple[torch.Tensor, torch.Tensor]] = []  # per earlier step: what the layers take as key, value
    outputs = []
    for x in x_seq.unbind(0):
        key = value = None
        seen = memory[-span:] if span else memory
        if seen:
            key = torch.stack([k for k, _ in seen])
            value = torch.stack([v for _, v in seen])
        layer_outputs = [x]
        for layer in model.layers:
            x = layer(x=x, key=key, value=value)
            layer_outputs.append(x)
        m = torch.einsum('lbd,l->bd', torch.stack(layer_outputs), w)  # the memory vector of this step
        memory.append((model.key(m), model.value(m)) if isinstance(model, FeedbackTransformerKV) else (m, m))
        outputs.append(x)
    return model.norm(torch.stack(outputs))
