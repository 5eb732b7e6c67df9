"""Low-rank Laplace: the top-k eigenpairs of the GGN, H ≈ V diag(λ) Vᵀ (Lanczos on
GGN-vector products, ``matfree.py``; its spectrum decays fast, notebook 07a), plus the
diagonal prior D = diag(p₀). With Σ⁻¹ = D^½ (I + W Wᵀ) D^½, W = D^-½ V diag(cλ)^½
(P × k), and Wᵀ W = E diag(s) Eᵀ, U = W E s^-½ is orthonormal and

    log det Σ⁻¹ = Σ log dᵢ + log det(I_k + Wᵀ W),
    Σ           = D^-½ (I + U diag(1/(1 + s) − 1) Uᵀ) D^-½,

in O(P·k²). Along the P − k dropped directions the posterior is the prior.
laplace-torch's ``LowRankLaplace`` takes the top eigenpairs of the *Hessian*
(``asdfghjkl``), not of the GGN: they differ by the residual term.

Shapes: P parameters, k the rank, N inputs, K outputs, S samples.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .checks import check_count
from .devices import randn
from .matfree import MatfreeGGN, MatVec, check_basis_fits, lanczos
from .operators import Operator, per_row
from .posterior import prior_precision_diag


def top_eigenpairs(matvec: MatVec, v0: Tensor, k: int, n_iter: int):
    """The k largest eigenpairs (λ (k,), V (P, k)) of a symmetric PSD operator from
    ``n_iter`` Lanczos steps started at v0; eigenvalues below 1e-12·λ_max dropped."""
    T, Q = lanczos(matvec, v0, n_iter)
    theta, U = torch.linalg.eigh(T)
    theta, U = theta.flip(0), U.flip(1)  # largest first
    keep = theta > 1e-12 * theta[0].clamp(min=torch.finfo(theta.dtype).tiny)
    theta, U = theta[keep][:k], U[:, keep][:, :k]
    return theta, Q @ U


class LowRankGGN(MatfreeGGN):
    """Stores the batches (:class:`MatfreeGGN`); ``finish()`` runs ``n_iter`` Lanczos
    steps (default min(P, 2·rank + 20), fixed-seed start) on their GGN. Eigenpairs do
    not add up: a fit cannot be continued."""

    can_update = False

    def __init__(self, *args, rank: int = 20, n_iter: int | None = None, module=None):
        check_count("rank", rank)
        super().__init__(*args, module=module)  # f, θ*, the likelihood, the sizes
        P = self.theta.numel()
        self.rank = min(rank, P)
        self.n_iter = n_iter or min(P, 2 * self.rank + 20)
        check_basis_fits(P, self.n_iter, self.theta)  # before any data

    def finish(self) -> LowRankPosterior:
        v0 = randn((self.theta.numel(),), self.theta, torch.Generator().manual_seed(0))
        lam, V = top_eigenpairs(self.operator(), v0, self.rank, self.n_iter)
        return LowRankPosterior(V, lam, self.param_sizes)


class LowRankMatrix(Operator):
    """Σ⁻¹ = D^½ (I + U diag(s) Uᵀ) D^½ (:meth:`LowRankPosterior._whitened`), or with
    ``inverse=True`` Σ = D^-½ (I + U diag(1/(1 + s) − 1) Uᵀ) D^-½, in O(P·k);
    ``log_det()`` gives log det Σ⁻¹."""

    def __init__(self, d, U: Tensor, s, log_det: Callable[[], Tensor], inverse=False):
        self.d, self.U, self.inverse = d, U, inverse
        self.middle = (1 / (1 + s) - 1) if inverse else s
        self._log_det = log_det
        self.like, self.shape = U, (U.shape[0], U.shape[0])

    def __matmul__(self, v: Tensor) -> Tensor:
        root = per_row(self.d.sqrt(), v)  # D^½, or D^-½ for Σ
        w = v / root if self.inverse else v * root
        w = w + self.U @ (per_row(self.middle, v) * (self.U.T @ w))
        return w / root if self.inverse else w * root

    def diagonal(self) -> Tensor:
        inner = 1 + self.U**2 @ self.middle
        return inner / self.d if self.inverse else inner * self.d

    def logdet(self) -> Tensor:
        return -self._log_det() if self.inverse else self._log_det()


class LowRankPosterior:
    """The ``posterior.Posterior`` protocol for H ≈ V diag(λ) Vᵀ; ``H`` is (V (P, k),
    λ (k,)), as laplace-torch's ``LowRankLaplace.H``."""

    def __init__(self, V: Tensor, eigvals: Tensor, param_sizes: list[int]):
        self.V, self.eigvals, self.param_sizes = V, eigvals, list(param_sizes)
        self.n_params = V.shape[0]

    @property
    def H(self) -> tuple[Tensor, Tensor]:
        return self.V, self.eigvals

    def _scaled(self, prior: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        """(d (P,), W (P, k)) with Σ⁻¹ = D^½ (I + W Wᵀ) D^½, W = D^-½ V diag(cλ)^½."""
        d = prior_precision_diag(prior, self.param_sizes).to(self.V.dtype)
        return d, self.V / d.sqrt()[:, None] * (c * self.eigvals).sqrt()

    def _whitened(self, prior: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(d (P,), U (P, k) orthonormal, s (k,)) with W Wᵀ = U diag(s) Uᵀ, so that
        Σ⁻¹ = D^½ (I + U diag(s) Uᵀ) D^½."""
        d, W = self._scaled(prior, c)
        s, E = torch.linalg.eigh(W.T @ W)
        s = s.clamp(min=0)
        return d, (W @ E) / s.clamp(min=torch.finfo(s.dtype).tiny).sqrt(), s

    def log_det(self, prior: Tensor, c: Tensor) -> Tensor:
        """log det Σ⁻¹ = Σ log dᵢ + log det(I_k + Wᵀ W) (one k×k determinant)."""
        d, W = self._scaled(prior, c)
        eye = torch.eye(W.shape[1], dtype=W.dtype, device=W.device)
        return d.log().sum() + torch.logdet(eye + W.T @ W)

    def variance(self, prior: Tensor, c: Tensor) -> Tensor:
        return self.covariance(prior, c).diagonal()

    def functional_variance(self, J: Tensor, prior: Tensor, c: Tensor) -> Tensor:
        d, U, s = self._whitened(prior, c)
        Jt = J / d.sqrt()  # J D^-½, (N, K, P)
        JU = Jt @ U  # (N, K, k)
        return Jt @ Jt.mT + (JU * (1 / (1 + s) - 1)) @ JU.mT

    def sample(self, n_samples: int, prior: Tensor, c: Tensor, generator=None):
        d, U, s = self._whitened(prior, c)
        eps = randn((n_samples, self.n_params), self.V, generator)
        return (eps + ((eps @ U) * ((1 + s).rsqrt() - 1)) @ U.T) / d.sqrt()

    def precision(self, prior: Tensor, c: Tensor) -> LowRankMatrix:
        log_det = lambda: self.log_det(prior, c)
        return LowRankMatrix(*self._whitened(prior, c), log_det)

    def covariance(self, prior: Tensor, c: Tensor) -> LowRankMatrix:
        log_det = lambda: self.log_det(prior, c)
        return LowRankMatrix(*self._whitened(prior, c), log_det, inverse=True)
