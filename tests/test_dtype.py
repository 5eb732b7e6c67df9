"""Every tensor the public ``Laplace`` API returns has the model's dtype.

Grid: float32 and float64 models (the same tiny 3 → 8 → 2 tanh MLP, P = 50) × every structure in
``structures.STRUCTURES`` (the full one once per evidence route "auto", "eigen", "cholesky") ×
N·K < P and N·K > P (the full structure keeps the whitened Jacobians and its "auto" route takes
the eigen/dual route for a scalar prior only in the first) × regression and classification ×
each returned quantity: the evidence and its parts, Σ⁻¹, Σ, diag Σ, samples, J Σ Jᵀ, the GLM
predictive (regression: f_mu and f_var; classification: every ``link_approx``), the NN
predictive and functional samples. A float32 result computed in float64 internally must be cast
back; a float64 result of a float32 model is a silent dtype change for the caller.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from laplace_from_scratch import Laplace
from laplace_from_scratch.structures import STRUCTURES

DTYPES = (torch.float32, torch.float64)
ROUTES = ("auto", "eigen", "cholesky")  # evidence routes of the full structure
SIZES = ("NK<P", "NK>P")
LIKELIHOODS = ("regression", "classification")
LINKS = ("probit", "mc", "bridge")
D_IN, WIDTH, K = 3, 8, 2  # P = 50
# cheap settings where a structure has them (the dtype, not the accuracy, is under test)
OPTIONS = {"matfree": dict(n_probes=4, lanczos_steps=10, sample_steps=10)}


def _model64() -> nn.Module:
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(D_IN, WIDTH), nn.Tanh(), nn.Linear(WIDTH, K)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.8)
    return model.eval()


MODELS = {torch.float64: _model64()}
MODELS[torch.float32] = copy.deepcopy(MODELS[torch.float64]).float().eval()
P = sum(p.numel() for p in MODELS[torch.float64].parameters())


@functools.cache
def _data(dtype: torch.dtype, likelihood: str, size: str):
    g = torch.Generator().manual_seed(1)
    N = P // (2 * K) if size == "NK<P" else 2 * P // K  # N·K = P/2 or 2P
    X = torch.randn(N, D_IN, generator=g, dtype=torch.float64).to(dtype)
    if likelihood == "regression":
        y = torch.randn(N, K, generator=g, dtype=torch.float64).to(dtype)
    else:
        y = torch.randint(0, K, (N,), generator=g)
    x_test = torch.randn(4, D_IN, generator=g, dtype=torch.float64).to(dtype)
    return X, y, x_test


def make_laplace(model, likelihood, structure, route, **kw) -> tuple[Laplace, bool]:
    """``Laplace`` with the evidence route given as the ``evidence_route=`` keyword where it is one
    (of ``Laplace`` or of the full structure), else set as the ``evidence_route`` attribute.
    Returns (la, whether the keyword was used); the keyword is only refused at ``fit``."""
    if route is None:
        return Laplace(model, likelihood, hessian_structure=structure, **kw), False
    try:
        return Laplace(model, likelihood, hessian_structure=structure, evidence_route=route, **kw), True
    except TypeError as e:
        if "evidence_route" not in str(e):
            raise
    la = Laplace(model, likelihood, hessian_structure=structure, **kw)
    la.evidence_route = route
    return la, False


@functools.cache
def _fitted(dtype, structure, route, size, likelihood) -> Laplace:
    X, y, _ = _data(dtype, likelihood, size)
    kw = dict(OPTIONS.get(structure, {}))
    if likelihood == "regression":
        kw["sigma_noise"] = 0.5
    loader = DataLoader(TensorDataset(X, y), batch_size=16)
    la, keyword = make_laplace(MODELS[dtype], likelihood, structure, route, **kw)
    try:
        la.fit(loader)
    except TypeError as e:  # an older Laplace passes unknown keywords to the builder at fit
        if not keyword or "evidence_route" not in str(e):
            raise
        la, _ = make_laplace(MODELS[dtype], likelihood, structure, None, **kw)
        la.evidence_route = route
        la.fit(loader)
    if route is not None and hasattr(la.structure, "route"):
        assert la.structure.route == route
    return la


def _as_tensor(x) -> torch.Tensor:
    """A returned matrix: a tensor, or an object with ``to_matrix()``."""
    return x if isinstance(x, torch.Tensor) else x.to_matrix()


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(5)


COMMON = {
    "log_marginal_likelihood": lambda la, x: la.log_marginal_likelihood(),
    "log_likelihood": lambda la, x: la.log_likelihood,
    "log_det_posterior_precision": lambda la, x: la.log_det_posterior_precision,
    "log_det_ratio": lambda la, x: la.log_det_ratio,
    "posterior_precision": lambda la, x: _as_tensor(la.posterior_precision),
    "posterior_covariance": lambda la, x: _as_tensor(la.posterior_covariance),
    "posterior_variance": lambda la, x: la.posterior_variance,
    "sample": lambda la, x: la.sample(5, generator=_gen()),
    "functional_variance": lambda la, x: la.functional_variance(la.jacobians(x)),
    "functional_samples": lambda la, x: la.functional_samples(x, n_samples=5, generator=_gen()),
    "predictive_nn": lambda la, x: la(x, pred_type="nn", link_approx="mc", n_samples=5, generator=_gen()),
}


def _glm_probs(link: str):
    return lambda la, x: la(x, link_approx=link, n_samples=5, generator=_gen())


BY_LIKELIHOOD = {
    "regression": {"predictive_glm": lambda la, x: la(x)},  # (f_mu, f_var)
    "classification": {f"predictive_glm_{link}": _glm_probs(link) for link in LINKS},
}


def _cases():
    for dtype in DTYPES:
        for structure in STRUCTURES:
            for route in ROUTES if structure == "full" else (None,):
                for size in SIZES:
                    for lik in LIKELIHOODS:
                        for name in {**COMMON, **BY_LIKELIHOOD[lik]}:
                            s = structure if route is None else f"{structure}[{route}]"
                            dt = str(dtype).removeprefix("torch.")
                            yield pytest.param(
                                dtype, structure, route, size, lik, name, id=f"{dt}-{s}-{size}-{lik}-{name}"
                            )


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add overhead on 2 shared cores
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("dtype, structure, route, size, likelihood, quantity", list(_cases()))
def test_returned_tensors_have_the_model_dtype(dtype, structure, route, size, likelihood, quantity):
    la = _fitted(dtype, structure, route, size, likelihood)
    x = _data(dtype, likelihood, size)[2]
    out = {**COMMON, **BY_LIKELIHOOD[likelihood]}[quantity](la, x)
    outs = out if isinstance(out, tuple) else (out,)
    got = [t.dtype for t in outs]
    assert got == [dtype] * len(outs), f"{quantity}: {got} for a {dtype} model"
