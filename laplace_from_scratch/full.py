"""Full Laplace, the path of notebooks 02–04 on one screen (:class:`FullGGN`,
:class:`FullPosterior`):

    Laplace.fit → FullGGN.update: H += J̃ᵀJ̃, a few examples at a time (J̃ = SᵀJ, Λ = SSᵀ)
    → FullGGN.finish → FullPosterior, whose methods are notebook 03's functions:
    Σ⁻¹ = posterior_precision(H, p₀, c) → L = cholesky(Σ⁻¹) → log det Σ⁻¹ = 2 Σ log Lᵢᵢ
    → diag Σ, samples L⁻ᵀε, and J Σ Jᵀ = VᵀV with V = L⁻¹Jᵀ for the GLM predictive.

Two additions a reader may skip, both chosen when the posterior is made, by the rule of
:func:`full_posterior`: the memory-limit layer (``memory_limit.py``) and the eigen route
(:class:`EigenRoute`).

Shapes: N examples, K outputs, P parameters, M rows of J̃, S samples.
"""

from __future__ import annotations

from functools import cached_property

import torch
from torch import Tensor

from . import memory_limit
from .curvature import (
    CHUNK_FRACTION,
    CHUNK_FRACTION_TIGHT,
    FunctionalBuilder,
    jacobian_chunk,
    resume,
    whitened_batches,
)
from .eigen import EigenPosterior
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
# FullGGN keeps the whitened Jacobians (M < P rows) for the eigen route up to
DUAL_FRACTION = 1 / 4  # of one P×P matrix, beside H, or
DUAL_FLOOR_BYTES = 1 << 26  # 64 MiB if more (small models: cheap, and the fast route)
DUAL_FRACTION_ONE_BUFFER = 1 / 32  # of one P×P matrix with one_buffer (no floor)


def dual_budget(P: int, like: Tensor, one_buffer: bool) -> int:
    """How many numbers of whitened Jacobians FullGGN keeps for the eigen route."""
    if one_buffer:
        return int(P * P * DUAL_FRACTION_ONE_BUFFER)
    return max(int(P * P * DUAL_FRACTION), DUAL_FLOOR_BYTES // like.element_size())


class FullGGN(FunctionalBuilder):
    """H = Σ J̃ᵀJ̃ (P, P), in place from the whitened Jacobians J̃ = Sᵀ J of a few
    examples at a time; J̃ is kept for the eigen route while it has fewer than P rows and
    fits the budget above. The options are :func:`full_posterior`'s."""

    def __init__(self, *args, evidence_route="auto", one_buffer=False, in_place=False):
        super().__init__(*args)  # f, θ*, the likelihood, the parameter sizes
        theta, P = self.theta, self.theta.numel()
        what = f"full Laplace over P = {P} parameters"
        memory_limit.check_fits(P, theta.dtype, theta.device, 1, what)
        self.H = theta.new_zeros(P, P)
        self.options = dict(
            route=evidence_route, one_buffer=one_buffer, in_place=in_place
        )
        self.fraction = CHUNK_FRACTION_TIGHT if one_buffer else CHUNK_FRACTION
        self.kept: list[Tensor] | None = None if evidence_route == "cholesky" else []
        self.dual_budget = dual_budget(P, theta, one_buffer)
        self.posterior: FullPosterior | None = None

    def update(self, X: Tensor) -> Tensor:
        out, P = self.outputs(X), self.theta.numel()
        chunk = jacobian_chunk(out.shape[-1], P, self.fraction)
        for Jw in whitened_batches(self.f, self.theta, X, self.likelihood, chunk):
            self.H.addmm_(Jw.T, Jw)  # in place: one P×P buffer, no temporary
            if self.kept is not None:
                self.kept.append(Jw)
                M = sum(b.shape[0] for b in self.kept)
                if M >= P or M * P > self.dual_budget:  # too many for the eigen route
                    self.kept = None
        return out

    def finish(self) -> FullPosterior:
        Jw = torch.cat(self.kept) if self.kept else None
        self.kept = None if Jw is None else [Jw]  # one copy, shared with the posterior
        self.posterior = full_posterior(self.H, self.param_sizes, Jw, **self.options)
        return self.posterior

    @property
    def can_update(self) -> bool:
        """False once the memory-limit layer has overwritten H with L (one buffer)."""
        limit = self.posterior and self.posterior.limit
        return not (limit and limit.overwritten)

    def resumed(self) -> FullGGN:
        P = self.H.shape[0]
        memory_limit.check_fits(P, self.H.dtype, self.H.device, 1, "a copy of H")
        return resume(self, "H", "kept")


class FullPosterior:
    """Σ⁻¹ = c·H + diag(p₀) from the GGN H (P, P), by notebook 03's functions: the
    Cholesky factor L of Σ⁻¹, kept until p₀ or c change, gives log det Σ⁻¹, diag Σ,
    J Σ Jᵀ and samples. ``limit``: the memory-limit layer (``memory_limit.layer``), or
    None when memory is ample; ``Jw`` and ``route``: the eigen route's."""

    def __init__(self, H: Tensor, param_sizes, Jw, route, one_buffer, in_place):
        self._H, self.param_sizes, self.n_params = H, list(param_sizes), H.shape[0]
        self.Jw, self.route = Jw, route
        self.one_buffer, self.in_place = one_buffer, in_place
        self.limit = memory_limit.layer(H, one_buffer, in_place)  # None: ample memory
        self.cache = PerPrior()

    @property
    def H(self) -> Tensor:
        return self._H if self.limit is None else self.limit.H  # (raises if lost)

    def precision(self, prior: Tensor, c: Tensor) -> Tensor:
        """Σ⁻¹ = c·H + diag(p₀), a new (P, P) tensor (differentiable)."""
        p0 = prior_precision_diag(prior, self.param_sizes)
        return posterior_precision(self.H, p0, c)

    def L(self, prior: Tensor, c: Tensor) -> Tensor:
        """The Cholesky factor L (P, P) of Σ⁻¹ = L Lᵀ, without autograd."""
        p0 = prior_precision_diag(prior, self.param_sizes).to(self._H.dtype)
        if self.limit is not None:
            return self.cache(p0, c, lambda: self.limit.L(p0, c))
        return self.cache(p0, c, lambda: cholesky(posterior_precision(self.H, p0, c)))

    def log_det(self, prior: Tensor, c: Tensor) -> Tensor:
        L, p0 = self.L(prior, c), prior_precision_diag(prior, self.param_sizes)
        value = log_det_from_cholesky(L)
        return log_det_with_gradients(value, p0, c, lambda: inverse_diagonal(L))

    def functional_variance(self, J: Tensor, prior: Tensor, c: Tensor) -> Tensor:
        # J Σ Jᵀ = VᵀV with V = L⁻¹Jᵀ: N·K·P² for the solve instead of P³ for Σ
        L, (N, K, P) = self.L(prior, c), J.shape
        V = torch.linalg.solve_triangular(L, J.reshape(N * K, P).T, upper=False)
        V = V.T.reshape(N, K, P)
        return V @ V.mT

    def variance(self, prior: Tensor, c: Tensor) -> Tensor:
        return inverse_diagonal(self.L(prior, c))

    def covariance(self, prior: Tensor, c: Tensor) -> Tensor:
        """Σ, a new dense (P, P) tensor: for small P."""
        return covariance_from_cholesky(self.L(prior, c))

    def sample(self, n_samples: int, prior: Tensor, c: Tensor, generator=None):
        L = self.L(prior, c)
        return sample_from_cholesky(L.new_zeros(self.n_params), L, n_samples, generator)


class EigenRoute(FullPosterior):
    """The full posterior whose log det Σ⁻¹ for a scalar δ comes from one
    eigendecomposition of H (``eigen.EigenPosterior``; dual route when ``Jw`` was kept):
    O(P) per new (δ, c). The rest, and log det for other priors (refused with
    ``route="eigen"``), is the Cholesky path above."""

    @cached_property
    def eigen(self) -> EigenPosterior:
        """H = V diag(λ) Vᵀ, computed once."""
        if self.Jw is not None:
            return EigenPosterior.from_jacobians(self.Jw)
        return EigenPosterior.from_H(self.H)

    def log_det(self, prior: Tensor, c: Tensor) -> Tensor:
        if prior.numel() == 1:
            return self.eigen.log_det(prior, c)
        if self.route == "eigen":
            raise ValueError("evidence_route='eigen' needs a scalar prior_precision")
        return super().log_det(prior, c)


def full_posterior(
    H: Tensor, param_sizes, Jw=None, route="auto", one_buffer=False, in_place=False
) -> FullPosterior:
    """The full structure's posterior, by one rule, at fit and for a saved state: the
    eigen route with ``route="eigen"``, or with ``"auto"`` when the whitened Jacobians
    Jw were kept (N·K < P: an M×M eigendecomposition, cheaper than one Cholesky); the
    Cholesky path otherwise. The memory-limit layer is chosen inside."""
    eigen = route == "eigen" or (route == "auto" and Jw is not None)
    return (EigenRoute if eigen else FullPosterior)(
        H, param_sizes, Jw, route, one_buffer, in_place
    )
