"""Weight decay ⇔ prior precision: the mean-loss objective and the MAP objective agree."""

import math

import pytest
import torch
from conftest import mlp

from laplace_from_scratch import flatten_params
from laplace_from_scratch.helpers import (
    converge_to_mode,
    gradient_ratio,
    map_objective,
    mean_objective,
    minimize,
    prior_precision_to_weight_decay,
    sinusoid,
    toy_nonlinear,
    weight_decay_to_prior_precision,
)


def _regression():
    d = sinusoid(n=40, dtype=torch.float64)
    return d.X_train, d.y_train


def _classification():
    d = toy_nonlinear(n=40, dtype=torch.float64)
    return d.X, d.y


@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_objectives_are_proportional(likelihood):
    """L_MAP(θ) = c·L_mean(θ) + const for every θ, with c = N (class.) or N·K/(2σ²) (regr.)."""
    X, y = _regression() if likelihood == "regression" else _classification()
    N, sigma, wd = X.shape[0], 0.4, 3e-3
    delta = weight_decay_to_prior_precision(wd, N, likelihood, sigma_noise=sigma)
    c = N / (2 * sigma**2) if likelihood == "regression" else N
    model = mlp(X.shape[1], 1 if likelihood == "regression" else 2)
    values = []
    for _ in range(3):
        for p in model.parameters():
            p.data.normal_()
        values.append(
            (
                map_objective(model, X, y, likelihood, sigma, delta)
                - c * mean_objective(model, X, y, likelihood, wd)
            ).item()
        )
    # the difference is the normalising constant of the Gaussian likelihood (0 for classification)
    const = N * math.log(sigma * math.sqrt(2 * math.pi)) if likelihood == "regression" else 0.0
    assert values == pytest.approx([const] * 3, rel=1e-12, abs=1e-9)


def test_ridge_regression_closed_form():
    """Convex case: mean MSE + wd trained by L-BFGS equals the closed-form MAP with δ from the mapping."""
    X, y = _regression()
    N, sigma, wd = X.shape[0], 0.4, 1e-2
    delta = weight_decay_to_prior_precision(wd, N, "regression", sigma_noise=sigma)
    model = torch.nn.Linear(1, 1).double()
    minimize(
        model, lambda: mean_objective(model, X, y, "regression", wd), n_steps=200, lr=1, optimizer="lbfgs"
    )
    # MAP of y = w x + b + ε with prior N(0, δ⁻¹ I) on (w, b): (ΦᵀΦ/σ² + δ I)⁻¹ Φᵀy/σ²
    Phi = torch.cat([X, torch.ones_like(X)], 1)
    theta = torch.linalg.solve(
        Phi.T @ Phi / sigma**2 + delta * torch.eye(2, dtype=X.dtype), Phi.T @ y / sigma**2
    )
    torch.testing.assert_close(flatten_params(model), theta.ravel(), rtol=1e-8, atol=1e-10)


def test_logistic_regression_optima_coincide():
    """Convex case (L2 makes it strictly convex): both objectives, from different starts, same θ*."""
    X, y = _classification()
    N, wd = X.shape[0], 1e-2
    delta = weight_decay_to_prior_precision(wd, N, "classification")
    a, b = torch.nn.Linear(2, 2).double(), torch.nn.Linear(2, 2).double()
    minimize(a, lambda: mean_objective(a, X, y, "classification", wd), n_steps=300, lr=1, optimizer="lbfgs")
    minimize(
        b, lambda: map_objective(b, X, y, "classification", 1.0, delta), n_steps=300, lr=1, optimizer="lbfgs"
    )
    torch.testing.assert_close(flatten_params(a), flatten_params(b), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_mlp_mean_loss_optimum_is_a_map_stationary_point(likelihood):
    """Non-convex case: train with mean loss + wd; there, the MAP objective with δ(wd) is stationary too."""
    X, y = _regression() if likelihood == "regression" else _classification()
    N, sigma, wd = X.shape[0], 0.4, 3e-2
    delta = weight_decay_to_prior_precision(wd, N, likelihood, sigma_noise=sigma)
    model = mlp(X.shape[1], 1 if likelihood == "regression" else 2, width=6)
    minimize(
        model, lambda: mean_objective(model, X, y, likelihood, wd), n_steps=3000, lr=1, optimizer="lbfgs"
    )
    theta_mean = flatten_params(model)
    g_mean = torch.autograd.grad(mean_objective(model, X, y, likelihood, wd), list(model.parameters()))
    assert max(t.abs().max().item() for t in g_mean) < 1e-6
    # continuing from there on the MAP objective does not move θ
    minimize(
        model,
        lambda: map_objective(model, X, y, likelihood, sigma, delta),
        n_steps=200,
        lr=1,
        optimizer="lbfgs",
    )
    torch.testing.assert_close(flatten_params(model), theta_mean, rtol=1e-5, atol=1e-5)
    # while a wrong δ (weight decay used as δ directly) does move it
    minimize(
        model, lambda: map_objective(model, X, y, likelihood, sigma, wd), n_steps=200, lr=1, optimizer="lbfgs"
    )
    assert (flatten_params(model) - theta_mean).abs().max() > 1e-2


def test_mapping_round_trip_and_values():
    assert weight_decay_to_prior_precision(1e-3, 500, "classification") == pytest.approx(0.5)
    assert weight_decay_to_prior_precision(1e-3, 500, "regression", sigma_noise=0.5) == pytest.approx(1.0)
    delta = weight_decay_to_prior_precision(2e-4, 150, "regression", sigma_noise=0.3, n_outputs=2)
    assert prior_precision_to_weight_decay(
        delta, 150, "regression", sigma_noise=0.3, n_outputs=2
    ) == pytest.approx(2e-4)
    with pytest.raises(ValueError, match="likelihood"):
        weight_decay_to_prior_precision(1e-3, 10, "poisson")


def test_minimize_rejects_unknown_optimizer():
    model = mlp(1, 1)
    with pytest.raises(ValueError, match="optimizer"):
        minimize(model, lambda: model(torch.zeros(1, 1, dtype=torch.float64)).sum(), optimizer="sgd")


def test_train_minibatch_reaches_the_map_of_delta_n_times_wd():
    """Adam's (coupled) weight decay on the mean loss: with full batches and the learning rate
    decayed to 0, training ends at a stationary point of the summed NLL + ½ N·wd ‖θ‖²."""
    from laplace_from_scratch.helpers import train_minibatch

    X, y = _classification()
    N, wd = X.shape[0], 1e-2
    model = mlp(X.shape[1], 2, width=6)
    losses = train_minibatch(model, X, y, epochs=3000, batch_size=N, lr=1e-2, weight_decay=wd)
    assert len(losses) == 3000 and losses[-1] < losses[0] and not model.training

    def largest_gradient(delta: float) -> float:
        objective = map_objective(model, X, y, "classification", 1.0, delta)
        return max(g.abs().max().item() for g in torch.autograd.grad(objective, list(model.parameters())))

    g_map = largest_gradient(weight_decay_to_prior_precision(wd, N))
    g_wrong = largest_gradient(wd)  # the decay taken as δ itself
    print(f"max |gradient|: δ = N·wd {g_map:.1e} (tolerance 1e-3), δ = wd {g_wrong:.1e}")
    assert g_map < 1e-3 and g_wrong > 100 * g_map


def test_train_minibatch_is_repeatable_and_shuffles_by_seed():
    from laplace_from_scratch import helpers
    from laplace_from_scratch.helpers import train_minibatch

    X, y = _classification()
    runs = []
    for seed in (0, 0, 1):  # the same initial weights each time; the batch order varies
        model = helpers.mlp(X.shape[1], 2, width=6, seed=0, dtype=torch.float64)
        train_minibatch(model, X, y, epochs=3, batch_size=8, seed=seed)
        runs.append(flatten_params(model))
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    assert (runs[0] - runs[2]).abs().max() > 1e-6


def test_gradient_ratio_is_zero_at_the_ridge_map_and_one_without_data():
    """At the closed-form ridge MAP the objective's gradient vanishes (ratio ~ 0); with a
    huge prior at θ = θ_ridge the prior term dominates (ratio far from 0)."""
    X, y = _regression()
    sigma, delta = 0.4, 2.0
    Phi = torch.cat([X, torch.ones_like(X)], 1)
    theta = torch.linalg.solve(
        Phi.T @ Phi / sigma**2 + delta * torch.eye(2, dtype=X.dtype), Phi.T @ y / sigma**2
    )
    model = torch.nn.Linear(1, 1).double()
    with torch.no_grad():
        model.weight.copy_(theta[:1].reshape(1, 1))
        model.bias.copy_(theta[1:].reshape(1))
    at_map = gradient_ratio(model, X, y, "regression", sigma, delta)
    assert at_map < 1e-8, at_map
    off = gradient_ratio(model, X, y, "regression", sigma, 1e6 * delta)
    assert off > 1.0, off


def test_converge_to_mode_stops_when_a_run_no_longer_lowers_the_objective():
    """Logistic regression with a prior is strictly convex: the runs end early at the
    mode (ratio ~ 0), the objective never rises, and the history has one entry per run
    plus the start."""
    X, y = _classification()
    model = torch.nn.Linear(2, 2).double()
    seen = converge_to_mode(model, X, y, "classification", prior_precision=0.5, runs=5, steps=50)
    assert 2 <= len(seen) <= 6
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(seen, seen[1:], strict=False))
    assert len(seen) < 6 or (seen[-2] - seen[-1]) / abs(seen[-2]) < 1e-9
    ratio = gradient_ratio(model, X, y, "classification", prior_precision=0.5)
    assert ratio < 1e-5, ratio
