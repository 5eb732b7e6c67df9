"""Curvature of the negative log-likelihood: GGN, exact Hessian, empirical Fisher.

For a loss L(θ) = Σₙ ℓ(yₙ, f(xₙ; θ)) the chain rule splits the Hessian in two:

    ∇²L = Σₙ Jₙᵀ Λₙ Jₙ  +  Σₙ Σₖ (∂ℓ/∂fₖ)ₙ ∇²fₖ(xₙ; θ)
          └── GGN ──────┘   └── residual term ──────────┘

with Jₙ = ∂f(xₙ)/∂θ (K, P) and Λₙ = ∂²ℓ/∂f² (K, K). The GGN is positive semi-definite
whenever Λ is, and exact for a model linear in θ. laplace-torch's ``H`` is the GGN of
the *summed* loss with Λ = I for regression (σ enters the posterior precision later).

The curvature *builders* share one interface: ``update(X)`` per batch, returning the
outputs f (n, K) for the loss, and ``finish()``, returning the posterior structure
(``posterior.py``). Here :class:`FullGGN` and :class:`DiagJacobianGGN`; the others are
``diag.DiagGGN``, ``kron.KFAC`` and, with their posteriors, low-rank and matrix-free.

Shapes: N examples, K outputs, P parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import hessian

from . import dense
from .functional import Functional
from .jacobians import jacobian
from .likelihoods import Likelihood
from .posterior import DiagPosterior, FullPosterior

# Whitened Jacobians are formed a chunk of examples at a time (jacobian_chunk), the
# chunk a fraction of one P×P matrix where full Laplace holds P×P buffers anyway:
CHUNK_FRACTION = 1 / 64  # beside H as it accumulates: 1.6 % more memory
CHUNK_FRACTION_TIGHT = 1 / 256  # one_buffer, and the predictive beside full Laplace
CHUNK_FLOOR = 1 << 20  # 2²⁰ numbers (4 MiB in float32): always affordable, still fast
CHUNK_CAP = 1 << 27  # 2²⁷ numbers (512 MiB in float32) where no P×P matrix exists
# Whitened Jacobians (M × P, M < P) that FullGGN keeps for the dual route, at most
DUAL_FRACTION = 1 / 4  # of one P×P matrix, beside H, or
DUAL_FLOOR_BYTES = 1 << 26  # 64 MiB if more (small models: cheap, and the fast route)
DUAL_FRACTION_ONE_BUFFER = 1 / 32  # of one P×P matrix with one_buffer (no floor)


def ggn_from_jacobians(J: Tensor, Lam: Tensor) -> Tensor:
    """Σₙ Jₙᵀ Λₙ Jₙ. J: (N, K, P), Λ: (N, K, K) → (P, P)."""
    P = J.shape[-1]
    LJ = torch.einsum("nkl,nlp->nkp", Lam, J)
    return J.reshape(-1, P).T @ LJ.reshape(-1, P)


def ggn(
    f: Functional,
    theta: Tensor,
    X: Tensor,
    likelihood: Likelihood,
    batch_size: int = 256,
) -> Tensor:
    """The full GGN Σₙ Jₙᵀ Λ(f(xₙ)) Jₙ, (P, P), accumulated over batches of
    ``batch_size`` inputs."""
    P = theta.numel()
    G = torch.zeros(P, P, dtype=theta.dtype, device=theta.device)
    for start in range(0, X.shape[0], batch_size):
        Xb = X[start : start + batch_size]
        with torch.no_grad():
            Lam = likelihood.output_hessian(f(theta, Xb))
        G += ggn_from_jacobians(jacobian(f, theta, Xb), Lam)
    return G


def exact_hessian(
    f: Functional, theta: Tensor, X: Tensor, y: Tensor, likelihood: Likelihood
) -> Tensor:
    """∇²_θ Σₙ −log p(yₙ | f(xₙ; θ)), (P, P), by ``torch.func.hessian``. For small P
    only."""
    return hessian(lambda th: likelihood.nll(f(th, X), y))(theta.detach())


def residual_term(
    f: Functional, theta: Tensor, X: Tensor, y: Tensor, likelihood: Likelihood
) -> Tensor:
    """Σₙ Σₖ rₙₖ ∇²fₖ(xₙ; θ) with rₙ = ∂ℓ/∂f at θ held fixed: the part of the Hessian
    the GGN drops."""
    theta = theta.detach()
    with torch.no_grad():
        r = likelihood.output_gradient(f(theta, X), y)  # (N, K)
    return hessian(lambda th: (r * f(th, X)).sum())(theta)


def empirical_fisher(
    f: Functional, theta: Tensor, X: Tensor, y: Tensor, likelihood: Likelihood
) -> Tensor:
    """Σₙ gₙ gₙᵀ, gₙ = Jₙᵀ (∂ℓ/∂f)ₙ the per-example gradient, (P, P)."""
    with torch.no_grad():
        r = likelihood.output_gradient(f(theta, X), y)  # (N, K)
    G = torch.einsum("nkp,nk->np", jacobian(f, theta, X), r)  # (N, P)
    return G.T @ G


def symmetric_sqrt(Lam: Tensor) -> Tensor:
    """Λ^½ of symmetric PSD matrices by eigendecomposition (negative rounding clamped to
    0). (..., K, K)."""
    lam, U = torch.linalg.eigh(Lam)
    return (U * lam.clamp(min=0).sqrt().unsqueeze(-2)) @ U.mT


def whitened_jacobians(
    f: Functional,
    theta: Tensor,
    X: Tensor,
    likelihood: Likelihood,
    batch_size: int = 256,
) -> Tensor:
    """J̃ (N·K, P) with rows Λₙ^½ Jₙ, so that the GGN is J̃ᵀ J̃. The dual (Gram) route
    uses it."""
    rows = []
    for start in range(0, X.shape[0], batch_size):
        Xb = X[start : start + batch_size]
        with torch.no_grad():
            sqrt_Lam = symmetric_sqrt(likelihood.output_hessian(f(theta, Xb)))
        Jw = torch.einsum("nkl,nlp->nkp", sqrt_Lam, jacobian(f, theta, Xb))  # (n, K, P)
        rows.append(Jw.reshape(-1, theta.numel()))
    return torch.cat(rows)


def ggn_diagonal(
    f: Functional,
    theta: Tensor,
    X: Tensor,
    likelihood: Likelihood,
    batch_size: int = 256,
) -> Tensor:
    """diag(Σₙ Jₙᵀ Λₙ Jₙ), (P,), without forming P×P: the column sums of the squared
    whitened Jacobians.

    Memory is one batch of whitened Jacobians, (batch_size·K, P).
    """
    d = torch.zeros_like(theta)
    for start in range(0, X.shape[0], batch_size):
        Xb = X[start : start + batch_size]
        d += (whitened_jacobians(f, theta, Xb, likelihood) ** 2).sum(0)
    return d


def jacobian_chunk(
    n_outputs: int,
    n_params: int,
    fraction: float = CHUNK_FRACTION,
    cap: float = float("inf"),
) -> int:
    """How many examples' Jacobians (K × P numbers each) to form at a time: as many as
    fit in min(``fraction``·P², ``cap``) numbers (``cap`` where no P×P matrix exists),
    or in :data:`CHUNK_FLOOR` numbers if that is more, and at least one."""
    K = max(n_outputs, 1)
    budget = min(fraction * n_params * n_params, cap)
    return max(1, int(budget / (K * n_params)), CHUNK_FLOOR // (K * n_params))


class FunctionalBuilder:
    """What every builder that works from f(θ, x) alone keeps: f, θ* (P,), the
    likelihood (for Λ) and the parameter tensor sizes."""

    def __init__(
        self,
        f: Functional,
        theta: Tensor,
        likelihood: Likelihood,
        param_sizes: list[int],
    ):
        self.f, self.theta = f, theta
        self.likelihood, self.param_sizes = likelihood, param_sizes

    def outputs(self, X: Tensor) -> Tensor:
        """f(X; θ*), (N, K), without gradients."""
        with torch.no_grad():
            return self.f(self.theta, X)


class FullGGN(FunctionalBuilder):
    """Accumulates the full GGN H = Σ J̃ᵀJ̃ (P, P) in place, from the whitened Jacobians
    J̃ = Λ^½ J of a few examples at a time (:func:`jacobian_chunk`). While N·K < P and
    they fit :data:`DUAL_FRACTION` of a P×P matrix (or 64 MiB) they are kept
    (``jacobian_chunks``) for the dual route of the evidence (``EigenPosterior``)."""

    def __init__(
        self,
        f: Functional,
        theta: Tensor,
        likelihood: Likelihood,
        param_sizes: list[int],
        one_buffer: bool = False,
        in_place: bool = False,
        evidence_route: str = "auto",
    ):
        super().__init__(f, theta, likelihood, param_sizes)
        P = theta.numel()
        dense.check_fits(
            P, theta.dtype, theta.device, 1, f"full Laplace over P = {P} parameters"
        )
        self.H = torch.zeros(P, P, dtype=theta.dtype, device=theta.device)
        self.jacobian_chunks: list[Tensor] | None = []
        # options of the posterior (``posterior.FullPosterior``)
        self.one_buffer, self.in_place = one_buffer, in_place
        self.route = evidence_route
        self._posterior = None
        fraction = DUAL_FRACTION_ONE_BUFFER if one_buffer else DUAL_FRACTION
        floor = 0 if one_buffer else DUAL_FLOOR_BYTES // theta.element_size()
        self.dual_budget = max(int(P * P * fraction), floor)  # numbers

    def update(self, X: Tensor) -> Tensor:
        out = self.outputs(X)
        P = self.theta.numel()
        fraction = CHUNK_FRACTION_TIGHT if self.one_buffer else CHUNK_FRACTION
        chunk = jacobian_chunk(out.shape[-1], P, fraction)
        for start in range(0, X.shape[0], chunk):
            Jw = whitened_jacobians(
                self.f, self.theta, X[start : start + chunk], self.likelihood, chunk
            )
            self.H.addmm_(Jw.T, Jw)  # in place: one P×P buffer, no temporary
            kept = self.jacobian_chunks
            if kept is not None:
                kept.append(Jw)
                M = sum(b.shape[0] for b in kept)
                if M >= P or M * P > self.dual_budget:  # too many for the dual route
                    self.jacobian_chunks = None
        return out

    def finish(self):
        Jw = torch.cat(self.jacobian_chunks) if self.jacobian_chunks else None
        if Jw is not None:
            self.jacobian_chunks = [Jw]  # one copy, shared with the posterior
        self._posterior = FullPosterior(
            self.H, self.param_sizes, Jw, self.route, self.one_buffer, self.in_place
        )
        return self._posterior

    @property
    def can_update(self) -> bool:
        """False once the posterior has overwritten H with its factor (one_buffer)."""
        return self._posterior is None or self._posterior._H is not None


class DiagJacobianGGN(FunctionalBuilder):
    """diag(G) from per-example Jacobians (:func:`ggn_diagonal`), for networks with
    parameters outside Linear/Conv2d layers (``diag.DiagGGN`` for the others)."""

    def __init__(
        self,
        f: Functional,
        theta: Tensor,
        likelihood: Likelihood,
        param_sizes: list[int],
    ):
        super().__init__(f, theta, likelihood, param_sizes)
        self.d = torch.zeros_like(theta)

    def update(self, X: Tensor) -> Tensor:
        out = self.outputs(X)
        self.d += ggn_diagonal(self.f, self.theta, X, self.likelihood)
        return out

    def finish(self):
        return DiagPosterior(self.d, self.param_sizes)
