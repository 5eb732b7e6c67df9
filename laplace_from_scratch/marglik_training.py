"""Learning the prior precision δ (and the noise σ) while training: online marginal
likelihood (Immer et al., 2021, Algorithm 1), with laplace-torch 0.3's call shape.

Every epoch the network takes SGD steps on the mean loss plus the prior's weight decay
at the current δ and σ,

    loss = mean_loss(f, y) + ½ θᵀ diag(δ) θ / (N · c),   c = T/(2σ²) (regression), T,

and every ``marglik_frequency`` epochs after the burn-in a Laplace approximation is
fitted at the current weights and ``n_hypersteps`` Adam steps go to log δ and log σ on
the negative evidence. The weights, δ and σ of the best evidence are returned with
their Laplace. Shapes: N examples, P parameters in ``n`` trainable tensors.
"""

from __future__ import annotations

import copy
import math
import warnings

import torch
from torch import nn

from .checks import check_choice, check_count, check_positive
from .laplace import Laplace
from .likelihoods import NAMES, get_likelihood
from .posterior import PRIOR_KINDS, prior_precision_diag
from .structures import PRIORS, STRUCTURES


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
    """Train ``model`` and its hyperparameters together; returns ``(la, model, margliks,
    losses)`` as laplace-torch does: the Laplace fitted at the best evidence, the model
    with those weights (the same object, trained in place), the negative evidence after
    every hyperparameter step and the mean training loss of every epoch.

    ``backend`` is accepted so that laplace-torch scripts run unchanged (its README
    passes ``BackPackGGN``) and is not used: the curvature is always this module's GGN.
    ``prior_structure``: one δ ("scalar"), one per trainable tensor ("layerwise") or one
    per parameter ("diag"). Weight decay in ``optimizer_kwargs`` is set to 0 with a
    warning (the prior is the weight decay). σ is learned for regression unless
    ``fix_sigma_noise``. ``scheduler_cls(optimizer, **scheduler_kwargs)`` steps after
    every batch. On an error the model's weights are restored.
    """
    check_choice("likelihood", likelihood, NAMES)
    check_choice("hessian_structure", hessian_structure, STRUCTURES)
    check_choice("prior_structure", prior_structure, PRIOR_KINDS)
    if prior_structure not in PRIORS[hessian_structure]:
        raise ValueError(
            f"hessian_structure={hessian_structure!r} supports prior_structure "
            f"{' or '.join(PRIORS[hessian_structure])}, not {prior_structure!r}"
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
        warnings.warn(
            "weight_decay is the prior precision here, learned by the evidence: "
            "set to 0",
            stacklevel=2,
        )
        optimizer_kwargs["weight_decay"] = 0.0
    saved, mode = copy.deepcopy(model.state_dict()), model.training
    try:
        return _train(
            model, params, train_loader, likelihood, hessian_structure, locals()
        )
    except BaseException:
        model.load_state_dict(saved)
        raise
    finally:
        model.train(mode)


def _fit(model: nn.Module, loader, likelihood: str, structure: str, T, s, prior):
    """A Laplace at the model's current weights, fitted in eval mode."""
    la = Laplace(
        model, likelihood, hessian_structure=structure, temperature=T,
        sigma_noise=s, prior_precision=prior,
    )  # fmt: skip
    mode = model.training
    model.eval()
    la.fit(loader)
    model.train(mode)
    return la


def _train(model, params, loader, likelihood: str, structure: str, a: dict):
    """The loop of :func:`marglik_training`; ``a`` holds its arguments."""
    like = get_likelihood(likelihood)
    T, sigma_init = a["temperature"], a["sigma_noise_init"]
    regression = likelihood == "regression"
    learn_sigma = regression and not a["fix_sigma_noise"]
    sizes = [p.numel() for p in params]
    # laplace-torch reads len(train_loader.dataset); any iterable of batches works here
    N = (
        len(loader.dataset)
        if hasattr(loader, "dataset")
        else sum(len(b[1]) for b in loader)
    )
    dev, dtype = params[0].device, params[0].dtype
    optimizer = a["optimizer_cls"](model.parameters(), **a["optimizer_kwargs"])
    scheduler = a["scheduler_cls"] and a["scheduler_cls"](
        optimizer, **(a["scheduler_kwargs"] or {})
    )
    # laplace-torch starts δ at T·prior_prec_init
    n_prior = {"scalar": 1, "layerwise": len(sizes), "diag": sum(sizes)}
    log_prior = torch.full(
        (n_prior[a["prior_structure"]],),
        math.log(T * a["prior_prec_init"]),
        device=dev,
        dtype=dtype,
    ).requires_grad_(True)
    log_sigma = torch.full((1,), math.log(sigma_init), device=dev, dtype=dtype)
    log_sigma.requires_grad_(learn_sigma)
    hyper = torch.optim.Adam([log_prior, log_sigma][: 1 + learn_sigma], a["lr_hyp"])
    fixed_sigma = sigma_init if regression else 1.0

    margliks: list[float] = []
    losses: list[float] = []
    best = (math.inf, None, None, None)  # −evidence, weights, δ, σ
    epochs = range(1, a["n_epochs"] + 1)
    if a["progress_bar"]:
        from tqdm.auto import tqdm

        epochs = tqdm(epochs, desc="marglik_training")
    for epoch in epochs:
        epoch_loss = 0.0
        # δ and σ move only in the hyperparameter steps after an epoch
        s = log_sigma.detach().exp() if learn_sigma else fixed_sigma
        factor = T / (2 * s**2) if regression else T
        delta = prior_precision_diag(log_prior.detach().exp(), sizes)
        for X, y in loader:
            X, y = X.to(dev), y.to(dev)
            optimizer.zero_grad()
            theta = nn.utils.parameters_to_vector(params)
            prior_term = (0.5 * (delta * theta) @ theta) / N / factor
            loss = like.mean_loss(model(X), y) + prior_term
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item() * len(y)
            if scheduler is not None:
                scheduler.step()
        losses.append(epoch_loss / N)
        if epoch % a["marglik_frequency"] != 0 or epoch < a["n_epochs_burnin"]:
            continue
        la = _fit(model, loader, likelihood, structure, T, s, log_prior.detach().exp())
        for _ in range(a["n_hypersteps"]):
            hyper.zero_grad()
            prior, s = log_prior.exp(), log_sigma.exp() if learn_sigma else None
            neg = -la.log_marginal_likelihood(prior, s)
            neg.backward()
            hyper.step()
            margliks.append(neg.item())
        if margliks[-1] < best[0]:  # δ and σ as they were for that evidence
            s = s.detach() if learn_sigma else fixed_sigma
            best = (margliks[-1], copy.deepcopy(model.state_dict()), prior.detach(), s)
    if best[1] is not None:
        model.load_state_dict(best[1])
        prior, s = best[2], best[3]
    else:  # no evidence step (burn-in ≥ n_epochs): the last values
        prior = log_prior.detach().exp()
        s = log_sigma.detach().exp() if learn_sigma else fixed_sigma
    la = _fit(model, loader, likelihood, structure, T, s, prior)
    return la, model, margliks, losses
