"""The Gaussian (Laplace) posterior N(θ*, Σ) over the flat parameters, in laplace-torch
0.3's convention: H is the GGN of the summed loss (Λ = I for regression), and

    Σ⁻¹ = c·H + diag(p₀),    c = 1/(σ²T),

σ the noise (1 for classification), T the temperature, p₀ the prior precision (a
scalar, one per parameter tensor or one per parameter). c means this in all the module.

Here: the :class:`Posterior` protocol of every structure (``full.py``, ``diag.py``,
``kron.py``, ``lowrank.py``, ``matfree.py``), and notebook 03's algebra without an
explicit inverse: the Cholesky factor L of Σ⁻¹ (one jitter rule), log det Σ⁻¹ =
2 Σ log Lᵢᵢ with its gradients, Σ, diag Σ and samples θ* + L⁻ᵀ ε.

Shapes: P parameters (never the precision: that is Σ⁻¹), S samples, N inputs, K outputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from .checks import require
from .devices import randn

# what a prior precision can be: one value, one per parameter tensor, one per parameter
PRIOR_KINDS = ("scalar", "layerwise", "diag")


def prior_sizes(param_sizes: Sequence[int]) -> dict[str, int]:
    """How many values a prior precision of each of :data:`PRIOR_KINDS` holds."""
    return {"scalar": 1, "layerwise": len(param_sizes), "diag": sum(param_sizes)}


def prior_kind(prior_precision: Tensor, param_sizes: Sequence[int]) -> str:
    """Which of :data:`PRIOR_KINDS` a prior precision (scalar, (n_tensors,) or (P,))
    is. The one place that checks a prior's shape and sign."""
    sizes = prior_sizes(param_sizes)
    kind = {n: k for k, n in sizes.items()}.get(prior_precision.numel())
    if prior_precision.ndim > 1 or kind is None:
        raise ValueError(
            f"prior_precision must be a scalar, {sizes['layerwise']} values (one per "
            f"parameter tensor) or {sizes['diag']} values (one per parameter); got "
            f"shape {tuple(prior_precision.shape)}"
        )
    require(
        torch.isfinite(prior_precision) & (prior_precision > 0),
        "prior_precision must be positive and finite",
    )
    return kind


def prior_precision_diag(
    prior_precision: float | Tensor,
    param_sizes: Sequence[int],
    per_tensor: bool = False,
) -> Tensor:
    """The module's one prior expander: a prior precision (:func:`prior_kind`) as one
    value per parameter, (P,), or with ``per_tensor`` one per parameter tensor (which a
    prior per parameter does not have: ValueError)."""
    p0 = prior_precision  # a tensor keeps its device (torch.as_tensor would move it)
    if not isinstance(p0, Tensor):
        p0 = torch.as_tensor(p0)
    kind = prior_kind(p0, param_sizes)
    n = prior_sizes(param_sizes)["layerwise" if per_tensor else "diag"]
    if kind == "scalar":
        return p0.reshape(()).expand(n)
    if p0.numel() == n:
        return p0.reshape(-1)
    if kind == "diag":
        raise ValueError(
            "a prior precision per parameter has no value per parameter tensor: use a "
            f"scalar or {n} values (one per parameter tensor)"
        )
    return p0.repeat_interleave(torch.tensor(list(param_sizes), device=p0.device))


def posterior_precision(H: Tensor, prior_prec_diag: Tensor, c=1.0) -> Tensor:
    """Σ⁻¹ = c·H + diag(p₀), c = 1/(σ²T). H: (P, P), p₀: (P,) → (P, P)."""
    return c * H + torch.diag_embed(prior_prec_diag.to(H.dtype))


# The one jitter rule of the module: if a Cholesky factorisation fails, add ε·s·I, s the
# mean |diagonal|, with ε = 1e-10, 1e-9, ..., 1e-3 (1e-10 is ~10⁶ ulps of float64 and
# below float32's resolution, so it only matters where the matrix is singular).
JITTER_FIRST, JITTER_TRIES = 1e-10, 8


def jitters(scale: Tensor) -> Iterator[Tensor | float]:
    """0, then ε·``scale`` for ε = JITTER_FIRST, 10·JITTER_FIRST, ... (JITTER_TRIES
    values)."""
    yield 0.0
    for k in range(JITTER_TRIES):
        yield JITTER_FIRST * 10.0**k * scale


def with_jitter(
    attempt: Callable[[Tensor | float], Tensor | None], scale: Tensor, warn: bool = True
) -> Tensor:
    """The module's one jitter loop: ``attempt(jitter)`` (a factorisation of
    A + jitter·I, or None) for each of :func:`jitters` until one succeeds, with a
    warning unless ``warn=False``; ``ValueError`` rather than NaNs."""
    for jitter in jitters(scale):
        L = attempt(jitter)
        if L is None:
            continue
        if torch.is_tensor(jitter) and warn:
            warnings.warn(
                "matrix not positive definite: added jitter "
                f"{float(jitter.max()):.3g}·I ({float((jitter / scale).max()):.0e} × "
                "mean diagonal) to factorise it",
                RuntimeWarning,
                stacklevel=3,
            )
        return L
    raise ValueError(
        f"Cholesky failed even with jitter {float(jitter.max()):.3g}·I: the matrix is "
        "far from positive definite"
    )


def cholesky(A: Tensor, warn: bool = True) -> Tensor:
    """Lower Cholesky factor L of a symmetric positive-definite A (..., P, P), with
    jitter if needed (:func:`with_jitter`, scaled per matrix)."""
    diagonal = A.diagonal(dim1=-2, dim2=-1)
    scale = diagonal.abs().mean(-1).clamp(min=torch.finfo(A.dtype).tiny)[..., None]

    def attempt(jitter: Tensor | float) -> Tensor | None:
        A_j = A
        if torch.is_tensor(jitter):  # after a failure only: one more P×P, A + jitter·I
            A_j = A.clone()
            A_j.diagonal(dim1=-2, dim2=-1).add_(jitter)
        L, info = torch.linalg.cholesky_ex(A_j)
        # one host sync per attempt: whether to add jitter is decided on the host
        if bool((info == 0).all() & torch.isfinite(L).all()):
            return L
        if not bool(torch.isfinite(A).all()):  # after a failure only
            raise ValueError(
                "the matrix to factorise contains NaN or inf (check the curvature and "
                "the hyperparameters)"
            )
        return None

    return with_jitter(attempt, scale, warn)


def log_det_from_cholesky(L: Tensor) -> Tensor:
    """log det(L Lᵀ) = 2 Σ log Lᵢᵢ. L: (P, P) lower-triangular → scalar."""
    return 2 * L.diagonal().log().sum()


def covariance_from_cholesky(L: Tensor) -> Tensor:
    """Σ = (L Lᵀ)⁻¹ (P, P) by two triangular solves (``torch.cholesky_inverse``)."""
    return torch.cholesky_inverse(L)


def sample_from_cholesky(mean: Tensor, L: Tensor, n_samples: int, generator=None):
    """θ = μ + L⁻ᵀ ε, ε ~ N(0, I), Σ⁻¹ = L Lᵀ: samples with covariance Σ, (S, P)."""
    eps = randn((mean.numel(), n_samples), mean, generator)
    return mean + torch.linalg.solve_triangular(L.mT, eps, upper=True).T


def default_block(n: int) -> int:
    """Block width b = n/64, between 128 and 2048: a panel (n × b) is then 1/64 of an
    n×n matrix, and the blocks are wide enough for fast matrix products."""
    return min(2048, max(128, n // 64))


def inverse_diagonal(L: Tensor, block_size: int | None = None) -> Tensor:
    """diag((L Lᵀ)⁻¹) (P,) for lower-triangular L: Σᵢᵢ = Σₖ (L⁻¹)ₖᵢ², by solves against
    b identity columns at a time (never Σ itself)."""
    P = L.shape[0]
    block_size = default_block(P) if block_size is None else block_size
    out = L.new_empty(P)
    for k in range(0, P, block_size):
        e = min(k + block_size, P)
        # columns k..e of I; the rows above k of L⁻¹ E are zero, so solve from row k
        E = L.new_zeros(P - k, e - k).fill_diagonal_(1)
        X = torch.linalg.solve_triangular(L[k:, k:], E, upper=False)
        out[k:e] = X.square().sum(0)
    return out


class _LogDet(torch.autograd.Function):
    """The value of log det Σ⁻¹ with the gradients of :func:`log_det_with_gradients`."""

    @staticmethod
    def forward(ctx, p0: Tensor, c: Tensor, value: Tensor, variance: Tensor) -> Tensor:
        ctx.save_for_backward(p0, c, variance)
        return value.clone()

    @staticmethod
    def backward(ctx, g: Tensor):
        p0, c, variance = ctx.saved_tensors
        grad_c = (variance.numel() - (p0 * variance).sum()) / c
        return g * variance, g * grad_c, None, None


def log_det_with_gradients(
    value: Tensor, p0: Tensor, c: float | Tensor, variance: Callable[[], Tensor]
) -> Tensor:
    """log det Σ⁻¹ (its ``value``, computed without autograd) as a function of p₀ (P,)
    and c, when they need gradients; ``variance()`` gives diag Σ (P,).

    Jacobi's formula, ∂ log det A = tr(A⁻¹ ∂A), with A = Σ⁻¹ = c·H + diag(p₀):

    * ∂A/∂p₀ᵢ = eᵢeᵢᵀ, so ∂ log det Σ⁻¹/∂p₀ᵢ = Σᵢᵢ;
    * ∂A/∂c = H, so ∂ log det Σ⁻¹/∂c = tr(Σ H); and since c·H = Σ⁻¹ − diag(p₀),
      tr(Σ·cH) = tr(I) − tr(Σ diag(p₀)) = P − Σᵢ p₀ᵢΣᵢᵢ, so ∂/∂c = (P − Σᵢ p₀ᵢΣᵢᵢ)/c.

    Both come from diag Σ alone, never from Σ or H: the full structure computes it by
    triangular solves (:func:`inverse_diagonal`), the matrix-free one estimates it from
    the probes of its stochastic log det.
    """
    c = torch.as_tensor(c, dtype=value.dtype, device=value.device)
    if not (torch.is_grad_enabled() and (p0.requires_grad or c.requires_grad)):
        return value.clone()  # (the value may be a cached tensor)
    return _LogDet.apply(p0, c, value, variance().to(value.dtype))


T = TypeVar("T")


class PerPrior:
    """A value computed for one (p₀, c) and kept until either changes: the module's one
    cache key, p₀ (P,) and c as one vector."""

    def __init__(self) -> None:
        self.key: Tensor | None = None
        self.value = None

    def __call__(self, p0: Tensor, c: float | Tensor, compute: Callable[[], T]) -> T:
        with torch.no_grad():
            c = torch.as_tensor(c, dtype=p0.dtype, device=p0.device)
            key = torch.cat([p0.flatten(), c.reshape(1)])
            if self.key is None or not torch.equal(self.key, key):
                self.key = self.value = None  # frees the old value before the new one
                self.value, self.key = compute(), key.clone()
        return self.value


class Posterior(Protocol):
    """What every posterior structure provides: six methods of the prior precision
    ``prior`` (:func:`prior_kind`) and c = 1/(σ²T), tensors on the parameters' device,
    with Σ⁻¹ = c·H + diag(p₀). Results have the dtype of H."""

    H: object  # the curvature in the structure's own form (a tensor for full and diag)
    n_params: int

    def log_det(self, prior: Tensor, c: Tensor) -> Tensor:
        """log det Σ⁻¹, differentiable in ``prior`` and ``c``."""

    def variance(self, prior: Tensor, c: Tensor) -> Tensor:
        """diag Σ, (P,)."""

    def functional_variance(self, J: Tensor, prior: Tensor, c: Tensor) -> Tensor:
        """J Σ Jᵀ. J: (N, K, P) → (N, K, K)."""

    def sample(
        self, n_samples: int, prior: Tensor, c: Tensor, generator=None
    ) -> Tensor:
        """Draws from N(0, Σ), (S, P)."""

    def precision(self, prior: Tensor, c: Tensor):
        """Σ⁻¹: (P, P) for full, (P,) for diag, an operator (``operators.py``)
        otherwise."""

    def covariance(self, prior: Tensor, c: Tensor):
        """Σ: (P, P) for full and diag (dense: for small P), an operator otherwise."""
