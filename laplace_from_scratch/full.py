"""Full Laplace, the path notebooks 02–04 teach, on one screen (:class:`FullGGN` and
:class:`FullPosterior`):

    Laplace.fit → FullGGN.update: H += J̃ᵀJ̃ for a few examples at a time (J̃ = Λ^½ J)
                → FullGGN.finish → FullPosterior, whose methods are notebook 03's:
    Σ⁻¹ = posterior_precision(H, p₀, c) → L = cholesky(Σ⁻¹) → log det Σ⁻¹ = 2 Σ log Lᵢᵢ
    → diag Σ, J Σ Jᵀ = VᵀV with V = L⁻¹Jᵀ, samples L⁻ᵀε.

Two additions, each chosen when the posterior is made by the rule of
:func:`full_posterior`, and each skippable by a reader: the memory-limit layer
(``memory_limit.py``: Σ⁻¹ factored in one buffer), and the eigen route
(:class:`EigenRoute`: log det Σ⁻¹ for a scalar prior from one eigendecomposition).

Shapes: N examples, K outputs, P parameters, M rows of J̃, S samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from . import memory_limit
from .curvature import (
    CHUNK_FRACTION,
    CHUNK_FRACTION_TIGHT,
    FunctionalBuilder,
    jacobian_chunk,
    resume,
    whitened_jacobians,
)
from .eigen import EigenPosterior
from .functional import Functional
from .likelihoods import Likelihood
from .posterior import (
    PerPrior,
    cholesky,
    covariance_from_cholesky,
    inverse_diagonal,
    log_det_from_cholesky,
    log_det_with_gradients,
    posterior_precision,
    prior_precision_diag,
    sample_from_cholesky,
)

ROUTES = ("auto", "eigen", "cholesky")  # the full structure's evidence_route
# Whitened Jacobians (M × P, M < P) that FullGGN keeps for the eigen route, at most
DUAL_FRACTION = 1 / 4  # of one P×P matrix, beside H, or
DUAL_FLOOR_BYTES = 1 << 26  # 64 MiB if more (small models: cheap, and the fast route)
DUAL_FRACTION_ONE_BUFFER = 1 / 32  # of one P×P matrix with one_buffer (no floor)


class FullGGN(FunctionalBuilder):
    """Accumulates the full GGN H = Σ J̃ᵀJ̃ (P, P) in place, from the whitened Jacobians
    J̃ = Λ^½ J of a few examples at a time (``curvature.jacobian_chunk``). Unless
    ``evidence_route="cholesky"``, it keeps them (M·K < P rows, at most
    :data:`DUAL_FRACTION` of a P×P matrix or 64 MiB) for the eigen route."""

    def __init__(
        self,
        f: Functional,
        theta: Tensor,
        likelihood: Likelihood,
        param_sizes: list[int],
        evidence_route: str = "auto",
        one_buffer: bool = False,
        in_place: bool = False,
    ):
        super().__init__(f, theta, likelihood, param_sizes)
        P = theta.numel()
        memory_limit.check_fits(
            P, theta.dtype, theta.device, 1, f"full Laplace over P = {P} parameters"
        )
        self.H = torch.zeros(P, P, dtype=theta.dtype, device=theta.device)
        self.options = dict(
            route=evidence_route, one_buffer=one_buffer, in_place=in_place
        )
        self.jacobian_chunks: list[Tensor] | None = (
            None if evidence_route == "cholesky" else []
        )
        fraction = DUAL_FRACTION_ONE_BUFFER if one_buffer else DUAL_FRACTION
        floor = 0 if one_buffer else DUAL_FLOOR_BYTES // theta.element_size()
        self.dual_budget = max(int(P * P * fraction), floor)  # numbers
        self.posterior: FullPosterior | None = None

    def update(self, X: Tensor) -> Tensor:
        out = self.outputs(X)
        P = self.theta.numel()
        tight = self.options["one_buffer"]
        chunk = jacobian_chunk(
            out.shape[-1], P, CHUNK_FRACTION_TIGHT if tight else CHUNK_FRACTION
        )
        for start in range(0, X.shape[0], chunk):
            Jw = whitened_jacobians(
                self.f, self.theta, X[start : start + chunk], self.likelihood, chunk
            )
            self.H.addmm_(Jw.T, Jw)  # in place: one P×P buffer, no temporary
            kept = self.jacobian_chunks
            if kept is not None:
                kept.append(Jw)
                M = sum(b.shape[0] for b in kept)
                if M >= P or M * P > self.dual_budget:  # too many for the eigen route
                    self.jacobian_chunks = None
        return out

    def finish(self) -> FullPosterior:
        Jw = torch.cat(self.jacobian_chunks) if self.jacobian_chunks else None
        if Jw is not None:
            self.jacobian_chunks = [Jw]  # one copy, shared with the posterior
        self.posterior = full_posterior(self.H, self.param_sizes, Jw, **self.options)
        return self.posterior

    @property
    def can_update(self) -> bool:
        """False once the memory-limit layer has overwritten H with L (one buffer)."""
        limit = self.posterior and self.posterior.limit
        return not (limit and limit.overwritten)

    def resumed(self) -> FullGGN:
        P, dtype, device = self.H.shape[0], self.H.dtype, self.H.device
        memory_limit.check_fits(
            P, dtype, device, 1, "a continued full fit (a copy of H)"
        )
        return resume(self, "H", "jacobian_chunks")


class FullPosterior:
    """The full GGN H (P, P) with Σ⁻¹ = c·H + diag(p₀), by notebook 03's functions: the
    Cholesky factor L of Σ⁻¹ (cached until p₀ or c change) gives log det Σ⁻¹, diag Σ,
    J Σ Jᵀ and samples. ``limit``: the memory-limit layer, or None (the rule in
    :func:`full_posterior`)."""

    Jw = None  # whitened Jacobians: the eigen route's

    def __init__(
        self,
        H: Tensor,
        param_sizes: Sequence[int],
        route: str = "cholesky",
        one_buffer: bool = False,
        in_place: bool = False,
    ):
        self._H, self.param_sizes, self.n_params = H, list(param_sizes), H.shape[0]
        self.route, self.one_buffer, self.in_place = route, one_buffer, in_place
        self.limit = memory_limit.layer(
            H, one_buffer, in_place
        )  # None: memory is ample
        self.cache = PerPrior()

    @property
    def H(self) -> Tensor:
        return self._H if self.limit is None else self.limit.H

    def precision(self, prior: Tensor, c: Tensor) -> Tensor:
        """Σ⁻¹ = c·H + diag(p₀), a new (P, P) tensor (differentiable)."""
        return posterior_precision(
            self.H, prior_precision_diag(prior, self.param_sizes), c
        )

    def L(self, prior: Tensor, c: Tensor) -> Tensor:
        """The Cholesky factor L of Σ⁻¹ = L Lᵀ (P, P), without autograd; jitter (with a
        warning) if Σ⁻¹ is not numerically positive definite."""
        p0 = prior_precision_diag(prior, self.param_sizes).to(self._H.dtype)
        if self.limit is not None:
            return self.cache(p0, c, lambda: self.limit.L(p0, c))
        return self.cache(p0, c, lambda: cholesky(posterior_precision(self.H, p0, c)))

    def log_det(self, prior: Tensor, c: Tensor) -> Tensor:
        L = self.L(prior, c)
        p0 = prior_precision_diag(prior, self.param_sizes)
        value = log_det_from_cholesky(L)
        return log_det_with_gradients(value, p0, c, lambda: inverse_diagonal(L))

    def variance(self, prior: Tensor, c: Tensor) -> Tensor:
        return inverse_diagonal(self.L(prior, c))

    def covariance(self, prior: Tensor, c: Tensor) -> Tensor:
        """Σ, a new dense (P, P) tensor: for small P."""
        return covariance_from_cholesky(self.L(prior, c))

    def functional_variance(self, J: Tensor, prior: Tensor, c: Tensor) -> Tensor:
        # J Σ Jᵀ = VᵀV with V = L⁻¹Jᵀ: N·K·P² for the solve instead of P³ for Σ
        N, K, P = J.shape
        L = self.L(prior, c)
        V = torch.linalg.solve_triangular(L, J.reshape(N * K, P).T, upper=False)
        V = V.T.reshape(N, K, P)
        return V @ V.mT

    def sample(
        self, n_samples: int, prior: Tensor, c: Tensor, generator=None
    ) -> Tensor:
        L = self.L(prior, c)
        return sample_from_cholesky(L.new_zeros(self.n_params), L, n_samples, generator)


class EigenRoute(FullPosterior):
    """The full posterior whose log det Σ⁻¹ for a scalar prior δ comes from one
    eigendecomposition of H (``eigen.EigenPosterior``; by the dual route from the
    whitened Jacobians ``Jw`` (M, P) when they were kept): O(P) per new (δ, c) after it.
    Everything else, and log det for a prior per tensor or per parameter (which
    ``route="eigen"`` refuses), is the Cholesky path of :class:`FullPosterior`."""

    def __init__(
        self,
        H: Tensor,
        param_sizes: Sequence[int],
        Jw: Tensor | None = None,
        route: str = "auto",
        one_buffer: bool = False,
        in_place: bool = False,
    ):
        super().__init__(H, param_sizes, route, one_buffer, in_place)
        self.Jw, self._eigen = Jw, None

    @property
    def eigen(self) -> EigenPosterior:
        """H = V diag(λ) Vᵀ, computed once."""
        if self._eigen is None and self.Jw is not None:
            self._eigen = EigenPosterior.from_jacobians(self.Jw)
        elif self._eigen is None:
            self._eigen = EigenPosterior.from_H(self.H)
        return self._eigen

    def log_det(self, prior: Tensor, c: Tensor) -> Tensor:
        if prior.numel() == 1:
            return self.eigen.log_det(prior, c)
        if self.route == "eigen":
            raise ValueError("evidence_route='eigen' needs a scalar prior_precision")
        return super().log_det(prior, c)


def full_posterior(
    H: Tensor,
    param_sizes: Sequence[int],
    Jw: Tensor | None = None,
    route: str = "auto",
    one_buffer: bool = False,
    in_place: bool = False,
) -> FullPosterior:
    """The full structure's posterior, by one rule, at fit and for a saved state:

    * the eigen route (:class:`EigenRoute`) with ``route="eigen"``, or with ``"auto"``
      when the whitened Jacobians Jw were kept (N·K < P, and they fit): its
      eigendecomposition is then the M×M Gram matrix's, cheaper than one Cholesky of
      Σ⁻¹; otherwise the Cholesky path (:class:`FullPosterior`), as laplace-torch;
    * the memory-limit layer with ``in_place`` or ``one_buffer``, or when two more P×P
      buffers do not fit (``memory_limit.layer``).
    """
    if route == "eigen" or (route == "auto" and Jw is not None):
        return EigenRoute(H, param_sizes, Jw, route, one_buffer, in_place)
    return FullPosterior(H, param_sizes, route, one_buffer, in_place)
