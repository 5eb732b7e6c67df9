"""Function-space (GP) Laplace, ``hessian_structure="gp"`` (``gp.py``), in float64:

* with all N inputs in regression it is the full GGN Laplace: the same GLM predictive (marginal and
  joint) and the same evidence, with the same gradients in δ and σ (the check laplace-torch does
  not make);
* it equals laplace-torch's ``FunctionalLaplace`` / ``FunctionalLLLaplace`` (its predictive, and
  its ``log_det_ratio`` up to the stated M·K·log σ² term) with all inputs and with a subset (both
  given the same subset: laplace-torch draws it with numpy);
* where laplace-torch's joint kernel is wrong (K > 1 outputs, ``independent_outputs=False``, a
  network whose output Jacobians are not symmetric across outputs) ours equals the dense
  J* Σ J*ᵀ, and laplace-torch's equals the formula with K_*M's test and training output indices
  swapped;
* the errors a user can meet.

Each check prints the difference and its tolerance."""

import warnings

import pytest
import torch
from conftest import mlp, same_subset
from torch.func import functional_call, jacrev
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs

D = torch.float64
TOL = 1e-10  # float64 round-off of two exact routes (kernel vs weight space)
N = 24


pytestmark = pytest.mark.usefixtures("float64_default")


def problem(likelihood: str, K: int, depth: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = mlp(3, K, width=5, depth=depth)
    X = torch.randn(N, 3, generator=g, dtype=D)
    if likelihood == "regression":
        y = torch.randn(N, K, generator=g, dtype=D)
    else:
        y = torch.randint(0, K, (N,), generator=g)
    return model, DataLoader(TensorDataset(X, y), batch_size=8), torch.randn(5, 3, generator=g, dtype=D)


def hyper(likelihood: str) -> dict:
    return dict(prior_precision=1.3, sigma_noise=0.6 if likelihood == "regression" else 1.0)


def diff(a, b) -> float:
    return (a - b).abs().max().item()


def check(what: str, a, b, tol=TOL) -> None:
    err = diff(a, b)
    print(f"{what}: max |Δ| = {err:.1e} (tol {tol:.0e})")
    assert err <= tol, (what, err)


@pytest.mark.parametrize("K", [1, 3])
def test_all_inputs_in_regression_is_full_laplace(K):
    model, loader, Xs = problem("regression", K)
    gp = lfs.Laplace(model, "regression", "all", "gp", **hyper("regression"))
    full = lfs.Laplace(model, "regression", "all", "full", evidence_route="cholesky", **hyper("regression"))
    gp.fit(loader)
    full.fit(loader)
    for joint in (False, True):
        (m1, v1), (m2, v2) = gp.glm_predictive(Xs, joint), full.glm_predictive(Xs, joint)
        check(f"K={K} joint={joint} f_mu", m1, m2)
        check(f"K={K} joint={joint} f_var", v1, v2)
    grads = []
    for la in (gp, full):
        delta = torch.tensor(0.9, requires_grad=True)
        sigma = torch.tensor(0.5, requires_grad=True)
        lml = la.log_marginal_likelihood(delta, sigma)
        grads.append((lml.detach(), *torch.autograd.grad(lml, (delta, sigma))))
    check(f"K={K} evidence", grads[0][0], grads[1][0])
    check(f"K={K} ∂evidence/∂δ", grads[0][1], grads[1][1])
    check(f"K={K} ∂evidence/∂σ", grads[0][2], grads[1][2])


# laplace-torch's joint kernel is right for K = 1, independent outputs, and one hidden layer
CASES = [
    ("regression", 1, 2, False),
    ("regression", 2, 2, True),
    ("regression", 2, 1, False),
    ("classification", 3, 2, True),
    ("classification", 3, 1, False),
]


@pytest.mark.parametrize("subset", ["all", "last_layer"])
@pytest.mark.parametrize("M", [N, 10])
@pytest.mark.parametrize(("likelihood", "K", "depth", "independent"), CASES)
def test_equals_laplace_torch(likelihood, K, depth, independent, M, subset, monkeypatch):
    laplace = pytest.importorskip("laplace", reason="laplace-torch is installed by `make install`")
    model, loader, Xs = problem(likelihood, K, depth)
    opts = dict(n_subset=M, independent_outputs=independent)
    ours = lfs.Laplace(model, likelihood, subset, "gp", **opts, **hyper(likelihood))
    ours.fit(loader)
    monkeypatch.setattr(laplace.baselaplace, "SoDSampler", same_subset(ours._builder.subset(N).tolist(), N))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = laplace.Laplace(model, likelihood, subset, "gp", **opts, **hyper(likelihood))
        ref.fit(loader)
        for joint in (False, True):
            m1, v1 = ours.glm_predictive(Xs, joint)
            m2, v2 = ref._glm_predictive_distribution(Xs, joint=joint)
            check(f"{likelihood} K={K} M={M} {subset} joint={joint} f_mu", m1, m2)
            check(f"{likelihood} K={K} M={M} {subset} joint={joint} f_var", v1, v2)
        theirs = ref.log_det_ratio
    if likelihood == "regression":  # theirs is log det(K_MM + σ²I) = ours + M·K·log σ²
        theirs = theirs - M * K * torch.log(ref.sigma_noise.square()).reshape(())
    check(f"{likelihood} K={K} M={M} {subset} log det ratio", ours.log_det_ratio, theirs)


def test_laplace_torch_joint_kernel_swaps_output_indices():
    """laplace-torch reshapes K_*M (N*, M, K*, K_M) to (N*, M·K*, K_M): the training rows of its
    solve are indexed by the test output. Invisible when ⟨J*_c, J_e⟩ is symmetric in (c, e) (one
    hidden layer), wrong with two."""
    laplace = pytest.importorskip("laplace", reason="laplace-torch is installed by `make install`")
    model, loader, Xs = problem("regression", 2, depth=2)
    ours = lfs.Laplace(model, "regression", "all", "gp", **hyper("regression"))
    ours.fit(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = laplace.Laplace(model, "regression", "all", "gp", n_subset=N, **hyper("regression"))
        ref.fit(loader)
        _, v_ref = ref._glm_predictive_distribution(Xs)
    X = loader.dataset.tensors[0]
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def f(th, x):
        chunks = th.split([s.numel() for s in shapes])
        params = {n: c.view(s) for n, c, s in zip(names, chunks, shapes, strict=True)}
        return functional_call(model, params, (x,))

    J, Js = jacrev(f)(theta, X), jacrev(f)(theta, Xs)  # (N, K, P), (N*, K, P)
    delta, c = 1.3, 1 / 0.6**2
    Sigma = torch.linalg.inv(c * torch.einsum("nkp,nkq->pq", J, J) + delta * torch.eye(theta.numel()))
    dense = Js @ Sigma @ Js.mT
    _, v_ours = ours.glm_predictive(Xs)
    check("ours vs dense J*ΣJ*ᵀ", v_ours, dense)
    A = torch.einsum("nkp,mlp->nkml", J, J).reshape(N * 2, N * 2) / delta + torch.eye(N * 2) / c
    K_swapped = torch.einsum("bcp,dep->bdce", Js, J).reshape(len(Xs), N * 2, 2) / delta
    swapped = Js @ Js.mT / delta - K_swapped.mT @ torch.linalg.solve(A, K_swapped)
    check("laplace-torch vs the index-swapped formula", v_ref, swapped)
    err = diff(v_ref, dense)
    print(f"laplace-torch vs dense J*ΣJ*ᵀ: max |Δ| = {err:.1e} (a real difference: > 1e-4)")
    assert err > 1e-4


def test_errors_and_what_is_refused():
    model, loader, Xs = problem("classification", 3)
    la = lfs.Laplace(model, "classification", "all", "gp", n_subset=N + 1)
    with pytest.raises(ValueError, match="n_subset = 25 is more than the 24 training inputs"):
        la.fit(loader)
    with pytest.raises(ValueError, match="prior precision that is scalar"):
        lfs.Laplace(model, "classification", "all", "gp", prior_precision=torch.ones(6))
    with pytest.raises(ValueError, match="subnetwork"):
        lfs.Laplace(model, "classification", "subnetwork", "gp", subnetwork_indices=torch.arange(3))
    with pytest.raises(TypeError, match="takes no option rank"):
        lfs.Laplace(model, "classification", "all", "gp", rank=3)
    la = lfs.Laplace(model, "classification", "all", "gp", independent_outputs=True)
    la.fit(loader)
    assert la(Xs).shape == (5, 3) and la(Xs, pred_type="gp").shape == (5, 3)
    with pytest.raises(ValueError, match="independent_outputs=True each output has its own"):
        la.sample(2)
    # one posterior over the weights: samples, and the predictive of samples, work
    la = lfs.Laplace(model, "classification", "all", "gp", n_subset=10, seed=3)
    la.fit(loader)
    assert la.sample(4).shape == (4, la.n_params)
    assert la(Xs, pred_type="nn", link_approx="mc", n_samples=4).shape == (5, 3)
