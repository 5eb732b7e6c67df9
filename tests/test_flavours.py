"""laplace-torch's class names (``flavours.py``) and its ``backend=`` (``checks.py``):
what they build, what ``isinstance`` says (against laplace-torch's own class tree), and
what is refused."""

import pytest
import torch
from conftest import mlp
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs

laplace = pytest.importorskip("laplace", reason="laplace-torch is installed by `make install`")

# name → (subset_of_weights, hessian_structure) it builds
CONCRETE = {
    "FullLaplace": ("all", "full"),
    "DiagLaplace": ("all", "diag"),
    "KronLaplace": ("all", "kron"),
    "LowRankLaplace": ("all", "lowrank"),
    "FullLLLaplace": ("last_layer", "full"),
    "DiagLLLaplace": ("last_layer", "diag"),
    "KronLLLaplace": ("last_layer", "kron"),
    "FullSubnetLaplace": ("subnetwork", "full"),
    "DiagSubnetLaplace": ("subnetwork", "diag"),
    "FunctionalLaplace": ("all", "gp"),
    "FunctionalLLLaplace": ("last_layer", "gp"),
}
ABSTRACT = ["BaseLaplace", "ParametricLaplace", "LLLaplace", "SubnetLaplace"]


def model():
    return mlp(3, 2, width=4, depth=1)


def build(name: str):
    """Our object for a laplace-torch class name, with its third positional argument."""
    subset, _ = CONCRETE[name]
    third = {"subnetwork": (torch.tensor([0, 5, 7]),)}.get(subset, ())
    if name.startswith("Functional"):
        third = (10,)
    return getattr(lfs, name)(model(), "regression", *third)


@pytest.mark.parametrize("name", CONCRETE)
def test_name_builds_our_laplace(name):
    la = build(name)
    assert type(la) is lfs.Laplace
    assert (la.subset_of_weights, la.hessian_structure) == CONCRETE[name]


@pytest.mark.parametrize("name", CONCRETE)
@pytest.mark.parametrize("other", list(CONCRETE) + ABSTRACT)
def test_isinstance_follows_laplace_torch_class_tree(name, other):
    """isinstance(ours built as `name`, other) == issubclass(theirs `name`, other)."""
    theirs = issubclass(getattr(laplace, name), getattr(laplace, other))
    assert isinstance(build(name), getattr(lfs, other)) == theirs


def test_positional_order_is_laplace_torch_s():
    la = lfs.FullLaplace(model(), "regression", 0.25, 2.0, 0.0, 0.5)
    assert (la.sigma_noise.item(), la.prior_precision.item()) == (0.25, 2.0)
    assert la.temperature.item() == 0.5
    lr = lfs.LowRankLaplace(model(), "regression", laplace.curvature.CurvlinopsGGN, 0.25)
    assert lr.sigma_noise.item() == 0.25
    sub = lfs.DiagSubnetLaplace(model(), "regression", torch.tensor([1, 2]), 0.25)
    assert sub.subnetwork_indices.tolist() == [1, 2] and sub.sigma_noise.item() == 0.25
    gp = lfs.FunctionalLaplace(model(), "regression", 7, 0.25)
    assert gp.structure_options["n_subset"] == 7 and gp.sigma_noise.item() == 0.25


def test_refusals():
    with pytest.raises(TypeError, match="LLLaplace is abstract"):
        lfs.LLLaplace(model(), "regression")
    with pytest.raises(TypeError, match="at most 4 positional"):
        lfs.FullLaplace(model(), "regression", 1.0, 1.0, 0.0, 1.0, False)
    with pytest.raises(TypeError, match="two values for sigma_noise"):
        lfs.FullLaplace(model(), "regression", 0.3, sigma_noise=0.3)
    with pytest.raises(TypeError):  # the class fixes the structure
        lfs.FullLaplace(model(), "regression", hessian_structure="diag")


@pytest.mark.parametrize("backend", ["BackPackGGN", "AsdlGGN", "CurvlinopsGGN"])
def test_ggn_backend_accepted(backend):
    cls = getattr(laplace.curvature, backend)
    la = lfs.Laplace(model(), "regression", backend=cls, backend_kwargs={})
    assert not hasattr(la, "backend")  # nothing pretends to be laplace-torch's backend


@pytest.mark.parametrize(
    "backend", ["BackPackEF", "AsdlEF", "CurvlinopsEF", "AsdlHessian", "CurvlinopsHessian"]
)
def test_other_curvature_refused(backend):
    cls = getattr(laplace.curvature, backend)
    with pytest.raises(ValueError, match=f"backend='{backend}': ours computes the GGN"):
        lfs.Laplace(model(), "regression", backend=cls)
    with pytest.raises(ValueError, match="only a GGN backend"):
        lfs.marglik_training(model(), [], "regression", backend=cls)


def test_backend_kwargs_refused():
    ggn = laplace.curvature.CurvlinopsGGN
    with pytest.raises(ValueError, match="no curvature backend to configure"):
        lfs.Laplace(model(), "regression", backend=ggn, backend_kwargs={"stochastic": True})


def test_subnetwork_needs_indices():
    """A missing required argument is a TypeError, as laplace-torch's SubnetLaplace."""
    with pytest.raises(TypeError, match="needs subnetwork_indices"):
        lfs.Laplace(model(), "regression", subset_of_weights="subnetwork")
    with pytest.raises(ValueError, match="only with it"):
        lfs.Laplace(model(), "regression", subnetwork_indices=torch.tensor([0]))


@pytest.mark.usefixtures("float64_default")
def test_optimize_prior_precision_takes_pred_type_first():
    """laplace-torch's expectation_example.py calls optimize_prior_precision(PredType.GLM):
    pred_type is the first positional argument in both, and δ comes out the same."""
    X = torch.randn(20, 3, generator=torch.Generator().manual_seed(1))
    data = DataLoader(TensorDataset(X, X[:, :2].sin()), batch_size=7)
    net = model()  # one network for both (fit only reads its weights)
    ours = lfs.Laplace(net, "regression", "all", "kron")
    theirs = laplace.Laplace(net, "regression", "all", "kron")
    for la in (ours, theirs):
        la.fit(data)
        la.optimize_prior_precision(laplace.PredType.GLM)
    gap = (ours.prior_precision - theirs.prior_precision).abs().max().item()
    print(f"δ: ours {ours.prior_precision.item():.6f}, |Δ| {gap:.1e} (tol 1e-10)")
    assert gap <= 1e-10
    with pytest.raises(ValueError, match="pred_type must be one of"):
        ours.optimize_prior_precision("marglik")
