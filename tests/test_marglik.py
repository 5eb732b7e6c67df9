"""The evidence: eigen (and dual) route vs Cholesky, gradients vs finite differences, optimisation."""

import pytest
import torch
from conftest import mlp
from torch.utils.data import DataLoader, TensorDataset

from laplace_from_scratch import EigenPosterior
from laplace_from_scratch.curvature import ggn, whitened_batches
from laplace_from_scratch.full import EigenRoute, FullPosterior
from laplace_from_scratch.functional import make_functional
from laplace_from_scratch.helpers import sinusoid, toy_nonlinear, train_map
from laplace_from_scratch.laplace import Laplace
from laplace_from_scratch.likelihoods import Categorical, Gaussian

D = torch.float64


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def _regression_la(n=80, width=10, route="auto"):
    torch.manual_seed(0)
    d = sinusoid(n=n, dtype=D)
    model = mlp(1, 1, width=width)
    train_map(model, d.X_train, d.y_train, "regression", 0.3, 1.0, n_steps=300, lr=1e-2)
    la = Laplace(model, "regression", sigma_noise=0.3, prior_precision=1.0, evidence_route=route)
    la.fit(DataLoader(TensorDataset(d.X_train, d.y_train), batch_size=32))
    return la


@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_dual_route_equals_eigh_of_H(likelihood):
    if likelihood == "regression":
        model, lik = mlp(1, 1, width=10), Gaussian(1.0)
        X = sinusoid(n=40, dtype=D).X_train
    else:
        model, lik = mlp(2, 3, width=10), Categorical()
        X = toy_nonlinear(n=30, dtype=D).X
    f, theta = make_functional(model)
    Jw = torch.cat(list(whitened_batches(f, theta, X, lik)))
    H = ggn(f, theta, X, lik)
    assert _rel(Jw.T @ Jw, H) < 1e-10  # Λ^½ by eigh vs Λ itself: round-off only
    dual, full = EigenPosterior.from_jacobians(Jw), EigenPosterior.from_H(H)
    assert dual.eigvecs.shape[1] <= Jw.shape[0] < theta.numel()
    J = torch.randn(5, 2, theta.numel(), dtype=D)
    # both routes get each eigenvalue to ~eps·λ_max absolute (here ~1e-11), so derived quantities
    # agree to ~1e-9 relative; 1e-7 leaves a margin for the conditioning of the covariance
    for delta, sigma in [(1.0, 0.3), (1e-2, 1.0), (30.0, 2.0)]:
        c = 1 / sigma**2
        assert _rel(dual.log_det(delta, c), full.log_det(delta, c)) < 1e-9
        assert _rel(dual.covariance(delta, c), full.covariance(delta, c)) < 1e-7
        assert _rel(dual.functional_variance(J, delta, c), full.functional_variance(J, delta, c)) < 1e-7


def test_eigen_route_equals_cholesky_route_value_gradients_and_optimum():
    eig, chol = _regression_la(route="eigen"), _regression_la(route="cholesky")
    grads = []
    for la in (eig, chol):
        log_d = torch.tensor(0.4, dtype=D, requires_grad=True)
        log_s = torch.tensor(-1.1, dtype=D, requires_grad=True)
        lml = la.log_marginal_likelihood(log_d.exp(), log_s.exp())
        grads.append((lml.detach(), *torch.autograd.grad(lml, [log_d, log_s])))
    for a, b in zip(*grads, strict=True):  # same math, different eigen/Cholesky round-off: ~1e-10
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    for la in (eig, chol):
        la.sigma_noise = 0.3
        la.optimize_prior_precision()
    torch.testing.assert_close(eig.prior_precision, chol.prior_precision, rtol=1e-8, atol=0)


def test_auto_route_picks_eigen_for_scalar_and_cholesky_for_layerwise():
    la = _regression_la(n=30)  # N·K = 30 ≤ P/4 = 35: the whitened Jacobians are kept for the dual route
    post = la.structure
    assert isinstance(post, EigenRoute) and post.Jw is not None
    assert torch.equal(la.log_det_posterior_precision, post.eigen.log_det(la.prior_precision, la._c))
    la.prior_precision = torch.ones(la.n_param_tensors, dtype=D)
    cholesky = FullPosterior.log_det(post, la.prior_precision, la._c)
    assert torch.equal(la.log_det_posterior_precision, cholesky)
    strict = _regression_la(n=30, route="eigen")
    strict.prior_precision = torch.ones(la.n_param_tensors, dtype=D)
    with pytest.raises(ValueError, match="scalar"):
        strict.log_marginal_likelihood()


@pytest.mark.parametrize("structure", ["scalar", "layerwise"])
def test_evidence_gradients_match_finite_differences(structure):
    la = _regression_la()
    k = 1 if structure == "scalar" else la.n_param_tensors
    log_d = torch.linspace(-0.5, 0.8, k, dtype=D).reshape(() if k == 1 else (k,))
    log_s = torch.tensor(-1.0, dtype=D)

    def value(ld, ls):
        return la.log_marginal_likelihood(ld.exp(), ls.exp())

    ld, ls = log_d.clone().requires_grad_(True), log_s.clone().requires_grad_(True)
    g_d, g_s = torch.autograd.grad(value(ld, ls), [ld, ls])
    eps = 1e-5  # central differences in float64: truncation O(eps²), round-off O(1e-16·|lml|/eps)
    for i in range(k):
        e = torch.zeros(k, dtype=D).reshape(log_d.shape)
        e.view(-1)[i] = eps
        fd = (value(log_d + e, log_s) - value(log_d - e, log_s)).item() / (2 * eps)
        assert g_d.view(-1)[i].item() == pytest.approx(fd, rel=1e-6, abs=1e-8)
    fd_s = (value(log_d, log_s + eps) - value(log_d, log_s - eps)).item() / (2 * eps)
    assert g_s.item() == pytest.approx(fd_s, rel=1e-6)


def test_optimize_hyperparameters_reaches_a_stationary_point_of_the_evidence():
    la = _regression_la()
    la.prior_precision, la.sigma_noise = 1.0, 1.0
    history = la.optimize_hyperparameters(n_steps=500, lr=0.1)
    assert history[-1] > history[0]
    ld = la.prior_precision.log().clone().requires_grad_(True)
    ls = la.sigma_noise.log().clone().requires_grad_(True)
    g = torch.autograd.grad(la.log_marginal_likelihood(ld.exp(), ls.exp()), [ld, ls])
    assert max(abs(x.item()) for x in g) < 1e-3


def test_gridsearch_picks_the_best_validation_density_on_its_grid():
    la = _regression_la()
    d = sinusoid(n=60, seed=1, dtype=D)
    val = DataLoader(TensorDataset(d.X_train, d.y_train), batch_size=30)
    la.optimize_prior_precision(method="gridsearch", val_loader=val, grid_size=9)
    chosen = la.prior_precision.clone()
    grid = torch.logspace(-4, 4, 9, dtype=D)
    assert torch.isclose(grid, chosen).any()
    scores = []
    for delta in grid:
        la.prior_precision = delta
        mu, var = la(d.X_train)
        dist = torch.distributions.Normal(mu, (var[:, :, 0] + 0.09).sqrt())
        scores.append(-dist.log_prob(d.y_train).mean().item())
    assert grid[int(torch.tensor(scores).argmin())] == chosen
    with pytest.raises(ValueError, match="val_loader"):
        la.optimize_prior_precision(method="gridsearch")
    with pytest.raises(ValueError, match="method"):
        la.optimize_prior_precision(method="cv")
    la_c = Laplace(mlp(2, 2), "classification")
    la_c.fit(DataLoader(TensorDataset(torch.zeros(3, 2, dtype=D), torch.tensor([0, 1, 1])), batch_size=3))
    with pytest.raises(ValueError, match="regression"):
        la_c.optimize_hyperparameters()


def test_the_route_is_chosen_at_fit_by_its_rule_not_by_the_calls_after_it():
    """``evidence_route="auto"`` takes the eigen route when the whitened Jacobians were kept (N·K < P)
    and the Cholesky path otherwise, whatever δ the evidence is asked at later (a search); "eigen"
    takes it from one eigendecomposition of H there, to the same optimum."""
    la = _regression_la(n=200, width=5)  # P = 46 < N·K = 200: no dual, so the Cholesky path
    post = la.structure
    assert type(post) is FullPosterior and post.Jw is None
    keys, factor = [], post.L

    def spy(prior, c):
        keys.append(float(prior.detach()))
        return factor(prior, c)

    post.L = spy
    la.optimize_prior_precision(n_steps=3)
    # every step factors Σ⁻¹ at its own δ: one Cholesky per new δ, no eigendecomposition
    assert len(set(keys)) == 3 and la.structure is post and not hasattr(post, "eigen")
    eig = _regression_la(n=200, width=5, route="eigen")
    assert isinstance(eig.structure, EigenRoute) and eig.structure.Jw is None
    eig.optimize_prior_precision(n_steps=3)
    torch.testing.assert_close(eig.prior_precision, la.prior_precision, rtol=1e-8, atol=0)
