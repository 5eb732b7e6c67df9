"""Diagonal and last-layer Laplace against the full GGN they approximate or restrict (independent of
laplace-torch; tests/test_reference_laplace_torch.py compares with it)."""

import pytest
import torch
from conftest import kron_block_matrix, mlp
from torch.utils.data import DataLoader, TensorDataset

from laplace_from_scratch import Categorical, Gaussian, Laplace, ggn, make_functional
from laplace_from_scratch.curvature import ggn_diagonal
from laplace_from_scratch.helpers import fit_map, sinusoid
from laplace_from_scratch.jacobians import jacobian, last_layer_jacobian
from laplace_from_scratch.weights import select_weights

D = torch.float64


def _loader(X, y, batch_size=40):
    return DataLoader(TensorDataset(X, y), batch_size=batch_size)


def _regression():
    d = sinusoid(n=60, dtype=D)
    model = mlp(1, 2, width=8)  # two outputs: Λ and the last-layer Jacobian have structure
    y = torch.cat([d.y_train, -d.y_train], -1)
    fit_map(model, d.X_train, y, "regression", 0.3, 1.0, adam_steps=200, lbfgs_steps=50)
    return model, d.X_train, y


def _classification():
    X = torch.randn(60, 2, dtype=D)
    y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()
    model = mlp(2, 3, width=8)
    fit_map(model, X, y, "classification", prior_precision=1.0, adam_steps=200, lbfgs_steps=50)
    return model, X, y


PROBLEMS = {"regression": _regression, "classification": _classification}
LIKS = {"regression": Gaussian(1.0), "classification": Categorical()}


@pytest.mark.parametrize("likelihood", PROBLEMS)
def test_ggn_diagonal_is_the_diagonal_of_the_ggn(likelihood):
    model, X, _ = PROBLEMS[likelihood]()
    f, theta = make_functional(model)
    G = ggn(f, theta, X, LIKS[likelihood])
    torch.testing.assert_close(ggn_diagonal(f, theta, X, LIKS[likelihood], batch_size=7), G.diagonal())


@pytest.mark.parametrize("likelihood", PROBLEMS)
def test_diag_laplace_is_full_laplace_with_the_off_diagonal_dropped(likelihood):
    model, X, y = PROBLEMS[likelihood]()
    kw = dict(sigma_noise=0.3) if likelihood == "regression" else {}
    full = Laplace(model, likelihood, prior_precision=0.7, **kw)
    diag = Laplace(model, likelihood, hessian_structure="diag", prior_precision=0.7, **kw)
    full.fit(_loader(X, y))
    diag.fit(_loader(X, y))
    P_diag = torch.diag(full.posterior_precision.diagonal())
    torch.testing.assert_close(diag.posterior_precision, P_diag.diagonal())
    torch.testing.assert_close(diag.posterior_covariance, torch.linalg.inv(P_diag))
    torch.testing.assert_close(diag.log_det_posterior_precision, torch.logdet(P_diag))
    # the evidence differs from full only through log det Σ⁻¹
    gap = diag.log_marginal_likelihood() - full.log_marginal_likelihood()
    torch.testing.assert_close(gap, -0.5 * (torch.logdet(P_diag) - torch.logdet(full.posterior_precision)))
    J = jacobian(diag.weights.f, diag.mean, X[:5])
    torch.testing.assert_close(diag.functional_variance(J), J @ torch.linalg.inv(P_diag) @ J.mT)
    # Hadamard: a diagonal never has a smaller determinant than the full SPD matrix it comes from
    assert diag.log_det_posterior_precision >= full.log_det_posterior_precision


def test_diag_samples_have_the_diagonal_covariance():
    model, X, y = _regression()
    la = Laplace(model, "regression", hessian_structure="diag", sigma_noise=0.3)
    la.fit(_loader(X, y))
    S = 40_000
    s = la.sample(S, generator=torch.Generator().manual_seed(0))
    var = la.posterior_variance
    # 5 standard errors of a sample mean (√(var/S)) and of a sample variance (var·√(2/S))
    assert ((s.mean(0) - la.mean).abs() < 5 * (var / S).sqrt()).all()
    assert ((s.var(0) - var).abs() < 5 * var * (2 / S) ** 0.5).all()


def test_last_layer_jacobian_closed_form_equals_autodiff():
    model, X, _ = _regression()
    w = select_weights(model, "last_layer")
    f, theta, sizes = w.f, w.theta, w.sizes
    assert sizes == [model[-1].weight.numel(), model[-1].bias.numel()]
    with torch.no_grad():
        phi = model[:-1](X)
    # round-off only (autodiff's products may sum in another order: 3e-16 on an AVX-512 Xeon)
    torch.testing.assert_close(last_layer_jacobian(phi, 2), jacobian(f, theta, X), rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(f(theta, X), model(X))


@pytest.mark.parametrize("structure", ["full", "diag"])
@pytest.mark.parametrize("likelihood", PROBLEMS)
def test_last_layer_laplace_is_the_last_layer_block_of_all_weights(likelihood, structure):
    model, X, y = PROBLEMS[likelihood]()
    kw = dict(sigma_noise=0.3) if likelihood == "regression" else {}
    full = Laplace(model, likelihood, **kw)
    ll = Laplace(model, likelihood, subset_of_weights="last_layer", hessian_structure=structure, **kw)
    full.fit(_loader(X, y))
    ll.fit(_loader(X, y))
    n_ll = ll.n_params
    assert n_ll == model[-1].weight.numel() + model[-1].bias.numel()
    block = full.H[-n_ll:, -n_ll:]  # the last layer's parameters come last in both orders
    torch.testing.assert_close(ll.H, block.diagonal() if structure == "diag" else block)
    torch.testing.assert_close(ll.mean, full.mean[-n_ll:])
    assert ll.log_marginal_likelihood().isfinite()


# ----- KFAC ---------------------------------------------------------------------------------------

from laplace_from_scratch.kron import KronPosterior, kfac  # noqa: E402


def _blocks_of(G, sizes):
    out, i = [], 0
    for s in sizes:
        out.append(G[i : i + s, i : i + s])
        i += s
    return out


def test_kfac_is_exact_for_one_linear_layer_one_output_gaussian():
    """B = Σₙ 1 = N and A = (1/N) Σ x xᵀ, so B ⊗ A = Σ x xᵀ: the exact GGN."""
    X = torch.randn(50, 4, dtype=D)
    model = torch.nn.Linear(4, 1, bias=False).to(D)
    (block,) = kfac(model, X, Gaussian(1.0), batch_size=16)
    f, theta = make_functional(model)
    torch.testing.assert_close(kron_block_matrix(block), ggn(f, theta, X, Gaussian(1.0)))
    torch.testing.assert_close(kron_block_matrix(block), X.T @ X)


@pytest.mark.parametrize("likelihood", PROBLEMS)
def test_kfac_blocks_are_exact_for_a_single_input(likelihood):
    """With N = 1 each weight block is one Kronecker product, so KFAC equals the GGN's diagonal blocks."""
    model, X, _ = PROBLEMS[likelihood]()
    x = X[:1]
    blocks = kfac(model, x, LIKS[likelihood])
    f, theta = make_functional(model)
    exact = _blocks_of(ggn(f, theta, x, LIKS[likelihood]), [b.size for b in blocks])
    for b, e in zip(blocks, exact, strict=True):
        torch.testing.assert_close(kron_block_matrix(b), e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("likelihood", PROBLEMS)
def test_kron_posterior_algebra_equals_dense(likelihood):
    """log det, J Σ Jᵀ, diag Σ and samples from the eigendecomposed factors equal the dense block matrix."""
    model, X, y = PROBLEMS[likelihood]()
    post = KronPosterior(kfac(model, X, LIKS[likelihood], batch_size=25))
    deltas = torch.linspace(0.5, 2.0, len(post.blocks), dtype=D)
    c = torch.tensor(1 / 0.3**2, dtype=D)
    dense = c * post.H.to_matrix() + torch.diag(
        torch.cat([d.expand(s) for d, s in zip(deltas, post.sizes, strict=True)])
    )
    Sigma = torch.linalg.inv(dense)
    torch.testing.assert_close(post.log_det(deltas, c), torch.logdet(dense))
    torch.testing.assert_close(post.variance(deltas, c), Sigma.diagonal())
    torch.testing.assert_close(post.precision(deltas, c).to_matrix(), dense)
    torch.testing.assert_close(post.covariance(deltas, c).to_matrix(), Sigma)
    f, theta = make_functional(model)
    J = jacobian(f, theta, X[:6])
    torch.testing.assert_close(post.functional_variance(J, deltas, c), J @ Sigma @ J.mT)
    S = 40_000
    s = post.sample(S, deltas, c, generator=torch.Generator().manual_seed(0))
    var = Sigma.diagonal()
    assert ((s.var(0) - var).abs() < 5 * var * (2 / S) ** 0.5).all()
    cov01 = (s[:, 0] * s[:, 1]).mean()  # an off-diagonal entry inside the first weight block
    assert abs(cov01 - Sigma[0, 1]) < 5 * (Sigma[0, 0] * Sigma[1, 1] / S) ** 0.5


def test_kron_laplace_refuses_non_linear_layers_and_per_parameter_priors():
    model = torch.nn.Sequential(torch.nn.Conv1d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(4, 1)).to(D)
    X, y = torch.randn(8, 1, 6, dtype=D), torch.randn(8, 1, dtype=D)
    with pytest.raises(ValueError, match="nn.Linear"):
        Laplace(model, "regression", hessian_structure="kron").fit(_loader(X, y))
    reg, Xr, yr = _regression()
    P = sum(p.numel() for p in reg.parameters())
    with pytest.raises(ValueError, match="'kron' supports a prior precision that is scalar or layerwise"):
        Laplace(reg, "regression", hessian_structure="kron", prior_precision=torch.ones(P))  # at construction
    la = Laplace(reg, "regression", hessian_structure="kron")
    with pytest.raises(ValueError, match="scalar or layerwise"):
        la.prior_precision = torch.ones(P)  # and whenever it is set
