"""Learning δ (and σ) while training: online marginal likelihood (Immer et al., 2021,
Algorithm 1), with laplace-torch 0.3's call shape. Every epoch the network takes
optimiser steps on the mean loss plus the prior's weight decay at the current δ and σ,

    loss = mean_loss(f, y) + ½ θᵀ diag(δ) θ / (N·κ),   κ = T/(2σ²) (regression), T,

κ turning the summed NLL at temperature T into the mean loss (laplace-torch's scaling;
not the c = 1/(σ²T) of Σ⁻¹); every ``marglik_frequency`` epochs after the burn-in a
Laplace is fitted and ``n_hypersteps`` steps of one ``marglik.LogAdam`` go to log δ and
log σ. The weights, δ and σ of the best evidence are returned with their Laplace.
"""

from __future__ import annotations

import copy
import math
import warnings

import torch
from torch import nn

from .checks import check_backend, check_choice, check_count, check_positive
from .laplace import Laplace
from .likelihoods import NAMES, get_likelihood
from .marglik import LogAdam
from .posterior import PRIOR_KINDS, prior_precision_diag, prior_sizes
from .structures import STRUCTURES


def marglik_training(
    model: nn.Module,
    train_loader,
    likelihood: str = "classification",
    hessian_structure: str = "kron",
    backend: object = None,
    optimizer_cls: type[torch.optim.Optimizer] = torch.optim.Adam,
    optimizer_kwargs: dict | None = None,
    scheduler_cls: type | None = None,
    scheduler_kwargs: dict | None = None,
    n_epochs: int = 300,
    lr_hyp: float = 0.1,
    prior_structure: str = "layerwise",
    n_epochs_burnin: int = 0,
    n_hypersteps: int = 10,
    marglik_frequency: int = 1,
    prior_prec_init: float = 1.0,
    sigma_noise_init: float = 1.0,
    temperature: float = 1.0,
    fix_sigma_noise: bool = False,
    progress_bar: bool = False,
) -> tuple[Laplace, nn.Module, list[float], list[float]]:
    """Train ``model`` and its hyperparameters together; returns, as laplace-torch,
    ``(la, model, margliks, losses)``: the Laplace at the best evidence, the model with
    those weights (trained in place), the negative evidence after every hyperstep and
    the mean training loss of every epoch. ``backend``: a GGN backend class or None,
    accepted and not used (``checks.check_backend``). ``prior_structure``: "scalar",
    "layerwise" or "diag".
    Weight decay in ``optimizer_kwargs`` is set to 0 with a warning; σ is learned for
    regression unless ``fix_sigma_noise``; the scheduler steps after every batch. On an
    error the model's weights are restored."""
    likelihood = check_choice("likelihood", likelihood, NAMES)
    check_backend(backend)
    hessian_structure = check_choice(
        "hessian_structure", hessian_structure, tuple(STRUCTURES)
    )
    prior_structure = check_choice("prior_structure", prior_structure, PRIOR_KINDS)
    priors = STRUCTURES[hessian_structure].priors
    if prior_structure not in priors:
        raise ValueError(
            f"hessian_structure={hessian_structure!r} supports prior_structure "
            f"{' or '.join(priors)}, not {prior_structure!r}"
        )
    check_count("n_epochs", n_epochs)
    check_count("n_hypersteps", n_hypersteps)
    check_count("marglik_frequency", marglik_frequency)
    check_count("n_epochs_burnin", n_epochs_burnin, minimum=0)
    check_positive("lr_hyp", lr_hyp)
    check_positive("prior_prec_init", prior_prec_init)
    check_positive("sigma_noise_init", sigma_noise_init)
    check_positive("temperature", temperature)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    optimizer_kwargs = dict(optimizer_kwargs or {})  # the caller's dict stays as it is
    if optimizer_kwargs.get("weight_decay"):
        msg = "weight_decay is the prior precision here, learned by the evidence: "
        warnings.warn(msg + "set to 0", stacklevel=2)
        optimizer_kwargs["weight_decay"] = 0.0
    optimizer = optimizer_cls(model.parameters(), **optimizer_kwargs)
    scheduler = scheduler_cls and scheduler_cls(optimizer, **(scheduler_kwargs or {}))
    # Adam on log δ (laplace-torch starts δ at T·prior_prec_init) and, if learned, log σ
    like_params = dict(device=params[0].device, dtype=params[0].dtype)
    n_prior = prior_sizes([p.numel() for p in params])[prior_structure]
    log_prior = math.log(temperature * prior_prec_init)
    logs = {"prior_precision": torch.full((n_prior,), log_prior, **like_params)}
    if likelihood == "regression" and not fix_sigma_noise:
        log_sigma = math.log(sigma_noise_init)
        logs["sigma_noise"] = torch.full((1,), log_sigma, **like_params)
    hyper = LogAdam(logs, lr_hyp)
    # laplace-torch reads len(train_loader.dataset); any iterable of batches works here
    dataset = getattr(train_loader, "dataset", None)
    N = len(dataset) if dataset is not None else sum(len(b[1]) for b in train_loader)
    fixed_sigma = sigma_noise_init if likelihood == "regression" else 1.0
    like, sizes = get_likelihood(likelihood), [p.numel() for p in params]
    T = temperature
    margliks: list[float] = []
    losses: list[float] = []
    best: dict = {"neg_evidence": math.inf}  # and the weights and hyperparameters of it
    epochs = range(1, n_epochs + 1)
    if progress_bar:
        from tqdm.auto import tqdm  # (an optional dependency)

        epochs = tqdm(epochs, desc="marglik_training")
    saved, mode = copy.deepcopy(model.state_dict()), model.training
    try:
        for epoch in epochs:
            # δ and σ move only in the hyperparameter steps after an epoch
            current = hyper.values()
            sigma = current.get("sigma_noise", fixed_sigma)
            kappa = T / (2 * sigma**2) if likelihood == "regression" else T
            delta = prior_precision_diag(current["prior_precision"], sizes)
            epoch_loss = 0.0
            for X, y in train_loader:
                X, y = X.to(like_params["device"]), y.to(like_params["device"])
                optimizer.zero_grad()
                theta = nn.utils.parameters_to_vector(params)
                prior_term = (0.5 * (delta * theta) @ theta) / N / kappa
                loss = like.mean_loss(model(X), y) + prior_term
                loss.backward()
                optimizer.step()
                epoch_loss += loss.item() * len(y)
                if scheduler is not None:
                    scheduler.step()
            losses.append(epoch_loss / N)
            if epoch % marglik_frequency != 0 or epoch < n_epochs_burnin:
                continue
            prior = current["prior_precision"]
            la = _fit(
                model, train_loader, likelihood, hessian_structure, T, sigma, prior
            )
            for _ in range(n_hypersteps):
                margliks.append(-hyper.step(la.log_marginal_likelihood).item())
            if margliks[-1] < best["neg_evidence"]:  # δ, σ as they were for that value
                weights = copy.deepcopy(model.state_dict())
                best = {"neg_evidence": margliks[-1], "weights": weights, **hyper.last}
        last = best if "weights" in best else hyper.values()  # (no evidence step: last)
        if "weights" in best:
            model.load_state_dict(best["weights"])
        sigma = last.get("sigma_noise", fixed_sigma)
        prior = last["prior_precision"]
        la = _fit(model, train_loader, likelihood, hessian_structure, T, sigma, prior)
        return la, model, margliks, losses
    except BaseException:
        model.load_state_dict(saved)
        raise
    finally:
        model.train(mode)


def _fit(model: nn.Module, loader, likelihood: str, structure: str, T, sigma, prior):
    """A Laplace at the model's current weights, fitted in eval mode."""
    la = Laplace(
        model, likelihood, hessian_structure=structure, temperature=T,
        sigma_noise=sigma, prior_precision=prior,
    )  # fmt: skip
    mode = model.training
    model.eval()
    la.fit(loader)
    model.train(mode)
    return la
