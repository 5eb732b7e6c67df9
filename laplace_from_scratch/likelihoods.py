"""Likelihoods: the negative log-likelihood and its Hessian Λ with respect to the outputs.

Both are for the *summed* loss over the data, as in laplace-torch:

* Gaussian noise with standard deviation σ (regression):
  −log p(y | f) = ‖y − f‖² / (2σ²) + K·log(σ√(2π)) per example, and Λ = I/σ².
* Categorical with a softmax over K logits (classification):
  −log p(y | f) = −log softmax(f)_y per example, and Λ = diag(p) − p pᵀ.

Shapes: N examples, K outputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


class Gaussian:
    """Gaussian observation noise, y = f(x) + ε, ε ~ N(0, σ² I)."""

    name = "regression"

    def __init__(self, sigma_noise: float = 1.0):
        if not sigma_noise > 0:
            raise ValueError(f"sigma_noise must be positive, got {sigma_noise}")
        self.sigma_noise = float(sigma_noise)

    def nll(self, f: Tensor, y: Tensor) -> Tensor:
        """Summed negative log-likelihood. f, y: (N, K) → scalar."""
        _check_regression(f, y)
        s2 = self.sigma_noise**2
        n_terms = f.numel()
        return 0.5 * ((y - f) ** 2).sum() / s2 + n_terms * math.log(self.sigma_noise * math.sqrt(2 * math.pi))

    def output_hessian(self, f: Tensor) -> Tensor:
        """Λₙ = ∂²(−log p)/∂f² = I/σ² for every example. f: (N, K) → (N, K, K)."""
        N, K = f.shape
        eye = torch.eye(K, dtype=f.dtype, device=f.device)
        return eye.expand(N, K, K) / self.sigma_noise**2

    def output_gradient(self, f: Tensor, y: Tensor) -> Tensor:
        """∂(−log p)/∂f = (f − y)/σ² per example. (N, K)."""
        return (f - y) / self.sigma_noise**2


class Categorical:
    """Softmax classification over K classes; labels are integers in [0, K)."""

    name = "classification"

    def nll(self, f: Tensor, y: Tensor) -> Tensor:
        """Summed cross-entropy. f: (N, K) logits, y: (N,) integer labels → scalar."""
        _check_classification(f, y)
        return F.cross_entropy(f, y, reduction="sum")

    def output_hessian(self, f: Tensor) -> Tensor:
        """Λₙ = diag(pₙ) − pₙ pₙᵀ with p = softmax(f). f: (N, K) → (N, K, K)."""
        p = torch.softmax(f, dim=-1)
        return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)

    def output_gradient(self, f: Tensor, y: Tensor) -> Tensor:
        """∂(−log p)/∂f = softmax(f) − onehot(y) per example. (N, K)."""
        _check_classification(f, y)
        return torch.softmax(f, dim=-1) - F.one_hot(y, f.shape[-1]).to(f.dtype)


Likelihood = Gaussian | Categorical


def get_likelihood(likelihood: str | Likelihood, sigma_noise: float = 1.0) -> Likelihood:
    """``"regression"`` → Gaussian(σ), ``"classification"`` → Categorical; objects pass through."""
    if isinstance(likelihood, Gaussian | Categorical):
        return likelihood
    if likelihood == "regression":
        return Gaussian(sigma_noise)
    if likelihood == "classification":
        return Categorical()
    raise ValueError(f"likelihood must be 'regression' or 'classification', got {likelihood!r}")


def _check_regression(f: Tensor, y: Tensor) -> None:
    if f.shape != y.shape:
        raise ValueError(f"regression targets y {tuple(y.shape)} must match outputs {tuple(f.shape)}")


def _check_classification(f: Tensor, y: Tensor) -> None:
    if f.ndim != 2:
        raise ValueError(f"classification outputs must be (N, K) logits, got {tuple(f.shape)}")
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError(f"classification labels must be integers, got dtype {y.dtype}")
    if y.shape != f.shape[:1]:
        raise ValueError(f"labels y {tuple(y.shape)} must have shape (N,) = ({f.shape[0]},)")
    if y.numel() and (y.min() < 0 or y.max() >= f.shape[1]):
        raise ValueError(f"labels must lie in [0, {f.shape[1]}), got [{y.min()}, {y.max()}]")
