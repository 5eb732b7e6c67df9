"""Predictions under the Laplace posterior: the linearised (GLM) model around θ*,
f_lin(x; θ) = f(x; θ*) + J(x)(θ − θ*), Gaussian under θ ~ N(θ*, Σ) with mean f(x; θ*)
and covariance f_var = J Σ Jᵀ (*without* the observation noise); Monte Carlo over it
and over the network itself ("NN sampling"); and, for classification, the probit
approximation, Monte Carlo of softmax(f) (σ(f) for one logit) and the Laplace bridge.

Shapes: N inputs, K outputs, P parameters, S samples.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
from torch import Tensor
from torch.func import vmap

from .devices import randn
from .functional import Functional
from .jacobians import jacobian
from .posterior import cholesky


def jacobian_sandwich(J: Tensor, Sigma: Tensor) -> Tensor:
    """f_var = J Σ Jᵀ per input from a dense Σ. J: (N, K, P), Σ: (P, P) → (N, K, K)."""
    return torch.einsum("nkp,pq,nlq->nkl", J, Sigma, J)


def linearized_predictive(f: Functional, theta: Tensor, X: Tensor, Sigma: Tensor):
    """Closed-form linearised predictive: f_mu = f(X; θ*) (N, K), f_var = J Σ Jᵀ
    (N, K, K)."""
    with torch.no_grad():
        f_mu = f(theta, X)
    return f_mu, jacobian_sandwich(jacobian(f, theta, X), Sigma)


def linearized_samples(f: Functional, theta: Tensor, X: Tensor, samples: Tensor):
    """f(X; θ*) + J (θₛ − θ*) for each sample θₛ. samples: (S, P) → (S, N, K)."""
    with torch.no_grad():
        f_mu = f(theta, X)
    J = jacobian(f, theta, X)
    return f_mu + torch.einsum("nkp,sp->snk", J, samples - theta)


def nn_samples(
    f: Functional, X: Tensor, samples: Tensor, keep_graph: bool = False
) -> Tensor:
    """The network at each sampled θₛ ("NN sampling"). samples: (S, P) → (S, N, K),
    without gradients unless ``keep_graph`` (then differentiable in X)."""
    with nullcontext() if keep_graph else torch.no_grad():
        return vmap(f, in_dims=(0, None))(samples, X)


def probit(f_mu: Tensor, f_var: Tensor) -> Tensor:
    """softmax(f_μ / √(1 + π/8 · diag f_var)). f_mu: (N, K), f_var: (N, K, K) →
    probabilities (N, K)."""
    kappa = 1 / torch.sqrt(1 + math.pi / 8 * f_var.diagonal(dim1=-2, dim2=-1))
    return torch.softmax(kappa * f_mu, dim=-1)


def sum_zero(f_mu: Tensor, f_var: Tensor) -> tuple[Tensor, Tensor]:
    """(C f_mu, C f_var C), C = I − 11ᵀ/K: the centred logits, with the same softmax, on
    which :func:`probit` no longer counts the common-mode variance as uncertainty (μ is
    centred too: probit is not shift-invariant). f_mu: (N, K), f_var: (N, K, K)."""
    K = f_mu.shape[-1]
    C = torch.eye(K, dtype=f_var.dtype, device=f_var.device) - 1 / K
    return f_mu @ C, C @ f_var @ C


def mc_softmax(f_mu: Tensor, f_var: Tensor, n_samples: int, generator=None) -> Tensor:
    """E[softmax(f)] for f ~ N(f_mu, f_var) by Monte Carlo. → (N, K)."""
    f = gaussian_samples(f_mu, f_var, n_samples, generator)
    return torch.softmax(f, dim=-1).mean(0)


def gaussian_samples(f_mu: Tensor, f_var: Tensor, n_samples: int, generator=None):
    """f ~ N(f_mu, f_var) per input: f_mu + L ε, L Lᵀ = f_var (``posterior.cholesky``,
    jitter where singular). f_mu: (N, K), f_var: (N, K, K) → (S, N, K)."""
    L = cholesky(f_var, warn=False)
    eps = randn((n_samples, *f_mu.shape), f_mu, generator)
    return f_mu + torch.einsum("nkl,snl->snk", L, eps)


def two_class(p1: Tensor) -> Tensor:
    """Probabilities of class 1, (...,), as columns [p(y=0), p(y=1)], (..., 2)."""
    return torch.stack([1 - p1, p1], dim=-1)


def probit_binary(f_mu: Tensor, f_var: Tensor) -> Tensor:
    """σ(f_μ / √(1 + π/8 · f_var)) for one logit, as :func:`probit` on the logits
    [0, f] (the pinned one has no variance). f_mu: (N, 1), f_var: (N, 1, 1) → (N, 2)."""
    kappa = 1 / torch.sqrt(1 + math.pi / 8 * f_var.reshape(-1))
    return two_class(torch.sigmoid(kappa * f_mu.reshape(-1)))


def mc_sigmoid(f_mu: Tensor, f_var: Tensor, n_samples: int, generator=None) -> Tensor:
    """E[σ(f)] for one logit f ~ N(f_mu, f_var) by Monte Carlo. f_mu: (N, 1), f_var:
    (N, 1, 1) → (N, 2)."""
    eps = randn((n_samples, f_mu.shape[0]), f_mu, generator)
    f = f_mu.reshape(-1) + f_var.reshape(-1).clamp(min=0).sqrt() * eps
    return two_class(torch.sigmoid(f).mean(0))


def laplace_bridge(f_mu: Tensor, f_var: Tensor, normalize: bool = False) -> Tensor:
    """Mean of the Laplace-bridge Dirichlet (Hobbhahn et al., 2022), (N, K): the
    Gaussian over f conditioned on Σₖ fₖ = 0, then αₖ = (1 − 2/K + e^{μₖ} Σₗ e^{−μₗ} /
    K²) / Σₖₖ and α / Σ α. ``normalize=True`` (laplace-torch's "bridge_norm") first
    rescales the variances to mean √(K/2) (μ by 1/√m, Σₖₖ by 1/m)."""
    K = f_mu.shape[-1]
    s = f_var.sum(-1)  # Σ 1, (N, K)
    total = s.sum(-1, keepdim=True)  # 1ᵀ Σ 1, (N, 1)
    mu = f_mu - s * f_mu.sum(-1, keepdim=True) / total
    var = f_var.diagonal(dim1=-2, dim2=-1) - s**2 / total
    if normalize:
        m = var.mean(-1, keepdim=True) / math.sqrt(K / 2)
        mu, var = mu / m.sqrt(), var / m
    # log αₖ, computed in log space: far from the data e^{μₖ} Σ e^{−μₗ} overflows
    log_a = mu + torch.logsumexp(-mu, dim=-1, keepdim=True) - 2 * math.log(K)
    if K > 2:
        log_a = torch.logaddexp(log_a, torch.full_like(log_a, math.log(1 - 2 / K)))
    return torch.softmax(log_a - var.log(), dim=-1)


def entropy(probs: Tensor) -> Tensor:
    """Entropy −Σ p log p of each row of class probabilities, (N, C) → (N,), in nats."""
    return -torch.special.xlogy(probs, probs).sum(-1)  # xlogy(0, 0) = 0 in any dtype
