"""Notebook 05b's two inline tuning rules equal the module's on a small case.

The validation grid search, scored on the eigen route, picks the δ and gives the
validation NLL that ``Laplace.optimize_prior_precision(method="gridsearch")`` and the
module's GLM predictive give; the layerwise evidence by the determinant lemma (an r×r
determinant from the eigendecomposition of H) equals ``log_marginal_likelihood`` with a
prior precision per parameter tensor (a P×P Cholesky factor).
"""

import parity
import pytest
import torch
from conftest import mlp
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs
from laplace_from_scratch import helpers


@pytest.fixture(autouse=True)
def _float64():
    """The notebook's default dtype."""
    with parity.float64_default():
        yield


def _fitted(sigma=0.3):
    data = helpers.sinusoid(n=40, seed=0)
    model = mlp(1, 1, width=6)
    model.eval()
    la = lfs.Laplace(model, "regression", sigma_noise=sigma, prior_precision=1.0)
    la.fit(DataLoader(TensorDataset(data.X_train, data.y_train), batch_size=20))
    return la


def test_inline_grid_search_equals_the_modules():
    sigma = 0.3
    la = _fitted(sigma)
    eig = la.structure.eigen
    val = helpers.sinusoid(n=15, seed=2)
    J = lfs.jacobian(la.weights.f, la.mean, val.X_train)
    with torch.no_grad():
        f_mu = la.weights.f(la.mean, val.X_train)

    def val_nll(delta):  # as in notebook 05b
        var = eig.functional_variance(J, delta, 1 / sigma**2)[:, 0, 0] + sigma**2
        normal = torch.distributions.Normal(f_mu, var.sqrt()[:, None])
        return -normal.log_prob(val.y_train).mean()

    grid = torch.logspace(-4, 4, 9)
    scores = torch.stack([val_nll(d) for d in grid])
    for delta, score in zip(grid, scores, strict=True):  # the module's predictive
        la.prior_precision = delta
        mu, var = la(val.X_train)
        std = (var[:, :, 0] + sigma**2).sqrt()
        nll = -torch.distributions.Normal(mu, std).log_prob(val.y_train).mean()
        # the eigen route against the module's Cholesky route: round-off (2.4e-10 on an AVX-512 Xeon)
        assert abs(nll - score).item() < 1e-9
    la.optimize_prior_precision(
        method="gridsearch",
        val_loader=DataLoader(TensorDataset(val.X_train, val.y_train), batch_size=8),
        log_prior_prec_min=-4,
        log_prior_prec_max=4,
        grid_size=9,
    )
    assert la.prior_precision.item() == grid[scores.argmin()].item()


def test_layerwise_evidence_by_the_lemma_equals_the_modules():
    sigma = 0.4
    la = _fitted(sigma)
    eig = la.structure.eigen
    sizes, theta = torch.tensor(la.param_sizes), la.mean.detach()

    def log_evidence_layerwise(delta_l):  # as in notebook 05b
        p0 = delta_l.repeat_interleave(sizes)
        B = eig.eigvecs * eig.eigvals.sqrt() / sigma
        small = torch.eye(B.shape[1]) + B.T @ (B / p0[:, None])
        return la.log_likelihood - 0.5 * (torch.logdet(small) + p0 @ theta**2)

    delta_l = torch.tensor([0.3, 2.0, 0.05, 7.0, 1.0, 0.5])
    assert len(sizes) == len(delta_l)
    expected = la.log_marginal_likelihood(delta_l, sigma)
    assert abs(log_evidence_layerwise(delta_l) - expected).item() < 1e-8
    # and its gradient in the layerwise δ
    d = delta_l.clone().requires_grad_()
    (g_inline,) = torch.autograd.grad(log_evidence_layerwise(d), d)
    d = delta_l.clone().requires_grad_()
    (g_module,) = torch.autograd.grad(la.log_marginal_likelihood(d, sigma), d)
    torch.testing.assert_close(g_inline, g_module, rtol=1e-8, atol=1e-10)
