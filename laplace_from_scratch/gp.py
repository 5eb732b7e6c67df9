"""Function-space (GP) Laplace, laplace-torch's ``FunctionalLaplace``
(``hessian_structure="gp"``; Immer et al., 2021, "Improving predictions of Bayesian
neural nets via local linearization"). The linearised network with prior N(μ₀, I/δ) is a
Gaussian process over the outputs with kernel k(x, x') = J(x) J(x')ᵀ/δ, and its GLM
predictive is the GP's posterior after M training inputs (subset of data):

    f_var(x*) = k** − k*M (K_MM + (c·Λ_M)⁻¹)⁻¹ k_M*,    K_MM = J_M J_Mᵀ/δ'

with Λ_M the output Hessians of the M inputs, c = 1/(σ²T) and, as in laplace-torch,
δ' = δ·N/M (its kernel's prior variance is M/(N·δ); δ' = δ when all N inputs are used).
By the Woodbury identity that is J* Σ J*ᵀ for the weight-space posterior

    Σ⁻¹ = c·J_Mᵀ Λ_M J_M + δ'·I,

so this file builds Σ by notebook 05's dual route (``eigen.py``): one ``eigh`` of the
(M·K)×(M·K) Gram matrix of the whitened rows Λ_M^½ J_M. With all N inputs
(``n_subset=None`` or N) that is the full GGN posterior, exactly, in regression; in
classification Λ_M keeps only its diagonal, p(1 − p), as laplace-torch does (the GGN's
Λ = diag(p) − ppᵀ is singular), and ``independent_outputs=True`` keeps one kernel per
output, J(x)ₖ J(x')ₖᵀ (one posterior per output, no single Σ over the weights).

The function-space side is the cheaper one when M·K ≪ P: nothing P×P is formed, the
kernel is (M·K)×(M·K) and the M·K Jacobian rows (M·K·P numbers) are kept.

The evidence's log-determinant is that of the kernel, log det(I + c·Λ_M^½ K_MM Λ_M^½) =
Σᵢ log(1 + c·λᵢ/δ') (laplace-torch's classification ``log_det_ratio``; its regression
one is log det(K_MM + σ²I), which adds M·K·log σ²), so the evidence is the weight-space
Laplace evidence log p(D | θ*) − ½ log det(Σ⁻¹Σ₀) − ½ (θ*−μ₀)ᵀΣ₀⁻¹(θ*−μ₀): exact with
all N inputs in regression. (laplace-torch's own GP evidence adds a GP scatter term to
log p(D | θ*) and differs from its full Laplace's with all N inputs.)

Shapes: N training inputs, M of them kept, K outputs, P parameters, R = rows of J.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import memory_limit
from .curvature import FunctionalBuilder, resume
from .eigen import EigenPosterior
from .jacobians import jacobian


class GPBuilder(FunctionalBuilder):
    """Keeps the training inputs; at :meth:`finish` picks M of them (``n_subset``, by a
    ``seed``-ed permutation; None: all), forms their Jacobians and the GP posterior."""

    def __init__(self, *args, n_subset=None, independent_outputs=False, seed=0):
        super().__init__(*args)  # f, θ*, the likelihood, the parameter sizes
        self.n_subset, self.independent, self.seed = n_subset, independent_outputs, seed
        self.inputs: list[Tensor] = []

    def update(self, X: Tensor) -> Tensor:
        self.inputs.append(X.detach())
        return self.outputs(X)

    def subset(self, N: int) -> Tensor:
        """The M kept positions in the order the inputs came, (M,)."""
        M = N if self.n_subset is None else self.n_subset
        if M > N:
            raise ValueError(f"n_subset = {M} is more than the {N} training inputs")
        g = torch.Generator().manual_seed(self.seed)  # the same subset on any device
        return torch.randperm(N, generator=g)[:M].sort().values

    def finish(self) -> GPPosterior:
        X = torch.cat(self.inputs)
        N, theta = X.shape[0], self.theta
        X_M = X[self.subset(N).to(X.device)]
        out = self.outputs(X_M)
        (M, K), P = out.shape, theta.numel()
        memory_limit.check_bytes(
            M * K * P * theta.element_size(),
            theta.device,
            f"the GP structure's Jacobians of {M} inputs ({M}·{K}×{P})",
            "Use a smaller n_subset, or a weight-space structure.",
        )
        # Λ_M^½ J_M, with Λ_M's diagonal (laplace-torch's choice for classification)
        lam = self.likelihood.output_hessian(out).diagonal(dim1=-2, dim2=-1)
        Jw = lam.sqrt().unsqueeze(-1) * jacobian(self.f, theta, X_M)  # (M, K, P)
        if self.independent:
            parts = [EigenPosterior.from_jacobians(Jw[:, k]) for k in range(K)]
        else:
            parts = [EigenPosterior.from_jacobians(Jw.reshape(M * K, P))]
        return GPPosterior(parts, N / M, P)

    def resumed(self) -> GPBuilder:
        return resume(self, "inputs")


class GPPosterior:
    """The GP posterior of :class:`GPBuilder`: one ``EigenPosterior`` of J_Mᵀ Λ_M J_M
    (``parts``: one, or one per output with independent outputs) at the prior δ' = δ·
    ``scale`` (N/M). Methods as ``posterior.Posterior``'s, for a scalar δ."""

    def __init__(self, parts: list[EigenPosterior], scale: float, n_params: int):
        self.parts, self.scale, self.n_params = parts, scale, n_params

    # what a state_dict holds (``structures.py``), and the posterior made from it
    @property
    def eigvecs(self) -> list[Tensor]:
        return [part.eigvecs for part in self.parts]

    @property
    def eigvals(self) -> list[Tensor]:
        return [part.eigvals for part in self.parts]

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype  # (every part's)

    @classmethod
    def from_state(cls, eigvecs, eigvals, scale, n_params, dtype) -> GPPosterior:
        parts = [
            EigenPosterior(lam, V, n_params, dtype)
            for V, lam in zip(eigvecs, eigvals, strict=True)
        ]
        return cls(parts, scale, n_params)

    @property
    def H(self) -> list[tuple[Tensor, Tensor]]:
        """The subset's GGN in eigen form, (V, λ) per part."""
        return [part.H for part in self.parts]

    def _joint(self, what: str) -> EigenPosterior:
        if len(self.parts) > 1:
            raise ValueError(
                f"{what} needs one posterior over the weights; with "
                "independent_outputs=True each output has its own: use the predictive"
            )
        return self.parts[0]

    def log_det(self, prior, c=1.0) -> Tensor:
        """log det(I + c·Λ^½ K_MM Λ^½) + P·log δ: log det Σ⁻¹ with all N inputs, its
        subset-of-data estimate below."""
        total = 0
        for part in self.parts:
            delta, d = part.precision_eigvals(prior * self.scale, c)
            total = total + (d / delta).log().sum()
        delta = torch.as_tensor(prior, dtype=d.dtype, device=d.device).reshape(())
        return (total + self.n_params * delta.log()).to(self.dtype)

    def functional_variance(self, J: Tensor, prior, c=1.0) -> Tensor:
        """J Σ Jᵀ. J: (B, R, P), R a multiple of K (rows ordered input by input, as
        ``glm_predictive``'s (N, K) and joint (1, N·K)) → (B, R, R); with independent
        outputs, zero between rows of different outputs."""
        delta = prior * self.scale
        if len(self.parts) == 1:
            return self.parts[0].functional_variance(J, delta, c)
        K, R = len(self.parts), J.shape[1]
        out = J.new_zeros(J.shape[0], R, R, dtype=self.dtype)
        for k, part in enumerate(self.parts):
            rows = torch.arange(k, R, K, device=J.device)
            out[:, rows[:, None], rows] = part.functional_variance(J[:, rows], delta, c)
        return out

    def variance(self, prior, c=1.0) -> Tensor:
        return self._joint("diag Σ").variance(prior * self.scale, c)

    def precision(self, prior, c=1.0) -> Tensor:
        return self._joint("Σ⁻¹").precision(prior * self.scale, c)

    def covariance(self, prior, c=1.0) -> Tensor:
        return self._joint("Σ").covariance(prior * self.scale, c)

    def sample(self, n_samples: int, prior, c=1.0, generator=None) -> Tensor:
        return self._joint("sampling the weights").sample(
            n_samples, prior * self.scale, c, generator
        )
