"""The Gaussian posterior: factorisations, sampling statistics, jitter, prior shapes."""

import math
import warnings

import pytest
import torch

from laplace_from_scratch.eigen import EigenPosterior
from laplace_from_scratch.posterior import (
    cholesky,
    covariance_from_cholesky,
    log_det_from_cholesky,
    posterior_precision,
    prior_precision_diag,
    sample_from_cholesky,
)

D = torch.float64


def _spd(P=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(P, P, generator=g, dtype=D)
    return A @ A.T + 0.5 * torch.eye(P, dtype=D)


def test_cholesky_quantities_against_dense_linear_algebra():
    A = _spd()
    L = cholesky(A)
    torch.testing.assert_close(L @ L.T, A, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(log_det_from_cholesky(L), torch.logdet(A), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(covariance_from_cholesky(L), torch.linalg.inv(A), rtol=1e-10, atol=1e-12)


def test_samples_have_the_posterior_covariance_not_its_square():
    """Pitfall 2 of the seeds: θ* + Σ ε has covariance Σ², the right sampler has Σ."""
    P, S = 4, 200_000
    prec = _spd(P)
    Sigma = torch.linalg.inv(prec)
    mean = torch.arange(P, dtype=D)
    g = torch.Generator().manual_seed(1)
    theta = sample_from_cholesky(mean, cholesky(prec), S, generator=g)
    assert theta.shape == (S, P)
    emp_cov = torch.cov(theta.T)
    # standard error of a sample covariance entry: √((Σᵢᵢ Σⱼⱼ + Σᵢⱼ²)/S); allow 5 of them
    se = ((Sigma.diagonal()[:, None] * Sigma.diagonal()[None, :] + Sigma**2) / S).sqrt()
    assert ((emp_cov - Sigma).abs() < 5 * se).all()
    assert ((theta.mean(0) - mean).abs() < 5 * (Sigma.diagonal() / S).sqrt()).all()
    # the seed's bug gives Σ², which this test distinguishes from Σ
    wrong = mean + torch.randn(S, P, generator=g, dtype=D) @ Sigma.T
    assert not ((torch.cov(wrong.T) - Sigma).abs() < 5 * se).all()
    torch.testing.assert_close(
        torch.cov(wrong.T), Sigma @ Sigma, rtol=0.05, atol=0.05 * Sigma.abs().max().item() ** 2
    )


@pytest.mark.parametrize("sigma, delta, T", [(1.0, 1.0, 1.0), (0.3, 0.5, 1.0), (0.3, 0.5, 2.0)])
def test_eigen_route_equals_cholesky_route(sigma, delta, T):
    H = _spd(8) - 0.5 * torch.eye(8, dtype=D)  # PSD like a GGN
    c = 1 / (sigma**2 * T)
    P = posterior_precision(H, torch.full((8,), delta, dtype=D), c)
    L = cholesky(P)
    eig = EigenPosterior.from_H(H)
    torch.testing.assert_close(eig.log_det(delta, c), log_det_from_cholesky(L), rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(eig.covariance(delta, c), covariance_from_cholesky(L), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(eig.precision(delta, c), P, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        eig.variance(delta, c), covariance_from_cholesky(L).diagonal(), rtol=1e-9, atol=0
    )
    theta = eig.sample(100_000, delta, c, generator=torch.Generator().manual_seed(0))
    Sigma = covariance_from_cholesky(L)
    se = ((Sigma.diagonal()[:, None] * Sigma.diagonal()[None, :] + Sigma**2) / 100_000).sqrt()
    assert ((torch.cov(theta.T) - Sigma).abs() < 5 * se).all()


def test_eigen_route_rejects_non_scalar_prior():
    eig = EigenPosterior.from_H(_spd(3))
    with pytest.raises(ValueError, match="scalar"):
        eig.log_det(torch.ones(3, dtype=D))


def test_jitter_is_added_with_a_warning_and_never_nans():
    v = torch.tensor([1.0, 2.0, 3.0], dtype=D)
    A = torch.outer(v, v)  # rank 1: PSD but singular
    with pytest.warns(RuntimeWarning, match="jitter"):
        L = cholesky(A)
    assert torch.isfinite(L).all()
    torch.testing.assert_close(L @ L.T, A, rtol=0, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cholesky(_spd())  # no warning for a healthy matrix
    with pytest.raises(ValueError, match="positive definite"):
        cholesky(-torch.eye(3, dtype=D))


def test_prior_precision_shapes():
    sizes = [6, 3, 2]
    torch.testing.assert_close(
        prior_precision_diag(torch.tensor(2.0, dtype=D), sizes), torch.full((11,), 2.0, dtype=D)
    )
    layer = prior_precision_diag(torch.tensor([1.0, 2.0, 3.0], dtype=D), sizes)
    torch.testing.assert_close(layer, torch.tensor([1.0] * 6 + [2.0] * 3 + [3.0] * 2, dtype=D))
    per_param = torch.linspace(1, 2, 11, dtype=D)
    torch.testing.assert_close(prior_precision_diag(per_param, sizes), per_param)
    with pytest.raises(ValueError, match="one per parameter tensor"):
        prior_precision_diag(torch.ones(4), sizes)
    with pytest.raises(ValueError, match="positive"):
        prior_precision_diag(-1.0, sizes)


def test_posterior_precision_convention():
    H = _spd(3)
    P = posterior_precision(H, torch.tensor([1.0, 2.0, 3.0], dtype=D), 1 / (0.5**2 * 2.0))
    torch.testing.assert_close(P, H / (0.25 * 2.0) + torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=D)))
    assert math.isclose(P[0, 1].item(), H[0, 1].item() * 2.0)


def test_full_laplace_runs_the_functions_notebook_03_prints(monkeypatch):
    """``Laplace(hessian_structure="full")`` calls the very functions notebook 03 builds and prints."""
    from collections import Counter

    from conftest import mlp

    import laplace_from_scratch as lfs
    from laplace_from_scratch import full
    from laplace_from_scratch import posterior as post

    names = [
        "posterior_precision",
        "cholesky",
        "log_det_from_cholesky",
        "sample_from_cholesky",
        "covariance_from_cholesky",
    ]
    calls = Counter()

    def spying(name):
        f = getattr(post, name)

        def spy(*args, **kwargs):
            calls[name] += 1
            return f(*args, **kwargs)

        return spy

    for name in names:  # the full structure calls notebook 03's functions themselves
        assert getattr(full, name) is getattr(post, name)
        monkeypatch.setattr(full, name, spying(name))
    torch.manual_seed(0)
    model = mlp(1, 1, width=4)  # P = 13 < N·K = 40: no dual route, so the evidence takes Cholesky
    X = torch.linspace(-2, 2, 40, dtype=D)[:, None]
    la = lfs.Laplace(model.to(D), "regression", sigma_noise=0.3, prior_precision=0.7)
    la.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, X.sin()), batch_size=20))
    evidence_log_det = la.log_det_posterior_precision
    la.sample(3)
    assert la.posterior_covariance.shape == (la.n_params, la.n_params)
    assert all(calls[n] >= 1 for n in names), calls
    direct = log_det_from_cholesky(cholesky(posterior_precision(la.H, la.prior_precision_diag, la._c)))
    torch.testing.assert_close(evidence_log_det, direct, rtol=0, atol=0)
