"""Feature maps φ' of linear / fast-weight attention: keys and queries [..., d_key] → features [..., d_dot].

The three maps the fast-weights paper compares (Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly
Fast Weight Programmers", section 4), each followed by the sum normalisation φ'(x) = φ(x) / (Σⱼ φ(x)ⱼ + eps)
unless `sum_normalization=False`:

* `DPFP(nu)`: Deterministic Parameter-Free Projection (section 4.2), d_dot = 2 · d_key · ν, with a fused forward
  and backward (`dpfp_normalised`);
* `LinearElu()`: φ(x) = ELU(x) + 1 (Katharopoulos, Vyas, Pappas & Fleuret 2020, "Transformers are RNNs"),
  d_dot = d_key;
* `Favor(d_key, features)`: FAVOR+ positive random features (Choromanski et al. 2021, "Rethinking Attention with
  Performers"), d_dot = 2 · features;

and one map of the delta rule's successors, normalised by its length instead of its sum:

* `L2NormSiLU()`: φ'(x) = SiLU(x) / ‖SiLU(x)‖₂, d_dot = d_key (DeltaNet's and Gated DeltaNet's keys and queries;
  unit keys make I − β k kᵀ a reflection for β = 2).

`make_feature_map(name, d_key, …)` builds one by its option name ('dpfp', 'linear', 'favor', 'l2'); each map's
`out_features(d_key)` gives d_dot. Every map acts on the last axis alone (no per-head parameters), so q and k of
all heads may go through one call.

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
import math
from typing import Optional

import torch
from torch import nn

__all__ = ['DPFP', 'LinearElu', 'Favor', 'L2NormSiLU', 'FEATURE_MAPS', 'make_feature_map', 'sum_normalise',
           'dpfp_normalised', 'orthogonal_random_features']

#: the option names of the feature maps (`phi=` of the configs)
FEATURE_MAPS = ('dpfp', 'linear', 'favor', 'l2')


def sum_normalise(phi: torch.Tensor, eps: float) -> torch.Tensor:
    """φ' = φ / (Σⱼ φⱼ + eps) over the last axis (the paper's sum normalisation, section 4.1 / eq. 26).

    Args:
        phi: features φ, [..., d_dot], non-negative.
        eps: added to the sum to avoid dividing by zero.

    Returns:
        φ', the same shape, whose entries sum to (almost) one.
    """
    # times the reciprocal: one division per row instead of per feature, and a cheaper backward pass
    return phi * (phi.sum(dim=-1, keepdim=True) + eps).reciprocal()


class DPFP(nn.Module):
    """Deterministic Parameter-Free Projection φ' (Schlag et al. 2021), normalised by its sum (labml_nn's `DPFP`).

    With r = ReLU([k, −k]) (size 2·d_key), φ is the concatenation over i = 1..ν of r ⊙ roll(r, i):

        φ_{2·d_key·(i−1) + j}(k) = r_j · r_{(j − i) mod 2·d_key}

    (`torch.roll` by +i: element j of the rolled copy is r_{j−i}). The result has d_dot = 2·d_key·ν features, is
    sparse and nearly orthogonal for different keys. It is normalised so that its entries sum to one:
    φ'(k) = φ(k) / (Σⱼ φ(k)ⱼ + eps) (bit for bit labml_nn's); with `sum_normalization=False` it is φ itself.

    Args:
        nu: ν ≥ 1, the number of rolled products (the paper uses ν ∈ {1, 2, 3}).
        eps: added to the sum to avoid dividing by zero (φ(0) = 0).
        sum_normalization: divide by the sum (default, as labml_nn) or not.

    Shapes:
        k: [..., d_key] → [..., 2 · d_key · ν]

    Raises:
        ValueError: nu < 1.
    """

    def __init__(self, nu: int = 1, eps: float = 1e-6, *, sum_normalization: bool = True):
        super().__init__()
        if nu < 1:
            raise ValueError(f"DPFP needs nu >= 1, got nu={nu}")
        self.nu = nu
        self.relu = nn.ReLU()
        self.eps = eps
        self.sum_normalization = sum_normalization

    def out_features(self, d_key: int) -> int:
        """d_dot = 2 · d_key · ν."""
        return 2 * d_key * self.nu

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        if not self.sum_normalization:
            return self.dpfp(k)
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
        return phi / (phi.sum(dim=-1, keepdim=True) + self.eps) if self.sum_normalization else phi

    def dpfp(self, k: torch.Tensor) -> torch.Tensor:
        """The un-normalised φ(k): [..., d_key] → [..., 2 · d_key · ν], written as the definition (the reference
        the fused `forward` is tested against)."""
        r = torch.cat([k, -k], dim=-1).relu_()  # `self.relu` is kept for labml_nn's module layout
        if self.nu == 1:  # the common case, without the stack (fewer operations for a generation step)
            return r * r.roll(shifts=1, dims=-1)
        rolled = torch.stack([r.roll(shifts=i, dims=-1) for i in range(1, self.nu + 1)], dim=-2)  # [..., ν, 2·d_key]
        return (r.unsqueeze(-2) * rolled).flatten(-2)  # broadcasting r over the ν copies, no repeat


class LinearElu(nn.Module):
    """φ(x) = ELU(x) + 1 (Katharopoulos et al. 2020), positive for every x; d_dot = d_key. Sum-normalised,
    φ' = φ / (Σ φ + eps), unless `sum_normalization=False`.

    Args:
        eps: added to the sum to avoid dividing by zero.
        sum_normalization: divide by the sum (default) or not.

    Shapes:
        k: [..., d_key] → [..., d_key]
    """

    def __init__(self, eps: float = 1e-6, *, sum_normalization: bool = True):
        super().__init__()
        self.eps = eps
        self.sum_normalization = sum_normalization

    def out_features(self, d_key: int) -> int:
        """d_dot = d_key."""
        return d_key

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        if _small_inference(k) or not k.is_floating_point():
            return self.plain(k)
        return _LinearEluFunction.apply(k, self.eps if self.sum_normalization else None)

    def plain(self, k: torch.Tensor) -> torch.Tensor:
        """φ'(k) by the definition's operations (the reference the fused `forward` is tested against; quicker for
        a generation step's few values without autograd)."""
        phi = torch.relu(k) + torch.exp(k).clamp_max(1)  # ELU(x) + 1, in the fused function's operations
        return sum_normalise(phi, self.eps) if self.sum_normalization else phi


def orthogonal_random_features(d_key: int, features: int, generator: Optional[torch.Generator] = None,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The random projection Ω [features, d_key] of FAVOR+ (Choromanski et al. 2021, section 2.4): rows ωᵢ in
    blocks of d_key mutually orthogonal directions (Q of the QR decomposition of a d_key × d_key standard normal
    matrix, one block per d_key rows, the last block cut), each scaled to the length of an independent standard
    normal d_key-vector, so that every ωᵢ is marginally N(0, I) as the estimator needs.

    Draws from `generator` (None: torch's global generator, which `lazylab train` seeds with `seed`).

    Args:
        d_key: the size of the keys the features are of.
        features: m, the number of random directions (rows of Ω).
        generator: the random generator to draw from, or None for torch's global one.
        dtype: the dtype of the result (the draws themselves are made in float64).

    Returns:
        Ω, [features, d_key].
    """
    blocks = []
    for _ in range(-(-features // d_key)):
        gaussian = torch.randn(d_key, d_key, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gaussian)
        blocks.append((q * torch.sign(torch.diagonal(r))).T)  # signs fixed: Haar-distributed rows
    directions = torch.cat(blocks)[:features]
    lengths = torch.randn(features, d_key, generator=generator, dtype=torch.float64).norm(dim=-1, keepdim=True)
    return (directions * lengths).to(dtype)


class Favor(nn.Module):
    """FAVOR+ positive orthogonal random features (Choromanski et al. 2021, "Rethinking Attention with Performers",
    eq. 7 with h(x) = exp(−‖x‖²/2) / √2 and f ∈ {exp(u), exp(−u)}):

        φ(x) = exp(−‖x‖²/2) / √(2m) · [exp(ω₁ᵀx), …, exp(ω_mᵀx), exp(−ω₁ᵀx), …, exp(−ω_mᵀx)]

    so that E[φ(x)ᵀφ(y)] = exp(xᵀy), the softmax kernel (unscaled, as in the authors' code: no 1/√d_key). The
    2·m features are positive; sum-normalised, φ' = φ / (Σ φ + eps), unless `sum_normalization=False`.

    The projection Ω = [ω₁ … ω_m]ᵀ (`orthogonal_random_features`) is drawn once, when the module is made, from
    `generator` (None: torch's global generator, so from the run's `seed`), and kept as the buffer `projection`
    (saved in state dicts and checkpoints). It is never redrawn by itself: `redraw()` draws a new one, for whoever
    wants the Performer's periodic redrawing. All heads share it, and so do layers copied from one layer (as they
    start from the same weights).

    The features are computed in float32 (float64 for float64 inputs), also under autocast: the exponent would
    lose too much in bfloat16. Sum-normalised, the largest exponent is taken out first (it cancels), so that
    large ‖x‖ neither overflows nor divides 0 by 0.

    Args:
        d_key: the size of x.
        features: m, the number of random projections (d_dot = 2m).
        eps: added to the sum in the normalisation.
        sum_normalization: divide by the sum (default) or not.
        generator: where Ω is drawn from.

    Shapes:
        k: [..., d_key] → [..., 2 · features]

    Raises:
        ValueError: d_key < 1 or features < 1.
    """

    def __init__(self, d_key: int, features: int, eps: float = 1e-6, *, sum_normalization: bool = True,
                 generator: Optional[torch.Generator] = None):
        super().__init__()
        if d_key < 1 or features < 1:
            raise ValueError(f"Favor needs d_key >= 1 and features >= 1, got d_key={d_key}, features={features}")
        self.d_key, self.features, self.eps = d_key, features, eps
        self.sum_normalization = sum_normalization
        self.register_buffer('projection', orthogonal_random_features(d_key, features, generator))

    def out_features(self, d_key: int) -> int:
        """d_dot = 2 · features."""
        return 2 * self.features

    @torch.no_grad()
    def redraw(self, generator: Optional[torch.Generator] = None) -> None:
        """Draw a new projection Ω (in place, on the buffer's device and dtype)."""
        self.projection.copy_(orthogonal_random_features(self.d_key, self.features, generator))

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        if k.shape[-1] != self.d_key:
            raise ValueError(f"Favor(d_key={self.d_key}) got inputs of size {k.shape[-1]}")
        if not self.sum_normalization or _small_inference(k):
            return self.plain(k)
        exact = torch.promote_types(k.dtype, torch.float32)
        with torch.autocast(k.device.type, enabled=False):
            return _FavorFunction.apply(k.to(exact), self.projection.to(exact), self.eps)

    def plain(self, k: torch.Tensor) -> torch.Tensor:
        """φ'(k) by plain operations that autograd differentiates (the reference the fused `forward` is tested
        against; quicker for a generation step's few values): the fused function's operations, so the same bits.
        """
        exact = torch.promote_types(k.dtype, torch.float32)
        with torch.autocast(k.device.type, enabled=False):
            k = k.to(exact)
            u = k @ self.projection.to(exact).T  # ωᵢᵀx: [..., m]
            a = torch.cat([u, -u], dim=-1)
            # log φ = a − ‖x‖²/2 − log √(2m)
            log_scale = k.square().sum(-1, keepdim=True) * 0.5 + 0.5 * math.log(2 * self.features)
            if not self.sum_normalization:
                return (a - log_scale).exp()
            # φ / (Σφ + eps) = e^(a−c) / (Σ e^(a−c) + eps·e^(‖x‖²/2 + log √(2m) − c)) for any c; c = max a (no
            # gradient: it cancels), so that large ‖x‖ neither overflows nor divides 0 by 0
            c = u.detach().abs().amax(-1, keepdim=True)
            e = (a - c).exp()
            scaled_eps = (log_scale - c + math.log(self.eps)).exp() if self.eps > 0 else 0.0
            return e * (e.sum(-1, keepdim=True) + scaled_eps).reciprocal()


class L2NormSiLU(nn.Module):
    """φ'(x) = SiLU(x) / √(‖SiLU(x)‖² + eps), SiLU(x) = x σ(x): the L2-normalised SiLU features of DeltaNet and
    Gated DeltaNet (Yang, Wang, Zhang, Shen & Kim 2024, "Parallelizing Linear Transformers with the Delta Rule over
    Sequence Length"; Yang, Kautz & Hatamizadeh 2025; flash-linear-attention's `l2norm`, eps 1e-6).
    Keys of length one keep the delta rule's state bounded for β ∈ (0, 2): each factor I − β k kᵀ has eigenvalues 1
    and 1 − β ∈ (−1, 1). d_dot = d_key. It is normalised by its length, never by its sum: the option
    `sum_normalization` does not apply to it.

    Computed in float32 (float64 for float64 inputs), also under autocast: the squared length would lose too much
    in bfloat16.

    Args:
        eps: added to the squared length before the square root.

    Shapes:
        k: [..., d_key] → [..., d_key]
    """

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def out_features(self, d_key: int) -> int:
        """d_dot = d_key."""
        return d_key

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        exact = torch.promote_types(k.dtype, torch.float32)
        with torch.autocast(k.device.type, enabled=False):
            phi = nn.functional.silu(k.to(exact))
            return phi * torch.rsqrt(phi.square().sum(-1, keepdim=True) + self.eps)


def make_feature_map(name: str, d_key: int, *, nu: int = 1, features: int = 64, sum_normalization: bool = True,
                     eps: float = 1e-6) -> nn.Module:
    """The feature map φ' called `name` ('dpfp' with `nu`, 'linear', 'favor' with `features`, 'l2') for keys of
    size d_key (only FAVOR+ needs it). `sum_normalization` applies to the first three ('l2' is L2-normalised).

    Args:
        name: one of `FEATURE_MAPS`: 'dpfp', 'linear', 'favor', 'l2'.
        d_key: the size of the keys (used by 'favor' only).
        nu: ν of DPFP.
        features: m, the random features of FAVOR+.
        sum_normalization: whether φ is divided by its sum ('dpfp', 'linear', 'favor').
        eps: the small constant of the normalisation.

    Raises:
        ValueError: an unknown name.
    """
    if name == 'dpfp':
        return DPFP(nu=nu, eps=eps, sum_normalization=sum_normalization)
    if name == 'linear':
        return LinearElu(eps=eps, sum_normalization=sum_normalization)
    if name == 'favor':
        return Favor(d_key, features, eps=eps, sum_normalization=sum_normalization)
    if name == 'l2':
        return L2NormSiLU(eps=eps)
    raise ValueError(f"unknown feature map {name!r}; feature maps: {', '.join(FEATURE_MAPS)}")


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
        with torch.autocast(grad_out.device.type, enabled=False):  # backward() may be called inside autocast
            return _DPFPFunction._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out: torch.Tensor):
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


# ----------------------------------------------------------------------------------------------------------------
# The fused ELU + 1 and FAVOR+ (for training: fewer passes over q and k than autograd's, and a short backward)
# ----------------------------------------------------------------------------------------------------------------

def _small_inference(k: torch.Tensor) -> bool:
    """A few values without autograd (a generation step): the plain operations are quicker than a fused call."""
    return k.numel() <= 16384 and not (torch.is_grad_enabled() and k.requires_grad)


def _normalise_(phi: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """φ → φ' = φ · r in place, r = 1 / (Σ φ + eps); returns (φ', r)."""
    r = phi.sum(-1, keepdim=True).add_(eps).reciprocal_()
    return phi.mul_(r), r


def _normalise_backward(grad: torch.Tensor, out: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The gradient through φ' = φ · r, r = 1 / (Σ φ + eps): dφ = r (g − ⟨g, φ'⟩)."""
    return (grad - torch.linalg.vecdot(grad, out).unsqueeze(-1)).mul_(r)


class _LinearEluFunction(torch.autograd.Function):
    """φ'(x) for φ(x) = ELU(x) + 1 = max(x, 0) + min(eˣ, 1), sum-normalised unless eps is None. The second form
    takes one exp over all values (ELU's own kernel is five times slower on CPU), and min(eˣ, 1) is also φ's
    slope (1 for x > 0, eˣ = φ below), so the backward needs nothing else. Not twice differentiable."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: Optional[float]):
        slope = torch.exp(x).clamp_max_(1)
        phi = torch.relu(x).add_(slope)
        if eps is None:
            ctx.save_for_backward(slope)
            return phi
        out, r = _normalise_(phi, eps)
        ctx.save_for_backward(slope, out, r)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        slope, *normalised = ctx.saved_tensors
        grad = grad.to(slope.dtype)  # (a backward pass inside autocast may hand in another dtype)
        if normalised:
            return _normalise_backward(grad, *normalised).mul_(slope), None
        return grad * slope, None


class _FavorFunction(torch.autograd.Function):
    """Sum-normalised FAVOR+ φ'(x) = softmax-like e^(b) / (Σ e^(b) + eps), b = [Ωx, −Ωx] − ‖x‖²/2 − log √(2m),
    for x [..., d_key] and Ω [m, d_key] (no gradient: a buffer). ‖x‖²/2 and log √(2m) are the same for every
    feature of a row, so they cancel but for the eps term: the exponent is taken as b − max b = a − max a with
    a = [Ωx, −Ωx], and eps becomes eps · e^(‖x‖²/2 + log √(2m) − max a). Backward, as for a softmax:
    db = φ' ⊙ (g − ⟨g, φ'⟩), dx = (db₁ − db₂) Ω − x Σ db, with db₁, db₂ the two halves. Not twice differentiable.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, omega: torch.Tensor, eps: float):
        m = omega.shape[0]
        u = x @ omega.T
        a = x.new_empty(*u.shape[:-1], 2 * m)
        a[..., :m] = u
        torch.neg(u, out=a[..., m:])
        a_max = u.abs().amax(-1, keepdim=True)  # = max a
        e = a.sub_(a_max).exp_()
        if eps > 0:  # eps · e^(‖x‖²/2 + log √(2m) − max a)
            scaled_eps = x.square().sum(-1, keepdim=True).mul_(0.5).add_(0.5 * math.log(2 * m))
            scaled_eps = scaled_eps.sub_(a_max).add_(math.log(eps)).exp_()
        else:
            scaled_eps = 0.0
        r = e.sum(-1, keepdim=True).add_(scaled_eps).reciprocal_()
        out = e.mul_(r)
        ctx.save_for_backward(x, omega, out, r)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, omega, out, r = ctx.saved_tensors
        m = omega.shape[0]
        grad = grad.to(out.dtype)
        d_b = (grad - torch.linalg.vecdot(grad, out).unsqueeze(-1)).mul_(out)
        d_x = (d_b[..., :m] - d_b[..., m:]) @ omega
        return d_x.sub_(x * d_b.sum(-1, keepdim=True)), None, None
