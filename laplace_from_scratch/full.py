"""Full Laplace, the path of notebooks 02–04 on one screen (:class:`FullGGN`,
:class:`FullPosterior`):

    Laplace.fit → FullGGN.update: H += J̃ᵀJ̃, a few examples at a time (J̃ = Λ^½ J)
    → FullGGN.finish → FullPosterior, whose methods are notebook 03's functions:
    Σ⁻¹ = posterior_precision(H, p₀, c) → L = cholesky(Σ⁻¹) → log det Σ⁻¹ = 2 Σ log Lᵢᵢ
    → diag Σ, samples L⁻ᵀε, and J Σ Jᵀ = VᵀV with V = L⁻¹Jᵀ for the GLM predictive.

Two additions a reader may skip, both chosen when the posterior is made, by the rule of
:func:`full_posterior`: the memory-limit layer (``memory_limit.py``) and the eigen route
(:class:`EigenRoute`).

Shapes: N examples, K outputs, P parameters, M rows of J̃, S samples.
"""

from __future__ import annotations

from collections.abc import Sequence
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


class FullGGN(FunctionalBuilder):
    """Accumulates the GGN H = Σ J̃ᵀJ̃ (P, P) in place from the whitened Jacobians
    J̃ = Λ^½ J of a few examples at a time; keeps them for the eigen route (unless
    ``evidence_route="cholesky"``) while they are fewer than P rows and fit the
    budget above. The options are the posterior's (:func:`full_posterior`)."""

    def __init__(
        self,
        *args,  # f, θ*, the likelihood, the parameter sizes (FunctionalBuilder)
        evidence_route: str = "auto",
        one_buffer: bool = False,
        in_place: bool = False,
    ):
        super().__init__(*args)
        theta, P = self.theta, self.theta.numel()
        what = f"full Laplace over P = {P} parameters"
        memory_limit.check_fits(P, theta.dtype, theta.device, 1, what)
        self.H = torch.zeros(P, P, dtype=theta.dtype, device=theta.device)
        self.options = dict(
            route=evidence_route, one_buffer=one_buffer, in_place=in_place
        )
        self.kept: list[Tensor] | None = None if evidence_route == "cholesky" else []
        budget = DUAL_FRACTION_ONE_BUFFER if one_buffer else DUAL_FRACTION
        floor = 0 if one_buffer else DUAL_FLOOR_BYTES // theta.element_size()
        self.dual_budget = max(int(P * P * budget), floor)  # numbers
        self.posterior: FullPosterior | None = None

    def update(self, X: Tensor) -> Tensor:
        out, P = self.outputs(X), self.theta.numel()
        fraction = (
            CHUNK_FRACTION_TIGHT if self.options["one_buffer"] else CHUNK_FRACTION
        )
        chunk = jacobian_chunk(out.shape[-1], P, fraction)
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
    J Σ Jᵀ and samples. ``limit`` is the memory-limit layer (``memory_limit.layer``:
    when asked for, or when memory is short), or None; ``Jw`` and ``route`` are the
    eigen route's (:func:`full_posterior`)."""

    def __init__(
        self,
        H: Tensor,
        param_sizes: Sequence[int],
        Jw: Tensor | None = None,
        route: str = "cholesky",
        one_buffer: bool = False,
        in_place: bool = False,
    ):
        self._H, self.param_sizes, self.n_params = H, list(param_sizes), H.shape[0]
        self.Jw, self.route, self.one_buffer, self.in_place = (
            Jw,
            route,
            one_buffer,
            in_place,
        )
        self.limit = memory_limit.layer(
            H, one_buffer, in_place
        )  # None: memory is ample
        self.cache = PerPrior()

    @property
    def H(self) -> Tensor:
        return self._H if self.limit is None else self.limit.H  # (raises if lost)

    def precision(self, prior: Tensor, c: Tensor) -> Tensor:
        """Σ⁻¹ = c·H + diag(p₀), a new (P, P) tensor (differentiable)."""
        return posterior_precision(
            self.H, prior_precision_diag(prior, self.param_sizes), c
        )

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

    def variance(self, prior: Tensor, c: Tensor) -> Tensor:
        return inverse_diagonal(self.L(prior, c))

    def covariance(self, prior: Tensor, c: Tensor) -> Tensor:
        """Σ, a new dense (P, P) tensor: for small P."""
        return covariance_from_cholesky(self.L(prior, c))

    def functional_variance(self, J: Tensor, prior: Tensor, c: Tensor) -> Tensor:
        # J Σ Jᵀ = VᵀV with V = L⁻¹Jᵀ: N·K·P² for the solve instead of P³ for Σ
        N, K, P = J.shape
        V = torch.linalg.solve_triangular(
            self.L(prior, c), J.reshape(N * K, P).T, upper=False
        )
        V = V.T.reshape(N, K, P)
        return V @ V.mT

    def sample(
        self, n_samples: int, prior: Tensor, c: Tensor, generator=None
    ) -> Tensor:
        L = self.L(prior, c)
        return sample_from_cholesky(L.new_zeros(self.n_params), L, n_samples, generator)


class EigenRoute(FullPosterior):
    """The full posterior whose log det Σ⁻¹ for a scalar prior δ comes from one
    eigendecomposition of H (``eigen.EigenPosterior``; the dual route when the whitened
    Jacobians ``Jw`` (M, P) were kept): O(P) per new (δ, c) after it. Everything else,
    and log det for a prior per tensor or parameter (refused with ``route="eigen"``),
    is the Cholesky path above."""

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
    H: Tensor,
    param_sizes: Sequence[int],
    Jw: Tensor | None = None,
    route: str = "auto",
    one_buffer: bool = False,
    in_place: bool = False,
) -> FullPosterior:
    """The full structure's posterior, by one rule, at fit and for a saved state: the
    eigen route with ``route="eigen"``, or with ``"auto"`` when the whitened Jacobians
    Jw were kept (N·K < P: its eigendecomposition is then M×M, cheaper than one
    Cholesky of Σ⁻¹); the Cholesky path otherwise, as laplace-torch. The memory-limit
    layer is chosen inside (``memory_limit.layer``)."""
    eigen = route == "eigen" or (route == "auto" and Jw is not None)
    return (EigenRoute if eigen else FullPosterior)(
        H, param_sizes, Jw, route, one_buffer, in_place
    )
