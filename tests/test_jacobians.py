import pytest
import torch
from conftest import mlp

from laplace_from_scratch import jacobian, jacobian_loop, make_functional


@pytest.mark.parametrize("mode", ["rev", "fwd"])
def test_vmap_jacobian_equals_loop(mode):
    model = mlp(2, 3)
    X = torch.randn(7, 2, dtype=torch.float64)
    f, theta = make_functional(model)
    J_loop = jacobian_loop(f, theta, X)
    assert J_loop.shape == (7, 3, theta.numel())
    torch.testing.assert_close(jacobian(f, theta, X, mode=mode), J_loop, rtol=1e-12, atol=1e-12)


def test_jacobian_matches_finite_differences():
    model = mlp(1, 1)
    X = torch.linspace(-1, 1, 4, dtype=torch.float64).unsqueeze(-1)
    f, theta = make_functional(model)
    J = jacobian(f, theta, X)
    eps = 1e-6
    for p in range(0, theta.numel(), 7):
        e = torch.zeros_like(theta)
        e[p] = eps
        fd = (f(theta + e, X) - f(theta - e, X)) / (2 * eps)
        # central differences: error O(eps²·f''') ≈ 1e-12, round-off O(1e-16/eps) ≈ 1e-10
        torch.testing.assert_close(J[:, :, p], fd, rtol=0, atol=1e-8)


def test_chunked_equals_unchunked():
    model = mlp(2, 2)
    X = torch.randn(9, 2, dtype=torch.float64)
    f, theta = make_functional(model)
    torch.testing.assert_close(jacobian(f, theta, X, chunk_size=4), jacobian(f, theta, X), rtol=0, atol=0)


def test_bad_mode():
    f, theta = make_functional(mlp(2, 2))
    with pytest.raises(ValueError, match="mode"):
        jacobian(f, theta, torch.zeros(1, 2, dtype=torch.float64), mode="central")
