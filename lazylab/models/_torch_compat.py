"""The private PyTorch APIs the models rely on, in one place.

Each is wrapped by a named function that says what it relies on; `tests/models/test_torch_compat.py` checks that
each still exists and behaves so (run it first after a PyTorch upgrade). Users: the feedback memory
(`lazylab.models.feedback.memory`) and the fast-weights step functions (`lazylab.models.fast_weights.step`).
"""
import torch
from torch.nn.modules import module as _module


def backward_pass_id() -> int:
    """The id of the autograd graph task (one backward pass) running now; -1 outside a backward pass.

    Relies on `torch._C._current_graph_task_id()`: called inside a custom `autograd.Function.backward`, it gives one
    id per `backward()` / `autograd.grad()` call, different for every call (also over a retained graph). The
    feedback memory's tape uses it to start from zero in each new pass.
    """
    return torch._C._current_graph_task_id()


def softmax_backward(grad_output: torch.Tensor, output: torch.Tensor, dim: int) -> torch.Tensor:
    """The gradient of y = softmax(x, dim) with respect to x, given ∂L/∂y and y (not x):

        ∂L/∂x = y ⊙ (∂L/∂y − Σ_dim(∂L/∂y ⊙ y))

    Relies on `torch._softmax_backward_data(grad_output, output, dim, input_dtype)`, the kernel autograd itself
    uses for softmax: one fused pass instead of three elementwise ones. Shapes: grad_output and output alike.
    """
    return torch._softmax_backward_data(grad_output, output, dim, output.dtype)


def global_forward_hooks_registered() -> bool:
    """Whether a global forward hook or pre-hook is registered (`torch.nn.modules.module.register_module_forward_hook`
    / `register_module_forward_pre_hook`): then every module call runs it, and code that skips module calls must
    not be used.

    Relies on the module-level dictionaries `_global_forward_hooks` and `_global_forward_pre_hooks` of
    `torch.nn.modules.module`, where those functions store the hooks (no public API asks for them).
    """
    return bool(_module._global_forward_hooks or _module._global_forward_pre_hooks)


def untracked_alias(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor sharing `tensor`'s storage whose version counter is its own (`tensor.data`).

    Autograd checks, before using a tensor it saved, that the tensor's version counter has not moved (no in-place
    write since). Writes through `tensor` bump only `tensor`'s counter, so views of the alias saved for backward
    stay valid while `tensor` is written elsewhere: the feedback memory writes new slots into its buffer while
    earlier steps' attention holds views of the slots written before (which those writes never touch).

    Relies on `Tensor.data` returning a detached alias with a fresh version counter (documented behaviour of
    `.data`, which `Tensor.detach()` deliberately does not share).
    """
    return tensor.data


def layer_norm_with_statistics(x: torch.Tensor, weight, bias, eps: float):
    """LayerNorm over the last dimension, returning (y, mean, rstd), mean and rstd = 1/√(var + eps) of shape
    [..., 1], which `layer_norm_backward` takes.

    Relies on `torch.native_layer_norm(input, normalized_shape, weight, bias, eps)`, the kernel
    `F.layer_norm` calls (it is in the torch namespace but undocumented). weight and bias may be None.
    """
    return torch.native_layer_norm(x, (x.shape[-1],), weight, bias, eps)


def layer_norm_backward(grad_y: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                        weight) -> torch.Tensor:
    """∂L/∂x of y = LayerNorm(x) over the last dimension, from ∂L/∂y, x and the forward's mean and rstd:

        x̂ = (x − mean)·rstd,  ĝ = ∂L/∂y ⊙ weight,  ∂L/∂x = rstd · (ĝ − mean(ĝ) − x̂ · mean(ĝ ⊙ x̂))

    (the weight's and bias's gradients are not computed). Relies on
    `torch.ops.aten.native_layer_norm_backward.default(grad_out, input, normalized_shape, mean, rstd, weight,
    bias, output_mask)`, the kernel autograd uses for layer_norm, in one fused pass. weight may be None.
    """
    return torch.ops.aten.native_layer_norm_backward.default(
        grad_y, x, (x.shape[-1],), mean, rstd, weight, None, [True, False, False])[0]
