"""MAP training: the summed negative log-likelihood plus a Gaussian prior.

The Laplace approximation sits at a mode of the log joint, so what we minimise is

    L(θ) = Σₙ −log p(yₙ | f(xₙ; θ)) + ½ δ ‖θ‖²,

the negative log posterior up to a constant, with prior θ ~ N(0, δ⁻¹ I). The usual
deep-learning objective is a *mean* loss plus weight decay ``wd``,

    L̄(θ) = mean loss + ½ wd ‖θ‖².

They have the same minimiser when δ matches ``wd``
(:func:`weight_decay_to_prior_precision`):

* classification, mean cross-entropy: L = N·L̄ exactly when δ = N·wd;
* regression, ``nn.MSELoss()`` (mean over N·K entries) and noise σ: the summed
  NLL is N·K·MSE/(2σ²) + const, so L = N·K/(2σ²)·L̄ + const when δ = N·K·wd/(2σ²).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from ..likelihoods import get_likelihood

Objective = Callable[[], Tensor]


def squared_norm(model: nn.Module) -> Tensor:
    """‖θ‖² over all trainable parameters."""
    return sum((p**2).sum() for p in model.parameters() if p.requires_grad)


def map_objective(
    model: nn.Module,
    X: Tensor,
    y: Tensor,
    likelihood: str = "regression",
    sigma_noise: float = 1.0,
    prior_precision: float = 1.0,
) -> Tensor:
    """Σₙ −log p(yₙ | f(xₙ; θ)) + ½ δ ‖θ‖², a scalar (the negative log joint up to a
    constant)."""
    lik = get_likelihood(likelihood, sigma_noise)
    return lik.nll(model(X), y) + 0.5 * prior_precision * squared_norm(model)


def mean_objective(
    model: nn.Module,
    X: Tensor,
    y: Tensor,
    likelihood: str = "regression",
    weight_decay: float = 0.0,
) -> Tensor:
    """The usual objective: mean MSE (regression) or mean
    cross-entropy, plus ½ wd ‖θ‖².
    """
    return get_likelihood(likelihood).mean_loss(
        model(X), y
    ) + 0.5 * weight_decay * squared_norm(model)


def weight_decay_to_prior_precision(
    weight_decay: float,
    n_data: int,
    likelihood: str = "classification",
    sigma_noise: float = 1.0,
    n_outputs: int = 1,
) -> float:
    """The prior precision δ whose MAP equals that of a mean loss with weight decay
    ``wd``.

    Classification (mean cross-entropy, softmax or binary): δ = N·wd.
    Regression with ``nn.MSELoss()``: δ = N·K·wd / (2σ²).
    """
    lik = get_likelihood(likelihood, sigma_noise)
    return weight_decay * lik.prior_precision_per_weight_decay(
        n_data, n_outputs, sigma_noise
    )


def prior_precision_to_weight_decay(
    prior_precision: float,
    n_data: int,
    likelihood: str = "classification",
    sigma_noise: float = 1.0,
    n_outputs: int = 1,
) -> float:
    """Inverse of :func:`weight_decay_to_prior_precision`."""
    unit = weight_decay_to_prior_precision(
        1.0, n_data, likelihood, sigma_noise, n_outputs
    )
    return prior_precision / unit


def minimize(
    model: nn.Module,
    objective: Objective,
    n_steps: int = 2000,
    lr: float = 1e-2,
    optimizer: str = "adam",
) -> list[float]:
    """Minimise ``objective()`` over the parameters of ``model``, full batch.

    ``optimizer="adam"`` takes ``n_steps`` Adam steps; ``"lbfgs"`` takes ``n_steps``
    L-BFGS iterations with a strong-Wolfe line search (deterministic and precise,
    good for small models in float64). Returns the objective after each step.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    history: list[float] = []
    if optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr)
        for _ in range(n_steps):
            opt.zero_grad()
            loss = objective()
            loss.backward()
            opt.step()
            history.append(loss.item())
    elif optimizer == "lbfgs":
        opt = torch.optim.LBFGS(
            params,
            lr=lr,
            max_iter=n_steps,
            tolerance_grad=1e-12,
            tolerance_change=1e-15,
            history_size=50,
            line_search_fn="strong_wolfe",
        )

        def closure() -> Tensor:
            opt.zero_grad()
            loss = objective()
            loss.backward()
            history.append(loss.item())
            return loss

        opt.step(closure)
    else:
        raise ValueError(f"optimizer must be 'adam' or 'lbfgs', got {optimizer!r}")
    return history


def train_map(
    model: nn.Module,
    X: Tensor,
    y: Tensor,
    likelihood: str = "regression",
    sigma_noise: float = 1.0,
    prior_precision: float = 1.0,
    n_steps: int = 2000,
    lr: float = 1e-2,
    optimizer: str = "adam",
) -> list[float]:
    """Train ``model`` to the MAP of :func:`map_objective`; returns the loss history."""
    return minimize(
        model,
        lambda: map_objective(model, X, y, likelihood, sigma_noise, prior_precision),
        n_steps=n_steps,
        lr=lr,
        optimizer=optimizer,
    )


def fit_map(
    model: nn.Module,
    X: Tensor,
    y: Tensor,
    likelihood: str = "regression",
    sigma_noise: float = 1.0,
    prior_precision: float = 1.0,
    adam_steps: int = 1000,
    lbfgs_steps: int = 1500,
    lr: float = 1e-2,
) -> nn.Module:
    """Train to the MAP the way the notebooks do: Adam to get close, then L-BFGS to
    converge tightly.

    A converged mode is what Laplace expands around, and it makes printed numbers
    reproducible. ``lbfgs_steps=0`` skips the polish. Returns ``model``.
    """
    train_map(
        model, X, y, likelihood, sigma_noise, prior_precision, n_steps=adam_steps, lr=lr
    )
    if lbfgs_steps:
        train_map(
            model,
            X,
            y,
            likelihood,
            sigma_noise,
            prior_precision,
            n_steps=lbfgs_steps,
            lr=1.0,
            optimizer="lbfgs",
        )
    return model


def gradient_ratio(
    model: nn.Module,
    X: Tensor,
    y: Tensor,
    likelihood: str = "regression",
    sigma_noise: float = 1.0,
    prior_precision: float = 1.0,
) -> float:
    """‖∇θ of :func:`map_objective`‖ / ‖∇θ of its data term‖ at the model's weights.

    0 at a mode of the objective, about 1 where the prior's pull is unbalanced
    (notebook 05b, which builds it; at a ReLU kink autograd's gradient stays non-zero).
    X: (N, ...) inputs, y: (N, ...) targets."""
    params = [p for p in model.parameters() if p.requires_grad]

    def norm(objective: Tensor) -> Tensor:
        grads = torch.autograd.grad(objective, params)
        return torch.cat([g.ravel() for g in grads]).norm()

    data_term = get_likelihood(likelihood, sigma_noise).nll(model(X), y)
    objective = map_objective(model, X, y, likelihood, sigma_noise, prior_precision)
    return (norm(objective) / norm(data_term)).item()


def converge_to_mode(
    model: nn.Module,
    X: Tensor,
    y: Tensor,
    likelihood: str = "regression",
    sigma_noise: float = 1.0,
    prior_precision: float = 1.0,
    runs: int = 8,
    steps: int = 1500,
    rtol: float = 1e-9,
) -> list[float]:
    """More runs of ``steps`` L-BFGS iterations on :func:`map_objective`, until one
    lowers it by less than ``rtol`` of itself (notebook 05b's test of a mode) or
    ``runs`` are done. Trains ``model`` in place; returns the objective before each
    run and after the last (length: runs made + 1)."""
    args = (model, X, y, likelihood, sigma_noise, prior_precision)
    with torch.no_grad():
        seen = [map_objective(*args).item()]
    for _ in range(runs):
        train_map(*args, n_steps=steps, lr=1.0, optimizer="lbfgs")
        with torch.no_grad():
            seen.append(map_objective(*args).item())
        if (seen[-2] - seen[-1]) / abs(seen[-2]) < rtol:
            break
    return seen


def train_minibatch(
    model: nn.Module,
    X: Tensor,
    y: Tensor,
    likelihood: str = "classification",
    epochs: int = 60,
    batch_size: int = 128,
    lr: float = 1e-3,
    weight_decay: float = 5e-4,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` the way practitioners do: Adam on the *mean* loss with weight
    decay ``wd``, shuffled mini-batches, ``epochs`` passes with a cosine decay of the
    learning rate to 0. Returns the mean training loss of every epoch (without the
    decay term); the model is left in eval mode.

    X: (N, ...) inputs, y: (N,) labels (classification) or (N, K) targets. The decay is
    Adam's ``weight_decay`` (added to the gradient: an L2 penalty ½ wd ‖θ‖² on the mean
    loss), so a stationary point is the MAP with δ = N·wd for the mean cross-entropy
    (:func:`weight_decay_to_prior_precision`). AdamW's *decoupled* decay has no such δ.
    The batches come from a generator seeded with ``seed``: the same run every time.
    """
    lik = get_likelihood(likelihood)
    loader = DataLoader(
        TensorDataset(X, y),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs * len(loader))
    model.train()
    losses = []
    for _ in range(epochs):
        total = 0.0
        for xb, yb in loader:
            opt.zero_grad()
            loss = lik.mean_loss(model(xb), yb)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(yb)
        losses.append(total / len(y))
    model.eval()
    return losses
