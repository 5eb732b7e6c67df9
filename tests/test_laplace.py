"""The Laplace object: exact Bayesian linear regression, predictive Monte Carlo, bad input."""

import math

import pytest
import torch
from conftest import mlp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from laplace_from_scratch import vector_to_model
from laplace_from_scratch.helpers import sinusoid, train_map
from laplace_from_scratch.laplace import Laplace

D = torch.float64


def _loader(X, y, bs=32):
    return DataLoader(TensorDataset(X, y), batch_size=bs)


def _blr_problem(sigma=0.4, delta=2.0):
    """y = Φθ + ε with Φ = [x, 1]: Laplace is exact. θ* is set to the closed-form posterior mean."""
    d = sinusoid(n=60, dtype=D)
    X, y = d.X_train / 10, d.y_train
    Phi = torch.cat([X, torch.ones_like(X)], 1)
    prec = Phi.T @ Phi / sigma**2 + delta * torch.eye(2, dtype=D)
    mean = torch.linalg.solve(prec, Phi.T @ y / sigma**2).ravel()
    model = nn.Linear(1, 1).to(D)
    vector_to_model(mean, model)
    return model, X, y, Phi, prec, mean


def test_bayesian_linear_regression_is_exact():
    sigma, delta = 0.4, 2.0
    model, X, y, Phi, prec, mean = _blr_problem(sigma, delta)
    la = Laplace(model, "regression", sigma_noise=sigma, prior_precision=delta)
    la.fit(_loader(X, y))
    torch.testing.assert_close(la.mean, mean, rtol=0, atol=0)
    torch.testing.assert_close(la.posterior_precision, prec, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(la.posterior_covariance, torch.linalg.inv(prec), rtol=1e-10, atol=1e-12)
    # exact evidence: y ~ N(0, σ² I + Φ Φᵀ / δ)
    N = X.shape[0]
    cov_y = sigma**2 * torch.eye(N, dtype=D) + Phi @ Phi.T / delta
    exact = torch.distributions.MultivariateNormal(torch.zeros(N, dtype=D), cov_y).log_prob(y.ravel())
    torch.testing.assert_close(la.log_marginal_likelihood(), exact, rtol=1e-10, atol=1e-10)
    # exact predictive: f(x*) ~ N(φ*ᵀθ*, φ*ᵀ Σ φ*)
    xs = torch.linspace(-2, 2, 7, dtype=D).unsqueeze(-1)
    Phis = torch.cat([xs, torch.ones_like(xs)], 1)
    f_mu, f_var = la(xs)
    torch.testing.assert_close(f_mu.ravel(), Phis @ mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        f_var[:, 0, 0], ((Phis @ torch.linalg.inv(prec)) * Phis).sum(-1), rtol=1e-10, atol=1e-12
    )


def test_evidence_is_differentiable_in_hyperparameters():
    model, X, y, *_ = _blr_problem()
    la = Laplace(model, "regression")
    la.fit(_loader(X, y))
    log_delta = torch.tensor(0.3, dtype=D, requires_grad=True)
    log_sigma = torch.tensor(-1.0, dtype=D, requires_grad=True)
    lml = la.log_marginal_likelihood(log_delta.exp(), log_sigma.exp())
    g_delta, g_sigma = torch.autograd.grad(lml, [log_delta, log_sigma])

    def value(ld, ls):
        return la.log_marginal_likelihood(
            torch.tensor(ld, dtype=D).exp(), torch.tensor(ls, dtype=D).exp()
        ).item()

    eps = 1e-5  # central differences: truncation O(eps²) ≈ 1e-10
    fd_delta = (value(0.3 + eps, -1.0) - value(0.3 - eps, -1.0)) / (2 * eps)
    fd_sigma = (value(0.3, -1.0 + eps) - value(0.3, -1.0 - eps)) / (2 * eps)
    assert g_delta.item() == pytest.approx(fd_delta, rel=1e-6)
    assert g_sigma.item() == pytest.approx(fd_sigma, rel=1e-6)


def _mlp_laplace(sigma=0.3, delta=1.0):
    torch.manual_seed(0)
    d = sinusoid(n=80, dtype=D)
    model = mlp(1, 1, width=10)
    train_map(model, d.X_train, d.y_train, "regression", sigma, delta, n_steps=300, lr=1e-2)
    la = Laplace(model, "regression", sigma_noise=sigma, prior_precision=delta)
    la.fit(_loader(d.X_train, d.y_train))
    return la, d


def test_sample_statistics_match_the_posterior():
    la, _ = _mlp_laplace()
    S = 100_000
    theta = la.sample(S, generator=torch.Generator().manual_seed(0))
    Sigma = la.posterior_covariance
    se_mean = (Sigma.diagonal() / S).sqrt()
    assert ((theta.mean(0) - la.mean).abs() < 5 * se_mean).all()
    se = ((Sigma.diagonal()[:, None] * Sigma.diagonal()[None, :] + Sigma**2) / S).sqrt()
    # 5 standard errors per entry; with P² ≈ 20k entries a few may exceed 4, none should exceed 5.5
    assert ((torch.cov(theta.T) - Sigma).abs() < 5.5 * se).all()


def test_mc_over_the_linearised_model_converges_to_closed_form():
    la, d = _mlp_laplace()
    xs = d.X_test[::50]
    f_mu, f_var = la(xs)
    S = 100_000
    f = la.glm_samples(xs, S, generator=torch.Generator().manual_seed(0))  # (S, N, 1)
    var = f_var[:, 0, 0]
    # standard errors: mean √(var/S), variance var·√(2/S) (Gaussian outputs)
    assert ((f.mean(0)[:, 0] - f_mu[:, 0]).abs() < 5 * (var / S).sqrt()).all()
    assert ((f.var(0)[:, 0] - var).abs() < 5 * var * math.sqrt(2 / S)).all()


def test_nn_sampling_equals_glm_for_a_model_linear_in_its_weights():
    """For f linear in θ the network is its own linearisation: NN sampling → closed form."""
    model, X, y, *_ = _blr_problem()
    la = Laplace(model, "regression", sigma_noise=0.4, prior_precision=2.0)
    la.fit(_loader(X, y))
    xs = torch.linspace(-3, 3, 5, dtype=D).unsqueeze(-1)
    f_mu, f_var = la(xs)
    S = 200_000
    g = torch.Generator().manual_seed(0)
    nn_mean, nn_var = la(xs, pred_type="nn", link_approx="mc", n_samples=S, generator=g)
    var = f_var[:, 0, 0]
    assert ((nn_mean[:, 0] - f_mu[:, 0]).abs() < 5 * (var / S).sqrt()).all()
    assert ((nn_var[:, 0] - var).abs() < 5 * var * math.sqrt(2 / S)).all()


def test_bad_input_raises_clear_errors():
    model = mlp(1, 1)
    with pytest.raises(ValueError, match="likelihood"):
        Laplace(model, "poisson")
    with pytest.raises(ValueError, match="hessian_structure"):
        Laplace(model, "regression", hessian_structure="block")
    with pytest.raises(ValueError, match="subset_of_weights"):
        Laplace(model, "regression", subset_of_weights="first_layer")
    with pytest.raises(ValueError, match="hessian_structure"):
        Laplace(model, "regression", hessian_structure="functional")
    with pytest.raises(TypeError, match="needs subnetwork_indices"):
        Laplace(model, "regression", subset_of_weights="subnetwork")
    with pytest.raises(ValueError, match="nn.Linear"):
        Laplace(
            torch.nn.Sequential(torch.nn.Linear(1, 2), torch.nn.Tanh()),
            "regression",
            subset_of_weights="last_layer",
        )
    with pytest.raises(ValueError, match="sigma_noise"):
        Laplace(model, "regression", sigma_noise=-1.0)
    with pytest.raises(ValueError, match="sigma_noise"):
        Laplace(mlp(1, 2), "classification", sigma_noise=0.5)
    with pytest.raises(ValueError, match="prior_precision"):
        Laplace(model, "regression", prior_precision=torch.ones(5))
    with pytest.raises(ValueError, match="temperature"):
        Laplace(model, "regression", temperature=0.0)
    with pytest.raises(ValueError, match="prior_mean"):
        Laplace(model, "regression", prior_mean=torch.zeros(3))
    la = Laplace(model, "regression")
    for use in [
        lambda: la.posterior_precision,
        lambda: la.log_marginal_likelihood(),
        lambda: la(torch.zeros(2, 1, dtype=D)),
        lambda: la.sample(3),
    ]:
        with pytest.raises(RuntimeError, match="fit"):
            use()
    X, y = torch.zeros(4, 1, dtype=D), torch.zeros(4, 1, dtype=D)
    with pytest.raises(ValueError, match="targets"):
        la.fit(_loader(X, torch.zeros(4, 2, dtype=D)))
    la.fit(_loader(X, y))
    with pytest.raises(ValueError, match="pred_type"):
        la(X, pred_type="laplace")
    with pytest.raises(ValueError, match="link_approx"):
        la(X, link_approx="softmax")
    with pytest.raises(ValueError, match="batch dimension"):
        la(torch.zeros(1, dtype=D))
    clf = Laplace(mlp(1, 3), "classification")
    with pytest.raises(ValueError, match="integers"):
        clf.fit(_loader(X, torch.zeros(4, dtype=D)))
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        clf.fit(_loader(X, torch.tensor([0, 1, 2, 3])))


def test_bayesian_linear_regression_evidence_optimum_is_the_exact_one():
    """δ tuned on the Laplace evidence equals the maximiser of the exact evidence (golden section)."""
    sigma = 0.4
    model, X, y, Phi, *_ = _blr_problem(sigma, 2.0)
    N = X.shape[0]

    def exact(delta):
        cov = sigma**2 * torch.eye(N, dtype=D) + Phi @ Phi.T / delta
        return torch.distributions.MultivariateNormal(torch.zeros(N, dtype=D), cov).log_prob(y.ravel()).item()

    lo, hi = -6.0, 6.0  # golden-section search on log δ
    for _ in range(80):
        a, b = hi - 0.618 * (hi - lo), lo + 0.618 * (hi - lo)
        lo, hi = (a, hi) if exact(math.exp(a)) < exact(math.exp(b)) else (lo, b)
    best = math.exp((lo + hi) / 2)
    # At θ*(δ̂) the Laplace evidence, as a function of δ with θ* held fixed, is stationary at the exact
    # optimum δ̂: dE/dδ = ∂L/∂δ + ∇_θL·dθ*/dδ and ∇_θL = 0 at the MAP. So tuning from δ = 1 finds δ̂.
    Phi_ = torch.cat([X, torch.ones_like(X)], 1)
    prec = Phi_.T @ Phi_ / sigma**2 + best * torch.eye(2, dtype=D)
    vector_to_model(torch.linalg.solve(prec, Phi_.T @ y / sigma**2).ravel(), model)
    la = Laplace(model, "regression", sigma_noise=sigma, prior_precision=1.0)
    la.fit(_loader(X, y))
    la.optimize_prior_precision(n_steps=1000, lr=0.05)
    assert la.prior_precision.item() == pytest.approx(best, rel=1e-4)


def test_prediction_cholesky_is_cached_and_follows_delta_sigma_and_refits():
    """f_var uses a cached factor of P: it must be the same as J Σ Jᵀ with a fresh Σ after every change."""
    la, d = _mlp_laplace()
    Xq = torch.linspace(-5, 15, 7, dtype=torch.float64).unsqueeze(-1)

    def fresh():
        from laplace_from_scratch import jacobian, jacobian_sandwich

        Sigma = torch.linalg.inv(la.posterior_precision)
        return jacobian_sandwich(jacobian(la.weights.f, la.mean, Xq), Sigma)

    for change in [
        None,
        ("prior_precision", 3.0),
        ("sigma_noise", 0.5),
        ("prior_precision", torch.tensor(0.2)),
    ]:
        if change:
            setattr(la, *change)
        torch.testing.assert_close(la(Xq)[1], fresh(), rtol=1e-8, atol=1e-12)
    assert la.structure.cache.value is not None
    la.fit(_loader(d.X_train[:40], d.y_train[:40]))  # a refit drops the cache
    assert la.structure.cache.value is None
    torch.testing.assert_close(la(Xq)[1], fresh(), rtol=1e-8, atol=1e-12)


def test_subnetwork_takes_full_and_diag_and_names_what_it_refuses():
    model = mlp(1, 1)
    idx = torch.arange(0, 20, 2)
    for structure in ("kron", "lowrank", "matfree"):
        with pytest.raises(ValueError, match="DiagSubnetLaplace"):
            Laplace(
                model, "regression", subset_of_weights="subnetwork",
                hessian_structure=structure, subnetwork_indices=idx,
            )  # fmt: skip


@pytest.mark.parametrize("structure", ["full", "diag"])
def test_subnetwork_samples_are_full_length_as_laplace_torchs(structure):
    """laplace-torch's SubnetLaplace.sample returns every weight: the subnetwork's drawn,
    the others at their fitted values (its assemble_full_samples). Ours the same, and
    its subnetwork entries are our draws over the subnetwork."""
    laplace = pytest.importorskip("laplace", reason="laplace-torch is installed by `make install`")
    torch.manual_seed(0)
    model = mlp(1, 1).double()
    X = torch.linspace(-2, 2, 30, dtype=torch.float64)[:, None]
    y = torch.sin(X)
    P = sum(p.numel() for p in model.parameters())
    idx = torch.arange(1, P, 5)
    kw = dict(subset_of_weights="subnetwork", hessian_structure=structure,
              subnetwork_indices=idx, sigma_noise=0.3, prior_precision=2.0)  # fmt: skip
    ours, ref = Laplace(model, "regression", **kw), laplace.Laplace(model, "regression", **kw)
    ours.fit(_loader(X, y))
    ref.fit(_loader(X, y))
    s_ours = ours.sample(7, generator=torch.Generator().manual_seed(1))
    s_ref = ref.sample(7, generator=torch.Generator().manual_seed(1))
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    rest = torch.ones(P, dtype=torch.bool)
    rest[idx] = False
    assert s_ours.shape == s_ref.shape == (7, P)
    assert torch.equal(s_ours[:, rest], s_ref[:, rest])
    assert torch.equal(s_ours[:, rest], theta[rest].expand(7, -1))
    draws = ours._draw(7, generator=torch.Generator().manual_seed(1))
    assert torch.equal(s_ours[:, idx], draws)


def test_subnetwork_samples_follow_the_trainable_weights_order():
    """subnetwork_indices index the trainable weights only (flatten_params); a frozen
    layer is not in the samples, and the other weights keep their values."""
    model = mlp(1, 1)
    model[0].requires_grad_(False)
    X = torch.linspace(-2, 2, 20, dtype=next(model.parameters()).dtype)[:, None]
    P = sum(p.numel() for p in model.parameters() if p.requires_grad)
    idx = torch.arange(0, P, 4)
    la = Laplace(model, "regression", subset_of_weights="subnetwork", subnetwork_indices=idx)
    la.fit(_loader(X, torch.sin(X)))
    s = la.sample(3, generator=torch.Generator().manual_seed(0))
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad])
    rest = torch.ones(P, dtype=torch.bool)
    rest[idx] = False
    assert s.shape == (3, P)
    assert torch.equal(s[:, rest], theta[rest].expand(3, -1))
