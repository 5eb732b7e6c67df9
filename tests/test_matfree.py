"""Matrix-free products and solvers against dense linear algebra on problems small enough for both."""

import pytest
import torch
from conftest import mlp

from laplace_from_scratch import Categorical, Gaussian, ggn, make_functional
from laplace_from_scratch.helpers import sinusoid, toy_multiclass
from laplace_from_scratch.jacobians import jacobian
from laplace_from_scratch.matfree import (
    conjugate_gradient,
    ggn_vector_product,
    jacobian_sandwich_cg,
    lanczos,
    lanczos_inv_sqrt,
    posterior_precision_matvec,
    sample_matrix_free,
    slq_log_det,
)

D = torch.float64


def _spd(n, cond=1e3, seed=0):
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=D))
    return (Q * torch.logspace(0, torch.log10(torch.tensor(cond)).item(), n, dtype=D)) @ Q.T


@pytest.mark.parametrize("lik", [Gaussian(1.0), Categorical()], ids=["gaussian", "categorical"])
def test_ggn_vector_product_equals_dense_ggn_times_v(lik):
    K = 1 if isinstance(lik, Gaussian) else 3
    model = mlp(1, K, width=10)
    f, theta = make_functional(model)
    X = sinusoid(n=40, dtype=D).X_train
    v = torch.randn(theta.numel(), dtype=D)
    torch.testing.assert_close(
        ggn_vector_product(f, theta, X, lik, v, batch_size=15), ggn(f, theta, X, lik) @ v
    )


def test_conjugate_gradient_solves_spd_systems():
    A, b = _spd(60), torch.randn(60, dtype=D)
    x, iters = conjugate_gradient(lambda v: A @ v, b, tol=1e-12)
    torch.testing.assert_close(x, torch.linalg.solve(A, b), rtol=1e-8, atol=1e-10)
    assert iters <= 3 * 60  # exact arithmetic needs ≤ 60; rounding costs a few more


def test_lanczos_tridiagonalises_and_exhausts_the_space():
    A = _spd(30)
    T, Q = lanczos(lambda v: A @ v, torch.randn(30, dtype=D), 30)
    torch.testing.assert_close(Q.T @ Q, torch.eye(Q.shape[1], dtype=D), atol=1e-10, rtol=0)
    torch.testing.assert_close(Q.T @ A @ Q, T, atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(torch.linalg.eigvalsh(T), torch.linalg.eigvalsh(A), rtol=1e-8, atol=1e-8)


def test_slq_log_det_within_its_standard_error():
    A = _spd(200, cond=1e2)
    est, se = slq_log_det(
        lambda v: A @ v, 200, n_probes=200, m=40, generator=torch.Generator().manual_seed(0), dtype=D
    )
    exact = torch.logdet(A)
    # 40 Lanczos steps make the quadrature error negligible at condition number 100; what is left is
    # the Monte Carlo error of Hutchinson's trace estimator, which the probes' standard error measures.
    assert abs(est - exact) < 4 * se
    assert se / exact.abs() < 0.01


def test_lanczos_inverse_square_root_is_exact_with_a_full_krylov_space():
    A, b = _spd(25, cond=1e2), torch.randn(25, dtype=D)
    lam, U = torch.linalg.eigh(A)
    exact = U @ ((U.T @ b) / lam.sqrt())
    torch.testing.assert_close(lanczos_inv_sqrt(lambda v: A @ v, b, m=25), exact, rtol=1e-7, atol=1e-9)


def test_matrix_free_laplace_equals_dense_laplace():
    model = mlp(1, 1, width=10)
    f, theta = make_functional(model)
    d = sinusoid(n=40, dtype=D)
    lik, delta, c = Gaussian(1.0), 0.7, 1 / 0.3**2
    Pmat = c * ggn(f, theta, d.X_train, lik) + delta * torch.eye(theta.numel(), dtype=D)
    mv = posterior_precision_matvec(f, theta, d.X_train, lik, torch.tensor(delta, dtype=D), c)
    v = torch.randn(theta.numel(), dtype=D)
    torch.testing.assert_close(mv(v), Pmat @ v)
    J = jacobian(f, theta, d.X_test[::50])
    torch.testing.assert_close(
        jacobian_sandwich_cg(mv, J, tol=1e-12)[0], J @ torch.linalg.inv(Pmat) @ J.mT, rtol=1e-6, atol=1e-12
    )
    # samples: with a full Krylov space, θ* + P^{-½} ε exactly, for the same draws ε
    s = sample_matrix_free(mv, theta, 3, m=theta.numel(), generator=torch.Generator().manual_seed(0))
    eps = torch.randn(3, theta.numel(), generator=torch.Generator().manual_seed(0), dtype=D)
    lam, U = torch.linalg.eigh(Pmat)
    torch.testing.assert_close(s, theta + (eps @ U / lam.sqrt()) @ U.T, rtol=1e-6, atol=1e-8)


def test_batched_matvec_and_cg_equal_column_by_column():
    """(P, R) inputs: the vmapped GGN products and the column-wise CG equal R separate calls."""
    torch.manual_seed(0)
    d = toy_multiclass(n=60, dtype=torch.float64)
    f, theta = make_functional(mlp(2, 3, width=6))
    lik = Categorical()
    delta = torch.tensor(0.7, dtype=torch.float64)
    mv = posterior_precision_matvec(f, theta, d.X, lik, delta)
    V = torch.randn(theta.numel(), 5, dtype=torch.float64)
    cols = torch.stack([mv(v) for v in V.T], 1)
    torch.testing.assert_close(mv(V), cols, rtol=1e-12, atol=1e-12)
    X, it = conjugate_gradient(mv, V, tol=1e-12)
    dense = ggn(f, theta, d.X, lik) + delta * torch.eye(theta.numel(), dtype=torch.float64)
    torch.testing.assert_close(X, torch.linalg.solve(dense, V), rtol=1e-8, atol=1e-10)
    assert it < theta.numel() + 20


# ----- hessian_structure="matfree" through Laplace ------------------------------------------------


@pytest.fixture(scope="module")
def matfree_problem():
    from torch.utils.data import DataLoader, TensorDataset

    from laplace_from_scratch import Laplace
    from laplace_from_scratch.helpers import fit_map, mlp

    d = sinusoid(n=60, dtype=D)
    model = mlp(1, 1, width=8, seed=0, dtype=D)
    fit_map(model, d.X_train, d.y_train, "regression", 0.3, adam_steps=200, lbfgs_steps=50)
    loader = DataLoader(TensorDataset(d.X_train, d.y_train), batch_size=20)
    full = Laplace(model, "regression", sigma_noise=0.3, prior_precision=0.5)
    full.fit(loader)
    return model, loader, d, full


def test_matfree_laplace_against_full(matfree_problem):
    """Matrix-free Laplace at small P against full Laplace. Statistical quantities (SLQ log det, its
    Hutchinson gradient and diag Σ) within 4 of their standard errors; CG f_var to its tolerance."""
    from laplace_from_scratch import Laplace

    model, loader, d, full = matfree_problem
    P = full.n_params
    mf = Laplace(
        model,
        "regression",
        hessian_structure="matfree",
        sigma_noise=0.3,
        prior_precision=0.5,
        n_probes=40,
        lanczos_steps=P,
        cg_tol=1e-10,
    )
    mf.fit(loader)
    exact = full.log_det_posterior_precision.item()
    est = mf.log_det_posterior_precision
    se = mf.structure.log_det_se.item()
    assert 0 < se and abs(est.item() - exact) < 4 * se
    J = mf.jacobians(d.X_test[::100])
    torch.testing.assert_close(mf.functional_variance(J), full.functional_variance(J), rtol=1e-6, atol=1e-10)
    # gradients in δ: tr(Σ) estimated by Hutchinson from the same probes; its standard error from the
    # per-probe spread is not returned, so compare at the level the 40 probes support (10 %)
    x = torch.tensor(0.5, dtype=D, requires_grad=True)
    mf.log_marginal_likelihood(prior_precision=x).backward()
    y = torch.tensor(0.5, dtype=D, requires_grad=True)
    full.log_marginal_likelihood(prior_precision=y).backward()
    assert abs(x.grad.item() / y.grad.item() - 1) < 0.1
    assert torch.equal(mf.log_det_posterior_precision, est)  # same probes for the same (δ, σ): deterministic
    S = 100  # one Lanczos run per sample
    s = mf.sample(S, generator=torch.Generator().manual_seed(0))
    var = full.posterior_variance
    assert ((s.var(0) - var).abs() < 5 * var * (2 / S) ** 0.5).all()
    with pytest.raises(ValueError, match="n_probes"):
        Laplace(model, "regression", hessian_structure="matfree", n_probes=1).fit(loader)


def test_matfree_precision_operator_equals_dense(matfree_problem):
    from laplace_from_scratch import Laplace

    model, loader, _, full = matfree_problem
    mf = Laplace(model, "regression", hessian_structure="matfree", sigma_noise=0.3, prior_precision=0.5)
    mf.fit(loader)
    torch.testing.assert_close(mf.H.to_matrix(), full.H, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(
        mf.posterior_precision.to_matrix(), full.posterior_precision, rtol=1e-10, atol=1e-10
    )


def test_preconditioned_cg_solves_spd_systems_in_fewer_steps_with_a_good_preconditioner():
    A, B = _spd(60), torch.randn(60, 3, dtype=D)
    x, plain = conjugate_gradient(lambda v: A @ v, B, tol=1e-12)
    M = torch.diag(1 / torch.diagonal(A))
    y, jacobi = conjugate_gradient(lambda v: A @ v, B, tol=1e-12, precondition=lambda v: M @ v)
    exact = torch.linalg.solve(A, B)
    torch.testing.assert_close(y, exact, rtol=1e-8, atol=1e-10)
    # the exact inverse as preconditioner: one step
    exact_inverse = lambda v: torch.linalg.solve(A, v)  # noqa: E731
    z, one = conjugate_gradient(lambda v: A @ v, B, tol=1e-12, precondition=exact_inverse)
    torch.testing.assert_close(z, exact, rtol=1e-8, atol=1e-10)
    print(f"iterations: plain {plain}, Jacobi {jacobi}, exact inverse {one}")
    assert one <= 2 < plain


@pytest.mark.parametrize("preconditioner", ["none", "diag", "kron"])
def test_matfree_predictive_with_a_preconditioner_equals_full(preconditioner):
    """The preconditioned CG predictive equals full Laplace's (float64) at the CG tolerance; the
    preconditioner is fitted on the same batches."""
    from torch.utils.data import DataLoader, TensorDataset

    from laplace_from_scratch import Laplace
    from laplace_from_scratch.helpers import mlp

    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(64, 4, dtype=D, generator=g), torch.randint(0, 3, (64,), generator=g)
    model = mlp(4, 3, width=6, seed=0, dtype=D)
    loader = DataLoader(TensorDataset(X, y), batch_size=16)
    full = Laplace(model, "classification", prior_precision=0.7)
    full.fit(loader)
    mf = Laplace(
        model, "classification", hessian_structure="matfree", prior_precision=0.7,
        cg_tol=1e-10, preconditioner=preconditioner,
    )  # fmt: skip
    mf.fit(loader)
    J = mf.jacobians(X[:5])
    diff = (mf.functional_variance(J) - full.functional_variance(J)).abs().max().item()
    its = mf.structure.cg_iterations
    print(f"{preconditioner}: max |Δ f_var| = {diff:.1e} (tolerance 1e-8), CG iterations {its}")
    assert diff < 1e-8
    with pytest.raises(ValueError, match="preconditioner"):
        Laplace(model, "classification", hessian_structure="matfree", preconditioner="lowrank")
