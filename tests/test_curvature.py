"""Curvature against independent references (all float64)."""

import pytest
import torch
from conftest import mlp
from torch import nn
from torch.func import hessian

from laplace_from_scratch import (
    Bernoulli,
    Categorical,
    Gaussian,
    empirical_fisher,
    exact_hessian,
    ggn,
    ggn_from_jacobians,
    jacobian_loop,
    make_functional,
    residual_term,
)

# float64 throughout: sums of O(N·P) products with entries O(1) agree to ~1e-13;
# 1e-10 leaves three orders of magnitude for accumulation order.
TOL = dict(rtol=1e-10, atol=1e-10)


def _problem(likelihood):
    if isinstance(likelihood, Gaussian):
        model = mlp(2, 2)
        X = torch.randn(6, 2, dtype=torch.float64)
        y = torch.randn(6, 2, dtype=torch.float64)
    else:
        model = mlp(2, 3)
        X = torch.randn(6, 2, dtype=torch.float64)
        y = torch.tensor([0, 1, 2, 2, 1, 0])
    return model, X, y


LIKELIHOODS = [Gaussian(0.7), Categorical()]


@pytest.mark.parametrize("lik", LIKELIHOODS, ids=["gaussian", "categorical"])
def test_ggn_equals_definition_with_loop_jacobians(lik):
    model, X, _ = _problem(lik)
    f, theta = make_functional(model)
    J = jacobian_loop(f, theta, X)
    Lam = lik.output_hessian(f(theta, X))
    G_def = sum(J[n].T @ Lam[n] @ J[n] for n in range(X.shape[0]))
    torch.testing.assert_close(ggn(f, theta, X, lik, batch_size=4), G_def, **TOL)
    torch.testing.assert_close(ggn_from_jacobians(J, Lam), G_def, **TOL)


@pytest.mark.parametrize("lik", LIKELIHOODS, ids=["gaussian", "categorical"])
def test_hessian_is_ggn_plus_residual(lik):
    model, X, y = _problem(lik)
    f, theta = make_functional(model)
    H = exact_hessian(f, theta, X, y, lik)
    torch.testing.assert_close(ggn(f, theta, X, lik) + residual_term(f, theta, X, y, lik), H, **TOL)
    # and the residual is not negligible at a random θ, so the identity says something
    assert (H - ggn(f, theta, X, lik)).abs().max() > 1e-3


def test_ggn_equals_hessian_for_linear_model():
    model = nn.Linear(3, 2).double()
    X = torch.randn(10, 3, dtype=torch.float64)
    y = torch.randn(10, 2, dtype=torch.float64)
    f, theta = make_functional(model)
    lik = Gaussian(0.5)
    H = exact_hessian(f, theta, X, y, lik)
    torch.testing.assert_close(ggn(f, theta, X, lik), H, **TOL)
    # closed form: (I_K ⊗ [X 1]ᵀ[X 1]) / σ² in PyTorch's (weight row-major, then bias) order
    Xb = torch.cat([X, torch.ones(10, 1, dtype=torch.float64)], 1)
    A = Xb.T @ Xb / 0.25
    P = theta.numel()
    ref = torch.zeros(P, P, dtype=torch.float64)
    w_idx = [[k * 3 + i for i in range(3)] + [6 + k] for k in range(2)]
    for k in range(2):
        ref[torch.tensor(w_idx[k]).unsqueeze(1), torch.tensor(w_idx[k])] = A
    torch.testing.assert_close(H, ref, **TOL)


@pytest.mark.parametrize("lik", LIKELIHOODS, ids=["gaussian", "categorical"])
def test_empirical_fisher_from_per_example_gradients(lik):
    model, X, y = _problem(lik)
    f, theta = make_functional(model)
    grads = []
    for n in range(X.shape[0]):
        th = theta.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(lik.nll(f(th, X[n : n + 1]), y[n : n + 1]), th)
        grads.append(g)
    G = torch.stack(grads)
    torch.testing.assert_close(empirical_fisher(f, theta, X, y, lik), G.T @ G, **TOL)


def test_softmax_output_hessian_equals_autodiff_hessian_of_cross_entropy():
    lik = Categorical()
    f = torch.randn(5, 4, dtype=torch.float64)
    y = torch.tensor([0, 3, 1, 2, 3])
    Lam = lik.output_hessian(f)
    for n in range(5):
        H = hessian(lambda z, n=n: lik.nll(z.unsqueeze(0), y[n : n + 1]))(f[n])
        torch.testing.assert_close(Lam[n], H, **TOL)
    # Λ is PSD with the all-ones vector in its null space (softmax is shift invariant)
    torch.testing.assert_close(Lam.sum(-1), torch.zeros(5, 4, dtype=torch.float64), **TOL)


@pytest.mark.parametrize(
    "lik, K",
    [(Categorical(), 4), (Gaussian(0.3), 2), (Bernoulli(), 1)],
    ids=["softmax", "gaussian", "sigmoid"],
)
def test_output_hessian_sqrt_is_a_factor(lik, K):
    """S Sᵀ = Λ for the closed-form factors, also for logits so confident that p has
    entries near 1e-13 (where an eigendecomposition's rounding would show)."""
    f = torch.randn(6, K, dtype=torch.float64)
    f[0] *= 30  # a nearly one-hot softmax
    S, Lam = lik.output_hessian_sqrt(f), lik.output_hessian(f)
    err = (S @ S.mT - Lam).abs().max().item()
    print(f"{type(lik).__name__}: max |S Sᵀ − Λ| = {err:.1e} (tolerance 1e-12)")
    assert S.shape == Lam.shape
    assert err <= 1e-12


def test_gaussian_output_hessian_equals_autodiff():
    lik = Gaussian(0.3)
    f = torch.randn(4, 2, dtype=torch.float64)
    y = torch.randn(4, 2, dtype=torch.float64)
    H = hessian(lambda z: lik.nll(z, y))(f).reshape(8, 8)
    torch.testing.assert_close(torch.block_diag(*lik.output_hessian(f)), H, **TOL)
    torch.testing.assert_close(lik.output_hessian(f)[0], torch.eye(2, dtype=torch.float64) / 0.09, **TOL)


def test_gaussian_nll_matches_torch_distributions():
    lik = Gaussian(0.3)
    f = torch.randn(4, 2, dtype=torch.float64)
    y = torch.randn(4, 2, dtype=torch.float64)
    ref = -torch.distributions.Normal(f, 0.3).log_prob(y).sum()
    torch.testing.assert_close(lik.nll(f, y), ref, **TOL)


def test_mean_reduced_loss_shrinks_ggn_by_n():
    """The seeds' pitfall: the GGN of a mean loss is the summed one divided by N."""
    model, X, y = _problem(Gaussian(1.0))
    f, theta = make_functional(model)
    H_sum = exact_hessian(f, theta, X, y, Gaussian(1.0))
    H_mean = hessian(lambda th: Gaussian(1.0).nll(f(th, X), y) / X.shape[0])(theta)
    torch.testing.assert_close(H_mean * X.shape[0], H_sum, **TOL)


@pytest.mark.parametrize(
    "make_bad, match",
    [
        (lambda: (torch.zeros(3, 2), torch.tensor([0.0, 1.0, 1.0])), "integers"),
        (lambda: (torch.zeros(3, 2), torch.tensor([0, 1, 2])), r"\[0, 2\)"),
        (lambda: (torch.zeros(3, 2), torch.tensor([0, 1])), "shape"),
    ],
)
def test_categorical_bad_labels(make_bad, match):
    f, y = make_bad()
    with pytest.raises(ValueError, match=match):
        Categorical().nll(f, y)


def test_gaussian_bad_sigma_and_shapes():
    with pytest.raises(ValueError, match="sigma_noise"):
        Gaussian(0.0)
    with pytest.raises(ValueError, match="match"):
        Gaussian(1.0).nll(torch.zeros(3, 1), torch.zeros(3))


def test_predictive_jacobian_blocks_stay_bounded_without_a_pp_matrix(monkeypatch):
    """glm_predictive forms Jacobians a few inputs at a time. The budget was a fraction of
    one P×P matrix, which a diagonal posterior at P = 10⁶ never allocates: 1/256 of it
    would be 390 inputs, 15.6 GB of Jacobians. Now at most 2²⁷ numbers per block."""
    from torch.utils.data import DataLoader, TensorDataset

    from laplace_from_scratch import Laplace
    from laplace_from_scratch.curvature import CHUNK_CAP, CHUNK_FLOOR, CHUNK_FRACTION_TIGHT, jacobian_chunk

    P, K = 1_000_010, 10
    assert jacobian_chunk(K, P, CHUNK_FRACTION_TIGHT, cap=CHUNK_CAP) * K * P <= CHUNK_CAP == 1 << 27
    assert jacobian_chunk(K, P, 1 / 256) == int(P / 256 / K)  # no cap: 390 inputs
    # small P: the floor (2²⁴ numbers, 64 MiB in float32) decides, even over a cap below it
    assert CHUNK_FLOOR == 1 << 24
    assert jacobian_chunk(K, 9_550, 1 / 256, cap=1 << 27) == CHUNK_FLOOR // (K * 9_550) == 175
    assert jacobian_chunk(K, 9_550, 1 / 256, cap=1) == CHUNK_FLOOR // (K * 9_550)

    torch.manual_seed(0)
    model = nn.Linear(100_000, K).float()
    X = torch.randn(8, 100_000)
    la = Laplace(model, "classification", hessian_structure="diag")
    la.fit(DataLoader(TensorDataset(X, torch.arange(8) % K), batch_size=8))
    import laplace_from_scratch.laplace as laplace_module

    seen, jacobian = [], laplace_module.jacobian

    def recording(f, theta, x):
        J = jacobian(f, theta, x)
        seen.append(J.numel())
        return J

    # every Jacobian glm_predictive forms (of x, or of the last layer's features)
    monkeypatch.setattr(laplace_module, "jacobian", recording)
    # the Jacobian route, which networks outside Linear/Conv2d take (a Linear network's diagonal
    # predicts layer by layer, without J: tests/test_layer_predictive.py)
    la._predictive_layers = lambda: None
    f_mu, f_var = la.glm_predictive(torch.randn(40, 100_000))
    assert f_var.shape == (40, K, K) and len(seen) > 1
    assert max(seen) <= 1 << 27
