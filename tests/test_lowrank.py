"""Low-rank Laplace (lowrank.py) against the exact truncated eigendecomposition of the dense GGN, float64.

Tolerances: the top-k eigenpairs from Lanczos run to P steps are exact up to round-off, so the truncated
GGN V diag(λ) Vᵀ matches Σᵢ≤ₖ λᵢ qᵢqᵢᵀ from ``eigh`` to 1e-8 relative (measured ~1e-15); every posterior
quantity built from it matches the dense algebra with that truncated H to 1e-8. Samples: 5 standard
errors of a sample covariance.
"""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs
from laplace_from_scratch import helpers

D = torch.float64


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def problem():
    d = helpers.sinusoid(n=60, dtype=D)
    model = helpers.mlp(1, 1, width=8, seed=0, dtype=D)
    helpers.fit_map(model, d.X_train, d.y_train, "regression", 0.3, adam_steps=200, lbfgs_steps=50)
    loader = DataLoader(TensorDataset(d.X_train, d.y_train), batch_size=20)
    full = lfs.Laplace(model, "regression", sigma_noise=0.3)
    full.fit(loader)
    return model, loader, d, full.H


def truncated(H, k):
    lam, Q = torch.linalg.eigh(H)
    lam, Q = lam.flip(0)[:k], Q.flip(1)[:, :k]
    return (Q * lam) @ Q.T, lam


@pytest.mark.parametrize("rank", [3, 10])
@pytest.mark.parametrize("prior", ["scalar", "diag"])
def test_lowrank_equals_the_truncated_eigendecomposition(problem, rank, prior):
    model, loader, d, H = problem
    P = H.shape[0]
    p0 = torch.tensor(0.5, dtype=D) if prior == "scalar" else torch.linspace(0.1, 2.0, P, dtype=D)
    la = lfs.Laplace(
        model,
        "regression",
        hessian_structure="lowrank",
        sigma_noise=0.3,
        prior_precision=p0,
        rank=rank,
        n_iter=P,
    )
    la.fit(loader)
    Hk, lam = truncated(H, rank)
    V, ev = la.H
    assert V.shape == (P, rank) and rel(ev, lam) < 1e-8
    assert rel((V * ev) @ V.T, Hk) < 1e-8
    dense = Hk / 0.3**2 + torch.diag(p0.expand(P))
    Sigma = torch.linalg.inv(dense)
    assert rel(la.posterior_precision.to_matrix(), dense) < 1e-8
    assert rel(la.posterior_covariance.to_matrix(), Sigma) < 1e-8
    assert rel(la.posterior_variance, Sigma.diagonal()) < 1e-8
    assert abs(la.log_det_posterior_precision.item() - torch.logdet(dense).item()) < 1e-8 * abs(
        torch.logdet(dense).item()
    )
    J = la.jacobians(d.X_test[::100])
    assert rel(la.functional_variance(J), J @ Sigma @ J.mT) < 1e-8
    S = 20_000
    s = la.sample(S, generator=torch.Generator().manual_seed(0)) - la.mean
    C = s.T @ s / S
    se = (Sigma.diagonal()[:, None] * Sigma.diagonal()[None, :] / S).sqrt()  # ≥ the s.e. of each entry/√2
    assert ((C - Sigma).abs() < 5 * 1.5 * se).all()


def test_lowrank_evidence_is_differentiable_and_tunes(problem):
    model, loader, _, H = problem
    la = lfs.Laplace(model, "regression", hessian_structure="lowrank", sigma_noise=0.3, rank=10)
    la.fit(loader)
    log_d = torch.tensor(0.2, dtype=D, requires_grad=True)
    la.log_marginal_likelihood(log_d.exp()).backward()
    h = 1e-5
    fd = (
        la.log_marginal_likelihood(torch.exp(torch.tensor(0.2 + h, dtype=D)))
        - la.log_marginal_likelihood(torch.exp(torch.tensor(0.2 - h, dtype=D)))
    ) / (2 * h)
    assert abs(log_d.grad.item() / fd.item() - 1) < 1e-6
    la.optimize_prior_precision(n_steps=50)
    assert la.prior_precision.item() != 1.0


def test_lowrank_defaults_and_bad_options(problem):
    model, loader, *_ = problem
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        lfs.Laplace(model, "regression", hessian_structure="lowrank", rank=0).fit(loader)
    la = lfs.Laplace(model, "regression", hessian_structure="lowrank", rank=5)
    la.fit(loader)
    with pytest.raises(ValueError, match="cannot be updated"):
        la.fit(loader, override=False)
