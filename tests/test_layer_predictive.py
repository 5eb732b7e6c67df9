"""The layer-wise GLM predictive (``layer_predictive.py``) equals J Σ Jᵀ from per-example Jacobians.

Diagonal and KFAC posteriors of Linear/Conv2d networks predict without forming J; here the same fitted
posterior's ``functional_variance(J)`` is the reference, in float64, to 1e-10 relative (both sum the
same products in another order: round-off, ~1e-16 measured). laplace-torch is compared on the same
cells by the parity matrix (tests/test_parity.py: diag and kron, all weights and last layer, every
likelihood, MLP and CNN, 1e-8), which now runs through this route.
"""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs
from laplace_from_scratch import jacobians as jacobians_module

D = torch.float64
RTOL = 1e-10


class Pool(nn.Module):
    """Mean over the positions of a sequence: (n, T, d) → (n, d)."""

    def forward(self, x):
        return x.mean(1)


def network(kind: str, K: int) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    if kind == "mlp":
        layers = [nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, K)]
        return nn.Sequential(*layers).to(D).eval(), (5,)
    if kind == "cnn":  # padding, stride, no bias on one layer
        layers = [
            nn.Conv2d(2, 3, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(3, 4, 3, stride=2, bias=False),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(36, K),
        ]
        return nn.Sequential(*layers).to(D).eval(), (2, 8, 8)
    # a Linear applied to a sequence: its weight is shared over positions, like a convolution's
    layers = [nn.Linear(3, 5), nn.Tanh(), Pool(), nn.Linear(5, K)]
    return nn.Sequential(*layers).to(D).eval(), (4, 3)


def targets(likelihood: str, K: int, n: int, g: torch.Generator) -> torch.Tensor:
    if likelihood == "regression":
        return torch.randn(n, K, generator=g, dtype=D)
    return torch.randint(0, max(K, 2), (n,), generator=g)


LIKELIHOODS = [("regression", 2), ("classification", 3), ("binary_classification", 1)]


@pytest.mark.parametrize("structure", ["diag", "kron"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
@pytest.mark.parametrize("likelihood, K", LIKELIHOODS)
@pytest.mark.parametrize("kind", ["mlp", "cnn", "sequence"])
def test_layerwise_predictive_equals_the_jacobian_route(kind, likelihood, K, subset, structure):
    model, shape = network(kind, K)
    if kind == "sequence" and structure == "kron" and subset == "all":
        with pytest.raises(NotImplementedError, match="sequence"):
            lfs.Laplace(model, likelihood, hessian_structure="kron").fit(
                DataLoader(
                    TensorDataset(
                        torch.randn(4, *shape, dtype=D), targets(likelihood, K, 4, torch.Generator())
                    )
                )
            )
        return  # KFAC of a Linear layer on sequences is not built (diag is)
    g = torch.Generator().manual_seed(1)
    X, Xq = torch.randn(40, *shape, generator=g, dtype=D), torch.randn(9, *shape, generator=g, dtype=D)
    y = targets(likelihood, K, 40, g)
    kw = {"sigma_noise": 0.5} if likelihood == "regression" else {}
    la = lfs.Laplace(
        model, likelihood, subset_of_weights=subset, hessian_structure=structure, temperature=0.7, **kw
    )
    la.fit(DataLoader(TensorDataset(X, y), batch_size=16))
    # a layerwise prior: the blocks carry their own δ
    la.prior_precision = torch.linspace(0.3, 3.0, la.n_param_tensors, dtype=D)
    assert la._predictive_layers() is not None
    f_mu, f_var = la.glm_predictive(Xq)
    J = la.jacobians(Xq)
    ref = la.functional_variance(J)
    assert f_var.shape == ref.shape == (9, K, K)
    assert ((f_var - ref).norm() / ref.norm()).item() < RTOL
    with torch.no_grad():
        assert torch.equal(f_mu, la.weights.f(la.mean, Xq))


def test_the_layerwise_route_forms_no_jacobian(monkeypatch):
    """No (N, K, P) Jacobian: the Jacobian function is made to fail, and the predictive still runs,
    also through the links; the full structure, which needs J, then fails."""
    model, shape = network("mlp", 3)
    g = torch.Generator().manual_seed(2)
    X, y = torch.randn(30, *shape, generator=g, dtype=D), targets("classification", 3, 30, g)
    fitted = {}
    for structure in ["kron", "diag", "full"]:
        fitted[structure] = lfs.Laplace(model, "classification", hessian_structure=structure)
        fitted[structure].fit(DataLoader(TensorDataset(X, y), batch_size=10))

    def no_jacobian(*args, **kwargs):
        raise AssertionError("a per-example Jacobian was formed")

    monkeypatch.setattr(jacobians_module, "vmap", no_jacobian)
    for structure in ["kron", "diag"]:
        for link in ["probit", "bridge", "mc"]:
            p = fitted[structure](X[:5], link_approx=link, generator=torch.Generator().manual_seed(0))
            assert p.shape == (5, 3)
    with pytest.raises(AssertionError, match="per-example Jacobian"):
        fitted["full"](X[:5])


def test_the_model_at_theta_star_not_as_it_is_now():
    """The predictive is the posterior's, at the weights of the fit: training the model further
    afterwards (as a user might) changes neither route."""
    model, shape = network("mlp", 2)
    g = torch.Generator().manual_seed(3)
    X, y = torch.randn(30, *shape, generator=g, dtype=D), targets("regression", 2, 30, g)
    la = lfs.Laplace(model, "regression", hessian_structure="kron")
    la.fit(DataLoader(TensorDataset(X, y), batch_size=10))
    before = la.glm_predictive(X[:4])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    after = la.glm_predictive(X[:4])
    assert torch.equal(before[0], after[0]) and torch.allclose(before[1], after[1], rtol=1e-12, atol=0)


def test_the_predictive_is_differentiable_in_the_prior_precision():
    """f_var keeps the graph of δ (as the Jacobian route's does), not of θ."""
    model, shape = network("mlp", 2)
    g = torch.Generator().manual_seed(4)
    X, y = torch.randn(30, *shape, generator=g, dtype=D), targets("regression", 2, 30, g)
    grads = []
    for route in ["layers", "jacobians"]:
        la = lfs.Laplace(model, "regression", hessian_structure="diag")
        la.fit(DataLoader(TensorDataset(X, y), batch_size=10))
        delta = torch.tensor(0.8, dtype=D, requires_grad=True)
        la.prior_precision = delta
        f_var = (
            la.glm_predictive(X[:4])[1] if route == "layers" else la.functional_variance(la.jacobians(X[:4]))
        )
        grads.append(torch.autograd.grad(f_var.sum(), delta)[0])
    assert torch.allclose(grads[0], grads[1], rtol=1e-10)
