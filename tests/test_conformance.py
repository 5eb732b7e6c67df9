"""Conformance of every posterior structure to the ``Posterior`` protocol (curvlinops' style).

One parametrisation over ``structures.STRUCTURES`` × likelihood × every prior kind in ``STRUCTURES[s].priors``
× data size (N·K < P and N·K > P: the full structure's evidence takes the eigen/dual route for a
scalar prior in the first, Cholesky in the second). For each case every protocol method,
called as ``method(prior, factor)`` on ``la.structure`` after ``Laplace.fit``, is compared with
dense float64 linear algebra on a reference Σ⁻¹ = c·H + diag(p₀):

* H: the GGN Σₙ Jₙᵀ Λₙ Jₙ computed here from ``torch.func.jacrev`` (independent of the package)
  for full, lowrank (rank = P, exact) and matfree; its diagonal for diag; with Λₙ's diagonal
  for gp (all N inputs, so the kernel route must give this weight-space posterior exactly); the
  structure's own Kronecker blocks (``la.H.to_matrix()``) for kron, whose Σ⁻¹ is not the GGN's. So
  ``test_precision_is_the_reference`` also checks that diag is the GGN's diagonal, that lowrank at
  full rank is the GGN, and that matfree's products are the GGN's.
* ``precision`` = Σ⁻¹, ``covariance`` = inv(Σ⁻¹), ``variance`` = diag inv(Σ⁻¹), ``log_det`` =
  slogdet, its gradient in the prior (in the prior's own shape) and in c = autograd of slogdet,
  ``functional_variance(J)`` = J Σ Jᵀ (J from ``la.jacobians``), ``sample``: whitened draws are
  N(0, I) by three statistics whose tolerances follow from the sample count.

A new structure added to ``STRUCTURES`` fails here until it is given a reference curvature in
``reference_curvature`` (and, where it needs them, options in ``OPTIONS``).

Matfree is stochastic only where its docstring says so: with ``lanczos_steps = sample_steps = P``
its Lanczos quadrature and Lanczos square root are exact, so SLQ's log det and the Hutchinson
diag(Σ) (also the log det's gradient) carry only the probes' Monte-Carlo error, whose exact
standard deviation is computed here from the dense reference; CG runs to ``cg_tol = 1e-12``.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev
from torch.utils.data import DataLoader, TensorDataset

from laplace_from_scratch import Laplace
from laplace_from_scratch.structures import STRUCTURES

D = torch.float64

# ----- tolerances -------------------------------------------------------------------------------
RTOL = 1e-10  # relative error of exact structures in float64 (Frobenius / absolute for scalars)
RTOL_ITERATIVE = 1e-8  # matfree's CG solves (relative residual 1e-12 times cond(Σ⁻¹) ≲ 10⁴)
N_SIGMA = 5  # stochastic checks: within 5 exact standard deviations (seeded: deterministic)
N_SAMPLES = 20_000  # draws for the sample test (each is one P-vector)
# each matfree draw costs sample_steps = P GGN-vector products (~1 ms each here), so its sample
# test runs on two cases (see MATFREE_SAMPLE_CASES) with this many draws
N_SAMPLES_MATFREE = 160
N_PROBES = 20  # matfree SLQ / Hutchinson probes (its tolerances scale with 1/√N_PROBES)
# ‖Ŵ − I‖²_F / (P(P+1)/S) for S whitened N(0, I_P) draws has mean 1 and (simulated, P ≥ 25,
# S ≥ P/2) standard deviation ≤ 0.1: 1.5 is ≥ 5 of them
FROBENIUS_RATIO = 1.5

D_IN, WIDTH, K = 3, 4, 2  # 3 → 4 → 2 tanh: P = 26
LIKELIHOODS = ("regression", "classification")
# c = 1/(σ²T), not 1, so that a missing factor shows
FACTORS = {"regression": 1 / (0.7**2 * 1.3), "classification": 1 / 0.8}
SIZES = ("NK<P", "NK>P")


def _model() -> nn.Module:
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(D_IN, WIDTH), nn.Tanh(), nn.Linear(WIDTH, K)).to(D)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=D) * 0.8)
    return model.eval()


MODEL = _model()
SIZES_OF_TENSORS = [p.numel() for p in MODEL.parameters()]
P = sum(SIZES_OF_TENSORS)


def _n_data(size: str) -> int:
    return P // (2 * K) if size == "NK<P" else P  # N·K = P/2 or 2P


# options that make each structure exact (or exact up to its stated Monte-Carlo error) at tiny P
OPTIONS = {
    "lowrank": dict(rank=P),
    "matfree": dict(n_probes=N_PROBES, lanczos_steps=P, sample_steps=P, cg_tol=1e-12),
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # tiny matrices: torch's thread pool only adds overhead on 2 shared cores
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@functools.cache
def _data(likelihood: str, size: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    N = _n_data(size)
    X = torch.randn(N, D_IN, generator=g, dtype=D)
    y = (
        torch.randn(N, K, generator=g, dtype=D)
        if likelihood == "regression"
        else torch.randint(0, K, (N,), generator=g)
    )
    return X, y


@functools.cache
def _fitted(structure: str, likelihood: str, size: str) -> Laplace:
    X, y = _data(likelihood, size)
    la = Laplace(MODEL, likelihood, hessian_structure=structure, **OPTIONS.get(structure, {}))
    la.fit(DataLoader(TensorDataset(X, y), batch_size=math.ceil(X.shape[0] / 2)))  # two batches
    return la


@functools.cache
def _ggn(likelihood: str, size: str, diagonal_lambda: bool = False) -> torch.Tensor:
    """Σₙ Jₙᵀ Λₙ Jₙ (P, P) from jacrev, Λ = I (regression) or diag p − p pᵀ (classification);
    with ``diagonal_lambda`` only Λ's diagonal (the GP structure's, as laplace-torch's)."""
    X, _ = _data(likelihood, size)
    names = [n for n, _ in MODEL.named_parameters()]
    theta = torch.cat([p.detach().reshape(-1) for p in MODEL.parameters()])

    def f(th):
        chunks = th.split(SIZES_OF_TENSORS)
        params = {n: c.view_as(p) for n, c, p in zip(names, chunks, MODEL.parameters(), strict=True)}
        return functional_call(MODEL, params, (X,))

    J = jacrev(f)(theta)  # (N, K, P)
    with torch.no_grad():
        out = f(theta)
    if likelihood == "regression":
        Lam = torch.eye(K, dtype=D).expand(X.shape[0], K, K)
    else:
        p = out.softmax(-1)
        Lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    if diagonal_lambda:
        Lam = torch.diag_embed(Lam.diagonal(dim1=-2, dim2=-1))
    return torch.einsum("nkp,nkl,nlq->pq", J, Lam, J)


def reference_curvature(structure: str, likelihood: str, size: str) -> torch.Tensor:
    """The dense H (P, P) of the structure's own Σ⁻¹ = c·H + diag(p₀)."""
    if structure in ("full", "lowrank", "matfree"):  # lowrank at rank = P is the GGN
        return _ggn(likelihood, size)
    if structure == "diag":
        return torch.diag(_ggn(likelihood, size).diagonal())
    if structure == "kron":
        return _dense(_fitted(structure, likelihood, size).H)
    if structure == "gp":  # all N inputs (n_subset=None): the GGN with Λ's diagonal
        return _ggn(likelihood, size, diagonal_lambda=True)
    raise KeyError(f"no dense reference for structure {structure!r}: add one to reference_curvature")


def _prior(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    if kind == "scalar":
        return torch.tensor(0.7, dtype=D)
    if kind == "layerwise":
        return torch.linspace(0.5, 2.0, len(SIZES_OF_TENSORS), dtype=D)
    return 0.3 + 1.5 * torch.rand(P, generator=g, dtype=D)


def _groups(kind: str) -> torch.Tensor:
    """R (P, n_prior_values) with p₀ expanded = R @ prior (0/1 indicators)."""
    if kind == "scalar":
        return torch.ones(P, 1, dtype=D)
    if kind == "layerwise":
        idx = torch.repeat_interleave(torch.arange(len(SIZES_OF_TENSORS)), torch.tensor(SIZES_OF_TENSORS))
        return nn.functional.one_hot(idx, len(SIZES_OF_TENSORS)).to(D)
    return torch.eye(P, dtype=D)


def _expand(prior: torch.Tensor, kind: str) -> torch.Tensor:
    return _groups(kind) @ prior.reshape(-1)


def _dense(x) -> torch.Tensor:
    """A protocol return value as a dense (P, P) matrix: tensor, diagonal (P,) or ``to_matrix()``."""
    if isinstance(x, torch.Tensor):
        return torch.diag(x) if x.ndim == 1 else x
    return x.to_matrix()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _hutchinson_sd(M: torch.Tensor, n: int) -> torch.Tensor:
    """Standard deviation of the mean of n Rademacher estimates zᵀ M z of tr M: √(2 Σᵢ≠ⱼ Mₛ²ᵢⱼ / n)."""
    Ms = (M + M.T) / 2
    off = Ms - torch.diag(Ms.diagonal())
    return (2 * (off**2).sum() / n).sqrt()


def _cases():
    for s in STRUCTURES:
        for lik in LIKELIHOODS:
            for kind in STRUCTURES[s].priors:
                for size in SIZES:
                    yield pytest.param((s, lik, kind, size), id=f"{s}-{lik}-{kind}-{size}")


CASES = list(_cases())
# the scalar prior with N·K < P (the Krylov space of c·G + δI is exhausted early) and the most
# general prior with N·K > P
MATFREE_SAMPLE_CASES = (
    (
        ("regression", STRUCTURES["matfree"].priors[0], "NK<P"),
        ("classification", STRUCTURES["matfree"].priors[-1], "NK>P"),
    )
    if "matfree" in STRUCTURES
    else ()
)


class Case:
    """One (structure, likelihood, prior kind, size): the fitted structure and the dense reference.

    ``log_det`` with its gradient and ``variance`` are evaluated once per case, one right after
    the other (matfree's SLQ estimate serves both, cached for the last (prior, factor))."""

    def __init__(self, structure, likelihood, kind, size):
        self.structure, self.likelihood, self.kind, self.size = structure, likelihood, kind, size
        self.la = _fitted(structure, likelihood, size)
        self.post = self.la.structure
        self.prior = _prior(kind)
        self.factor = torch.tensor(FACTORS[likelihood], dtype=D)
        self.H = reference_curvature(structure, likelihood, size)
        self.A = self.factor * self.H + torch.diag(_expand(self.prior, kind))  # Σ⁻¹
        self.Sigma = torch.cholesky_inverse(torch.linalg.cholesky(self.A))
        self.stochastic = self.iterative = structure == "matfree"

    @functools.cached_property
    def log_det_and_variance(self):
        prior = self.prior.clone().requires_grad_()
        factor = self.factor.clone().requires_grad_()
        log_det = self.post.log_det(prior, factor)
        g_prior, g_factor = torch.autograd.grad(log_det, (prior, factor))
        return log_det.detach(), g_prior, g_factor, self.post.variance(self.prior, self.factor)


@functools.cache
def _case(params) -> Case:
    return Case(*params)


@pytest.fixture
def case(request) -> Case:
    return _case(request.param)


parametrize = pytest.mark.parametrize("case", CASES, indirect=True)


@parametrize
def test_precision_is_the_reference(case):
    got = _dense(case.post.precision(case.prior, case.factor))
    assert got.dtype == D and got.shape == (P, P)
    assert _rel(got, case.A) < RTOL


@parametrize
def test_covariance_is_the_inverse(case):
    got = _dense(case.post.covariance(case.prior, case.factor))
    assert got.dtype == D and got.shape == (P, P)
    assert _rel(got, case.Sigma) < (RTOL_ITERATIVE if case.iterative else RTOL)


@parametrize
def test_functional_variance_is_J_Sigma_Jt(case):
    x = torch.randn(5, D_IN, generator=torch.Generator().manual_seed(3), dtype=D)
    J = case.la.jacobians(x)
    assert J.shape == (5, K, P)
    got = case.post.functional_variance(J, case.prior, case.factor)
    want = J @ case.Sigma @ J.mT
    assert got.dtype == D and got.shape == (5, K, K)
    assert _rel(got, want) < (RTOL_ITERATIVE if case.iterative else RTOL)


@parametrize
def test_log_det_is_slogdet(case):
    got = case.log_det_and_variance[0]
    sign, want = torch.linalg.slogdet(case.A)
    assert sign > 0 and got.dtype == D and got.shape == ()
    if case.stochastic:
        # SLQ with P Lanczos steps is exact per probe: zᵀ log(Σ⁻¹) z, so only Hutchinson's error
        lam, Q = torch.linalg.eigh(case.A)
        sd = _hutchinson_sd((Q * lam.log()) @ Q.T, N_PROBES)
        assert abs(got - want) <= N_SIGMA * sd, f"{got.item()} vs {want.item()}, sd {sd.item():.3g}"
    else:
        assert abs(got - want) <= RTOL * max(1.0, abs(want.item()))


@parametrize
def test_log_det_gradient_is_autograd_of_slogdet(case):
    _, g_prior, g_factor, _ = case.log_det_and_variance
    prior_ref = case.prior.clone().requires_grad_()
    factor_ref = case.factor.clone().requires_grad_()
    A = factor_ref * case.H + torch.diag(_expand(prior_ref, case.kind))
    w_prior, w_factor = torch.autograd.grad(torch.linalg.slogdet(A)[1], (prior_ref, factor_ref))
    assert g_prior.shape == case.prior.shape and g_factor.shape == ()
    if case.stochastic:
        # ∂/∂p₀ₖ and ∂/∂c come from the Hutchinson estimate of diag Σ: zᵀ Dₖ Σ z summed over
        # each prior value's parameters, and (P − zᵀ diag(p₀) Σ z)/c
        R = _groups(case.kind)
        sd_prior = torch.stack(
            [_hutchinson_sd(R[:, k, None] * case.Sigma, N_PROBES) for k in range(R.shape[1])]
        )
        sd_factor = (
            _hutchinson_sd(_expand(case.prior, case.kind)[:, None] * case.Sigma, N_PROBES) / case.factor
        )
        assert ((g_prior - w_prior).abs().reshape(-1) <= N_SIGMA * sd_prior + 1e-10).all()
        assert abs(g_factor - w_factor) <= N_SIGMA * sd_factor + 1e-10
    else:
        assert _rel(g_prior.reshape(-1), w_prior.reshape(-1)) < RTOL
        assert abs(g_factor - w_factor) <= RTOL * abs(w_factor)


@parametrize
def test_variance_is_the_inverse_diagonal(case):
    got = case.log_det_and_variance[3]
    want = case.Sigma.diagonal()
    assert got.dtype == D and got.shape == (P,)
    if case.stochastic:
        # Hutchinson: zᵢ (Σz)ᵢ has variance Σⱼ≠ᵢ Σᵢⱼ² for Rademacher z
        off = case.Sigma - torch.diag(want)
        sd = ((off**2).sum(1) / N_PROBES).sqrt()
        assert ((got - want).abs() <= N_SIGMA * sd + 1e-10 * want.max()).all()
    else:
        assert _rel(got, want) < RTOL


@parametrize
def test_samples_have_mean_zero_and_covariance_sigma(case):
    S = N_SAMPLES
    if case.structure == "matfree":
        if (case.likelihood, case.kind, case.size) not in MATFREE_SAMPLE_CASES:
            pytest.skip(
                "matfree draws cost P GGN products each: sampled in "
                f"{MATFREE_SAMPLE_CASES} only (the prior enters its Lanczos only through the "
                "product checked for every case by test_precision_is_the_reference)"
            )
        S = N_SAMPLES_MATFREE
    x = case.post.sample(S, case.prior, case.factor, torch.Generator().manual_seed(4))
    assert x.dtype == D and x.shape == (S, P)
    # whiten by Σ⁻¹ = L Lᵀ: w = Lᵀ x ~ N(0, I_P) exactly when x ~ N(0, Σ)
    W = x @ torch.linalg.cholesky(case.A)
    # S‖w̄‖² ~ χ²_P (mean P, sd √(2P))
    assert S * W.mean(0).square().sum() <= P + N_SIGMA * math.sqrt(2 * P)
    # mean of the S·P squares ~ χ²_{SP}/(SP) (sd √(2/(SP))): the overall scale of Σ
    assert abs(W.square().mean() - 1) <= N_SIGMA * math.sqrt(2 / (S * P))
    # ‖Ŵ − I‖²_F has mean P(P+1)/S (Wishart); every direction of Σ, not just the scale
    err = (W.T @ W / S - torch.eye(P, dtype=D)).square().sum()
    assert err <= FROBENIUS_RATIO * P * (P + 1) / S, f"ratio {(err / (P * (P + 1) / S)).item():.3f}"
