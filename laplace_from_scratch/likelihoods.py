"""Likelihoods: the negative log-likelihood of the *summed* loss (as laplace-torch) and
its Hessian Λ with respect to the outputs: Gaussian noise σ (regression, Λ = I/σ²), a
softmax over K logits (classification, Λ = diag(p) − p pᵀ) and one logit with a sigmoid
(binary, Λ = σ(f)(1 − σ(f)): the two-class softmax with the first logit pinned at 0).

Each likelihood also owns what the rest of the module needs to know about it, so that
nothing switches on its name: the loss c = 1/(σ²T) scales, its constant, the mean loss
and δ per unit of weight decay, the predictive links and the validation score.

Shapes: N examples, K outputs, C classes, S samples.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import check_choice, check_outputs, require
from .predictive import (
    laplace_bridge,
    mc_sigmoid,
    mc_softmax,
    probit,
    probit_binary,
    two_class,
)

# the allowed likelihood names and GLM predictive links (``link_approx``), in one place
NAMES = ("regression", "classification", "binary_classification")
LINKS = ("probit", "mc", "bridge", "bridge_norm")


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
        sigma = self.sigma_noise
        log_norm = math.log(sigma * math.sqrt(2 * math.pi))
        return 0.5 * ((y - f) ** 2).sum() / sigma**2 + f.numel() * log_norm

    def output_hessian(self, f: Tensor) -> Tensor:
        """Λₙ = ∂²(−log p)/∂f² = I/σ² for every example: S Sᵀ = S/σ with S = I/σ
        (:meth:`output_hessian_sqrt`). f: (N, K) → (N, K, K)."""
        return self.output_hessian_sqrt(f) / self.sigma_noise

    def output_hessian_sqrt(self, f: Tensor) -> Tensor:
        """A factor S of Λ = S Sᵀ: I/σ. f: (N, K) → (N, K, K)."""
        check_outputs(f)
        N, K = f.shape
        eye = torch.eye(K, dtype=f.dtype, device=f.device)
        return eye.expand(N, K, K) / self.sigma_noise

    def output_gradient(self, f: Tensor, y: Tensor) -> Tensor:
        """∂(−log p)/∂f = (f − y)/σ² per example. (N, K)."""
        return (f - y) / self.sigma_noise**2

    has_noise = True

    def fit_loss(self, f: Tensor, y: Tensor) -> Tensor:
        """½ Σ ‖y − f‖²: the NLL at σ = 1 less its constant (c = 1/(σ²T) scales it)."""
        _check_regression(f, y)
        return 0.5 * ((y - f) ** 2).sum()

    def log_normaliser(self, n_terms: int, sigma_noise: Tensor) -> Tensor:
        """N·K·log(σ√2π), the NLL's constant over ``n_terms`` = N·K entries."""
        return n_terms * torch.log(sigma_noise * math.sqrt(2 * math.pi))

    def mean_loss(self, f: Tensor, y: Tensor) -> Tensor:
        """``nn.MSELoss()``: the mean over all N·K entries."""
        return F.mse_loss(f, y)

    def prior_precision_per_weight_decay(self, n_data, n_outputs, sigma_noise) -> float:
        """δ = N·K/(2σ²) per unit of weight decay (the MSE averages N·K entries)."""
        return n_data * n_outputs / (2 * sigma_noise**2)

    def link(self, f_mu, f_var, link_approx="probit", n_samples=100, generator=None):
        """The GLM predictive of f itself: f_mu (N, K), f_var (N, K, K) without σ²."""
        return f_mu, f_var

    def inverse_link(self, f: Tensor) -> Tensor:
        """The mean of y given f: f itself, (..., K)."""
        return f

    def nn_link(self, samples: Tensor):
        """Mean and variance (N, K) of the network outputs over S samples (S, N, K)."""
        return samples.mean(0), samples.var(0)

    def predictive_nll(self, prediction, y: Tensor, sigma_noise: Tensor) -> Tensor:
        """Σ −log N(y | f_mu, diag f_var + σ²) of a prediction (f_mu, f_var) from
        :meth:`link` or :meth:`nn_link`."""
        mu, var = prediction
        var = var.diagonal(dim1=-2, dim2=-1) if var.ndim == 3 else var
        _check_regression(mu, y)
        std = (var + sigma_noise**2).sqrt()
        return -torch.distributions.Normal(mu, std).log_prob(y).sum()


class _Classification:
    """What the classification likelihoods share: no noise, no constant, δ = N·wd."""

    has_noise = False

    def fit_loss(self, f: Tensor, y: Tensor) -> Tensor:
        """The summed negative log-likelihood (it has no constant)."""
        return self.nll(f, y)

    def log_normaliser(self, n_terms: int, sigma_noise: Tensor) -> Tensor:
        return sigma_noise.new_zeros(())

    def prior_precision_per_weight_decay(self, n_data, n_outputs, sigma_noise) -> float:
        """δ = N per unit of weight decay: the mean cross-entropy is over N examples."""
        return float(n_data)

    def predictive_nll(self, probs: Tensor, y: Tensor, sigma_noise=None) -> Tensor:
        """Σ −log p(y) of class probabilities (N, C) clamped at the smallest normal
        number (probability targets (N, C): −Σ y log p)."""
        logp = probs.clamp(min=torch.finfo(probs.dtype).tiny).log()
        if not (y.is_floating_point() and y.ndim == 2):  # else (N, C) probability rows
            _check_labels(y, probs.shape[1])
        if y.is_floating_point():
            return -(y * logp).sum()
        return -logp.gather(1, y.unsqueeze(1)).sum()


class Categorical(_Classification):
    """Softmax classification over K classes; labels are integers in [0, K)."""

    name = "classification"

    def nll(self, f: Tensor, y: Tensor) -> Tensor:
        """Summed cross-entropy. f: (N, K) logits, y: (N,) integer labels → scalar."""
        _check_classification(f, y)
        return F.cross_entropy(f, y, reduction="sum")

    def output_hessian(self, f: Tensor) -> Tensor:
        """Λₙ = diag(pₙ) − pₙ pₙᵀ with p = softmax(f). f: (N, K) → (N, K, K)."""
        _check_logits(f)
        p = torch.softmax(f, dim=-1)
        return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)

    def output_hessian_sqrt(self, f: Tensor) -> Tensor:
        """A factor S of Λ = S Sᵀ in closed form, S = diag(√p) − p √pᵀ (since Σ p = 1,
        S Sᵀ = diag(p) − 2 p pᵀ + p pᵀ). No eigendecomposition: no per-batch
        synchronisation on a GPU. f: (N, K) → (N, K, K)."""
        _check_logits(f)
        p = torch.softmax(f, dim=-1)
        r = p.sqrt()
        return torch.diag_embed(r) - p.unsqueeze(-1) * r.unsqueeze(-2)

    def output_gradient(self, f: Tensor, y: Tensor) -> Tensor:
        """∂(−log p)/∂f = softmax(f) − onehot(y) per example. (N, K)."""
        _check_classification(f, y)
        target = y if y.is_floating_point() else F.one_hot(y, f.shape[-1])
        return torch.softmax(f, dim=-1) - target.to(f.dtype)

    def mean_loss(self, f: Tensor, y: Tensor) -> Tensor:
        """The mean cross-entropy (``nn.CrossEntropyLoss()``)."""
        return F.cross_entropy(f, y)

    def link(self, f_mu, f_var, link_approx="probit", n_samples=100, generator=None):
        """Class probabilities (N, K) of the Gaussian logits, by ``link_approx``."""
        link_approx = check_choice("link_approx", link_approx, LINKS)
        if link_approx == "probit":
            return probit(f_mu, f_var)
        if link_approx == "mc":
            return mc_softmax(f_mu, f_var, n_samples, generator)
        return laplace_bridge(f_mu, f_var, normalize=link_approx == "bridge_norm")

    def inverse_link(self, f: Tensor) -> Tensor:
        """Class probabilities softmax(f), (..., K)."""
        return torch.softmax(f, -1)

    def nn_link(self, samples: Tensor) -> Tensor:
        """Mean softmax over S sampled networks' logits (S, N, K) → (N, K)."""
        return torch.softmax(samples, -1).mean(0)


class Bernoulli(_Classification):
    """Binary classification with one logit f: p(y = 1 | f) = σ(f); labels are integers
    in {0, 1}."""

    name = "binary_classification"

    def nll(self, f: Tensor, y: Tensor) -> Tensor:
        """Summed binary cross-entropy. f: (N, 1) logits, y: (N,) labels in {0, 1}."""
        _check_binary(f, y)
        y = y.to(f.dtype)
        return F.binary_cross_entropy_with_logits(f[:, 0], y, reduction="sum")

    def output_hessian(self, f: Tensor) -> Tensor:
        """Λₙ = σ(fₙ)(1 − σ(fₙ)). f: (N, 1) → (N, 1, 1)."""
        _check_one_logit(f)
        p = torch.sigmoid(f)
        return (p * (1 - p)).unsqueeze(-1)

    def output_hessian_sqrt(self, f: Tensor) -> Tensor:
        """√Λ = √(σ(f)(1 − σ(f))). f: (N, 1) → (N, 1, 1)."""
        return self.output_hessian(f).sqrt()

    def output_gradient(self, f: Tensor, y: Tensor) -> Tensor:
        """∂(−log p)/∂f = σ(f) − y per example. (N, 1)."""
        _check_binary(f, y)
        return torch.sigmoid(f) - y.to(f.dtype).unsqueeze(-1)

    def mean_loss(self, f: Tensor, y: Tensor) -> Tensor:
        """The mean binary cross-entropy (``nn.BCEWithLogitsLoss()``)."""
        return F.binary_cross_entropy_with_logits(f[:, 0], y.to(f.dtype))

    def link(self, f_mu, f_var, link_approx="probit", n_samples=100, generator=None):
        """Class probabilities (N, 2) of the Gaussian logit, by ``link_approx``."""
        link_approx = check_choice("link_approx", link_approx, LINKS)
        if link_approx.startswith("bridge"):
            raise ValueError(
                "link_approx='bridge' needs K ≥ 2 logits; "
                "use 'probit' or 'mc' for one logit"
            )
        if link_approx == "probit":
            return probit_binary(f_mu, f_var)
        return mc_sigmoid(f_mu, f_var, n_samples, generator)

    def inverse_link(self, f: Tensor) -> Tensor:
        """Class probabilities [1 − σ(f), σ(f)] of one logit, (..., 1) → (..., 2)."""
        return two_class(torch.sigmoid(f[..., 0]))

    def nn_link(self, samples: Tensor) -> Tensor:
        """Mean sigmoid over S sampled networks' logits (S, N, 1) → (N, 2)."""
        return two_class(torch.sigmoid(samples[..., 0]).mean(0))


Likelihood = Gaussian | Categorical | Bernoulli


def get_likelihood(likelihood: str | Likelihood, sigma_noise: float = 1.0):
    """``"regression"`` → Gaussian(σ), ``"classification"`` → Categorical,
    ``"binary_classification"`` → Bernoulli; likelihood objects pass through."""
    if isinstance(likelihood, Gaussian | Categorical | Bernoulli):
        return likelihood
    likelihood = check_choice("likelihood", likelihood, NAMES)
    if likelihood == "regression":
        return Gaussian(sigma_noise)
    return Categorical() if likelihood == "classification" else Bernoulli()


def _check_regression(f: Tensor, y: Tensor) -> None:
    if f.shape != y.shape:
        raise ValueError(
            f"regression targets y {tuple(y.shape)} must match outputs {tuple(f.shape)}"
        )


def _check_labels(y: Tensor, n_classes: int, n: int | None = None) -> None:
    """Integer labels in [0, C), of shape (n,) if ``n`` is given."""
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise ValueError(f"classification labels must be integers, got dtype {y.dtype}")
    if n is not None and y.shape != (n,):
        raise ValueError(f"labels y {tuple(y.shape)} must have shape (N,) = ({n},)")
    if y.numel():
        require(
            (y >= 0) & (y < n_classes),
            lambda: f"labels must lie in [0, {n_classes}), got [{y.min()}, {y.max()}]",
        )


def _check_logits(f: Tensor) -> None:
    if f.ndim != 2:
        raise ValueError(
            f"classification outputs must be (N, K) logits, got {tuple(f.shape)}"
        )
    if f.shape[1] < 2:
        raise ValueError(
            "a softmax over one logit is constant: 'classification' needs K ≥ 2 "
            "outputs; for one logit with a sigmoid use 'binary_classification'"
        )


def _check_one_logit(f: Tensor) -> None:
    if f.ndim != 2 or f.shape[1] != 1:
        raise ValueError(
            "binary_classification needs one logit per example, outputs (N, 1), got "
            f"{tuple(f.shape)}; for K ≥ 2 logits with a softmax use 'classification'"
        )


def _check_classification(f: Tensor, y: Tensor) -> None:
    _check_logits(f)
    if not (y.is_floating_point() and y.ndim == 2):
        return _check_labels(y, f.shape[1], f.shape[0])
    # one-hot or class-probability targets (N, K)
    if y.shape != f.shape:
        raise ValueError(
            f"probability targets y {tuple(y.shape)} must have the outputs' shape "
            f"{tuple(f.shape)}"
        )
    ones = torch.ones_like(y[:, 0])
    require(
        (y >= 0).all() & torch.isclose(y.sum(-1), ones, atol=1e-6).all(),
        "probability targets must be non-negative with rows that sum to 1",
    )


def _check_binary(f: Tensor, y: Tensor) -> None:
    _check_one_logit(f)
    _check_labels(y, 2, f.shape[0])
