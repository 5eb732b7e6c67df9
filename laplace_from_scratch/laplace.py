"""A thin ``Laplace`` object composing the module, shaped like laplace-torch's API.

    la = Laplace(model, "regression", subset_of_weights="all", hessian_structure="full",
                 sigma_noise=0.3, prior_precision=1.0, prior_mean=0.0, temperature=1.0)
    la.fit(train_loader)
    la.log_marginal_likelihood()          # scalar, differentiable in prior_precision / sigma_noise
    f_mu, f_var = la(x, pred_type="glm")  # regression: (N, K), (N, K, K)
    probs = la(x, link_approx="probit")   # classification: (N, C) class probabilities

Likelihoods: ``"regression"`` (Gaussian σ), ``"classification"`` (softmax over K ≥ 2 logits) and
``"binary_classification"`` (one logit, sigmoid; laplace-torch 0.3 has no such option, it is the
two-class softmax with one logit pinned at 0). Classification predictives return (N, C) with C = 2
for the binary case.
    la.sample(100)                        # (100, P)

Argument names, conventions and return shapes follow laplace-torch 0.3, so either can be
swapped for the other; unlike laplace-torch (whose defaults are ``last_layer`` and ``kron``),
the defaults here are ``"all"`` and ``"full"``. Implemented: ``subset_of_weights`` in
{``"all"``, ``"last_layer"``} × ``hessian_structure`` in {``"full"``, ``"diag"``, ``"kron"``}. With
``"diag"`` H, the posterior precision and ``posterior_variance`` are (P,) vectors, as in laplace-torch;
with ``"kron"`` H is a :class:`KronPosterior` (KFAC blocks, eigendecomposed) and the prior precision
is a scalar or one value per parameter tensor.

Shapes: N inputs, K outputs, P parameters, S samples.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from .curvature import ggn_diagonal, whitened_jacobians
from .devices import as_like, check_device, randn
from .diag import DiagGGN
from .functional import last_layer_functional, make_functional
from .jacobians import jacobian
from .kron import KFAC, KronPosterior
from .layers import supported_layers
from .likelihoods import get_likelihood
from .marglik import laplace_evidence, maximize_on_logs
from .posterior import (
    EigenPosterior,
    cholesky,
    covariance_from_cholesky,
    log_det_from_cholesky,
    posterior_precision,
    prior_precision_diag,
    sample_from_cholesky,
)
from .predictive import (
    laplace_bridge,
    linearized_samples,
    mc_sigmoid,
    mc_softmax,
    nn_samples,
    probit,
    probit_binary,
    two_class,
)

# keep the whitened Jacobians (N·K, P) for the dual evidence route when N·K < P and they are this small
MAX_DUAL_ENTRIES = 50_000_000

LIKELIHOODS = ("regression", "classification", "binary_classification")
SUBSETS = ("all", "last_layer", "subnetwork")
STRUCTURES = ("full", "diag", "kron", "lowrank", "gp")


class Laplace:
    """Laplace approximation N(θ*, P⁻¹) with P = H/(σ²T) + diag(p₀) over all weights of ``model``."""

    def __init__(
        self,
        model: nn.Module,
        likelihood: str,
        subset_of_weights: str = "all",
        hessian_structure: str = "full",
        sigma_noise: float | Tensor = 1.0,
        prior_precision: float | Tensor = 1.0,
        prior_mean: float | Tensor = 0.0,
        temperature: float = 1.0,
    ):
        _check_choice("likelihood", likelihood, LIKELIHOODS)
        _check_choice("subset_of_weights", subset_of_weights, SUBSETS)
        _check_choice("hessian_structure", hessian_structure, STRUCTURES)
        if subset_of_weights not in ("all", "last_layer"):
            raise NotImplementedError(f"subset_of_weights={subset_of_weights!r} is not implemented yet")
        if hessian_structure not in ("full", "diag", "kron"):
            raise NotImplementedError(f"hessian_structure={hessian_structure!r} is not implemented yet")
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.model = model
        self.likelihood = likelihood
        self.subset_of_weights = subset_of_weights
        self.hessian_structure = hessian_structure
        self.temperature = float(temperature)
        self._f, self.mean, self.param_sizes = self._make_functional()
        self.n_params = sum(self.param_sizes)
        self.n_layers = len(self.param_sizes)
        self.sigma_noise = sigma_noise
        self.prior_precision = prior_precision
        self.prior_mean = prior_mean
        self.H: Tensor | None = None
        self.loss: Tensor | None = None
        self.evidence_route = "auto"  # "auto" | "eigen" | "cholesky"
        self._Jw: Tensor | None = None
        self._eigen: EigenPosterior | None = None
        self._tuning = False  # inside optimize_hyperparameters (the auto evidence route prefers eigen)
        self._chol: tuple[Tensor, Tensor] | None = None  # (key, Cholesky factor of P) for predictions
        self.n_data = 0
        self.n_outputs = 0

    # ----- hyperparameters -------------------------------------------------------------------
    @property
    def sigma_noise(self) -> Tensor:
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, value: float | Tensor) -> None:
        sigma = as_like(value, self.mean, "sigma_noise")
        if sigma.numel() != 1 or not sigma.item() > 0:
            raise ValueError(f"sigma_noise must be one positive number, got {value}")
        if self.likelihood != "regression" and sigma.item() != 1:
            raise ValueError("sigma_noise must be 1 for classification")
        self._sigma_noise = sigma.reshape(())

    @property
    def prior_precision(self) -> Tensor:
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, value: float | Tensor) -> None:
        p0 = as_like(value, self.mean, "prior_precision")
        prior_precision_diag(p0, self.param_sizes)  # validates shape and sign
        self._prior_precision = p0

    @property
    def prior_precision_diag(self) -> Tensor:
        """p₀ expanded to one value per parameter, (P,)."""
        return prior_precision_diag(self.prior_precision, self.param_sizes)

    @property
    def prior_mean(self) -> Tensor:
        return self._prior_mean

    @prior_mean.setter
    def prior_mean(self, value: float | Tensor) -> None:
        mu0 = as_like(value, self.mean, "prior_mean")
        if mu0.numel() not in (1, self.n_params):
            raise ValueError(
                f"prior_mean must be a scalar or have {self.n_params} entries, got {tuple(mu0.shape)}"
            )
        self._prior_mean = mu0

    def _make_functional(self) -> tuple:
        """f(θ, x), θ* and the parameter tensor sizes of the weights Laplace is over."""
        if self.subset_of_weights == "last_layer":
            return last_layer_functional(self.model)
        f, theta = make_functional(self.model)
        return f, theta, [p.numel() for p in self.model.parameters() if p.requires_grad]

    @property
    def _diag(self) -> bool:
        return self.hessian_structure == "diag"

    @property
    def _kron(self) -> bool:
        return self.hessian_structure == "kron"

    @property
    def _block_deltas(self) -> Tensor:
        """The prior precision as one value per parameter tensor (KFAC block), (n_layers,)."""
        p0 = self.prior_precision
        if p0.numel() == 1:
            return p0.reshape(()).expand(self.n_layers)
        if p0.numel() != self.n_layers:
            raise ValueError(
                "hessian_structure='kron' needs a scalar or one prior precision per parameter tensor"
            )
        return p0.reshape(-1)

    # ----- fitting -------------------------------------------------------------------------
    def fit(self, train_loader: DataLoader) -> None:
        """Accumulate H (the GGN of the summed loss, Λ = I for regression) and the loss over the data.

        Full: H is built as J̃ᵀJ̃ from the Λ^½-whitened Jacobians J̃ of each batch; when N·K < P they are
        kept for the dual route of the evidence (see :class:`EigenPosterior`). KFAC, and the diagonal of
        a network whose weights all sit in Linear/Conv2d layers, come layer by layer from one forward
        and K backward passes per batch (``kron.py``, ``diag.py``); the diagonal of any other network
        from per-example Jacobians (``curvature.ggn_diagonal``: the same numbers, much slower).
        """
        self._f, self.mean, _ = self._make_functional()
        lik = get_likelihood(self.likelihood, 1.0)
        last = self.subset_of_weights == "last_layer"
        target = self.model[-1] if last else self.model  # the layers Laplace is over
        # KFAC, and the diagonal of Linear/Conv2d networks, come layer by layer from one forward and
        # K backward passes per batch (layers.py); anything else from per-example Jacobians
        builder = None
        if self._kron:
            builder = KFAC(target, lik)
        elif self._diag and supported_layers(target) is not None:
            builder = DiagGGN(target, lik)
        H = None
        if builder is None:
            shape = (self.n_params,) if self._diag else (self.n_params, self.n_params)
            H = torch.zeros(shape, dtype=self.mean.dtype, device=self.mean.device)
        loss = self.mean.new_zeros(())
        blocks: list[Tensor] | None = []  # whitened Jacobians for the dual route, while they may be kept
        n_data = 0
        for X, y in train_loader:
            check_device(X, self.mean, "the inputs X")
            check_device(y, self.mean, "the targets y")
            if builder is not None:  # the builder's own forward pass gives the outputs
                if last:
                    with torch.no_grad():
                        X = self.model[:-1](X)
                out = builder.update(X)
            else:
                with torch.no_grad():
                    out = self._f(self.mean, X)
            if self.likelihood == "regression":
                if y.shape != out.shape:
                    raise ValueError(
                        f"regression targets y {tuple(y.shape)} must match model outputs {tuple(out.shape)}"
                    )
                loss += 0.5 * ((y - out) ** 2).sum()  # ½·SSE, the Gaussian NLL at σ = 1 without its constant
            else:
                loss += lik.nll(out, y)  # Σ cross-entropy (also validates labels and output width)
            n_data += X.shape[0]
            if builder is not None:
                continue
            if self._diag:
                H += ggn_diagonal(self._f, self.mean, X, lik)
                continue
            Jw = whitened_jacobians(self._f, self.mean, X, lik)
            H.addmm_(Jw.T, Jw)  # in place: one P×P buffer, no temporary
            if blocks is not None:
                blocks.append(Jw)
                M = sum(b.shape[0] for b in blocks)
                if M >= self.n_params or M * self.n_params > MAX_DUAL_ENTRIES:
                    blocks = None  # too many for the dual route: stop keeping them
        if n_data == 0:
            raise ValueError("train_loader yielded no data")
        self._Jw = torch.cat(blocks) if blocks else None
        self._eigen = self._chol = None
        if self._kron:
            H = KronPosterior(builder.blocks())
        elif builder is not None:
            H = builder.diagonal()
        self.H, self.loss, self.n_data, self.n_outputs = H, loss, n_data, out.shape[-1]

    def _require_fit(self) -> Tensor:
        if self.H is None:
            raise RuntimeError("call Laplace.fit(train_loader) before using the posterior")
        return self.H

    # ----- the posterior -------------------------------------------------------------------
    @property
    def _H_factor(self) -> Tensor:
        return 1 / (self.sigma_noise**2 * self.temperature)

    @property
    def posterior_precision(self) -> Tensor:
        """P = H/(σ²T) + diag(p₀): (P, P), or its diagonal (P,) for ``"diag"``."""
        H = self._require_fit()
        if self._diag:
            return self._H_factor * H + self.prior_precision_diag
        if self._kron:  # dense block-diagonal: for checks on small P
            return self._H_factor * H.to_matrix() + torch.diag(self.prior_precision_diag)
        return posterior_precision(H, self.sigma_noise, self.prior_precision_diag, self.temperature)

    @property
    def posterior_variance(self) -> Tensor:
        """The marginal variances diag(Σ), (P,)."""
        if self._diag:
            return 1 / self.posterior_precision
        if self._kron:
            return self.H.covariance_diag(self._block_deltas, self._H_factor)
        return self.posterior_covariance.diagonal()

    @property
    def posterior_covariance(self) -> Tensor:
        """Σ = P⁻¹ (P, P), from the Cholesky factor of P (for ``"diag"``: the diagonal matrix)."""
        if self._diag:
            return torch.diag(self.posterior_variance)
        if self._kron:  # dense: for checks on small P
            return torch.linalg.inv(self.posterior_precision)
        return covariance_from_cholesky(self._prediction_cholesky())

    def _prediction_cholesky(self) -> Tensor:
        """The Cholesky factor L of P (full), without autograd, cached until δ, σ, T or H change:
        predicting batch after batch costs one factorisation, not one per batch."""
        with torch.no_grad():
            factor = torch.as_tensor(self._H_factor, dtype=self.mean.dtype, device=self.mean.device)
            key = torch.cat([self.prior_precision_diag.flatten(), factor.reshape(1)])
            if self._chol is None or self._chol[0].shape != key.shape or not torch.equal(self._chol[0], key):
                self._chol = (key.clone(), cholesky(self.posterior_precision))
        return self._chol[1]

    def sample(self, n_samples: int = 100, generator: torch.Generator | None = None) -> Tensor:
        """θ ~ N(θ*, P⁻¹), (S, P)."""
        if self._diag:
            eps = randn((n_samples, self.n_params), self.mean, generator)
            return self.mean + eps * self.posterior_variance.sqrt()
        if self._kron:
            return self.mean + self.H.sample(n_samples, self._block_deltas, self._H_factor, generator)
        return sample_from_cholesky(self.mean, self._prediction_cholesky(), n_samples, generator)

    def functional_variance(self, J: Tensor) -> Tensor:
        """f_var = J Σ Jᵀ per input. J: (N, K, P) → (N, K, K)."""
        if self._diag:
            return torch.einsum("nkp,p,nlp->nkl", J, self.posterior_variance, J)
        if self._kron:
            return self.H.functional_variance(J, self._block_deltas, self._H_factor)
        # J Σ Jᵀ = VᵀV with V = L⁻¹Jᵀ: N·K·P² for the solve instead of P³ for Σ
        N, K, P = J.shape
        V = torch.linalg.solve_triangular(self._prediction_cholesky(), J.reshape(N * K, P).T, upper=False)
        V = V.T.reshape(N, K, P)
        return V @ V.mT

    # ----- the evidence --------------------------------------------------------------------
    @property
    def log_likelihood(self) -> Tensor:
        """log p(D | θ*) at the current σ and T: −½SSE/(σ²T) − N·K·log(σ√2π), or −ΣCE/T."""
        self._require_fit()
        ll = -self._H_factor * self.loss
        if self.likelihood == "regression":
            ll = ll - self.n_data * self.n_outputs * torch.log(self.sigma_noise * math.sqrt(2 * math.pi))
        return ll

    @property
    def scatter(self) -> Tensor:
        """(θ* − μ₀)ᵀ diag(p₀) (θ* − μ₀)."""
        d = self.mean - self.prior_mean
        return (d * self.prior_precision_diag) @ d

    @property
    def log_det_prior_precision(self) -> Tensor:
        return self.prior_precision_diag.log().sum()

    @property
    def eigen(self) -> EigenPosterior:
        """The eigendecomposition of H (dual route from the Gram matrix when N·K < P), computed once."""
        self._require_fit()
        if self._eigen is None:
            self._eigen = (
                EigenPosterior.from_jacobians(self._Jw)
                if self._Jw is not None
                else EigenPosterior.from_H(self.H)
            )
        return self._eigen

    def _use_eigen(self) -> bool:
        _check_choice("evidence_route", self.evidence_route, ("auto", "eigen", "cholesky"))
        if self._diag or self._kron:
            if self.evidence_route == "eigen":
                raise ValueError("evidence_route='eigen' is for hessian_structure='full'")
            return False
        scalar = self.prior_precision.numel() == 1
        if self.evidence_route == "eigen" and not scalar:
            raise ValueError("evidence_route='eigen' needs a scalar prior_precision")
        if self.evidence_route != "auto":
            return self.evidence_route == "eigen"
        # auto: the eigen route costs one eigendecomposition (≈ 10× a Cholesky of P) and then O(P) per δ;
        # take it for a scalar prior when it is cheap (the N×N dual, N·K < P), already paid for, or about
        # to be re-used by a δ search. A single evaluation at large P takes one Cholesky instead.
        return scalar and (self._Jw is not None or self._eigen is not None or self._tuning)

    @property
    def log_det_posterior_precision(self) -> Tensor:
        """log det P: Σ log for diag; O(r) from the cached eigenvalues for a scalar prior; else Cholesky."""
        if self._diag:
            return self.posterior_precision.log().sum()
        if self._kron:
            return self.H.log_det(self._block_deltas, self._H_factor)
        if self._use_eigen():
            return self.eigen.log_det(self.prior_precision, self.sigma_noise, self.temperature)
        return log_det_from_cholesky(cholesky(self.posterior_precision))

    @property
    def log_det_ratio(self) -> Tensor:
        return self.log_det_posterior_precision - self.log_det_prior_precision

    def log_marginal_likelihood(
        self, prior_precision: float | Tensor | None = None, sigma_noise: float | Tensor | None = None
    ) -> Tensor:
        """log p(D) ≈ log p(D | θ*) − ½ (log det P − log det P₀ + (θ*−μ₀)ᵀ P₀ (θ*−μ₀)).

        Passing ``prior_precision`` or ``sigma_noise`` sets them first (as laplace-torch does);
        the result is differentiable in both.
        """
        if prior_precision is not None:
            self.prior_precision = prior_precision
        if sigma_noise is not None:
            self.sigma_noise = sigma_noise
        return laplace_evidence(
            self.log_likelihood, self.log_det_posterior_precision, self.log_det_prior_precision, self.scatter
        )

    # ----- hyperparameters by the evidence or by validation ------------------------------------
    def optimize_prior_precision(
        self,
        method: str = "marglik",
        n_steps: int = 100,
        lr: float = 0.1,
        init_prior_prec: float | Tensor = 1.0,
        prior_structure: str = "scalar",
        val_loader: DataLoader | None = None,
        pred_type: str = "glm",
        link_approx: str = "probit",
        n_samples: int = 100,
        log_prior_prec_min: float = -4,
        log_prior_prec_max: float = 4,
        grid_size: int = 100,
    ) -> None:
        """Set the prior precision by the evidence (``"marglik"``) or on validation data (``"gridsearch"``).

        Defaults are laplace-torch's: Adam on log δ, lr 0.1, 100 steps from δ = 1, scalar.
        ``prior_structure="layerwise"`` tunes one δ per parameter tensor (Cholesky route).
        Grid search picks, among ``grid_size`` values 10^[min, max], the δ with the lowest negative
        log predictive density on ``val_loader`` (laplace-torch's default for regression is the MSE of the
        mean, which does not depend on δ for the GLM predictive).
        """
        _check_choice("method", method, ("marglik", "gridsearch"))
        _check_choice("prior_structure", prior_structure, ("scalar", "layerwise"))
        self._require_fit()
        if method == "marglik":
            if val_loader is not None:
                raise ValueError("val_loader is only used by method='gridsearch'")
            self.prior_precision = init_prior_prec
            self.optimize_hyperparameters(n_steps, lr, tune_sigma=False, prior_structure=prior_structure)
            return
        if val_loader is None:
            raise ValueError("method='gridsearch' needs a val_loader")
        grid = torch.logspace(
            log_prior_prec_min, log_prior_prec_max, grid_size, dtype=self.mean.dtype, device=self.mean.device
        )
        scores = []
        for delta in grid:
            self.prior_precision = delta
            scores.append(self._validation_nll(val_loader, pred_type, link_approx, n_samples))
        self.prior_precision = grid[min(range(len(scores)), key=scores.__getitem__)]

    def optimize_hyperparameters(
        self, n_steps: int = 300, lr: float = 0.1, tune_sigma: bool = True, prior_structure: str = "scalar"
    ) -> list[float]:
        """Maximise the evidence jointly over δ and (regression) σ by Adam on their logs.

        Starts from the current values; returns the evidence before each step.
        """
        _check_choice("prior_structure", prior_structure, ("scalar", "layerwise"))
        self._require_fit()
        init = {"prior_precision": self.prior_precision.clone()}
        if prior_structure == "layerwise" and init["prior_precision"].numel() == 1:
            init["prior_precision"] = init["prior_precision"].reshape(()).expand(self.n_layers).clone()
        if tune_sigma:
            if self.likelihood != "regression":
                raise ValueError("sigma_noise can only be tuned for regression")
            init["sigma_noise"] = self.sigma_noise.clone()
        self._tuning = True
        try:
            best, history = maximize_on_logs(
                lambda **kw: self.log_marginal_likelihood(**kw), init, n_steps, lr
            )
        finally:
            self._tuning = False
        for name, value in best.items():
            setattr(self, name, value)
        return history

    def _validation_nll(self, loader: DataLoader, pred_type: str, link_approx: str, n_samples: int) -> float:
        """Mean negative log predictive density on ``loader`` (regression: Gaussian with f_var + σ²)."""
        total, count = 0.0, 0
        with torch.no_grad():
            for X, y in loader:
                check_device(X, self.mean, "the validation inputs X")
                check_device(y, self.mean, "the validation targets y")
                if self.likelihood == "regression":
                    mu, var = self(X, pred_type=pred_type, n_samples=n_samples)
                    var = var.diagonal(dim1=-2, dim2=-1) if var.ndim == 3 else var
                    dist = torch.distributions.Normal(mu, (var + self.sigma_noise**2).sqrt())
                    total -= dist.log_prob(y).sum().item()
                else:
                    p = self(X, pred_type=pred_type, link_approx=link_approx, n_samples=n_samples)
                    total -= (
                        p.gather(1, y.unsqueeze(1)).clamp(min=torch.finfo(p.dtype).tiny).log().sum().item()
                    )
                count += X.shape[0]
        return total / count

    # ----- predictions ---------------------------------------------------------------------
    def __call__(
        self,
        x: Tensor,
        pred_type: str = "glm",
        link_approx: str = "probit",
        n_samples: int = 100,
        generator: torch.Generator | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The predictive at inputs x (N, ...).

        Regression: ``pred_type="glm"`` → (f_mu (N, K), f_var (N, K, K)), f_var = J Σ Jᵀ without σ²;
        ``pred_type="nn"`` → mean and variance (N, K) of the network at posterior samples.
        Classification: class probabilities (N, C), by ``link_approx="probit"``, ``"mc"`` or
        ``"bridge"`` (softmax only) for the GLM, or by averaging softmax (sigmoid) over posterior
        samples of the network (``pred_type="nn"``). C = K, or 2 for ``"binary_classification"``.
        """
        _check_choice("pred_type", pred_type, ("glm", "nn"))
        _check_choice("link_approx", link_approx, ("probit", "mc", "bridge"))
        binary = self.likelihood == "binary_classification"
        if binary and link_approx == "bridge":
            raise ValueError("link_approx='bridge' needs K ≥ 2 logits; use 'probit' or 'mc' for one logit")
        if pred_type == "nn" and link_approx != "mc":
            link_approx = "mc"
        if not isinstance(x, Tensor) or x.ndim < 2:
            raise ValueError(
                "x must be a tensor of shape (N, ...) with a batch dimension, "
                f"got {getattr(x, 'shape', type(x))}"
            )
        check_device(x, self.mean, "x")
        if pred_type == "nn":
            samples = nn_samples(self._f, x, self.sample(n_samples, generator))
            if self.likelihood == "regression":
                return samples.mean(0), samples.var(0)
            if binary:
                return two_class(torch.sigmoid(samples[..., 0]).mean(0))
            return torch.softmax(samples, -1).mean(0)
        with torch.no_grad():
            f_mu = self._f(self.mean, x)
        f_var = self.functional_variance(jacobian(self._f, self.mean, x))
        if self.likelihood == "regression":
            return f_mu, f_var
        if link_approx == "probit":
            return probit_binary(f_mu, f_var) if binary else probit(f_mu, f_var)
        if link_approx == "bridge":
            return laplace_bridge(f_mu, f_var)
        return (mc_sigmoid if binary else mc_softmax)(f_mu, f_var, n_samples, generator)

    def glm_samples(
        self, x: Tensor, n_samples: int = 100, generator: torch.Generator | None = None
    ) -> Tensor:
        """Outputs of the linearised network at posterior samples, (S, N, K)."""
        return linearized_samples(self._f, self.mean, x, self.sample(n_samples, generator))


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
