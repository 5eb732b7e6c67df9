"""The Gaussian (Laplace) posterior N(θ*, Σ) over the flat parameter vector.

Convention (laplace-torch 0.3): with the GGN H of the summed loss computed with Λ = I
for regression (see ``curvature.py``), the posterior precision is

    Σ⁻¹ = H / (σ² T) + diag(p₀),

σ the noise standard deviation (1 for classification), T the temperature and p₀ the
prior precision: a scalar, one value per parameter tensor ("layerwise") or one per
parameter.

Two factorisations, each never forming an explicit inverse:

* Cholesky, Σ⁻¹ = L Lᵀ: log det Σ⁻¹ = 2 Σᵢ log Lᵢᵢ; a sample is θ* + L⁻ᵀ ε (a triangular
  solve), whose covariance is L⁻ᵀ L⁻¹ = Σ.
* Eigendecomposition of H = Q diag(λ) Qᵀ, for a *scalar* p₀ = δ: Σ⁻¹ = Q diag(λ/(σ²T) +
  δ) Qᵀ, so after one O(P³) decomposition every change of δ, σ or T costs O(P).

Every posterior structure of the module (full here, diagonal here, KFAC in ``kron.py``,
low-rank in ``lowrank.py``, matrix-free in ``matfree.py``) implements one small
protocol, :class:`Posterior`: it holds the fitted curvature H and, given the prior
precision p₀ and the factor c = 1/(σ²T), gives the log-determinant of Σ⁻¹, the marginal
variances, J Σ Jᵀ, samples, and Σ⁻¹ itself (dense for full, in the structure's own form
otherwise). ``Laplace`` composes them without knowing which one it holds.

Shapes: P parameters (P is never the precision: that is Σ⁻¹), S samples, N inputs,
K outputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from . import dense
from .devices import randn
from .layer_predictive import LayerBlock


def prior_precision_diag(
    prior_precision: float | Tensor, param_sizes: Sequence[int]
) -> Tensor:
    """Expand a prior precision to one value per parameter, shape (P,).

    ``prior_precision`` is a scalar (or a 1-element tensor), a tensor with one value per
    parameter tensor (``len(param_sizes)`` values, "layerwise"), or one value per
    parameter (P).
    """
    # a tensor keeps its device (torch.as_tensor would move it to torch's default
    # device)
    p0 = (
        prior_precision
        if isinstance(prior_precision, Tensor)
        else torch.as_tensor(prior_precision)
    )
    P, n_tensors = sum(param_sizes), len(param_sizes)
    if p0.ndim == 0 or p0.numel() == 1:
        out = p0.reshape(()).expand(P)
    elif p0.ndim == 1 and p0.numel() == P:
        out = p0
    elif p0.ndim == 1 and p0.numel() == n_tensors:
        out = torch.repeat_interleave(
            p0, torch.tensor(list(param_sizes), device=p0.device)
        )
    else:
        raise ValueError(
            f"prior_precision must be a scalar, {n_tensors} values (one per parameter "
            "tensor) "
            f"or {P} values (one per parameter); got shape {tuple(p0.shape)}"
        )
    if not torch.all(out > 0):
        raise ValueError("prior_precision must be positive")
    return out


def posterior_precision(
    H: Tensor,
    sigma_noise: float | Tensor,
    prior_prec_diag: Tensor,
    temperature: float = 1.0,
) -> Tensor:
    """Σ⁻¹ = H / (σ² T) + diag(p₀). H: (P, P), p₀: (P,) → (P, P)."""
    return H / (sigma_noise**2 * temperature) + torch.diag_embed(
        prior_prec_diag.to(H.dtype)
    )


def cholesky(A: Tensor, max_tries: int = 8) -> Tensor:
    """Lower Cholesky factor L of a symmetric positive-definite A (P, P), with jitter if
    needed.

    If A is not numerically positive definite, jitter ε·mean(diag A)·I is added with ε =
    1e-10, 1e-9, ... until the factorisation succeeds; a warning says how much was
    added. Raises ``ValueError`` rather than ever returning NaNs.
    """
    if not torch.isfinite(A).all():
        raise ValueError(
            "the matrix to factorise contains NaN or inf (check the curvature and the "
            "hyperparameters)"
        )
    L, info = torch.linalg.cholesky_ex(A)
    if info == 0 and torch.isfinite(L).all():
        return L
    scale = A.diagonal().abs().mean().clamp(min=torch.finfo(A.dtype).tiny)
    eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
    for k in range(max_tries):
        jitter = 10.0 ** (k - 10) * scale
        L, info = torch.linalg.cholesky_ex(A + jitter * eye)
        if info == 0 and torch.isfinite(L).all():
            warnings.warn(
                f"matrix not positive definite: added jitter {jitter.item():.3g}·I "
                f"({10.0 ** (k - 10):.0e} × mean diagonal) to factorise it",
                RuntimeWarning,
                stacklevel=2,
            )
            return L
    raise ValueError(
        f"Cholesky failed even with jitter {jitter.item():.3g}·I: the matrix is far "
        "from positive definite"
    )


def log_det_from_cholesky(L: Tensor) -> Tensor:
    """log det(L Lᵀ) = 2 Σ log Lᵢᵢ. L: (P, P) lower-triangular → scalar."""
    return 2 * L.diagonal().log().sum()


def covariance_from_cholesky(L: Tensor) -> Tensor:
    """Σ = (L Lᵀ)⁻¹ (P, P), by ``torch.cholesky_inverse`` (two triangular solves, no
    general inverse)."""
    return torch.cholesky_inverse(L)


def sample_from_cholesky(
    mean: Tensor, L: Tensor, n_samples: int, generator: torch.Generator | None = None
) -> Tensor:
    """θ = μ + L⁻ᵀ ε with ε ~ N(0, I) and Σ⁻¹ = L Lᵀ: samples with covariance Σ. → (S,
    P)."""
    eps = randn((mean.numel(), n_samples), mean, generator)
    return mean + torch.linalg.solve_triangular(L.mT, eps, upper=True).T


@dataclass
class EigenPosterior:
    """The posterior for a scalar prior from one eigendecomposition of the GGN, H = V
    diag(λ) Vᵀ.

    ``eigvecs`` V (P, r) holds the r eigenvectors with non-zero eigenvalues λ (r,); on
    the orthogonal complement H is zero. With d = λ/(σ²T) + δ the eigenvalues of Σ⁻¹
    there:

        log det Σ⁻¹ = Σᵢ log dᵢ + (P − r)·log δ
        Σ = V diag(1/d − 1/δ) Vᵀ + I/δ
        θ = θ* + V diag(d^-½ − δ^-½) Vᵀ ε + ε/√δ

    Every method takes (δ, σ, T) and costs O(P·r) at most (O(r) for the
    log-determinant), instead of a fresh O(P³) Cholesky. Two constructors:

    * :meth:`from_H`: ``eigh`` of the P×P GGN, O(P³) once (r = P).
    * :meth:`from_jacobians`: the *dual* route. With J̃ (M, P) the Jacobians whitened by
      Λ^½ (H = J̃ᵀ J̃, M = N·K), the M×M Gram matrix J̃ J̃ᵀ has the same non-zero
      eigenvalues, and V = J̃ᵀ U diag(λ^-½). When M < P this costs O(M²P + M³) instead
      of O(P³).
    """

    eigvals: Tensor  # (r,)
    eigvecs: Tensor  # (P, r), orthonormal columns
    n_params: int

    @classmethod
    def from_H(cls, H: Tensor) -> EigenPosterior:
        """Eigendecomposition of the P×P GGN H (PSD: negative round-off eigenvalues are
        clamped to 0)."""
        lam, Q = torch.linalg.eigh(H)
        return cls(lam.clamp(min=0), Q, H.shape[0])

    @classmethod
    def from_jacobians(cls, Jw: Tensor, rtol: float | None = None) -> EigenPosterior:
        """Dual route from whitened Jacobians Jw (M, P) with H = Jwᵀ Jw.

        Computed in float64 whatever the dtype of Jw (the M×M problem is small, and
        float32 would lose the small eigenvalues). Eigenvalues below ``rtol``·λ_max
        (default: 10·M·float64 epsilon) are treated as zero: they are round-off, and
        their directions join the complement where Σ⁻¹ = δ.
        """
        Jw = Jw.double()
        lam, U = torch.linalg.eigh(Jw @ Jw.T)
        rtol = 10 * Jw.shape[0] * torch.finfo(Jw.dtype).eps if rtol is None else rtol
        keep = lam > rtol * lam.max()
        lam, U = lam[keep], U[:, keep]
        V = (Jw.T @ U) / lam.sqrt()
        return cls(lam, V, Jw.shape[1])

    def precision_eigvals(
        self,
        prior_precision: float | Tensor,
        sigma_noise: float | Tensor = 1.0,
        temperature: float = 1.0,
    ) -> Tensor:
        """d = λ/(σ²T) + δ, the eigenvalues of Σ⁻¹ along the r
        columns of V, shape (r,).
        """
        return self.eigvals / (sigma_noise**2 * temperature) + _scalar(
            prior_precision, self.eigvals
        )

    def log_det(self, prior_precision, sigma_noise=1.0, temperature=1.0) -> Tensor:
        """log det Σ⁻¹ = Σ log dᵢ + (P − r) log δ."""
        delta = _scalar(prior_precision, self.eigvals)
        d = self.precision_eigvals(delta, sigma_noise, temperature)
        return d.log().sum() + (self.n_params - d.numel()) * delta.log()

    def covariance(self, prior_precision, sigma_noise=1.0, temperature=1.0) -> Tensor:
        """Σ = V diag(1/d − 1/δ) Vᵀ + I/δ, (P, P)."""
        delta = _scalar(prior_precision, self.eigvals)
        d = self.precision_eigvals(delta, sigma_noise, temperature)
        eye = torch.eye(
            self.n_params, dtype=self.eigvecs.dtype, device=self.eigvecs.device
        )
        return (self.eigvecs * (1 / d - 1 / delta)) @ self.eigvecs.T + eye / delta

    def functional_variance(
        self, J: Tensor, prior_precision, sigma_noise=1.0, temperature=1.0
    ) -> Tensor:
        """J Σ Jᵀ without forming Σ. J: (N, K, P) → (N, K, K). Reuse J V across (δ, σ,
        T) for speed."""
        delta = _scalar(prior_precision, self.eigvals)
        d = self.precision_eigvals(delta, sigma_noise, temperature)
        J64 = J.to(self.eigvecs.dtype)
        JV = J64 @ self.eigvecs  # (N, K, r)
        return ((JV * (1 / d - 1 / delta)) @ JV.mT + J64 @ J64.mT / delta).to(J.dtype)

    def sample(
        self,
        mean: Tensor,
        n_samples: int,
        prior_precision,
        sigma_noise=1.0,
        temperature=1.0,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """θ = μ + V diag(d^-½ − δ^-½) Vᵀ ε + ε/√δ, (S, P)."""
        delta = _scalar(prior_precision, self.eigvals)
        d = self.precision_eigvals(delta, sigma_noise, temperature)
        eps = randn((n_samples, mean.numel()), mean, generator)
        return (
            mean
            + ((eps @ self.eigvecs) * (d.rsqrt() - delta.rsqrt())) @ self.eigvecs.T
            + eps * delta.rsqrt()
        )


def _scalar(prior_precision: float | Tensor, like: Tensor) -> Tensor:
    delta = torch.as_tensor(prior_precision, dtype=like.dtype, device=like.device)
    if delta.numel() != 1:
        raise ValueError("the eigendecomposition route needs a scalar prior precision")
    return delta.reshape(())


class Posterior(Protocol):
    """What every posterior structure provides. ``prior`` is the prior precision as
    given (a scalar, one value per parameter tensor, or one per parameter:
    :func:`prior_precision_diag`) and ``factor`` is c = 1/(σ²T), both tensors on the
    parameters' device; Σ⁻¹ = c·H + diag(p₀)."""

    H: object  # the curvature in the structure's own form (a tensor for full and diag)
    n_params: int
    # the evidence route: "auto" (or "eigen" / "cholesky" where the structure has both)
    route: str
    # True inside a hyperparameter search (a structure may prefer a cheaper re-prior)
    tuning: bool

    def log_det(self, prior: Tensor, factor: Tensor) -> Tensor:
        """log det Σ⁻¹, differentiable in ``prior`` and ``factor``."""
        ...

    def variance(self, prior: Tensor, factor: Tensor) -> Tensor:
        """diag Σ, (P,)."""
        ...

    def functional_variance(self, J: Tensor, prior: Tensor, factor: Tensor) -> Tensor:
        """J Σ Jᵀ. J: (N, K, P) → (N, K, K)."""
        ...

    def sample(
        self, n_samples: int, prior: Tensor, factor: Tensor, generator=None
    ) -> Tensor:
        """Draws from N(0, Σ), (S, P)."""
        ...

    def precision(self, prior: Tensor, factor: Tensor):
        """Σ⁻¹ itself: (P, P) for full, (P,) for diag, an object with ``to_matrix()``
        otherwise."""
        ...

    def covariance(self, prior: Tensor, factor: Tensor):
        """Σ: (P, P) (dense: for small P), or the structure's own form."""
        ...


class FullPosterior:
    """The full GGN H (P, P). Its factor L of Σ⁻¹ = c·H + diag(p₀) lives in one more P×P
    buffer, formed and factored in place there (``dense.cholesky_``) and cached until
    the prior or c change: log det Σ⁻¹ from its diagonal (differentiable: ∂/∂p₀ = diag Σ
    and ∂/∂c = (P − Σᵢ p₀ᵢΣᵢᵢ)/c, both from L by blocks), diag Σ, J Σ Jᵀ and samples
    from triangular solves. So fit, evidence, tuning, predictions and samples keep
    **two** P×P buffers, H and L.

    When a second buffer does not fit the device (or with ``one_buffer=True``), the
    factor overwrites H: **one** buffer. The prior and σ are then fixed at the values of
    the first factorisation, except along the eigen route (below), which does not need
    H; changing them otherwise raises with what to do.

    Eigen route (``route``): for a scalar prior, log det Σ⁻¹ = Σ log(cλᵢ + δ) + (P − r)
    log δ from the eigenvalues of H, O(P) per new δ or σ. ``"auto"`` takes it when the
    whitened Jacobians were kept (the dual N·K×N·K route: kept while N·K < P within a
    memory budget, see ``FullGGN``), when it is already computed, or inside a δ search
    if two more P×P buffers fit (``eigh`` returns P×P eigenvectors and needs a
    workspace); otherwise the Cholesky route, one factorisation per new (δ, σ).
    """

    def __init__(
        self,
        H: Tensor,
        param_sizes: Sequence[int],
        Jw: Tensor | None = None,
        one_buffer: bool = False,
    ):
        self._H, self.param_sizes, self.n_params = H, list(param_sizes), H.shape[0]
        self.Jw = Jw
        self.route, self.tuning = "auto", False
        self.one_buffer = one_buffer
        self._eigen: EigenPosterior | None = None
        self._buffer: Tensor | None = (
            None  # the factor's P×P buffer (H itself in one-buffer mode)
        )
        self.cached_factor: tuple[Tensor, Tensor] | None = (
            None  # (key, L) with Σ⁻¹ = L Lᵀ
        )

    @property
    def H(self) -> Tensor:
        if self._H is None:
            raise RuntimeError(
                "the GGN was overwritten by its Cholesky factor (one P×P buffer: "
                "memory was short or "
                "one_buffer=True); fit again to get it back"
            )
        return self._H

    @property
    def eigen(self) -> EigenPosterior:
        """The eigendecomposition of H (by the dual route when the whitened Jacobians
        were kept), once."""
        if self._eigen is None:
            self._eigen = (
                EigenPosterior.from_jacobians(self.Jw)
                if self.Jw is not None
                else EigenPosterior.from_H(self.H)
            )
        return self._eigen

    @property
    def eigen_is_cached(self) -> bool:
        """Whether the eigendecomposition has been paid for already."""
        return self._eigen is not None

    def uses_eigen(self, prior: Tensor) -> bool:
        """Whether :meth:`log_det` takes the eigen route for this prior (see the class
        docstring)."""
        if self.route not in ("auto", "eigen", "cholesky"):
            raise ValueError(
                "evidence_route must be one of ('auto', 'eigen', 'cholesky'), got "
                f"{self.route!r}"
            )
        scalar = prior.numel() == 1
        if self.route == "eigen" and not scalar:
            raise ValueError("evidence_route='eigen' needs a scalar prior_precision")
        if self.route != "auto":
            return self.route == "eigen"
        if not scalar:
            return False
        if self.Jw is not None or self._eigen is not None:
            return True
        room = dense.fits(
            dense.dense_bytes(self.n_params, self._dtype, 2), self._device
        )
        return self.tuning and self._H is not None and room

    @property
    def _dtype(self) -> torch.dtype:
        return (self._H if self._H is not None else self._buffer).dtype

    @property
    def _device(self) -> torch.device:
        return (self._H if self._H is not None else self._buffer).device

    def precision(self, prior: Tensor, factor: Tensor) -> Tensor:
        """Σ⁻¹ = c·H + diag(p₀), a new (P, P) tensor (differentiable)."""
        return factor * self.H + torch.diag_embed(
            prior_precision_diag(prior, self.param_sizes).to(self.H.dtype)
        )

    def log_det(self, prior: Tensor, factor: Tensor) -> Tensor:
        # λ·c + δ: EigenPosterior's λ/(σ²T) + δ with σ = 1, T = 1/c
        if self.uses_eigen(prior):
            return self.eigen.log_det(prior, 1.0, 1 / factor)
        return _CholeskyLogDet.apply(
            prior_precision_diag(prior, self.param_sizes), factor, self
        )

    def cholesky_factor(self, prior: Tensor, factor: Tensor) -> Tensor:
        """The Cholesky factor L of Σ⁻¹ (no autograd), in the factor buffer, cached
        until ``prior`` or ``factor`` change. Jitter is added (with a warning) if Σ⁻¹ is
        not numerically positive definite."""
        with torch.no_grad():
            p0 = prior_precision_diag(prior, self.param_sizes).to(self._dtype)
            key = torch.cat([p0.flatten(), factor.reshape(1).to(self._dtype)])
            cached = self.cached_factor
            if (
                cached is not None
                and cached[0].shape == key.shape
                and torch.equal(cached[0], key)
            ):
                return cached[1]
            if self._H is None:
                raise RuntimeError(
                    "the prior precision or σ changed, but the GGN was overwritten by "
                    "its Cholesky factor "
                    "(one P×P buffer: memory was short or one_buffer=True): fit again, "
                    "or use the eigen "
                    "route for a scalar prior (evidence_route='eigen', with the "
                    "whitened Jacobians kept)"
                )
            if self._buffer is None:
                self.one_buffer = self.one_buffer or not dense.fits(
                    dense.dense_bytes(self.n_params, self._dtype), self._device
                )
                if self.one_buffer:
                    warnings.warn(
                        f"one P×P buffer only (P = {self.n_params}): the GGN is "
                        "overwritten by the factor of "
                        "the posterior precision; a later change of δ or σ needs the "
                        "eigen route or a new "
                        "fit",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                    self._buffer = self._H
                else:
                    self._buffer = torch.empty_like(self._H)
            self.cached_factor = None
            L = self._factor_into_buffer(p0, factor)
            if self.one_buffer:
                self._H = None
            self.cached_factor = (key.clone(), L)
        return L

    def _factor_into_buffer(self, p0: Tensor, factor: Tensor) -> Tensor:
        buf, H = self._buffer, self._H
        scale = None
        for k in range(9):
            jitter = 0.0 if k == 0 else 10.0 ** (k - 11) * scale
            if buf is not H:
                buf.copy_(H)
            elif k > 0:
                raise ValueError(
                    "the posterior precision is not positive definite, and with one "
                    "P×P buffer it cannot "
                    "be rebuilt for jitter: use a larger prior precision, or fit again "
                    "with memory for two"
                )
            buf.mul_(factor)
            buf.diagonal().add_(p0 + jitter)
            if scale is None:
                scale = buf.diagonal().abs().mean().item()
            if not torch.isfinite(buf.diagonal()).all():
                raise ValueError(
                    "the posterior precision contains NaN or inf (check the curvature "
                    "and δ, σ)"
                )
            try:
                L = dense.cholesky_(buf)
            except dense.NotPositiveDefinite:
                continue
            if jitter:
                warnings.warn(
                    "posterior precision not positive definite: added jitter "
                    f"{jitter:.3g}·I to factorise it",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return L
        raise ValueError(
            "Cholesky failed even with jitter: the posterior precision is far from "
            "positive definite"
        )

    def covariance(self, prior: Tensor, factor: Tensor) -> Tensor:
        """Σ, a new dense (P, P) tensor: for small P."""
        return covariance_from_cholesky(self.cholesky_factor(prior, factor))

    def variance(self, prior: Tensor, factor: Tensor) -> Tensor:
        return dense.inverse_diagonal(self.cholesky_factor(prior, factor))

    def functional_variance(self, J: Tensor, prior: Tensor, factor: Tensor) -> Tensor:
        # J Σ Jᵀ = VᵀV with V = L⁻¹Jᵀ: N·K·P² for the solve instead of P³ for Σ
        N, K, P = J.shape
        V = torch.linalg.solve_triangular(
            self.cholesky_factor(prior, factor), J.reshape(N * K, P).T, upper=False
        )
        V = V.T.reshape(N, K, P)
        return V @ V.mT

    def sample(
        self, n_samples: int, prior: Tensor, factor: Tensor, generator=None
    ) -> Tensor:
        L = self.cholesky_factor(prior, factor)
        return sample_from_cholesky(L.new_zeros(self.n_params), L, n_samples, generator)


class _CholeskyLogDet(torch.autograd.Function):
    """log det Σ⁻¹ = 2 Σᵢ log Lᵢᵢ from the cached factor; backward from diag Σ, without
    forming Σ."""

    @staticmethod
    def forward(ctx, prior_diag: Tensor, factor: Tensor, post: FullPosterior) -> Tensor:
        L = post.cholesky_factor(prior_diag, factor)
        ctx.post = post
        ctx.prior_diag = prior_diag.detach()
        ctx.factor = factor.detach()
        return 2 * L.diagonal().log().sum()

    @staticmethod
    def backward(ctx, g: Tensor):
        post = ctx.post
        var = dense.inverse_diagonal(post.cholesky_factor(ctx.prior_diag, ctx.factor))
        grad_factor = (
            post.n_params - (ctx.prior_diag * var).sum()
        ) / ctx.factor  # tr(Σ H) = (P − Σ p₀Σᵢᵢ)/c
        return g * var, g * grad_factor, None


class DiagPosterior:
    """A diagonal curvature d (P,): Σ⁻¹ = c·d + p₀ elementwise, so everything is
    elementwise."""

    def __init__(self, d: Tensor, param_sizes: Sequence[int]):
        self.H, self.param_sizes, self.n_params = d, list(param_sizes), d.shape[0]
        self.route, self.tuning = "auto", False

    def precision(self, prior: Tensor, factor: Tensor) -> Tensor:
        """The diagonal of Σ⁻¹, (P,), as laplace-torch returns it."""
        return factor * self.H + prior_precision_diag(prior, self.param_sizes)

    def log_det(self, prior: Tensor, factor: Tensor) -> Tensor:
        _no_eigen_route(self.route, "diag")
        return self.precision(prior, factor).log().sum()

    def variance(self, prior: Tensor, factor: Tensor) -> Tensor:
        return 1 / self.precision(prior, factor)

    def covariance(self, prior: Tensor, factor: Tensor) -> Tensor:
        return torch.diag(self.variance(prior, factor))

    def functional_variance(self, J: Tensor, prior: Tensor, factor: Tensor) -> Tensor:
        return torch.einsum("nkp,p,nlp->nkl", J, self.variance(prior, factor), J)

    def layer_blocks(self, prior: Tensor, factor: Tensor) -> list[LayerBlock]:
        """Σ per parameter tensor, for the layer-wise predictive
        (``layer_predictive.py``): the variances, in no rotated basis."""
        return [
            LayerBlock(v) for v in self.variance(prior, factor).split(self.param_sizes)
        ]

    def sample(
        self, n_samples: int, prior: Tensor, factor: Tensor, generator=None
    ) -> Tensor:
        eps = randn((n_samples, self.n_params), self.H, generator)
        return eps * self.variance(prior, factor).sqrt()


def _no_eigen_route(route: str, structure: str) -> None:
    if route == "eigen":
        raise ValueError(
            f"evidence_route='eigen' is for hessian_structure='full', not {structure!r}"
        )
