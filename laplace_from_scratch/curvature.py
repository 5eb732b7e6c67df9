"""Curvature of the negative log-likelihood: GGN, exact Hessian, empirical Fisher.

For a loss L(θ) = Σₙ ℓ(yₙ, f(xₙ; θ)) the chain rule splits the Hessian in two:

    ∇²L = Σₙ Jₙᵀ Λₙ Jₙ  +  Σₙ Σₖ (∂ℓ/∂fₖ)ₙ ∇²fₖ(xₙ; θ)
          └── GGN ──────┘   └── residual term ──────────┘

with Jₙ = ∂f(xₙ)/∂θ (K, P) and Λₙ = ∂²ℓ/∂f² (K, K). The GGN keeps the first part:
it is positive semi-definite whenever Λ is, and exact for a model linear in θ.

laplace-torch's ``H`` is the GGN of the *summed* loss with Λ = I for regression
(σ is applied later, in the posterior precision) and Λ = diag p − p pᵀ for
classification: ``ggn(f, θ, X, Gaussian(1.0))`` and ``ggn(f, θ, X, Categorical())``.

Shapes: N examples, K outputs, P parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import hessian

from .functional import Functional
from .jacobians import jacobian
from .likelihoods import Likelihood


def ggn_from_jacobians(J: Tensor, Lam: Tensor) -> Tensor:
    """Σₙ Jₙᵀ Λₙ Jₙ. J: (N, K, P), Λ: (N, K, K) → (P, P)."""
    P = J.shape[-1]
    LJ = torch.einsum("nkl,nlp->nkp", Lam, J)
    return J.reshape(-1, P).T @ LJ.reshape(-1, P)


def ggn(f: Functional, theta: Tensor, X: Tensor, likelihood: Likelihood, batch_size: int = 256) -> Tensor:
    """The full GGN Σₙ Jₙᵀ Λ(f(xₙ)) Jₙ, (P, P), accumulated over batches of ``batch_size`` inputs."""
    P = theta.numel()
    G = torch.zeros(P, P, dtype=theta.dtype, device=theta.device)
    for start in range(0, X.shape[0], batch_size):
        Xb = X[start : start + batch_size]
        with torch.no_grad():
            Lam = likelihood.output_hessian(f(theta, Xb))
        G += ggn_from_jacobians(jacobian(f, theta, Xb), Lam)
    return G


def exact_hessian(f: Functional, theta: Tensor, X: Tensor, y: Tensor, likelihood: Likelihood) -> Tensor:
    """∇²_θ Σₙ −log p(yₙ | f(xₙ; θ)), (P, P), by ``torch.func.hessian``. For small P only."""
    return hessian(lambda th: likelihood.nll(f(th, X), y))(theta.detach())


def residual_term(f: Functional, theta: Tensor, X: Tensor, y: Tensor, likelihood: Likelihood) -> Tensor:
    """Σₙ Σₖ rₙₖ ∇²fₖ(xₙ; θ) with rₙ = ∂ℓ/∂f at θ held fixed: the part of the Hessian the GGN drops."""
    theta = theta.detach()
    with torch.no_grad():
        r = likelihood.output_gradient(f(theta, X), y)  # (N, K)
    return hessian(lambda th: (r * f(th, X)).sum())(theta)


def empirical_fisher(f: Functional, theta: Tensor, X: Tensor, y: Tensor, likelihood: Likelihood) -> Tensor:
    """Σₙ gₙ gₙᵀ with gₙ = ∇_θ ℓ(yₙ, f(xₙ; θ)) = Jₙᵀ (∂ℓ/∂f)ₙ the per-example gradient, (P, P)."""
    with torch.no_grad():
        r = likelihood.output_gradient(f(theta, X), y)  # (N, K)
    G = torch.einsum("nkp,nk->np", jacobian(f, theta, X), r)  # (N, P)
    return G.T @ G


def symmetric_sqrt(Lam: Tensor) -> Tensor:
    """Λ^½ of symmetric PSD matrices by eigendecomposition (negative rounding clamped to 0). (..., K, K)."""
    lam, U = torch.linalg.eigh(Lam)
    return (U * lam.clamp(min=0).sqrt().unsqueeze(-2)) @ U.mT


def whitened_jacobians(
    f: Functional, theta: Tensor, X: Tensor, likelihood: Likelihood, batch_size: int = 256
) -> Tensor:
    """J̃ (N·K, P) with rows Λₙ^½ Jₙ, so that the GGN is J̃ᵀ J̃. The dual (Gram) route uses it."""
    rows = []
    for start in range(0, X.shape[0], batch_size):
        Xb = X[start : start + batch_size]
        with torch.no_grad():
            sqrt_Lam = symmetric_sqrt(likelihood.output_hessian(f(theta, Xb)))  # (n, K, K)
        rows.append(torch.einsum("nkl,nlp->nkp", sqrt_Lam, jacobian(f, theta, Xb)).reshape(-1, theta.numel()))
    return torch.cat(rows)


def ggn_diagonal(
    f: Functional, theta: Tensor, X: Tensor, likelihood: Likelihood, batch_size: int = 256
) -> Tensor:
    """diag(Σₙ Jₙᵀ Λₙ Jₙ), (P,), without forming P×P: the column sums of the squared whitened Jacobians.

    Memory is one batch of whitened Jacobians, (batch_size·K, P).
    """
    d = torch.zeros_like(theta)
    for start in range(0, X.shape[0], batch_size):
        d += (whitened_jacobians(f, theta, X[start : start + batch_size], likelihood) ** 2).sum(0)
    return d
