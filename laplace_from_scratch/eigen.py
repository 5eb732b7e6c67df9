"""The posterior for a scalar prior δ from one eigendecomposition of the GGN, and its
dual (kernel) route: with H = Q diag(λ) Qᵀ, Σ⁻¹ = Q diag(cλ + δ) Qᵀ, so after one O(P³)
decomposition a change of δ or c costs O(P); when H = J̃ᵀ J̃ with N·K < P rows, the M×M
Gram matrix J̃ J̃ᵀ has the same non-zero eigenvalues, at O(M²P + M³).

Shapes: P parameters, r non-zero eigenvalues, M rows of J̃, N inputs, K outputs,
S samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .devices import randn


@dataclass
class EigenPosterior:
    """The posterior for a scalar prior δ from one eigendecomposition H = V diag(λ) Vᵀ,
    V (P, r) the eigenvectors with non-zero λ (r,). With d = c·λ + δ:

        log det Σ⁻¹ = Σᵢ log dᵢ + (P − r)·log δ,    Σ = V diag(1/d − 1/δ) Vᵀ + I/δ

    so every ``posterior.Posterior`` method costs O(P·r) at most, with results in
    ``dtype`` (the model's). From :meth:`from_H` (``eigh`` of H) or the dual route
    :meth:`from_jacobians` (V = J̃ᵀ U diag(λ^-½) from J̃ J̃ᵀ = U diag(λ) Uᵀ)."""

    eigvals: Tensor  # (r,)
    eigvecs: Tensor  # (P, r), orthonormal columns
    n_params: int
    dtype: torch.dtype  # of the results

    @classmethod
    def from_H(cls, H: Tensor) -> EigenPosterior:
        """``eigh`` of the P×P GGN H (negative round-off eigenvalues clamped to 0)."""
        lam, Q = torch.linalg.eigh(H)
        return cls(lam.clamp(min=0), Q, H.shape[0], H.dtype)

    @classmethod
    def from_jacobians(cls, Jw: Tensor, rtol: float | None = None) -> EigenPosterior:
        """Dual route from whitened Jacobians Jw (M, P), H = Jwᵀ Jw, in float64 (results
        in Jw's dtype). Eigenvalues below ``rtol``·λ_max (default 10·M·ε) are round-off:
        their directions join the complement where Σ⁻¹ = δ."""
        dtype, Jw = Jw.dtype, Jw.double()
        lam, U = torch.linalg.eigh(Jw @ Jw.T)
        rtol = 10 * Jw.shape[0] * torch.finfo(Jw.dtype).eps if rtol is None else rtol
        keep = lam > rtol * lam.max()
        lam, U = lam[keep], U[:, keep]
        return cls(lam, (Jw.T @ U) / lam.sqrt(), Jw.shape[1], dtype)

    @property
    def H(self) -> tuple[Tensor, Tensor]:
        """The GGN in this structure's form: (V, λ)."""
        return self.eigvecs, self.eigvals

    def precision_eigvals(self, prior, c=1.0) -> tuple[Tensor, Tensor]:
        """(δ, d): the scalar δ (0-dim) and d = c·λ + δ (r,), Σ⁻¹'s eigenvalues along V,
        in the decomposition's dtype."""
        dtype, device = self.eigvals.dtype, self.eigvals.device
        delta = torch.as_tensor(prior, dtype=dtype, device=device)
        if delta.numel() != 1:
            raise ValueError(
                "the eigendecomposition route needs a scalar prior precision"
            )
        delta = delta.reshape(())
        c = torch.as_tensor(c, dtype=dtype, device=device)
        return delta, self.eigvals * c + delta

    def log_det(self, prior, c=1.0) -> Tensor:
        """log det Σ⁻¹ = Σ log dᵢ + (P − r) log δ."""
        delta, d = self.precision_eigvals(prior, c)
        value = d.log().sum() + (self.n_params - d.numel()) * delta.log()
        return value.to(self.dtype)

    def variance(self, prior, c=1.0) -> Tensor:
        """diag Σ = Σⱼ Vᵢⱼ² (1/dⱼ − 1/δ) + 1/δ, (P,)."""
        delta, d = self.precision_eigvals(prior, c)
        return (self.eigvecs.square() @ (1 / d - 1 / delta) + 1 / delta).to(self.dtype)

    def precision(self, prior, c=1.0) -> Tensor:
        """Σ⁻¹ = V diag(d − δ) Vᵀ + δI, (P, P)."""
        delta, d = self.precision_eigvals(prior, c)
        V, eye = self.eigvecs, torch.eye(self.n_params, dtype=d.dtype, device=d.device)
        return ((V * (d - delta)) @ V.T + delta * eye).to(self.dtype)

    def covariance(self, prior, c=1.0) -> Tensor:
        """Σ = V diag(1/d − 1/δ) Vᵀ + I/δ, (P, P)."""
        delta, d = self.precision_eigvals(prior, c)
        V, eye = self.eigvecs, torch.eye(self.n_params, dtype=d.dtype, device=d.device)
        return ((V * (1 / d - 1 / delta)) @ V.T + eye / delta).to(self.dtype)

    def functional_variance(self, J: Tensor, prior, c=1.0) -> Tensor:
        """J Σ Jᵀ without forming Σ. J: (N, K, P) → (N, K, K)."""
        delta, d = self.precision_eigvals(prior, c)
        J64 = J.to(self.eigvecs.dtype)
        JV = J64 @ self.eigvecs  # (N, K, r)
        out = (JV * (1 / d - 1 / delta)) @ JV.mT + J64 @ J64.mT / delta
        return out.to(self.dtype)

    def sample(self, n_samples: int, prior, c=1.0, generator=None) -> Tensor:
        """V diag(d^-½ − δ^-½) Vᵀ ε + ε/√δ, ε drawn in ``dtype``, (S, P)."""
        delta, d = self.precision_eigvals(prior, c)
        V = self.eigvecs
        eps = randn(
            (n_samples, self.n_params), V.new_empty(0, dtype=self.dtype), generator
        ).to(V.dtype)
        return (
            ((eps @ V) * (d.rsqrt() - delta.rsqrt())) @ V.T + eps * delta.rsqrt()
        ).to(self.dtype)
