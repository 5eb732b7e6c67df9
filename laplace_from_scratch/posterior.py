"""The Gaussian (Laplace) posterior N(θ*, Σ) over the flat parameter vector, with the
convention of laplace-torch 0.3: H is the GGN of the summed loss with Λ = I for
regression (``curvature.py``), and the posterior precision is

    Σ⁻¹ = c·H + diag(p₀),    c = 1/(σ²T),

σ the noise (1 for classification), T the temperature and p₀ the prior precision: a
scalar, one value per parameter tensor ("layerwise") or one per parameter.

Two factorisations, neither forming an explicit inverse: Cholesky, Σ⁻¹ = L Lᵀ, with
log det Σ⁻¹ = 2 Σᵢ log Lᵢᵢ and samples θ* + L⁻ᵀ ε; and, for a *scalar* p₀ = δ, the
eigendecomposition H = Q diag(λ) Qᵀ, Σ⁻¹ = Q diag(cλ + δ) Qᵀ: after one O(P³)
decomposition every change of δ or c costs O(P).

Every posterior structure (full, eigen and diagonal here, KFAC in ``kron.py``, low-rank
in ``lowrank.py``, matrix-free in ``matfree.py``) implements the protocol
:class:`Posterior`; ``Laplace`` composes them without knowing which one it holds.
Results have the dtype of the curvature (the model's).

Shapes: P parameters (P is never the precision: that is Σ⁻¹), S samples, N inputs,
K outputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from . import dense
from .checks import check_choice
from .devices import randn

# (layer_predictive imports the likelihoods, which sample with :func:`cholesky`)
if TYPE_CHECKING:
    from .layer_predictive import LayerBlock

# what a prior precision can be: one value, one per parameter tensor, one per parameter
PRIOR_KINDS = ("scalar", "layerwise", "diag")


def prior_kind(prior_precision: Tensor, param_sizes: Sequence[int]) -> str:
    """Which of :data:`PRIOR_KINDS` a prior precision (scalar, (n_tensors,) or (P,))
    is. The one place that checks a prior's shape and sign."""
    P, n_tensors = sum(param_sizes), len(param_sizes)
    kind = {1: "scalar", n_tensors: "layerwise", P: "diag"}.get(prior_precision.numel())
    if prior_precision.ndim > 1 or kind is None:
        raise ValueError(
            f"prior_precision must be a scalar, {n_tensors} values (one per parameter "
            f"tensor) or {P} values (one per parameter); got shape "
            f"{tuple(prior_precision.shape)}"
        )
    if not torch.all(torch.isfinite(prior_precision) & (prior_precision > 0)):
        raise ValueError("prior_precision must be positive and finite")
    return kind


def prior_precision_diag(
    prior_precision: float | Tensor, param_sizes: Sequence[int]
) -> Tensor:
    """Expand a prior precision (scalar, one per parameter tensor, or one per parameter:
    :func:`prior_kind`) to one value per parameter, shape (P,)."""
    # a tensor keeps its device (torch.as_tensor would move it to the default device)
    p0 = (
        prior_precision
        if isinstance(prior_precision, Tensor)
        else torch.as_tensor(prior_precision)
    )
    kind = prior_kind(p0, param_sizes)
    if kind == "scalar":
        return p0.reshape(()).expand(sum(param_sizes))
    sizes = torch.tensor(list(param_sizes), device=p0.device)
    return torch.repeat_interleave(p0, sizes) if kind == "layerwise" else p0


def posterior_precision(
    H: Tensor, prior_prec_diag: Tensor, factor: float | Tensor = 1.0
) -> Tensor:
    """Σ⁻¹ = c·H + diag(p₀), c = 1/(σ²T). H: (P, P), p₀: (P,) → (P, P)."""
    return factor * H + torch.diag_embed(prior_prec_diag.to(H.dtype))


# The one jitter rule of the module: if a Cholesky factorisation fails, add ε·s·I, s the
# mean |diagonal|, with ε = 1e-10, 1e-9, ..., 1e-3 (1e-10 is ~10⁶ ulps of float64 and
# below float32's resolution, so it only matters where the matrix is singular).
JITTER_FIRST, JITTER_TRIES = 1e-10, 8


def jitters(scale: Tensor) -> Iterator[Tensor | float]:
    """0, then ε·``scale`` for ε = JITTER_FIRST, 10·JITTER_FIRST, ... (JITTER_TRIES
    values)."""
    yield 0.0
    for k in range(JITTER_TRIES):
        yield JITTER_FIRST * 10.0**k * scale


def cholesky(A: Tensor, warn: bool = True) -> Tensor:
    """Lower Cholesky factor L of a symmetric positive-definite A (..., P, P), with
    jitter if needed (:func:`jitters`, scaled per matrix; a warning says how much was
    added unless ``warn=False``). Raises ``ValueError`` rather than ever returning
    NaNs."""
    if not torch.isfinite(A).all():
        raise ValueError(
            "the matrix to factorise contains NaN or inf (check the curvature and the "
            "hyperparameters)"
        )
    scale = (
        A.diagonal(dim1=-2, dim2=-1).abs().mean(-1).clamp(min=torch.finfo(A.dtype).tiny)
    )
    for jitter in jitters(scale[..., None]):
        A_j = A
        if torch.is_tensor(jitter):  # after a failure only: one more P×P, A + jitter·I
            A_j = A.clone()
            A_j.diagonal(dim1=-2, dim2=-1).add_(jitter)
        L, info = torch.linalg.cholesky_ex(A_j)
        if bool((info == 0).all()) and bool(torch.isfinite(L).all()):
            if torch.is_tensor(jitter) and warn:
                relative = float((jitter / scale[..., None]).max())
                warnings.warn(
                    "matrix not positive definite: added jitter "
                    f"{float(jitter.max()):.3g}·I ({relative:.0e} × mean diagonal) "
                    "to factorise it",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return L
    raise ValueError(
        f"Cholesky failed even with jitter {float(jitter.max()):.3g}·I: the matrix is "
        "far from positive definite"
    )


def log_det_from_cholesky(L: Tensor) -> Tensor:
    """log det(L Lᵀ) = 2 Σ log Lᵢᵢ. L: (P, P) lower-triangular → scalar."""
    return 2 * L.diagonal().log().sum()


def covariance_from_cholesky(L: Tensor) -> Tensor:
    """Σ = (L Lᵀ)⁻¹ (P, P) by two triangular solves (``torch.cholesky_inverse``)."""
    return torch.cholesky_inverse(L)


def sample_from_cholesky(
    mean: Tensor, L: Tensor, n_samples: int, generator: torch.Generator | None = None
) -> Tensor:
    """θ = μ + L⁻ᵀ ε with ε ~ N(0, I) and Σ⁻¹ = L Lᵀ: samples with covariance Σ.
    → (S, P)."""
    eps = randn((mean.numel(), n_samples), mean, generator)
    return mean + torch.linalg.solve_triangular(L.mT, eps, upper=True).T


class Posterior(Protocol):
    """What every posterior structure provides: six methods of the prior precision
    ``prior`` (:func:`prior_kind`) and ``factor`` c = 1/(σ²T), tensors on the
    parameters' device, with Σ⁻¹ = c·H + diag(p₀). Results have the dtype of H."""

    H: object  # the curvature in the structure's own form (a tensor for full and diag)
    n_params: int

    def log_det(self, prior: Tensor, factor: Tensor) -> Tensor:
        """log det Σ⁻¹, differentiable in ``prior`` and ``factor``."""

    def variance(self, prior: Tensor, factor: Tensor) -> Tensor:
        """diag Σ, (P,)."""

    def functional_variance(self, J: Tensor, prior: Tensor, factor: Tensor) -> Tensor:
        """J Σ Jᵀ. J: (N, K, P) → (N, K, K)."""

    def sample(
        self, n_samples: int, prior: Tensor, factor: Tensor, generator=None
    ) -> Tensor:
        """Draws from N(0, Σ), (S, P)."""

    def precision(self, prior: Tensor, factor: Tensor):
        """Σ⁻¹: (P, P) for full, (P,) for diag, an operator (``operators.py``)
        otherwise."""

    def covariance(self, prior: Tensor, factor: Tensor):
        """Σ: (P, P) for full and diag (dense: for small P), an operator otherwise."""


@dataclass
class EigenPosterior:
    """The posterior for a scalar prior δ from one eigendecomposition H = V diag(λ) Vᵀ,
    V (P, r) the eigenvectors with non-zero λ (r,). With d = c·λ + δ:

        log det Σ⁻¹ = Σᵢ log dᵢ + (P − r)·log δ,    Σ = V diag(1/d − 1/δ) Vᵀ + I/δ

    so every method of the :class:`Posterior` protocol costs O(P·r) at most, with
    results in ``dtype`` (the model's). From :meth:`from_H` (``eigh`` of H) or the dual
    route :meth:`from_jacobians`: with H = J̃ᵀ J̃, J̃ (M, P), the Gram matrix J̃ J̃ᵀ has the
    same non-zero eigenvalues, V = J̃ᵀ U diag(λ^-½): O(M²P + M³) when M < P."""

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
        """Dual route from whitened Jacobians Jw (M, P) with H = Jwᵀ Jw.

        Computed in float64 whatever the dtype of Jw (the M×M problem is small, and
        float32 would lose the small eigenvalues); results are cast back to Jw's dtype.
        Eigenvalues below ``rtol``·λ_max (default: 10·M·float64 epsilon) are treated as
        zero: they are round-off, and their directions join the complement where
        Σ⁻¹ = δ.
        """
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

    def precision_eigvals(
        self, prior: float | Tensor, factor: float | Tensor = 1.0
    ) -> tuple[Tensor, Tensor]:
        """(δ, d): the scalar prior δ as a 0-dim tensor and d = c·λ + δ, the eigenvalues
        of Σ⁻¹ along the r columns of V, (r,), in the decomposition's dtype."""
        dtype, device = self.eigvals.dtype, self.eigvals.device
        delta = torch.as_tensor(prior, dtype=dtype, device=device)
        if delta.numel() != 1:
            raise ValueError(
                "the eigendecomposition route needs a scalar prior precision"
            )
        delta = delta.reshape(())
        c = torch.as_tensor(factor, dtype=dtype, device=device)
        return delta, self.eigvals * c + delta

    def log_det(self, prior, factor=1.0) -> Tensor:
        """log det Σ⁻¹ = Σ log dᵢ + (P − r) log δ."""
        delta, d = self.precision_eigvals(prior, factor)
        return (d.log().sum() + (self.n_params - d.numel()) * delta.log()).to(
            self.dtype
        )

    def variance(self, prior, factor=1.0) -> Tensor:
        """diag Σ = Σⱼ Vᵢⱼ² (1/dⱼ − 1/δ) + 1/δ, (P,)."""
        delta, d = self.precision_eigvals(prior, factor)
        return (self.eigvecs.square() @ (1 / d - 1 / delta) + 1 / delta).to(self.dtype)

    def precision(self, prior, factor=1.0) -> Tensor:
        """Σ⁻¹ = V diag(d − δ) Vᵀ + δI, (P, P)."""
        delta, d = self.precision_eigvals(prior, factor)
        V = self.eigvecs
        return (
            (V * (d - delta)) @ V.T
            + delta * torch.eye(self.n_params, dtype=V.dtype, device=V.device)
        ).to(self.dtype)

    def covariance(self, prior, factor=1.0) -> Tensor:
        """Σ = V diag(1/d − 1/δ) Vᵀ + I/δ, (P, P)."""
        delta, d = self.precision_eigvals(prior, factor)
        V = self.eigvecs
        eye = torch.eye(self.n_params, dtype=V.dtype, device=V.device)
        return ((V * (1 / d - 1 / delta)) @ V.T + eye / delta).to(self.dtype)

    def functional_variance(self, J: Tensor, prior, factor=1.0) -> Tensor:
        """J Σ Jᵀ without forming Σ. J: (N, K, P) → (N, K, K)."""
        delta, d = self.precision_eigvals(prior, factor)
        J64 = J.to(self.eigvecs.dtype)
        JV = J64 @ self.eigvecs  # (N, K, r)
        return ((JV * (1 / d - 1 / delta)) @ JV.mT + J64 @ J64.mT / delta).to(
            self.dtype
        )

    def sample(
        self,
        n_samples: int,
        prior,
        factor=1.0,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Draws V diag(d^-½ − δ^-½) Vᵀ ε + ε/√δ from N(0, Σ), ε drawn in ``dtype``,
        (S, P)."""
        delta, d = self.precision_eigvals(prior, factor)
        V = self.eigvecs
        eps = randn(
            (n_samples, self.n_params), V.new_empty(0, dtype=self.dtype), generator
        ).to(V.dtype)
        return (
            ((eps @ V) * (d.rsqrt() - delta.rsqrt())) @ V.T + eps * delta.rsqrt()
        ).to(self.dtype)


class FullPosterior:
    """The full GGN H (P, P), on notebook 03's path: L = :func:`cholesky` of Σ⁻¹ =
    :func:`posterior_precision` (cached until p₀ or c change) gives log det Σ⁻¹ (its
    gradients ∂/∂p₀ = diag Σ, ∂/∂c = (P − Σᵢ p₀ᵢΣᵢᵢ)/c by :class:`_CholeskyLogDet`),
    samples, Σ, and diag Σ and J Σ Jᵀ by triangular solves. Two additions:

    * **Eigen route** (``route``: "auto", "eigen" or "cholesky"), for a scalar prior:
      log det Σ⁻¹ from :class:`EigenPosterior`, O(P) per new δ or c. ``"auto"`` takes it
      when the whitened Jacobians were kept (``FullGGN``), when it is computed already,
      or when δ or c change after a factorisation, if two more P×P buffers fit.
    * **Memory limit** (``dense.InPlaceFactor``): when two more P×P buffers do not fit,
      or with ``in_place=True``, Σ⁻¹ is factored in place in one buffer beside H; with
      ``one_buffer=True`` (or when even that does not fit) in H itself (then p₀ and c
      are fixed at their first values, except on the eigen route).
    """

    ROUTES = ("auto", "eigen", "cholesky")

    def __init__(
        self,
        H: Tensor,
        param_sizes: Sequence[int],
        Jw: Tensor | None = None,
        route: str = "auto",
        one_buffer: bool = False,
        in_place: bool = False,
    ):
        self._H, self.param_sizes, self.n_params = H, list(param_sizes), H.shape[0]
        self.dtype, self.device = H.dtype, H.device
        self.Jw, self.route = Jw, route
        self.one_buffer, self.in_place = one_buffer, in_place or one_buffer
        self._eigen: EigenPosterior | None = None
        self._in_place: dense.InPlaceFactor | None = None  # memory-limit layer, if any
        self.cached_factor: tuple[Tensor, Tensor] | None = None  # (key, L), Σ⁻¹ = L Lᵀ

    @property
    def route(self) -> str:
        return self._route

    @route.setter
    def route(self, value: str) -> None:
        check_choice("evidence_route", value, self.ROUTES)
        self._route = value

    @property
    def H(self) -> Tensor:
        if self._H is None:
            raise RuntimeError(
                "the GGN was overwritten by its Cholesky factor (one P×P buffer: "
                "memory was short or one_buffer=True); fit again to get it back"
            )
        return self._H

    @property
    def eigen(self) -> EigenPosterior:
        """The eigendecomposition of H (by the dual route when the whitened Jacobians
        were kept), once."""
        if self._eigen is None and self.Jw is not None:
            self._eigen = EigenPosterior.from_jacobians(self.Jw)
        elif self._eigen is None:
            self._eigen = EigenPosterior.from_H(self.H)
        return self._eigen

    @property
    def eigen_is_cached(self) -> bool:
        """Whether the eigendecomposition has been paid for already."""
        return self._eigen is not None

    def _key(self, prior: Tensor, factor: Tensor) -> Tensor:
        """(p₀, c) as one vector: the factor cache's key."""
        p0 = prior_precision_diag(prior, self.param_sizes).to(self.dtype)
        c = torch.as_tensor(factor, dtype=self.dtype, device=self.device)
        return torch.cat([p0.flatten(), c.reshape(1)])

    def _is_cached(self, key: Tensor) -> bool:
        cached = self.cached_factor  # (torch.equal is False for another shape)
        return cached is not None and torch.equal(cached[0], key)

    def _two_fit(self) -> bool:
        """Whether two more P×P buffers fit the device."""
        return dense.fits(dense.dense_bytes(self.n_params, self.dtype, 2), self.device)

    def uses_eigen(self, prior: Tensor, factor: Tensor) -> bool:
        """Whether :meth:`log_det` takes the eigen route for (p₀, c) (see the class
        docstring)."""
        scalar = prior.numel() == 1
        if self.route == "eigen" and not scalar:
            raise ValueError("evidence_route='eigen' needs a scalar prior_precision")
        if self.route != "auto" or not scalar:
            return self.route == "eigen"
        if self.Jw is not None or self._eigen is not None:
            return True
        with torch.no_grad():
            changed = self.cached_factor is not None and not self._is_cached(
                self._key(prior, factor)
            )
        return changed and self._H is not None and self._two_fit()

    def precision(self, prior: Tensor, factor: Tensor) -> Tensor:
        """Σ⁻¹ = c·H + diag(p₀), a new (P, P) tensor (differentiable)."""
        return posterior_precision(
            self.H, prior_precision_diag(prior, self.param_sizes), factor
        )

    def log_det(self, prior: Tensor, factor: Tensor) -> Tensor:
        if self.uses_eigen(prior, factor):
            return self.eigen.log_det(prior, factor)
        return _CholeskyLogDet.apply(
            prior_precision_diag(prior, self.param_sizes), factor, self
        )

    def cholesky_factor(self, prior: Tensor, factor: Tensor) -> Tensor:
        """The Cholesky factor L of Σ⁻¹ (no autograd), cached until ``prior`` or
        ``factor`` change. Jitter is added (with a warning) if Σ⁻¹ is not numerically
        positive definite."""
        with torch.no_grad():
            key = self._key(prior, factor)
            if self._is_cached(key):
                return self.cached_factor[1]
            if self._H is None:
                raise RuntimeError(
                    "the prior precision or σ changed, but the GGN was overwritten by "
                    "its Cholesky factor (one P×P buffer: memory was short or "
                    "one_buffer=True): fit again, or use the eigen route for a scalar "
                    "prior (evidence_route='eigen', with the whitened Jacobians kept)"
                )
            self.cached_factor = None  # frees the old factor before the new one is made
            p0 = key[:-1]
            if self._in_place is None and (self.in_place or not self._two_fit()):
                self._in_place = dense.InPlaceFactor(self._H, self.one_buffer)
            if self._in_place is None:
                L = cholesky(posterior_precision(self._H, p0, factor))
            else:
                L = self._in_place.factor(self._H, p0, factor)
                if self._in_place.one_buffer:
                    self._H = None
            self.cached_factor = (key.clone(), L)
        return L

    def covariance(self, prior: Tensor, factor: Tensor) -> Tensor:
        """Σ, a new dense (P, P) tensor: for small P."""
        return covariance_from_cholesky(self.cholesky_factor(prior, factor))

    def variance(self, prior: Tensor, factor: Tensor) -> Tensor:
        return dense.inverse_diagonal(self.cholesky_factor(prior, factor))

    def functional_variance(self, J: Tensor, prior: Tensor, factor: Tensor) -> Tensor:
        # J Σ Jᵀ = VᵀV with V = L⁻¹Jᵀ: N·K·P² for the solve instead of P³ for Σ
        N, K, P = J.shape
        L = self.cholesky_factor(prior, factor)
        V = torch.linalg.solve_triangular(
            L, J.reshape(N * K, P).T, upper=False
        ).T.reshape(N, K, P)
        return V @ V.mT

    def sample(
        self, n_samples: int, prior: Tensor, factor: Tensor, generator=None
    ) -> Tensor:
        L = self.cholesky_factor(prior, factor)
        return sample_from_cholesky(L.new_zeros(self.n_params), L, n_samples, generator)


class _CholeskyLogDet(torch.autograd.Function):
    """log det Σ⁻¹ = :func:`log_det_from_cholesky` of the cached factor; backward from
    diag Σ (blocks of triangular solves), without forming Σ."""

    @staticmethod
    def forward(ctx, prior_diag: Tensor, factor: Tensor, post: FullPosterior) -> Tensor:
        ctx.post, ctx.prior_diag = post, prior_diag.detach()
        ctx.factor = factor.detach()
        return log_det_from_cholesky(post.cholesky_factor(prior_diag, factor))

    @staticmethod
    def backward(ctx, g: Tensor):
        post = ctx.post
        var = dense.inverse_diagonal(post.cholesky_factor(ctx.prior_diag, ctx.factor))
        # tr(Σ H) = (P − Σ p₀Σᵢᵢ)/c
        grad_factor = (post.n_params - (ctx.prior_diag * var).sum()) / ctx.factor
        return g * var, g * grad_factor, None


class DiagPosterior:
    """A diagonal curvature d (P,): Σ⁻¹ = c·d + p₀ elementwise, so everything is
    elementwise."""

    def __init__(self, d: Tensor, param_sizes: Sequence[int]):
        self.H, self.param_sizes, self.n_params = d, list(param_sizes), d.shape[0]

    def precision(self, prior: Tensor, factor: Tensor) -> Tensor:
        """The diagonal of Σ⁻¹, (P,), as laplace-torch returns it."""
        return factor * self.H + prior_precision_diag(prior, self.param_sizes)

    def log_det(self, prior: Tensor, factor: Tensor) -> Tensor:
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
        from .layer_predictive import LayerBlock

        return [
            LayerBlock(v) for v in self.variance(prior, factor).split(self.param_sizes)
        ]

    def sample(
        self, n_samples: int, prior: Tensor, factor: Tensor, generator=None
    ) -> Tensor:
        eps = randn((n_samples, self.n_params), self.H, generator)
        return eps * self.variance(prior, factor).sqrt()
