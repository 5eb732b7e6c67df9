"""Our GGN against laplace-torch 0.3's ``H`` (float64, full, all weights).

laplace-torch is the reference, not a dependency of the module: it is imported here only.
Its H is the GGN of the summed loss with Λ = I for regression (σ enters the posterior later)
and Λ = diag p − p pᵀ for classification. We compare with every backend that computes the
exact GGN: curvlinops (the default), BackPACK and ASDL.
"""

import pytest
import torch
from conftest import mlp
from torch.utils.data import DataLoader, TensorDataset

from laplace_from_scratch import Categorical, Gaussian, ggn, make_functional, sinusoid, toy_nonlinear

laplace = pytest.importorskip("laplace", reason="laplace-torch is installed by `make install`")
from laplace.curvature import AsdlGGN, BackPackGGN, CurvlinopsGGN  # noqa: E402

# float64: both sides sum the same N·K rank-one terms in a different order; 1e-8 relative
# (the bound) leaves ~6 orders of magnitude above float64 round-off.
RTOL = 1e-8


@pytest.fixture(autouse=True)
def _float64_default():
    """laplace-torch's curvlinops backend materialises H as ``linop @ torch.eye(P)`` with eye in
    the *default* dtype; under float32 default that rounds a float64 H to float32 accuracy
    (we measured 1.4e-8 relative on the sinusoid MLP). A float64 default makes it exact."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _rel_err(A, B):
    return ((A - B).norm() / B.norm()).item()


def _regression_problem():
    torch.manual_seed(0)
    d = sinusoid(dtype=torch.float64)
    return mlp(1, 1, width=20), d.X_train, d.y_train


def _multiclass_problem():
    torch.manual_seed(0)
    d = toy_nonlinear(n=120, dtype=torch.float64)
    X = d.X
    y = (d.y + 2 * (d.X[:, 0] > 0.5).long()) % 3  # three classes
    return mlp(2, 3, width=10), X, y


@pytest.mark.parametrize("backend", [CurvlinopsGGN, BackPackGGN, AsdlGGN])
@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_ggn_equals_laplace_torch_H(likelihood, backend):
    model, X, y = _regression_problem() if likelihood == "regression" else _multiclass_problem()
    loader = DataLoader(TensorDataset(X, y), batch_size=50)
    la = laplace.Laplace(
        model, likelihood, subset_of_weights="all", hessian_structure="full", backend=backend
    )
    la.fit(loader)
    f, theta = make_functional(model)
    ours = ggn(f, theta, X, Gaussian(1.0) if likelihood == "regression" else Categorical())
    assert la.H.dtype == torch.float64 and la.H.shape == ours.shape
    assert _rel_err(ours, la.H) < RTOL
