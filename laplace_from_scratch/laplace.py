"""A thin ``Laplace`` object composing the module, shaped like laplace-torch's API.

    la = Laplace(model, "regression", sigma_noise=0.3, prior_precision=1.0)
    la.fit(train_loader)
    la.log_marginal_likelihood()          # scalar, differentiable in δ and σ
    f_mu, f_var = la(x, pred_type="glm")  # regression: (N, K), (N, K, K)
    probs = la(x, link_approx="probit")   # classification: (N, C) class probabilities

Likelihoods: ``"regression"``, ``"classification"`` (K ≥ 2 logits; integer, one-hot
or probability targets), ``"binary_classification"`` (one logit). Weights: ``"all"``,
``"last_layer"`` (the last ``nn.Linear``, or ``last_layer_name``) or ``"subnetwork"``
(``subnetwork_indices``, full GGN). Structures: ``structures.STRUCTURES``, their options
keyword arguments. **Our defaults**, ``"all"`` and ``"full"``, differ from
laplace-torch's (``"last_layer"``, ``"kron"``). Everything structure-specific lives in
``la.structure`` (``posterior.Posterior``); this class holds the hyperparameters, runs
the fit loop and composes the rest from the posterior's six methods.
laplace-torch's ``backend=`` is accepted when it names a GGN backend (``checks.py``).
``enable_backprop=True`` (laplace-torch's flag) makes the predictions differentiable in
their inputs x (never in the weights); by default they keep no graph.

Shapes: N inputs, K outputs, P parameters, S samples.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from contextlib import nullcontext

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from .checks import (
    check_backend,
    check_batch,
    check_choice,
    check_count,
    check_eval_mode,
    check_inputs,
    check_outputs,
    check_positive,
    deferred,
    require,
)
from .curvature import CHUNK_CAP, CHUNK_FRACTION_TIGHT, jacobian_chunk
from .devices import as_like
from .dict_inputs import DictInputs, DictModel
from .functional import flatten_params
from .jacobians import jacobian
from .layer_predictive import glm_variance
from .layers import supported_layers
from .likelihoods import LINKS, NAMES, get_likelihood
from .marglik import laplace_evidence, maximize_on_logs
from .posterior import prior_kind, prior_precision_diag
from .predictive import gaussian_samples, linearized_samples, nn_samples
from .saving import posterior_from_state, posterior_state
from .structures import STRUCTURES, check_combination, check_options
from .weights import select_weights

SUBSETS = ("all", "last_layer", "subnetwork")
# "gp" is laplace-torch's name for the GLM predictive of its GP structure: the
# linearised network's predictive is a Gaussian process whatever the structure, so here
# it is "glm"
PRED_TYPES = ("glm", "nn", "gp")
# what a state_dict holds beside θ* ("mean") and the posterior's fields ("H")
STATE = """loss n_data n_outputs input_shape prior_mean prior_precision sigma_noise
    temperature likelihood subset_of_weights hessian_structure param_sizes""".split()


def check_nn_link(pred_type: str, link_approx: str) -> None:
    """laplace-torch's rule: ``pred_type="nn"`` averages over sampled networks, a
    Monte Carlo link, so any other ``link_approx`` is a ValueError."""
    if pred_type == "nn" and link_approx != "mc":
        raise ValueError(
            "pred_type='nn' averages over sampled networks, a Monte Carlo link: "
            f"pass link_approx='mc' (got {link_approx!r}; laplace-torch refuses it too)"
        )


class Laplace:
    """Laplace approximation N(θ*, Σ) with posterior precision Σ⁻¹ = c·H + diag(p₀),
    c = 1/(σ²T), over the chosen weights (P of them)."""

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
        subnetwork_indices: Tensor | None = None,
        last_layer_name: str | None = None,
        enable_backprop: bool = False,
        dict_key_x: str = "input_ids",
        dict_key_y: str = "labels",
        backend: type | None = None,
        backend_kwargs: dict | None = None,
        **structure_options,
    ):
        # laplace-torch's enums (``enums.py``) become their strings here
        likelihood = check_choice("likelihood", likelihood, NAMES)
        subset_of_weights = check_choice(
            "subset_of_weights", subset_of_weights, SUBSETS
        )
        hessian_structure = check_choice(
            "hessian_structure", hessian_structure, tuple(STRUCTURES)
        )
        check_combination(subset_of_weights, hessian_structure)
        check_options(hessian_structure, structure_options)
        check_backend(backend, backend_kwargs)  # a GGN backend: accepted, not used
        if not isinstance(enable_backprop, bool):
            raise ValueError(
                f"enable_backprop must be True or False, got {enable_backprop!r}"
            )
        if subnetwork_indices is None and subset_of_weights == "subnetwork":
            # a missing argument, as in laplace-torch (SubnetLaplace requires it)
            raise TypeError("subset_of_weights='subnetwork' needs subnetwork_indices")
        if subnetwork_indices is not None and subset_of_weights != "subnetwork":
            raise ValueError(
                "subnetwork_indices go with subset_of_weights='subnetwork', and only "
                "with it"
            )
        if last_layer_name is not None and subset_of_weights != "last_layer":
            raise ValueError(
                "last_layer_name goes with subset_of_weights='last_layer', and only "
                "with it"
            )
        self.model, self.likelihood = model, likelihood
        self.subset_of_weights = subset_of_weights
        self.hessian_structure = hessian_structure
        self.subnetwork_indices = subnetwork_indices
        self.last_layer_name = last_layer_name
        self.structure_options = structure_options
        self.enable_backprop = enable_backprop
        # dict-shaped batches (``dict_inputs.py``): the keys of the inputs and targets,
        # and the layout of the packed inputs, set by the first dict batch ``fit`` sees
        self.dict_key_x, self.dict_key_y = dict_key_x, dict_key_y
        self._dict_inputs: DictInputs | None = None
        # Λ at σ = 1: σ enters through c = 1/(σ²T)
        self._lik = get_likelihood(likelihood, 1.0)
        self.weights = self._select_weights()
        # θ*: the chosen weights, read again by fit (``mean``: the prior mean before)
        self._theta, self.param_sizes = self.weights.theta, self.weights.sizes
        self.n_params = sum(self.param_sizes)
        self.n_param_tensors = len(self.param_sizes)
        self.temperature = temperature
        self.sigma_noise = sigma_noise
        self.prior_precision = prior_precision
        self.prior_mean = prior_mean
        self.structure = None  # the fitted posterior structure (posterior.py protocol)
        self._builder = None
        self.loss: Tensor | None = None
        self.n_data = self.n_outputs = 0
        self.input_shape: tuple[int, ...] | None = None  # of one input, seen in fit

    def _select_weights(self):
        subset, indices, name = (
            self.subset_of_weights,
            self.subnetwork_indices,
            self.last_layer_name,
        )
        if self._dict_inputs is None:
            return select_weights(self.model, subset, indices, name)
        model = DictModel(self.model, self._dict_inputs)  # takes the packed inputs
        name = None if name is None else f"model.{name}"
        return select_weights(model, subset, indices, name)

    def _batch(self, batch) -> tuple[Tensor, Tensor]:
        """(X, y) of an (X, y) batch or of a dict batch (X packed, y its
        ``dict_key_y``)."""
        if isinstance(batch, Mapping):
            batch = (self._inputs(batch), batch[self.dict_key_y])
        return check_batch(batch, self._theta)

    def _inputs(self, x):
        """x, or a dict of inputs packed into one tensor (``dict_inputs.py``)."""
        if not isinstance(x, Mapping):
            return x
        if self._dict_inputs is None:
            raise ValueError("dict inputs need a Laplace fitted on dict batches")
        return self._dict_inputs.pack(x, self._theta)

    # ----- hyperparameters: validated and converted to θ*'s device and dtype when set
    def _positive_scalar(self, value, name: str) -> Tensor:
        t = as_like(value, self._theta, name)
        if t.ndim > 1 or t.numel() != 1 or not (t.isfinite().all() and t.item() > 0):
            raise ValueError(
                f"{name} must be one positive finite number, got {value!r}"
            )
        return t.reshape(())

    @property
    def temperature(self) -> Tensor:
        return self._temperature

    @temperature.setter
    def temperature(self, value: float | Tensor) -> None:
        self._temperature = self._positive_scalar(value, "temperature")

    @property
    def sigma_noise(self) -> Tensor:
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, value: float | Tensor) -> None:
        sigma = self._positive_scalar(value, "sigma_noise")
        if not self._lik.has_noise and sigma.item() != 1:
            raise ValueError("sigma_noise must be 1 for classification")
        self._sigma_noise = sigma

    @property
    def prior_precision(self) -> Tensor:
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, value: float | Tensor) -> None:
        p0 = as_like(value, self._theta, "prior_precision")
        kind = prior_kind(p0, self.param_sizes)
        allowed = STRUCTURES[self.hessian_structure].priors
        if kind not in allowed:
            raise ValueError(
                f"hessian_structure={self.hessian_structure!r} supports a prior "
                f"precision that is {' or '.join(allowed)}, not {kind} "
                f"({p0.numel()} values)"
            )
        self._prior_precision = p0

    @property
    def prior_mean(self) -> Tensor:
        return self._prior_mean

    @prior_mean.setter
    def prior_mean(self, value: float | Tensor) -> None:
        mu0 = as_like(value, self._theta, "prior_mean")
        if mu0.ndim > 1 or mu0.numel() not in (1, self.n_params):
            raise ValueError(
                f"prior_mean must be a scalar or ({self.n_params},), got shape "
                f"{tuple(mu0.shape)}"
            )
        if not torch.all(torch.isfinite(mu0)):
            raise ValueError("prior_mean must be finite")
        self._prior_mean = mu0.reshape(()) if mu0.numel() == 1 else mu0

    @property
    def mean(self) -> Tensor:
        """θ* (P,) from ``fit``; before it, as laplace-torch, the prior mean μ₀ (as
        (P,))."""
        if self.structure is None:
            return self.prior_mean.expand(self.n_params)
        return self._theta

    @property
    def n_params_subnet(self) -> int:
        """laplace-torch's name for P with ``subset_of_weights="subnetwork"``."""
        if self.subnetwork_indices is None:
            raise AttributeError(
                "n_params_subnet is the size of a subnetwork: use n_params"
            )
        return self.n_params

    @property
    def prior_precision_diag(self) -> Tensor:
        """p₀ expanded to one value per parameter, (P,)."""
        return prior_precision_diag(self.prior_precision, self.param_sizes)

    # ----- fitting ------------------------------------------------------------------
    def fit(self, train_loader: DataLoader, override=True, progress_bar=False) -> None:
        """Accumulate the curvature (Λ = I for regression) and the loss over the
        (X, y) batches (or dict batches, ``dict_inputs.py``) at the model's current
        weights (θ* is read again, as laplace-torch does). ``override=False`` adds
        them to the previous ``fit`` (not for low-rank); with ``override=True`` nothing
        changes if the loop fails."""
        if isinstance(train_loader, Tensor) or not hasattr(train_loader, "__iter__"):
            raise TypeError(
                "train_loader must be an iterable of (X, y) batches, e.g. "
                "DataLoader(TensorDataset(X, y), "
                f"batch_size=32); got {type(train_loader).__name__}"
            )
        check_eval_mode(self.model)
        batches = iter(train_loader)
        first = next(batches, None)
        if first is not None:
            batches = itertools.chain([first], batches)
        old_inputs = self._dict_inputs  # (restored if this fit fails)
        if override or self.structure is None:  # dict batches: their layout
            self._dict_inputs = (
                DictInputs.from_batch(first, self.dict_key_x, self.dict_key_y)
                if isinstance(first, Mapping)
                else None
            )
        try:
            self._fit(batches, override, progress_bar)
        except BaseException:
            self._dict_inputs = old_inputs
            raise

    def _fit(self, batches, override: bool, progress_bar: bool) -> None:
        if override or self.structure is None:
            w = self._select_weights()
            build = STRUCTURES[self.hessian_structure].build
            builder = build(w, self._lik, self.param_sizes, **self.structure_options)
            loss, n_data, n_outputs = w.theta.new_zeros(()), 0, 0
        else:
            if self._builder is None:  # loaded from a state_dict: no running sums
                raise ValueError(
                    "a Laplace loaded from a state_dict cannot be updated "
                    "(override=False): fit it again"
                )
            if not self._builder.can_update:
                raise ValueError(
                    f"a {self.hessian_structure!r} fit cannot be updated "
                    "(override=False)"
                )
            # a copy of the running sums: if this fit fails, nothing here changes
            w, builder = self.weights, self._builder.resumed()
            loss, n_data, n_outputs = self.loss.clone(), self.n_data, self.n_outputs
        input_shape = self.input_shape
        if progress_bar:
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc="Laplace.fit")
        with deferred():  # the value checks of every batch, read once at the end
            for batch in batches:
                X, y = self._batch(batch)
                # (the features run without gradients)
                out = builder.update(X if w.features is None else w.features(X))
                check_outputs(out)
                require(
                    torch.isfinite(out),
                    "the model's outputs contain NaN or inf at the fitted weights",
                )
                # also checks the targets against the outputs
                loss = loss + self._lik.fit_loss(out, y)
                n_data, n_outputs = n_data + X.shape[0], out.shape[-1]
                input_shape = tuple(X.shape[1:])
        if n_data == 0:
            raise ValueError("train_loader yielded no data")
        structure = builder.finish()
        self.weights, self._theta = w, w.theta
        self.structure, self._builder = structure, builder
        self.loss, self.n_data, self.n_outputs = loss, n_data, n_outputs
        self.input_shape = input_shape

    def _post(self):
        if self.structure is None:
            raise RuntimeError(
                "call Laplace.fit(train_loader) before using the posterior"
            )
        return self.structure

    @property
    def H(self):
        """The curvature in the structure's own form (laplace-torch's ``H``)."""
        return self._post().H

    # ----- saving and loading a fitted Laplace (laplace-torch's state_dict shape) -----
    def state_dict(self) -> dict:
        """θ*, the curvature (``saving.py``), the loss, data counts and hyperparameters
        of a fitted Laplace: tensors and plain values, for ``torch.save``."""
        H = posterior_state(self.hessian_structure, self._post())
        return {"mean": self._theta, "H": H} | {k: getattr(self, k) for k in STATE}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` of a Laplace like this one; θ* is written into
        the model's chosen weights, as laplace-torch does. Nothing changes if it
        fails."""
        for key in ("likelihood", "subset_of_weights", "hessian_structure"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"the state is of a Laplace with {key}={state[key]!r}, this one "
                    f"has {key}={getattr(self, key)!r}"
                )
        if list(state["param_sizes"]) != self.param_sizes:
            raise ValueError(
                f"the state was saved for P = {sum(state['param_sizes'])} parameters "
                f"in tensors of sizes {list(state['param_sizes'])}; this model's "
                f"chosen weights have P = {self.n_params} in {self.param_sizes}"
            )
        mean = as_like(state["mean"], self._theta, "the state's mean")
        structure = posterior_from_state(state["H"])
        old = self._prior_precision, self._sigma_noise, self._temperature
        try:
            self.prior_precision = state["prior_precision"]
            self.sigma_noise = state["sigma_noise"]
            self.temperature = state["temperature"]
            self.prior_mean = state["prior_mean"]
        except (TypeError, ValueError):
            self._prior_precision, self._sigma_noise, self._temperature = old
            raise
        self.weights.write(mean)
        self.weights = self._select_weights()
        self._theta, self.structure, self._builder = self.weights.theta, structure, None
        self.loss = as_like(state["loss"], self._theta, "the state's loss")
        self.n_data, self.n_outputs = state["n_data"], state["n_outputs"]
        self.input_shape = state["input_shape"]

    # ----- the posterior: the structure's six methods at the current hyperparameters --
    @property
    def _c(self) -> Tensor:
        """c = 1/(σ²T), which scales H in Σ⁻¹ = c·H + diag(p₀)."""
        return 1 / (self.sigma_noise**2 * self.temperature)

    @property
    def posterior_precision(self):
        """Σ⁻¹: (P, P) for full, (P,) for diag, an operator otherwise."""
        return self._post().precision(self.prior_precision, self._c)

    @property
    def posterior_covariance(self):
        """Σ: (P, P) for full and diag (dense: small P), an operator otherwise."""
        return self._post().covariance(self.prior_precision, self._c)

    @property
    def posterior_variance(self) -> Tensor:
        """The marginal variances diag(Σ), (P,)."""
        return self._post().variance(self.prior_precision, self._c)

    def sample(self, n_samples: int = 100, generator=None) -> Tensor:
        """θ ~ N(θ*, Σ), (S, P); for a subnetwork, as laplace-torch, full-length
        samples (S, all weights) with the other weights at the model's values."""
        draws = self._draw(n_samples, generator)
        if self.subnetwork_indices is None:
            return draws
        # the flat order subnetwork_indices index (weights.select_weights')
        full = flatten_params(self.model).to(draws.dtype).expand(n_samples, -1).clone()
        full[:, self.subnetwork_indices] = draws
        return full

    def log_prob(self, value: Tensor, normalized: bool = True) -> Tensor:
        """log N(value; θ*, Σ) of weight vectors value (P,) or (S, P) → () or (S,),
        as laplace-torch's: before ``fit``, the prior N(μ₀, diag(p₀)⁻¹). Without
        ``normalized``, only −½ (value − θ*)ᵀ Σ⁻¹ (value − θ*)."""
        value = as_like(value, self._theta, "value")
        if value.ndim not in (1, 2) or value.shape[-1] != self.n_params:
            raise ValueError(
                f"value must be (P,) or (S, P) with P = {self.n_params} (the Laplace "
                f"weights), got shape {tuple(value.shape)}"
            )
        d = value - self.mean
        prior = self.structure is None  # the posterior before any data is the prior
        A = self.prior_precision_diag if prior else self.posterior_precision
        rows = d.reshape(-1, self.n_params)
        if isinstance(A, Tensor) and A.ndim == 1:  # a diagonal Σ⁻¹, (P,)
            quad = (rows * rows * A).sum(-1)
        else:  # (P, P) or an operator: Σ⁻¹ applied to the columns
            quad = (rows * (A @ rows.T).T).sum(-1)
        out = -quad.reshape(d.shape[:-1]) / 2
        if normalized:  # (the log-determinant only here: a factorisation, or SLQ)
            log_det = (
                self.log_det_prior_precision
                if prior
                else self.log_det_posterior_precision
            )
            out = out + (log_det - self.n_params * math.log(2 * math.pi)) / 2
        return out

    def _draw(self, n_samples: int, generator=None) -> Tensor:
        """θ ~ N(θ*, Σ) over the Laplace weights, (S, P)."""
        check_count("n_samples", n_samples)
        return self._theta + self._post().sample(
            n_samples, self.prior_precision, self._c, generator
        )

    def functional_variance(self, J: Tensor) -> Tensor:
        """f_var = J Σ Jᵀ per input. J: (N, K, P) → (N, K, K)."""
        return self._post().functional_variance(J, self.prior_precision, self._c)

    # ----- the evidence -------------------------------------------------------------
    @property
    def log_likelihood(self) -> Tensor:
        """log p(D | θ*) at the current σ and T: −c·½SSE − N·K·log(σ√2π), or −c·ΣCE."""
        self._post()
        return -self._c * self.loss - self._lik.log_normaliser(
            self.n_data * self.n_outputs, self.sigma_noise
        )

    @property
    def scatter(self) -> Tensor:
        """(θ* − μ₀)ᵀ diag(p₀) (θ* − μ₀)."""
        d = self._theta - self.prior_mean
        return (d * self.prior_precision_diag) @ d

    @property
    def log_det_prior_precision(self) -> Tensor:
        return self.prior_precision_diag.log().sum()

    @property
    def log_det_posterior_precision(self) -> Tensor:
        return self._post().log_det(self.prior_precision, self._c)

    @property
    def log_det_ratio(self) -> Tensor:
        return self.log_det_posterior_precision - self.log_det_prior_precision

    def log_marginal_likelihood(self, prior_precision=None, sigma_noise=None) -> Tensor:
        """log p(D | θ*) − ½ (log det Σ⁻¹ − log det Σ₀⁻¹ + (θ*−μ₀)ᵀ Σ₀⁻¹ (θ*−μ₀)),
        differentiable in δ and σ; ``prior_precision`` or ``sigma_noise`` are set first
        (as laplace-torch does), both or neither."""
        old = self._prior_precision, self._sigma_noise
        try:
            if prior_precision is not None:
                self.prior_precision = prior_precision
            if sigma_noise is not None:
                self.sigma_noise = sigma_noise
        except (TypeError, ValueError):
            self._prior_precision, self._sigma_noise = old
            raise
        return laplace_evidence(
            self.log_likelihood,
            self.log_det_posterior_precision,
            self.log_det_prior_precision,
            self.scatter,
        )

    # ----- hyperparameters by the evidence or by validation -------------------------
    def optimize_prior_precision(
        self,
        pred_type: str = "glm",
        method: str = "marglik",
        n_steps: int = 100,
        lr: float = 0.1,
        init_prior_prec: float | Tensor = 1.0,
        prior_structure: str = "scalar",
        val_loader: DataLoader | None = None,
        *,
        link_approx: str = "probit",
        n_samples: int = 100,
        log_prior_prec_min: float = -4,
        log_prior_prec_max: float = 4,
        grid_size: int = 100,
    ) -> None:
        """Set δ by the evidence (``"marglik"``: laplace-torch's Adam on log δ, lr 0.1,
        100 steps from δ = 1; ``prior_structure="layerwise"``: one δ per parameter
        tensor) or by the lowest negative log predictive density on ``val_loader``
        among ``grid_size`` values 10^[min, max] (``"gridsearch"``). A failure
        restores δ. laplace-torch's positional order (``pred_type``, the predictive
        the grid search scores, comes first); the grid's options are keywords."""
        pred_type = check_choice("pred_type", pred_type, PRED_TYPES)
        method = check_choice("method", method, ("marglik", "gridsearch"))
        prior_structure = check_choice(
            "prior_structure", prior_structure, ("scalar", "layerwise")
        )
        self._post()
        if method == "marglik":
            if val_loader is not None:
                raise ValueError("val_loader is only used by method='gridsearch'")
            check_count("n_steps", n_steps)
            check_positive("lr", lr)
            old = self._prior_precision
            try:
                self.prior_precision = init_prior_prec
                self.optimize_hyperparameters(
                    n_steps, lr, tune_sigma=False, prior_structure=prior_structure
                )
            except BaseException:
                self._prior_precision = old
                raise
            return
        if val_loader is None:
            raise ValueError("method='gridsearch' needs a val_loader")
        check_nn_link(pred_type, check_choice("link_approx", link_approx, LINKS))
        check_count("grid_size", grid_size)
        like = dict(dtype=self._theta.dtype, device=self._theta.device)
        grid = torch.logspace(log_prior_prec_min, log_prior_prec_max, grid_size, **like)
        old, scores = self._prior_precision, []
        try:
            for delta in grid:
                self.prior_precision = delta
                scores.append(
                    self._validation_nll(val_loader, pred_type, link_approx, n_samples)
                )
        finally:
            self._prior_precision = old
        self.prior_precision = grid[min(range(len(scores)), key=scores.__getitem__)]

    def optimize_hyperparameters(
        self, n_steps=300, lr=0.1, tune_sigma=True, prior_structure="scalar"
    ) -> list[float]:
        """Maximise the evidence over δ and (regression) σ by Adam on their logs, from
        the current values; returns the evidence before each step (the values after
        the last step are kept, as laplace-torch does)."""
        prior_structure = check_choice(
            "prior_structure", prior_structure, ("scalar", "layerwise")
        )
        check_count("n_steps", n_steps)
        check_positive("lr", lr)
        self._post()
        p0 = self.prior_precision.clone()
        if prior_structure == "layerwise" and p0.numel() == 1:
            p0 = prior_precision_diag(p0, self.param_sizes, per_tensor=True).clone()
        init = {"prior_precision": p0}
        if tune_sigma:
            if not self._lik.has_noise:
                raise ValueError("sigma_noise can only be tuned for regression")
            init["sigma_noise"] = self.sigma_noise.clone()
        best, history = maximize_on_logs(
            lambda **kw: self.log_marginal_likelihood(**kw), init, n_steps, lr
        )
        for name, value in best.items():
            setattr(self, name, value)
        return history

    def _validation_nll(self, loader, pred_type, link_approx, n_samples) -> float:
        """Mean negative log predictive density on ``loader`` (regression: Gaussian with
        f_var + σ²)."""
        total, count = 0.0, 0
        with torch.no_grad():
            for batch in loader:
                X, y = self._batch(batch)
                pred = self(
                    X, pred_type=pred_type, link_approx=link_approx, n_samples=n_samples
                )
                total += self._lik.predictive_nll(pred, y, self.sigma_noise).item()
                count += X.shape[0]
        if count == 0:
            raise ValueError("val_loader yielded no data")
        return total / count

    # ----- predictions --------------------------------------------------------------
    def _check_x(self, x: Tensor) -> None:
        """Inputs to predict at: a batch on θ*'s device; one shaped unlike the training
        inputs is tried on the model once, to fail here naming both shapes."""
        check_inputs(x, self._theta)
        if self.input_shape is None or tuple(x.shape[1:]) == self.input_shape:
            return
        try:
            with torch.no_grad():
                self.weights.f(self._theta, x[:1])
        except RuntimeError as e:
            if isinstance(e, torch.OutOfMemoryError):
                raise
            raise ValueError(
                f"x has shape {tuple(x.shape)}, but the model was fitted on inputs of "
                f"shape (N, {', '.join(map(str, self.input_shape))}) and cannot take "
                f"these: {e}"
            ) from None

    @property
    def _keep_graph(self) -> bool:
        """Whether predictions keep the graph to their inputs x: with
        ``enable_backprop=True`` (laplace-torch's flag), outside the caller's
        ``torch.no_grad``. Never a graph to θ*: gradients flow to x only."""
        return self.enable_backprop and torch.is_grad_enabled()

    def _features(self, x: Tensor, keep: bool) -> Tensor:
        """What ``weights.f_module`` takes: x (detached unless ``keep``), or the last
        layer's input φ(x) (N, D), computed once for all of x."""
        x = x if keep else x.detach()
        return x if self.weights.features is None else self.weights.features(x)

    def jacobians(self, x: Tensor) -> Tensor:
        """J = ∂f(x; θ)/∂θ at θ* over the Laplace weights, (N, K, P)."""
        x = self._inputs(x)
        return jacobian(self.weights.f, self._theta, x)

    def _predictive_layers(self) -> list[nn.Module] | None:
        """The Linear/Conv2d layers of the layer-wise predictive (structures whose entry
        is ``layerwise``: diag, KFAC); None: per-example Jacobians."""
        self._post()
        module = self.weights.module
        if module is None or not STRUCTURES[self.hessian_structure].layerwise:
            return None
        return supported_layers(module)

    def glm_predictive(self, x: Tensor, joint: bool = False) -> tuple[Tensor, Tensor]:
        """f_mu (N, K) and f_var = J Σ Jᵀ (N, K, K) of the linearised network (without
        σ²); with ``joint=True`` over all N·K outputs: (N·K,) and (N·K, N·K). Diagonal
        and KFAC posteriors of Linear/Conv2d networks never form J
        (``layer_predictive.py``); the others form it a few inputs at a time. With
        ``enable_backprop=True`` both are differentiable in x."""
        x = self._inputs(x)
        self._check_x(x)
        keep, w = self._keep_graph, self.weights
        x_in = self._features(x, keep)
        with nullcontext() if keep else torch.no_grad():
            f_mu = w.f_module(self._theta, x_in)
        if joint:
            J = jacobian(w.f_module, self._theta, x_in)
            N, K, P = J.shape
            return f_mu.reshape(-1), self.functional_variance(J.reshape(1, N * K, P))[0]
        layers = self._predictive_layers()
        if layers is not None:  # diag and KFAC on Linear/Conv2d layers: no J
            theta = self._theta.detach().requires_grad_()  # so that each z needs grad
            blocks = self._post().layer_blocks(self.prior_precision, self._c)
            _, f_var = glm_variance(
                lambda X: w.f_module(theta, X), w.module, layers, x_in, blocks, keep
            )
            return f_mu, f_var
        # few enough inputs for their J to stay small beside a P×P matrix (or CHUNK_CAP)
        K, P = f_mu.shape[-1], self.n_params
        chunk = jacobian_chunk(K, P, CHUNK_FRACTION_TIGHT, cap=CHUNK_CAP)
        Js = (jacobian(w.f_module, self._theta, xc) for xc in x_in.split(chunk))
        return f_mu, torch.cat([self.functional_variance(J) for J in Js])

    def __call__(
        self,
        x: Tensor,
        pred_type: str = "glm",
        link_approx: str = "probit",
        n_samples: int = 100,
        generator: torch.Generator | None = None,
        joint: bool = False,
        diagonal_output: bool = False,
        **model_kwargs,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The predictive at x (N, ...). Regression: ``"glm"`` → f_mu (N, K), f_var
        (N, K, K) without σ² (``diagonal_output``: (N, K); ``joint``: (N·K,),
        (N·K, N·K)); ``"nn"`` → mean and variance (N, K) over sampled networks.
        Classification: class probabilities (N, C) by ``link_approx`` or over sampled
        networks; ``joint`` is refused (see ``glm_predictive(x, joint=True)``).
        ``"nn"`` needs ``link_approx="mc"`` (laplace-torch's rule: sampled networks
        are a Monte Carlo average). laplace-torch passes ``model_kwargs`` to the model;
        ours calls ``model(x)`` only and refuses them (a dict input carries extras)."""
        pred_type = check_choice("pred_type", pred_type, PRED_TYPES)
        link_approx = check_choice("link_approx", link_approx, LINKS)
        check_nn_link(pred_type, link_approx)
        if model_kwargs:
            raise TypeError(
                f"unexpected keyword arguments {sorted(model_kwargs)}: laplace-torch "
                "passes these to the model, ours calls model(x) only (pass a dict "
                "input with dict_key_x for a model that takes more than x)"
            )
        check_count("n_samples", n_samples)
        reg = self._lik.has_noise
        if joint and not reg:
            raise ValueError(
                "joint=True is the joint Gaussian of regression outputs; class "
                "probabilities have none: use la.glm_predictive(x, joint=True) for the "
                "joint Gaussian over the logits"
            )
        if pred_type == "nn":
            f = self.functional_samples(x, "nn", n_samples, generator=generator)
            return self._lik.nn_link(f)
        f_mu, f_var = self.glm_predictive(x, joint=joint)
        if diagonal_output and not joint:
            f_var = f_var.diagonal(dim1=-2, dim2=-1)
            if not reg:  # the MC link samples from the diagonal Gaussian
                f_var = torch.diag_embed(f_var)
        return self._lik.link(f_mu, f_var, link_approx, n_samples, generator)

    def glm_samples(self, x: Tensor, n_samples: int = 100, generator=None) -> Tensor:
        """Outputs of the linearised network at posterior samples, (S, N, K)."""
        x = self._inputs(x)
        return linearized_samples(
            self.weights.f, self._theta, x, self._draw(n_samples, generator)
        )

    def functional_samples(
        self, x, pred_type="glm", n_samples=100, diagonal_output=False, generator=None
    ) -> Tensor:
        """Samples of the outputs f at x, (S, N, K), as laplace-torch's: ``"glm"`` from
        N(f_mu, f_var) per input (diagonal with ``diagonal_output``), ``"nn"`` the
        network at θ ~ N(θ*, Σ). With ``enable_backprop=True``, differentiable in x."""
        pred_type = check_choice("pred_type", pred_type, PRED_TYPES)
        check_count("n_samples", n_samples)
        x = self._inputs(x)
        if pred_type == "nn":  # (glm_predictive checks x itself)
            self._check_x(x)
            keep = self._keep_graph
            thetas = self._draw(n_samples, generator)
            return nn_samples(
                self.weights.f_module, self._features(x, keep), thetas, keep
            )
        f_mu, f_var = self.glm_predictive(x)
        if diagonal_output:
            f_var = torch.diag_embed(f_var.diagonal(dim1=-2, dim2=-1))
        return gaussian_samples(f_mu, f_var, n_samples, generator)

    def predictive_samples(
        self, x, pred_type="glm", n_samples=100, diagonal_output=False, generator=None
    ) -> Tensor:
        """:meth:`functional_samples` through the inverse link: class probabilities
        (S, N, C) (C = 2 for one logit), or the outputs (S, N, K) for regression."""
        f = self.functional_samples(x, pred_type, n_samples, diagonal_output, generator)
        return self._lik.inverse_link(f)


# laplace-torch's scripts name its base class (``isinstance(la, BaseLaplace)``); here
# one class makes every Laplace object, so that name is this class
BaseLaplace = Laplace
