"""Feature maps φ' of linear / fast-weight attention: keys and queries [..., d_key] → features [..., d_dot].

`DPFP` (Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly Fast Weight Programmers", section 4.2,
Deterministic Parameter-Free Projection), with a fused forward and backward (`dpfp_normalised`).

How the fused DPFP is computed: with r = ReLU([k, −k]) (size 2·d), φ concatenates, for i = 1..ν, the products
r ⊙ roll(r, i), and φ'(k) = φ(k) / (Σⱼ φ(k)ⱼ + eps). Element j < d of r ⊙ roll(r, i) is ReLU(kⱼ)·ReLU(b⁽ⁱ⁾ⱼ) and
element d + j is ReLU(−kⱼ)·ReLU(−b⁽ⁱ⁾ⱼ), where b⁽ⁱ⁾ = roll(k, i) with its first i entries negated (they wrap around
from the −k half). Both are pⱼ = kⱼ·b⁽ⁱ⁾ⱼ when kⱼ and b⁽ⁱ⁾ⱼ share a sign, and zero otherwise, so

    m⁽ⁱ⁾ = ReLU(k ⊙ b⁽ⁱ⁾)    (size d)
    φ⁽ⁱ⁾ = [m⁽ⁱ⁾ ⊙ 1(k > 0),  m⁽ⁱ⁾ ⊙ 1(k < 0)]

Forward and backward are a handful of elementwise passes (most d wide instead of 2·d) instead of the twenty or
so that autograd records for the concatenate-roll-multiply form. The products are the same numbers and φ is
summed in the same layout, so φ' is bit-for-bit the definition's (and labml-nn's); the gradients agree to
rounding. Masks are float tensors: bool masks take an unvectorised path in PyTorch's CPU kernels.
"""
import torch
from torch import nn

__all__ = ['DPFP', 'dpfp_normalised']


class DPFP(nn.Module):
    """Deterministic Parameter-Free Projection φ' (Schlag et al. 2021), normalised by its sum.

    With r = ReLU([k, −k]) (size 2·d_key), φ is the concatenation over i = 1..ν of r ⊙ roll(r, i):

        φ_{2·d_key·(i−1) + j}(k) = r_j · r_{(j − i) mod 2·d_key}

    (`torch.roll` by +i: element j of the rolled copy is r_{j−i}). The result has d_dot = 2·d_key·ν features, is
    sparse and nearly orthogonal for different keys. It is normalised so that its entries sum to one:
    φ'(k) = φ(k) / (Σⱼ φ(k)ⱼ + eps).

    Args:
        nu: ν ≥ 1, the number of rolled products (the paper uses ν ∈ {1, 2, 3}).
        eps: added to the sum to avoid dividing by zero (φ(0) = 0).

    Shapes:
        k: [..., d_key] → [..., 2 · d_key · ν]

    Raises:
        ValueError: nu < 1.
    """

    def __init__(self, nu: int = 1, eps: float = 1e-6):
        super().__init__()
        if nu < 1:
            raise ValueError(f"DPFP needs nu >= 1, got nu={nu}")
        self.nu = nu
        self.relu = nn.ReLU()
        self.eps = eps

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        # Both paths give the same bits. The fused one saves passes over large tensors and most of the backward;
        # small inputs without autograd (a generation step) are quicker as the few plain operations.
        small_inference = k.numel() <= 16384 and not (torch.is_grad_enabled() and k.requires_grad)
        if self.nu <= k.shape[-1] and k.is_floating_point() and not small_inference:
            return dpfp_normalised(k, self.nu, self.eps)
        return self.plain(k)

    def plain(self, k: torch.Tensor) -> torch.Tensor:
        """φ'(k) by the definition's operations, without `forward`'s choice of path (a generation step function
        calls this directly): the same bits as `forward`, but no fused backward."""
        phi = self.dpfp(k)
        return phi / (phi.sum(dim=-1, keepdim=True) + self.eps)

    def dpfp(self, k: torch.Tensor) -> torch.Tensor:
        """The un-normalised φ(k): [..., d_key] → [..., 2 · d_key · ν], written as the definition (the reference
        the fused `forward` is tested against)."""
        r = torch.cat([k, -k], dim=-1).relu_()  # `self.relu` is kept for labml_nn's module layout
        if self.nu == 1:  # the common case, without the stack (fewer operations for a generation step)
            return r * r.roll(shifts=1, dims=-1)
        rolled = torch.stack([r.roll(shifts=i, dims=-1) for i in range(1, self.nu + 1)], dim=-2)  # [..., ν, 2·d_key]
        return (r.unsqueeze(-2) * rolled).flatten(-2)  # broadcasting r over the ν copies, no repeat


# ----------------------------------------------------------------------------------------------------------------
# The fused DPFP (see the module docstring)
# ----------------------------------------------------------------------------------------------------------------

def _partners(k: torch.Tensor, nu: int) -> torch.Tensor:
    """b⁽ⁱ⁾ = roll(k, i) with its first i entries negated, for i = 1..ν: [..., d] → [..., ν, d]."""
    d = k.shape[-1]
    b = k.new_empty(*k.shape[:-1], nu, d)
    for i in range(1, nu + 1):
        b[..., i - 1, i:] = k[..., :d - i]
        torch.neg(k[..., d - i:], out=b[..., i - 1, :i])
    return b


def _indicator(x: torch.Tensor) -> torch.Tensor:
    """1(x > 0) in x's dtype."""
    return torch.gt(x, 0, out=torch.empty_like(x))


class _DPFPFunction(torch.autograd.Function):
    """φ'(k) for k [..., d] → [..., 2·d·ν] (see the module docstring). Not twice differentiable."""

    @staticmethod
    def forward(ctx, k: torch.Tensor, nu: int, eps: float):
        k = k.contiguous()
        d = k.shape[-1]
        partners = _partners(k, nu)  # [..., ν, d]
        m = torch.mul(partners, k.unsqueeze(-2)).clamp_min_(0)  # m⁽ⁱ⁾ = ReLU(k ⊙ b⁽ⁱ⁾)
        positive = _indicator(k).unsqueeze(-2)  # [..., 1, d]
        out = k.new_empty(*k.shape[:-1], nu, 2, d)
        torch.mul(m, positive, out=out[..., 0, :])
        torch.sub(m, out[..., 0, :], out=out[..., 1, :])  # where k = 0, m = 0 too
        # φ holds the same numbers in the same places as the definition's, so this sum (and the result) is
        # bit-for-bit the reference's
        out = out.view(*k.shape[:-1], 2 * d * nu)
        total = out.sum(dim=-1, keepdim=True).add_(eps)
        out.div_(total)
        ctx.save_for_backward(k, partners, m, total, positive)
        ctx.nu = nu
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        k, partners, m, total, positive = ctx.saved_tensors
        nu, d = ctx.nu, k.shape[-1]
        total = total.unsqueeze(-1)  # [..., 1, 1] against m's [..., ν, d]
        grad = grad_out.reshape(*k.shape[:-1], nu, 2, d)
        # d out / d m⁽ⁱ⁾ picks the half that m was written to: g₂ + 1(k > 0) (g₁ − g₂)
        grad_m = torch.lerp(grad[..., 1, :], grad[..., 0, :], positive)  # [..., ν, d]
        # through the normalisation φ / total:  (g − Σ g ⊙ φ / total) / total, then the ReLU (m > 0 ⇔ p > 0)
        dot = torch.linalg.vecdot(grad_m.flatten(-2), m.flatten(-2)).unsqueeze(-1).unsqueeze(-1).div_(total)
        grad_p = grad_m.sub_(dot).div_(total).mul_(_indicator(m))
        grad_k = grad_p[..., 0, :] * partners[..., 0, :]  # Σ over i (a copy-free sum: ν = 1 is the common case)
        for i in range(1, nu):
            grad_k.addcmul_(grad_p[..., i, :], partners[..., i, :])
        grad_partners = grad_p.mul_(k.unsqueeze(-2))
        for i in range(1, nu + 1):  # b⁽ⁱ⁾ⱼ is k_{j−i}, negated for j < i
            g = grad_partners[..., i - 1, :]
            grad_k[..., :d - i] += g[..., i:]
            grad_k[..., d - i:] -= g[..., :i]
        return grad_k, None, None


def dpfp_normalised(k: torch.Tensor, nu: int, eps: float) -> torch.Tensor:
    """φ'(k) = φ(k) / (Σ φ(k) + eps): [..., d] → [..., 2·d·ν], fused; needs 1 ≤ ν ≤ d (a roll by more than d
    wraps past the other half, which the formula above does not cover)."""
    if not 1 <= nu <= k.shape[-1]:
        raise ValueError(f"the fused DPFP needs 1 <= nu <= d_key, got nu={nu}, d_key={k.shape[-1]}")
    return _DPFPFunction.apply(k, nu, eps)
