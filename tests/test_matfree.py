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


@pytest.mark.parametrize("preconditioner", ["lowrank", "none", "diag", "kron"])
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
        cg_tol=1e-10, preconditioner=preconditioner, preconditioner_rank=10,
    )  # fmt: skip
    mf.fit(loader)
    J = mf.jacobians(X[:5])
    diff = (mf.functional_variance(J) - full.functional_variance(J)).abs().max().item()
    its = mf.structure.cg_iterations
    print(f"{preconditioner}: max |Δ f_var| = {diff:.1e} (tolerance 1e-8), CG iterations {its}")
    assert diff < 1e-8
    with pytest.raises(ValueError, match="preconditioner"):
        Laplace(model, "classification", hessian_structure="matfree", preconditioner="eigen")
    with pytest.raises(ValueError, match="preconditioner_rank"):
        Laplace(model, "classification", hessian_structure="matfree", preconditioner_rank=0)


def test_the_low_rank_preconditioner_cuts_cg_iterations():
    """Σ⁻¹ = c·G + δI of a network whose GGN has a few large eigenvalues: the preconditioner
    U diag(1/(cλ + δ)) Uᵀ + (I − UUᵀ)/δ from the top eigenpairs takes them out, plain CG has to
    resolve them. Counts printed; the low-rank one must take fewer."""
    from torch.utils.data import DataLoader, TensorDataset

    from laplace_from_scratch import Laplace
    from laplace_from_scratch.helpers import mlp

    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(200, 8, dtype=D, generator=g), torch.randint(0, 4, (200,), generator=g)
    model = mlp(8, 4, width=16, seed=0, dtype=D)
    loader = DataLoader(TensorDataset(X, y), batch_size=50)
    counts = {}
    for pre in ["none", "lowrank"]:
        mf = Laplace(
            model, "classification", hessian_structure="matfree", prior_precision=0.01,
            cg_tol=1e-8, preconditioner=pre, preconditioner_rank=20,
        )  # fmt: skip
        mf.fit(loader)
        mf.log_marginal_likelihood()
        assert mf.structure.pre is None  # made at its first use, not for the evidence
        mf.functional_variance(mf.jacobians(X[:3]))
        counts[pre] = mf.structure.cg_iterations
    print(f"CG iterations (P = {mf.n_params}, δ = 0.01): {counts}")
    assert counts["lowrank"] < counts["none"]
    # products with Σ (CG, preconditioned) equal the dense solve
    full = Laplace(model, "classification", prior_precision=0.01)
    full.fit(loader)
    v = torch.randn(mf.n_params, 2, dtype=D)
    exact = torch.linalg.solve(full.posterior_precision, v)
    diff = ((mf.posterior_covariance @ v - exact).norm() / exact.norm()).item()
    print(f"Σ v by preconditioned CG vs dense solve: relative {diff:.1e} (tolerance 1e-6)")
    assert diff < 1e-6


def test_cg_variances_are_within_kappa_tol_squared():
    """jacobian_sandwich_cg's stated accuracy: each variance within κ·tol² (relative) of the dense
    one, κ the condition number of Σ⁻¹, for loose tolerances where the bound is not trivial."""
    torch.manual_seed(0)
    d = toy_multiclass(n=80, dtype=D)
    f, theta = make_functional(mlp(2, 3, width=10))
    A = ggn(f, theta, d.X, Categorical()) + 0.05 * torch.eye(theta.numel(), dtype=D)
    eig = torch.linalg.eigvalsh(A)
    kappa = (eig[-1] / eig[0]).item()
    J = jacobian(f, theta, d.X[:6])
    rows = J.reshape(-1, J.shape[-1])  # bᵀ, one per output
    exact = (rows * torch.linalg.solve(A, rows.T).T).sum(1)  # bᵀ Σ b
    for tol in [1e-2, 1e-3]:
        fvar, its = jacobian_sandwich_cg(lambda v: A @ v, J, tol=tol)
        rel = ((torch.diagonal(fvar, 0, 1, 2).reshape(-1) - exact).abs() / exact).max().item()
        bound = kappa * tol**2
        print(f"tol {tol:.0e}: {its} iterations, relative variance error {rel:.1e} ≤ κ·tol² = {bound:.1e}")
        assert rel <= bound


# ----- GGN products layer by layer ----------------------------------------------------------------


def _product_operators(model, X, lik):
    """The GGN operator of ``model`` over the batches of X with the layer-wise product and without
    (the module withheld: JVPs under vmap)."""
    from laplace_from_scratch.matfree import GGNOperator

    f, theta = make_functional(model)
    batches = list(X.split(7))
    return GGNOperator(f, theta, lik, batches, model), GGNOperator(f, theta, lik, batches)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lik", [Gaussian(1.0), Categorical()], ids=["gaussian", "categorical"])
def test_layerwise_ggn_product_equals_the_jvp_product_and_the_dense_ggn(lik, bias):
    K = 1 if isinstance(lik, Gaussian) else 3
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 6, bias=bias), torch.nn.Tanh(), torch.nn.Linear(6, K)
    ).double()
    X = torch.randn(30, 4, dtype=D)
    layerwise, jvps = _product_operators(model, X, lik)
    assert len(layerwise.layers()) == 2 and jvps.layers() == []
    f, theta = make_functional(model)
    G = ggn(f, theta, X, lik)
    for V in [torch.randn(theta.numel(), dtype=D), torch.randn(theta.numel(), 5, dtype=D)]:
        diff = (layerwise @ V - G @ V).abs().max().item()
        print(f"layer-wise vs dense G V ({tuple(V.shape)}): {diff:.1e} (tolerance 1e-12)")
        assert diff < 1e-12
        torch.testing.assert_close(layerwise @ V, jvps @ V, rtol=1e-12, atol=1e-12)


def test_layerwise_ggn_product_falls_back_to_jvps_where_it_does_not_apply():
    """A Conv2d (measured no faster layer-wise), a frozen parameter, a Linear on (n, T, in) inputs:
    JVP products, equal to the dense GGN."""
    from laplace_from_scratch.helpers import cnn

    lik = Categorical()
    frozen = mlp(4, 3, width=5)
    frozen[0].bias.requires_grad_(False)
    nn = torch.nn
    token = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Flatten(), nn.Linear(10, 3))
    cases = [
        (cnn(3, image_size=8, channels=(2, 3), dtype=D), torch.randn(6, 1, 8, 8, dtype=D)),
        (frozen, torch.randn(6, 4, dtype=D)),
        (token.double(), torch.randn(6, 2, 4, dtype=D)),
    ]
    for model, X in cases:
        layerwise, _ = _product_operators(model, X, lik)
        assert layerwise.layers() == []
        f, theta = make_functional(model)
        v = torch.randn(theta.numel(), dtype=D)
        torch.testing.assert_close(layerwise @ v, ggn(f, theta, X, lik) @ v, rtol=1e-10, atol=1e-12)


def test_products_run_on_chunks_of_the_stored_rows_in_order():
    from laplace_from_scratch.matfree import chunks

    batches = [torch.arange(0, 5), torch.arange(5, 8), torch.arange(8, 20)]
    for rows in [1, 4, 7, 20, 50]:
        got = list(chunks(batches, rows))
        assert torch.equal(torch.cat(got), torch.arange(20))
        assert all(len(c) == rows for c in got[:-1]) and 0 < len(got[-1]) <= rows
    model, X = mlp(4, 3, width=5), torch.randn(40, 4, dtype=D)
    layerwise, _ = _product_operators(model, X, Categorical())
    assert layerwise.rows_per_pass(1) > layerwise.rows_per_pass(10) >= 1  # fewer rows, more vectors
