"""operators.py: the precision, covariance and GGN operators of kron, low-rank and matrix-free Laplace
against their own dense matrices (float64, P = 63); the memory check of ``to_matrix``; the model's
dtype in everything a float32 model's posterior returns."""

import pytest
import torch
from conftest import mlp
from torch.utils.data import DataLoader, TensorDataset

from laplace_from_scratch import Laplace, memory_limit
from laplace_from_scratch.operators import Operator

D = torch.float64
OPTIONS = {"kron": {}, "lowrank": {"rank": 10}, "matfree": {"cg_tol": 1e-10}}
# (structure, which operator): laplace-torch's H is the pair (V, λ) for low-rank, not an operator
CASES = [(s, w) for s in OPTIONS for w in ("precision", "covariance", "H") if (s, w) != ("lowrank", "H")]
HAS_LOGDET = {"kron", "lowrank"}


def _fitted(structure: str, dtype=D, **options) -> Laplace:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(30, 2, generator=g, dtype=dtype)
    y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()
    la = Laplace(mlp(2, 3, width=5, dtype=dtype), "classification", hessian_structure=structure,
                 prior_precision=0.5, **(OPTIONS[structure] | options))  # fmt: skip
    la.fit(DataLoader(TensorDataset(X, y), batch_size=10))
    return la


def _operator(la: Laplace, which: str) -> Operator:
    return {"precision": la.posterior_precision, "covariance": la.posterior_covariance, "H": la.H}[which]


@pytest.mark.parametrize("structure, which", CASES)
def test_products_diagonal_and_logdet_agree_with_the_dense_matrix(structure, which):
    la = _fitted(structure)
    A = _operator(la, which)
    P = la.n_params
    assert isinstance(A, Operator) and A.shape == (P, P)
    M = A.to_matrix()
    # round-off, but CG solves (matrix-free Σ) stop at a residual of 1e-10: times the condition number
    cg = (structure, which) == ("matfree", "covariance")
    tol = dict(rtol=1e-5, atol=1e-6 * M.abs().max().item()) if cg else dict(rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(M, M.T, **tol)
    V = torch.randn(P, 4, dtype=D)
    torch.testing.assert_close(A @ V, M @ V, **tol)
    torch.testing.assert_close(A @ V[:, 0], M @ V[:, 0], **tol)
    assert torch.equal(A(V[:, 0]), A @ V[:, 0])  # an operator is a function v ↦ A v
    torch.testing.assert_close(A.diagonal(), M.diagonal(), **tol)
    if structure not in HAS_LOGDET:
        with pytest.raises(NotImplementedError, match="log"):
            A.logdet()
    elif which != "H":  # the GGN is singular: its log det is round-off
        torch.testing.assert_close(A.logdet(), torch.linalg.slogdet(M)[1], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("structure", OPTIONS)
def test_covariance_is_the_inverse_of_the_precision(structure):
    la = _fitted(structure)
    eye = torch.eye(la.n_params, dtype=D)
    product = la.posterior_precision.to_matrix() @ la.posterior_covariance.to_matrix()
    torch.testing.assert_close(product, eye, rtol=0, atol=1e-7)


class _Dense(Operator):
    def __init__(self, A):
        self.A, self.like, self.shape = A, A, tuple(A.shape)

    def __matmul__(self, v):
        return self.A @ v


def test_the_base_class_works_in_blocks_of_columns():
    """P = 300: three blocks of 128 columns (``posterior.default_block``); products with 0/1 columns are
    exact."""
    A = torch.randn(300, 300, dtype=D)
    A = A + A.T
    assert torch.equal(_Dense(A).to_matrix(), A)
    assert torch.equal(_Dense(A).diagonal(), A.diagonal())
    with pytest.raises(NotImplementedError, match="_Dense has no exact logdet"):
        _Dense(A).logdet()


@pytest.mark.parametrize("structure", OPTIONS)
def test_to_matrix_checks_memory_before_allocating(structure, monkeypatch):
    la = _fitted(structure)
    A, P = la.posterior_precision, la.n_params
    monkeypatch.setattr(memory_limit, "available_bytes", lambda device: 1024)
    with pytest.raises(MemoryError, match=rf"to_matrix\(\) needs a dense {P}×{P} matrix.*products"):
        A.to_matrix()
    assert (A @ torch.ones(P, dtype=D)).shape == (P,)  # products need no P×P


@pytest.mark.parametrize("structure", OPTIONS)
def test_a_float32_model_gets_float32_back(structure):
    """Everything the posterior returns has the model's dtype, even for float64 hyperparameters
    passed to the structure directly."""
    cheap = dict(cg_tol=1e-4, n_probes=3, lanczos_steps=10, sample_steps=10)  # float32, fast
    la = _fitted(structure, torch.float32, **(cheap if structure == "matfree" else {}))
    post, X = la.structure, torch.randn(3, 2)
    prior, factor = torch.tensor(0.5, dtype=D), torch.tensor(2.0, dtype=D)
    J = la.jacobians(X)
    out = {
        "log_det": post.log_det(prior, factor),
        "variance": post.variance(prior, factor),
        "functional_variance": post.functional_variance(J, prior, factor),
        "sample": post.sample(2, prior, factor, generator=torch.Generator().manual_seed(0)),
        "evidence": la.log_marginal_likelihood(),
        "predictive": la(X),
    }
    ops = {"precision": post.precision(prior, factor), "covariance": post.covariance(prior, factor)}
    if structure != "lowrank":
        ops["H"] = post.H
    v = torch.ones(la.n_params)
    for name, A in ops.items():
        out |= {f"{name} @ v": A @ v, f"{name}.to_matrix": A.to_matrix(), f"{name}.diagonal": A.diagonal()}
        if structure in HAS_LOGDET:
            out[f"{name}.logdet"] = A.logdet()
    assert {k: t.dtype for k, t in out.items() if t.dtype != torch.float32} == {}
