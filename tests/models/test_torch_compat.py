"""The private PyTorch APIs behind `lazylab.models._torch_compat` still exist and behave as the models rely on."""
import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

from lazylab.models import _torch_compat as compat


def test_backward_pass_id_is_minus_one_outside_and_new_in_every_pass():
    seen = []

    class Record(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append(compat.backward_pass_id())
            return grad * 2

    assert compat.backward_pass_id() == -1
    x = torch.ones(3, requires_grad=True)
    y = Record.apply(x).sum()
    y.backward(retain_graph=True)
    y.backward(retain_graph=True)  # the same graph, a second pass
    (g,) = torch.autograd.grad(y, [x])
    assert len(seen) == 3 and -1 not in seen
    assert len(set(seen)) == 3, seen
    torch.testing.assert_close(g, torch.full((3,), 2.0))
    assert compat.backward_pass_id() == -1


def test_backward_pass_id_is_one_id_within_a_pass():
    seen = []

    class Record(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            seen.append(compat.backward_pass_id())
            return grad

    x = torch.ones(2, requires_grad=True)
    (Record.apply(x) + Record.apply(x)).sum().backward()
    assert len(seen) == 2 and seen[0] == seen[1] != -1


@pytest.mark.parametrize('dim', [0, -1])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_softmax_backward_equals_autograd(dim, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 6, generator=g, dtype=dtype, requires_grad=True)
    y = torch.softmax(x, dim=dim)
    grad_y = torch.randn(y.shape, generator=g, dtype=dtype)
    (expected,) = torch.autograd.grad(y, [x], grad_y)
    y = y.detach()
    closed_form = y * (grad_y - (grad_y * y).sum(dim, keepdim=True))
    torch.testing.assert_close(compat.softmax_backward(grad_y, y, dim), expected)
    torch.testing.assert_close(compat.softmax_backward(grad_y, y, dim), closed_form)


def test_global_forward_hooks_are_visible_while_registered():
    assert not compat.global_forward_hooks_registered()
    for register in (torch_module.register_module_forward_hook, torch_module.register_module_forward_pre_hook):
        calls = []
        handle = register(lambda module, *args, calls=calls: calls.append(type(module).__name__))
        try:
            assert compat.global_forward_hooks_registered()
            nn.ReLU()(torch.ones(1))
            assert calls == ['ReLU']  # and it does run on every module call
        finally:
            handle.remove()
        assert not compat.global_forward_hooks_registered()


def test_a_local_hook_is_not_a_global_one():
    layer = nn.Linear(2, 2)
    handle = layer.register_forward_hook(lambda module, args, out: out)
    try:
        assert not compat.global_forward_hooks_registered()
    finally:
        handle.remove()


def test_untracked_alias_shares_storage_but_not_the_version_counter():
    buffer = torch.zeros(4, 3)
    alias = compat.untracked_alias(buffer)
    assert alias.data_ptr() == buffer.data_ptr() and not alias.requires_grad
    buffer_version, alias_version = buffer._version, alias._version
    alias[0] = 1.0  # a write through the alias: seen in the buffer, counted on the alias only
    assert torch.equal(buffer[0], torch.ones(3))
    assert (buffer._version, alias._version) == (buffer_version, alias_version + 1)
    buffer[1] = 2.0  # a write through the buffer: seen in the alias, counted on the buffer only
    assert torch.equal(alias[1], torch.full((3,), 2.0))
    assert (buffer._version, alias._version) == (buffer_version + 1, alias_version + 1)


def test_writes_to_the_buffer_leave_saved_views_of_the_alias_usable():
    # What the feedback memory does: a view of the alias is saved by autograd (here by mul), then a later slot
    # is written through the buffer; backward must neither complain nor see a changed value.
    buffer = torch.zeros(4, 3)
    buffer[:2] = torch.arange(6.0).view(2, 3)
    alias = compat.untracked_alias(buffer)
    w = torch.ones(2, 3, requires_grad=True)
    loss = (alias[:2] * w).sum()
    with torch.no_grad():
        buffer[2:] = 7.0
    loss.backward()
    torch.testing.assert_close(w.grad, torch.arange(6.0).view(2, 3))
    # the same through the buffer itself trips autograd's check: the reason for the alias
    w.grad = None
    loss = (buffer[:2] * w).sum()
    with torch.no_grad():
        buffer[2:] = 8.0
    with pytest.raises(RuntimeError, match='modified by an inplace operation'):
        loss.backward()


@pytest.mark.parametrize('affine', [True, False], ids=['affine', 'plain'])
def test_layer_norm_with_statistics_and_its_backward_equal_autograd_and_the_closed_form(affine):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 7, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(16, generator=g, dtype=torch.float64) if affine else None
    bias = torch.randn(16, generator=g, dtype=torch.float64) if affine else None
    y, mean, rstd = compat.layer_norm_with_statistics(x, weight, bias, 1e-5)
    expected = torch.nn.functional.layer_norm(x, (16,), weight, bias, 1e-5)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mean, x.mean(-1, keepdim=True))
    torch.testing.assert_close(rstd, (x.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt())
    grad_y = torch.randn(y.shape, generator=g, dtype=torch.float64)
    (autograd,) = torch.autograd.grad(expected, [x], grad_y)
    x_hat = (x - mean) * rstd
    g_hat = grad_y * (weight if affine else 1)
    closed_form = rstd * (g_hat - g_hat.mean(-1, keepdim=True) - x_hat * (g_hat * x_hat).mean(-1, keepdim=True))
    ours = compat.layer_norm_backward(grad_y, x.detach(), mean, rstd, weight)
    torch.testing.assert_close(ours, autograd, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours, closed_form.detach(), rtol=1e-12, atol=1e-12)
