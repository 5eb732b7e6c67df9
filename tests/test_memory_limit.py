"""memory_limit.py: the blocked in-place Cholesky, the memory check, the route choice; diag(Σ) by
blocks (posterior.inverse_diagonal); and full Laplace with one P×P buffer against two, and without the
layer when memory is ample. Tolerances: float64 round-off (1e-12 relative), float32 1e-5."""

import pytest
import torch
from conftest import mlp
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs
from laplace_from_scratch import helpers, memory_limit
from laplace_from_scratch.posterior import PerPrior, inverse_diagonal

D = torch.float64


def spd(n, dtype=D, seed=0):
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(n, n, generator=g, dtype=D)
    return (G @ G.T / n + torch.eye(n, dtype=D)).to(dtype)


@pytest.mark.parametrize("n, block", [(1, 1), (7, 3), (100, 128), (257, 64), (300, 7), (513, None)])
@pytest.mark.parametrize("dtype, tol", [(D, 1e-12), (torch.float32, 1e-5)])
def test_blocked_cholesky_equals_torch(n, block, dtype, tol):
    A = spd(n, dtype)
    ref = torch.linalg.cholesky(A)
    B = A.clone()
    out = memory_limit.cholesky_(B, block)
    assert out.data_ptr() == B.data_ptr()  # in place
    assert torch.equal(B.triu(1), torch.zeros_like(B))
    assert ((B - ref).abs().max() / ref.abs().max()).item() < tol


def test_blocked_cholesky_refuses_indefinite_matrices():
    A = spd(50)
    A[30, 30] = -1.0
    with pytest.raises(memory_limit.NotPositiveDefinite, match="not positive definite"):
        memory_limit.cholesky_(A.clone(), 16)


def test_inverse_diagonal():
    A = spd(123)
    L = torch.linalg.cholesky(A)
    for b in (None, 10, 500):
        torch.testing.assert_close(
            inverse_diagonal(L, b), torch.linalg.inv(A).diagonal(), rtol=1e-12, atol=0
        )


def test_memory_check_names_the_problem_and_the_way_out(monkeypatch):
    monkeypatch.setattr(memory_limit, "available_bytes", lambda device: 10**6)
    with pytest.raises(
        MemoryError, match=r"needs 1 dense 2000×2000 float32 matrix\(es\): 0.01 GiB, but 0.00 GiB"
    ):
        memory_limit.check_fits(2000, torch.float32, torch.device("cpu"))
    X, y = torch.randn(20, 2, dtype=D), torch.randn(20, 1, dtype=D)
    la = lfs.Laplace(mlp(2, 1, width=30), "regression")
    with pytest.raises(
        MemoryError, match="full Laplace over P = 1051 parameters .*'diag', 'kron', 'lowrank'"
    ):
        la.fit(DataLoader(TensorDataset(X, y), batch_size=10))  # before any P×P allocation
    assert la.structure is None


@pytest.fixture
def fitted():
    d = helpers.sinusoid(n=60, dtype=D)
    model = mlp(1, 1, width=8)
    loader = DataLoader(TensorDataset(d.X_train, d.y_train), batch_size=20)
    return model, loader, d


def test_one_buffer_gives_the_same_posterior(fitted):
    model, loader, d = fitted
    kw = dict(sigma_noise=0.3, prior_precision=0.7, evidence_route="cholesky")
    two = lfs.Laplace(model, "regression", **kw)
    two.fit(loader)
    one = lfs.Laplace(model, "regression", **kw, one_buffer=True)
    one.fit(loader)
    with pytest.warns(RuntimeWarning, match="one P×P buffer only"):
        ev = one.log_marginal_likelihood()
    torch.testing.assert_close(ev, two.log_marginal_likelihood(), rtol=1e-12, atol=0)
    Xq = d.X_test[::50]
    torch.testing.assert_close(one(Xq)[1], two(Xq)[1], rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(one.posterior_variance, two.posterior_variance, rtol=1e-10, atol=0)
    g = torch.Generator().manual_seed(0)
    torch.testing.assert_close(
        one.sample(3, generator=g), two.sample(3, generator=torch.Generator().manual_seed(0))
    )
    with pytest.raises(RuntimeError, match="overwritten by its Cholesky factor"):
        _ = one.H
    with pytest.raises(RuntimeError, match="fit again"):
        one.log_marginal_likelihood(prior_precision=2.0)
    with pytest.raises(ValueError, match="cannot be updated"):
        one.fit(loader, override=False)


def test_in_place_factor_refills_one_buffer_beside_H(fitted):
    model, loader, _ = fitted
    la = lfs.Laplace(model, "regression", sigma_noise=0.3)
    la.fit(loader)
    H, one = la.H.clone(), torch.tensor(1.0, dtype=D)
    layer = memory_limit.InPlaceCholesky(la.H)
    p0 = torch.ones(la.n_params, dtype=D)
    L1 = layer.L(p0, one).clone()
    L2 = layer.L(3 * p0, one)
    assert L2.data_ptr() == layer.buffer.data_ptr() != la.H.data_ptr()  # one factor buffer, refilled
    assert torch.equal(la.H, H)  # H itself untouched
    torch.testing.assert_close(L2 @ L2.T, lfs.posterior_precision(H, 3 * p0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(L1, torch.linalg.cholesky(lfs.posterior_precision(H, p0)), rtol=1e-10, atol=0)
    # the posterior takes this layer when memory is short, with the same results
    ref = la.structure.L(3 * p0, one).clone()
    la.structure.cache, la.structure.limit = PerPrior(), memory_limit.InPlaceCholesky(la.H)
    assert torch.equal(la.structure.L(3 * p0, one), ref)


@pytest.mark.parametrize("in_place", [False, True])
def test_jitter_rebuilds_from_H_with_a_warning(fitted, in_place):
    model, loader, _ = fitted
    la = lfs.Laplace(model, "regression", sigma_noise=0.3)
    la.fit(loader)
    if in_place:  # the memory-limit layer follows the same jitter rule
        la.structure.limit = memory_limit.InPlaceCholesky(la.H)
    H = la.structure.H
    scale = H.diagonal().mean()
    H[0, :] = H[:, 0] = 0
    H[0, 0] = -1e-6 * scale  # slightly indefinite: jitter of 1e-5·scale fixes it
    tiny, one = torch.tensor(1e-12, dtype=D), torch.tensor(1.0, dtype=D)
    with pytest.warns(RuntimeWarning, match="added jitter"):
        L = la.structure.L(tiny, one)
    assert torch.isfinite(L).all() and L[0, 0] > 0
    H[0, 0] = -1e3 * scale  # far from positive definite: no jitter up to 1e-3·scale helps
    with pytest.raises(ValueError, match="far from positive definite"):
        la.structure.L(tiny * 2, one)


def test_the_memory_limit_layer_is_not_entered_when_memory_is_ample(fitted, monkeypatch):
    """With memory to spare and neither in_place nor one_buffer, full Laplace runs the taught path
    alone: no method of any evidence route enters the memory-limit layer."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the memory-limit layer was entered")

    monkeypatch.setattr(memory_limit, "InPlaceCholesky", forbidden)
    monkeypatch.setattr(memory_limit, "cholesky_", forbidden)
    model, loader, d = fitted
    for route in ("auto", "eigen", "cholesky"):
        la = lfs.Laplace(model, "regression", sigma_noise=0.3, evidence_route=route)
        la.fit(loader)
        assert la.structure.limit is None
        la.log_marginal_likelihood(prior_precision=torch.tensor(2.0, dtype=D, requires_grad=True)).backward()
        la(d.X_test[:5])
        la.sample(2)
        assert la.posterior_variance.shape == la.posterior_covariance.shape[:1] == (la.n_params,)


def test_the_memory_check_enters_the_layer_when_two_more_buffers_do_not_fit(fitted, monkeypatch):
    """The route choice: room for H and half another P×P matrix takes the layer, with the same
    results (here its buffer still fits beside H)."""
    model, loader, d = fitted
    ref = lfs.Laplace(model, "regression", sigma_noise=0.3, evidence_route="cholesky")
    ref.fit(loader)
    room = memory_limit.dense_bytes(ref.n_params, D, 1.5)
    monkeypatch.setattr(memory_limit, "available_bytes", lambda device: room)
    la = lfs.Laplace(model, "regression", sigma_noise=0.3, evidence_route="cholesky")
    la.fit(loader)
    assert isinstance(la.structure.limit, memory_limit.InPlaceCholesky)
    ev, ev_ref = la.log_marginal_likelihood(), ref.log_marginal_likelihood()
    torch.testing.assert_close(ev, ev_ref, rtol=1e-12, atol=0)
    assert la.structure.limit.buffer is not la.H
    torch.testing.assert_close(la(d.X_test[:5])[1], ref(d.X_test[:5])[1], rtol=1e-10, atol=1e-14)
