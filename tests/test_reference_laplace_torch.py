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

from laplace_from_scratch import Bernoulli, Categorical, Gaussian, ggn, make_functional
from laplace_from_scratch.helpers import PinnedZeroLogit, fit_map, sinusoid, toy_nonlinear

laplace = pytest.importorskip("laplace", reason="laplace-torch is installed by `make install`")
from laplace.curvature import AsdlGGN, BackPackGGN, CurvlinopsGGN  # noqa: E402

# float64: both sides sum the same N·K rank-one terms in a different order; 1e-8 relative
# (the bound) leaves ~6 orders of magnitude above float64 round-off.
RTOL = 1e-8


pytestmark = pytest.mark.usefixtures("float64_default")


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


# ----- the posterior, the evidence and the GLM predictive (full, all weights, regression) -----

from laplace_from_scratch.laplace import Laplace as OurLaplace  # noqa: E402


def _fit_both(model, X, y, **kw):
    loader = DataLoader(TensorDataset(X, y), batch_size=50)
    ref = laplace.Laplace(
        model, kw.pop("likelihood", "regression"), subset_of_weights="all", hessian_structure="full", **kw
    )
    ref.fit(loader)
    ours = OurLaplace(model, ref.likelihood, subset_of_weights="all", hessian_structure="full", **kw)
    ours.fit(loader)
    return ours, ref


def _trained_regression_problem():
    from laplace_from_scratch.helpers import train_map

    model, X, y = _regression_problem()
    train_map(model, X, y, "regression", 0.3, 1.0, n_steps=300, lr=1e-2)
    return model, X, y


@pytest.mark.parametrize("sigma, delta, T", [(1.0, 1.0, 1.0), (0.3, 0.5, 1.0), (0.3, 0.5, 2.0)])
def test_posterior_evidence_and_predictive_equal_laplace_torch(sigma, delta, T):
    model, X, y = _trained_regression_problem()
    ours, ref = _fit_both(model, X, y, sigma_noise=sigma, prior_precision=delta, temperature=T)
    X_test = sinusoid(dtype=torch.float64).X_test[::25]
    assert _rel_err(ours.posterior_precision, ref.posterior_precision) < RTOL
    assert _rel_err(ours.posterior_covariance, ref.posterior_covariance) < RTOL
    assert _rel_err(ours.log_marginal_likelihood(), ref.log_marginal_likelihood()) < RTOL
    (f_mu, f_var), (r_mu, r_var) = ours(X_test), ref(X_test, pred_type="glm")
    assert f_var.shape == r_var.shape == (X_test.shape[0], 1, 1)
    assert _rel_err(f_mu, r_mu) < RTOL and _rel_err(f_var, r_var) < RTOL


def test_layerwise_prior_equals_laplace_torch():
    model, X, y = _trained_regression_problem()
    n_tensors = len(list(model.parameters()))
    prior = torch.linspace(0.5, 3.0, n_tensors)
    ours, ref = _fit_both(model, X, y, sigma_noise=0.3, prior_precision=prior)
    assert _rel_err(ours.prior_precision_diag, ref.prior_precision_diag) == 0
    assert _rel_err(ours.posterior_precision, ref.posterior_precision) < RTOL
    assert _rel_err(ours.posterior_covariance, ref.posterior_covariance) < RTOL
    assert _rel_err(ours.log_marginal_likelihood(), ref.log_marginal_likelihood()) < RTOL
    X_test = sinusoid(dtype=torch.float64).X_test[::25]
    assert _rel_err(ours(X_test)[1], ref(X_test, pred_type="glm")[1]) < RTOL


def test_classification_evidence_and_probit_equal_laplace_torch():
    model, X, y = _multiclass_problem()
    ours, ref = _fit_both(model, X, y, likelihood="classification", prior_precision=0.7)
    assert _rel_err(ours.log_marginal_likelihood(), ref.log_marginal_likelihood()) < RTOL
    p, p_ref = ours(X[:20], link_approx="probit"), ref(X[:20], pred_type="glm", link_approx="probit")
    assert _rel_err(p, p_ref) < RTOL
    torch.testing.assert_close(p.sum(-1), torch.ones(20), rtol=0, atol=1e-12)


@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_optimize_prior_precision_reaches_laplace_torch_delta(likelihood):
    """laplace-torch's defaults on both sides (Adam on log δ, lr 0.1, 100 steps, δ₀ = 1, scalar)."""
    if likelihood == "regression":
        model, X, y = _trained_regression_problem()
        kw = dict(sigma_noise=0.3)
    else:
        model, X, y = _multiclass_problem()
        kw = dict(likelihood="classification")
    ours, ref = _fit_both(model, X, y, **kw)
    ref.optimize_prior_precision(method="marglik")
    ours.optimize_prior_precision(method="marglik")
    assert abs(ours.prior_precision.item() / ref.prior_precision.item() - 1) < 1e-4


# ----- binary classification: laplace-torch 0.3 has no one-logit likelihood --------------------------
# A one-logit network f is the two-class softmax network [0, f] with the same parameters: same
# cross-entropy, same GGN (Λ's pinned row and column meet zero Jacobian rows), and its probit on
# [0, f] with f_var = diag(0, v) is σ(f/√(1 + πv/8)). So laplace-torch on the pinned network is the
# reference for our 'binary_classification' on the one-logit network.


def _binary_problem():
    torch.manual_seed(0)
    d = toy_nonlinear(n=120, dtype=torch.float64)
    model = mlp(2, 1, width=10)
    fit_map(model, d.X, d.y, "binary_classification", prior_precision=1.0, adam_steps=300, lbfgs_steps=100)
    return model, d.X, d.y


def _fit_binary_both(**kw):
    model, X, y = _binary_problem()
    loader = DataLoader(TensorDataset(X, y), batch_size=50)
    backend = kw.pop("backend", CurvlinopsGGN)
    ref = laplace.Laplace(
        PinnedZeroLogit(model),
        "classification",
        subset_of_weights="all",
        hessian_structure="full",
        backend=backend,
        **kw,
    )
    ref.fit(loader)
    ours = OurLaplace(model, "binary_classification", **kw)
    ours.fit(loader)
    return ours, ref, X


@pytest.mark.parametrize("backend", [CurvlinopsGGN, BackPackGGN, AsdlGGN])
def test_binary_ggn_equals_laplace_torch_H_of_the_pinned_network(backend):
    ours, ref, X = _fit_binary_both(backend=backend)
    f, theta = make_functional(ours.model)
    assert _rel_err(ours.H, ref.H) < RTOL
    assert _rel_err(ggn(f, theta, X, Bernoulli()), ref.H) < RTOL


@pytest.mark.parametrize("delta", [0.1, 1.0, 10.0])
def test_binary_evidence_and_probit_equal_laplace_torch(delta):
    ours, ref, X = _fit_binary_both(prior_precision=delta)
    assert _rel_err(ours.log_marginal_likelihood(), ref.log_marginal_likelihood()) < RTOL
    Xq = torch.cat([X[:20], 5 * torch.randn(20, 2)])
    p, p_ref = ours(Xq, link_approx="probit"), ref(Xq, pred_type="glm", link_approx="probit")
    assert p.shape == p_ref.shape == (40, 2)
    assert _rel_err(p, p_ref) < RTOL


def test_binary_optimize_prior_precision_reaches_laplace_torch_delta():
    ours, ref, _ = _fit_binary_both()
    ref.optimize_prior_precision(method="marglik")
    ours.optimize_prior_precision(method="marglik")
    assert abs(ours.prior_precision.item() / ref.prior_precision.item() - 1) < 1e-4


def test_multiclass_laplace_bridge_equals_laplace_torch():
    model, X, y = _multiclass_problem()
    ours, ref = _fit_both(model, X, y, likelihood="classification", prior_precision=0.7)
    Xq = torch.cat([X[:20], 5 * torch.randn(20, 2)])
    p, p_ref = ours(Xq, link_approx="bridge"), ref(Xq, pred_type="glm", link_approx="bridge")
    assert _rel_err(p, p_ref) < RTOL


# diag, kron and the last layer (and full again) for regression, binary and multiclass: tests/test_parity.py
