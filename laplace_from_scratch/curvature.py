"""Curvature of the negative log-likelihood: GGN, exact Hessian, empirical Fisher.

For a loss L(θ) = Σₙ ℓ(yₙ, f(xₙ; θ)) the chain rule splits the Hessian in two:

    ∇²L = Σₙ Jₙᵀ Λₙ Jₙ  +  Σₙ Σₖ (∂ℓ/∂fₖ)ₙ ∇²fₖ(xₙ; θ)
          └── GGN ──────┘   └── residual term ──────────┘

with Jₙ = ∂f(xₙ)/∂θ (K, P) and Λₙ = ∂²ℓ/∂f² (K, K). The GGN is positive semi-definite
whenever Λ is, and exact for a model linear in θ. The curvature builders share one
interface, :class:`Builder`, and live with their posteriors (``full.py``, ``diag.py``,
``kron.py``, ``lowrank.py``, ``matfree.py``).

Shapes: N examples, K outputs, P parameters.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Protocol

import torch
from torch import Tensor
from torch.func import hessian

from .functional import Functional
from .jacobians import jacobian
from .likelihoods import Likelihood
from .posterior import Posterior

# Whitened Jacobians are formed a chunk of examples at a time (jacobian_chunk), the
# chunk a fraction of one P×P matrix where full Laplace holds P×P buffers anyway:
CHUNK_FRACTION = 1 / 64  # beside H as it accumulates: 1.6 % more memory
CHUNK_FRACTION_TIGHT = 1 / 256  # one_buffer, and the predictive beside full Laplace
CHUNK_FLOOR = 1 << 24  # 2²⁴ numbers (64 MiB in float32): few, large blocks per batch
CHUNK_CAP = 1 << 27  # 2²⁷ numbers (512 MiB in float32) where no P×P matrix exists


def ggn_from_jacobians(J: Tensor, Lam: Tensor) -> Tensor:
    """Σₙ Jₙᵀ Λₙ Jₙ. J: (N, K, P), Λ: (N, K, K) → (P, P)."""
    P = J.shape[-1]
    LJ = torch.einsum("nkl,nlp->nkp", Lam, J)
    return J.reshape(-1, P).T @ LJ.reshape(-1, P)


def ggn(
    f: Functional, theta: Tensor, X: Tensor, likelihood: Likelihood, batch_size=256
) -> Tensor:
    """The full GGN Σₙ Jₙᵀ Λ(f(xₙ)) Jₙ, (P, P), over batches of ``batch_size``."""
    P = theta.numel()
    G = torch.zeros(P, P, dtype=theta.dtype, device=theta.device)
    for Xb in X.split(batch_size):
        with torch.no_grad():
            Lam = likelihood.output_hessian(f(theta, Xb))
        G += ggn_from_jacobians(jacobian(f, theta, Xb), Lam)
    return G


def exact_hessian(f: Functional, theta: Tensor, X: Tensor, y: Tensor, likelihood):
    """∇²_θ Σₙ −log p(yₙ | f(xₙ; θ)), (P, P), by ``torch.func.hessian``. For small P
    only."""
    return hessian(lambda th: likelihood.nll(f(th, X), y))(theta.detach())


def residual_term(f: Functional, theta: Tensor, X: Tensor, y: Tensor, likelihood):
    """Σₙ Σₖ rₙₖ ∇²fₖ(xₙ; θ) with rₙ = ∂ℓ/∂f at θ held fixed: the part of the Hessian
    the GGN drops."""
    theta = theta.detach()
    with torch.no_grad():
        r = likelihood.output_gradient(f(theta, X), y)  # (N, K)
    return hessian(lambda th: (r * f(th, X)).sum())(theta)


def empirical_fisher(f: Functional, theta: Tensor, X: Tensor, y: Tensor, likelihood):
    """Σₙ gₙ gₙᵀ, gₙ = Jₙᵀ (∂ℓ/∂f)ₙ the per-example gradient, (P, P)."""
    with torch.no_grad():
        r = likelihood.output_gradient(f(theta, X), y)  # (N, K)
    G = torch.einsum("nkp,nk->np", jacobian(f, theta, X), r)  # (N, P)
    return G.T @ G


def whitened_batches(
    f: Functional, theta: Tensor, X: Tensor, likelihood: Likelihood, batch_size=256
) -> Iterator[Tensor]:
    """The whitened Jacobians J̃, rows Sₙᵀ Jₙ with Λₙ = Sₙ Sₙᵀ, of ``batch_size`` inputs
    at a time, (batch_size·K, P) each: the GGN is J̃ᵀ J̃ (and the dual route's Gram
    matrix J̃ J̃ᵀ)."""
    for Xb in X.split(batch_size):
        with torch.no_grad():
            S = likelihood.output_hessian_sqrt(f(theta, Xb))  # (n, K, K)
        Jw = torch.einsum("nlk,nlp->nkp", S, jacobian(f, theta, Xb))  # (n, K, P)
        yield Jw.reshape(-1, theta.numel())


def ggn_diagonal(
    f: Functional, theta: Tensor, X: Tensor, likelihood: Likelihood, batch_size=256
) -> Tensor:
    """diag(Σₙ Jₙᵀ Λₙ Jₙ), (P,): the column sums of the squared whitened Jacobians, one
    batch of them, (batch_size·K, P), at a time."""
    d = torch.zeros_like(theta)
    for Jw in whitened_batches(f, theta, X, likelihood, batch_size):
        d += (Jw**2).sum(0)
    return d


def jacobian_chunk(n_outputs, n_params, fraction=CHUNK_FRACTION, cap=math.inf) -> int:
    """How many examples' Jacobians (K·P numbers each) to form at once: as many as fit
    in max(min(``fraction``·P², ``cap``), :data:`CHUNK_FLOOR`) numbers, at least one."""
    K = max(n_outputs, 1)
    budget = min(fraction * n_params * n_params, cap)
    return max(1, int(budget / (K * n_params)), CHUNK_FLOOR // (K * n_params))


class Builder(Protocol):
    """What every curvature builder provides (``structures.py`` makes them)."""

    can_update: bool  # whether a later fit(override=False) may add to it

    def update(self, X: Tensor) -> Tensor:
        """Add one batch of inputs X; return the outputs f(X) (n, K), detached."""

    def finish(self) -> Posterior:
        """The posterior of everything added so far."""

    def resumed(self) -> Builder:
        """A builder adding to a copy of this one's sums (:func:`resume`)."""


def resume(builder, *names: str):
    """A shallow copy of ``builder`` with its attributes ``names`` (running sums:
    tensors and dicts of them cloned, lists copied), so that a failed continued fit
    leaves the original and its posterior as they were."""
    new = copy.copy(builder)
    for name in names:
        x = getattr(builder, name)
        if isinstance(x, Tensor):
            x = x.clone()
        elif isinstance(x, dict):
            x = {k: v.clone() for k, v in x.items()}
        elif isinstance(x, list):
            x = list(x)
        setattr(new, name, x)
    return new


class FunctionalBuilder:
    """What every builder that works from f(θ, x) alone keeps: f, θ* (P,), the
    likelihood (for Λ) and the parameter tensor sizes."""

    can_update = True

    def __init__(self, f: Functional, theta: Tensor, likelihood, param_sizes):
        self.f, self.theta = f, theta
        self.likelihood, self.param_sizes = likelihood, param_sizes

    def outputs(self, X: Tensor) -> Tensor:
        """f(X; θ*), (N, K), without gradients."""
        with torch.no_grad():
            return self.f(self.theta, X)
