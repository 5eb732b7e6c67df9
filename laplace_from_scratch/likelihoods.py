"""Likelihoods: the negative log-likelihood and its Hessian Λ with respect to the outputs.

Both are for the *summed* loss over the data, as in laplace-torch:

* Gaussian noise with standard deviation σ (regression):
  −log p(y | f) = ‖y − f‖² / (2σ²) + K·log(σ√(2π)) per example, and Λ = I/σ².
* Categorical with a softmax over K logits (classification):
  −log p(y | f) = −log softmax(f)_y per example, and Λ = diag(p) − p pᵀ.
* Bernoulli with one logit and a sigmoid (binary classification):
  −log p(y | f) = −y log σ(f) − (1 − y) log(1 − σ(f)), and Λ = σ(f)(1 − σ(f)).
  It is the two-class softmax with the first logit pinned at 0: softmax([0, f])₁ = σ(f), and
  [0, 1]ᵀ (diag p − p pᵀ) [0, 1] = p₁(1 − p₁). laplace-torch 0.3 has no binary likelihood; the
  tests compare against it through exactly this embedding.

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


class Bernoulli:
    """Binary classification with one logit f: p(y = 1 | f) = σ(f); labels are integers in {0, 1}."""

    name = "binary_classification"

    def nll(self, f: Tensor, y: Tensor) -> Tensor:
        """Summed binary cross-entropy. f: (N, 1) logits, y: (N,) labels in {0, 1} → scalar."""
        _check_binary(f, y)
        return F.binary_cross_entropy_with_logits(f[:, 0], y.to(f.dtype), reduction="sum")

    def output_hessian(self, f: Tensor) -> Tensor:
        """Λₙ = σ(fₙ)(1 − σ(fₙ)). f: (N, 1) → (N, 1, 1)."""
        p = torch.sigmoid(f)
        return (p * (1 - p)).unsqueeze(-1)

    def output_gradient(self, f: Tensor, y: Tensor) -> Tensor:
        """∂(−log p)/∂f = σ(f) − y per example. (N, 1)."""
        _check_binary(f, y)
        return torch.sigmoid(f) - y.to(f.dtype).unsqueeze(-1)


Likelihood = Gaussian | Categorical | Bernoulli
NAMES = ("regression", "classification", "binary_classification")


def get_likelihood(likelihood: str | Likelihood, sigma_noise: float = 1.0) -> Likelihood:
    """``"regression"`` → Gaussian(σ), ``"classification"`` → Categorical,
    ``"binary_classification"`` → Bernoulli; likelihood objects pass through."""
    if isinstance(likelihood, Gaussian | Categorical | Bernoulli):
        return likelihood
    if likelihood == "regression":
        return Gaussian(sigma_noise)
    if likelihood == "classification":
        return Categorical()
    if likelihood == "binary_classification":
        return Bernoulli()
    raise ValueError(f"likelihood must be one of {NAMES}, got {likelihood!r}")


def _check_regression(f: Tensor, y: Tensor) -> None:
    if f.shape != y.shape:
        raise ValueError(f"regression targets y {tuple(y.shape)} must match outputs {tuple(f.shape)}")


def _check_labels(y: Tensor) -> None:
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise ValueError(f"classification labels must be integers, got dtype {y.dtype}")


def _check_classification(f: Tensor, y: Tensor) -> None:
    if f.ndim != 2:
        raise ValueError(f"classification outputs must be (N, K) logits, got {tuple(f.shape)}")
    if f.shape[1] < 2:
        raise ValueError(
            "a softmax over one logit is constant: 'classification' needs K ≥ 2 outputs; "
            "for one logit with a sigmoid use 'binary_classification'"
        )
    _check_labels(y)
    if y.shape != f.shape[:1]:
        raise ValueError(f"labels y {tuple(y.shape)} must have shape (N,) = ({f.shape[0]},)")
    if y.numel() and (y.min() < 0 or y.max() >= f.shape[1]):
        raise ValueError(f"labels must lie in [0, {f.shape[1]}), got [{y.min()}, {y.max()}]")


def _check_binary(f: Tensor, y: Tensor) -> None:
    if f.ndim != 2 or f.shape[1] != 1:
        raise ValueError(
            f"binary_classification needs one logit per example, outputs (N, 1), got {tuple(f.shape)}; "
            "for K ≥ 2 logits with a softmax use 'classification'"
        )
    _check_labels(y)
    if y.shape != f.shape[:1]:
        raise ValueError(f"labels y {tuple(y.shape)} must have shape (N,) = ({f.shape[0]},)")
    if y.numel() and (y.min() < 0 or y.max() > 1):
        raise ValueError(f"binary labels must lie in {{0, 1}}, got [{y.min()}, {y.max()}]")
