"""The names a laplace-torch script imports: its option enums (same names and values as
laplace-torch 0.3's ``laplace.utils.enums``), accepted wherever we accept their strings and
stored and reported as those strings, and ``BaseLaplace``, the class of every Laplace object."""

import pytest
import torch
from conftest import mlp
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs
from laplace_from_scratch import (
    BaseLaplace,
    HessianStructure,
    Likelihood,
    LinkApprox,
    PredType,
    PriorStructure,
    SubsetOfWeights,
    TuningMethod,
)

ENUMS = [HessianStructure, LinkApprox, Likelihood, PredType, PriorStructure, SubsetOfWeights, TuningMethod]
D = torch.float64


def loader(likelihood: str):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(20, 2, generator=g, dtype=D)
    y = (
        torch.randn(20, 2, generator=g, dtype=D)
        if likelihood == "regression"
        else torch.randint(0, 3, (20,), generator=g)
    )
    return DataLoader(TensorDataset(X, y), batch_size=10), X


@pytest.mark.parametrize("enum", ENUMS, ids=lambda e: e.__name__)
def test_names_and_values_are_laplace_torchs(enum):
    enums = pytest.importorskip("laplace.utils.enums", reason="laplace-torch is installed by `make install`")
    theirs = getattr(enums, enum.__name__)
    assert {m.name: m.value for m in enum} == {m.name: m.value for m in theirs}
    for member in enum:
        assert member == member.value and isinstance(member, str)


def test_base_laplace_is_the_class_of_every_laplace():
    model = mlp(2, 2, width=4)
    for subset, structure in [("all", "full"), ("last_layer", "kron"), ("all", "diag"), ("all", "matfree")]:
        la = lfs.Laplace(model, "regression", subset, structure)
        assert isinstance(la, BaseLaplace) and isinstance(la, lfs.Laplace)
    assert BaseLaplace is lfs.Laplace
    # laplace-torch's per-structure names build this same class (tests/test_flavours.py)
    assert type(lfs.KronLLLaplace(model, "regression")) is lfs.Laplace


def test_enums_are_accepted_and_stored_as_strings():
    torch.manual_seed(0)
    model = mlp(2, 2, width=4)
    data, X = loader("regression")
    kw = dict(sigma_noise=0.5, prior_precision=0.8)
    la = lfs.Laplace(model, Likelihood.REGRESSION, SubsetOfWeights.LAST_LAYER, HessianStructure.KRON, **kw)
    ref = lfs.Laplace(model, "regression", "last_layer", "kron", **kw)
    for one in (la, ref):
        one.fit(data)
    for name in ("likelihood", "subset_of_weights", "hessian_structure"):
        assert type(getattr(la, name)) is str and getattr(la, name) == getattr(ref, name)
    x = X[:4]
    for a, b in zip(la(x, pred_type=PredType.GLM), ref(x, pred_type="glm"), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    g = torch.Generator()
    for pred in (PredType.NN, PredType.GLM):
        a = la.functional_samples(x, pred_type=pred, n_samples=3, generator=g.manual_seed(1))
        b = ref.functional_samples(x, pred_type=pred.value, n_samples=3, generator=g.manual_seed(1))
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    a = la.predictive_samples(x, PredType.NN, n_samples=3, generator=g.manual_seed(1))
    assert a.shape == (3, 4, 2)
    # laplace-torch's positional order: pred_type, then method
    la.optimize_prior_precision(
        PredType.GLM, TuningMethod.MARGLIK, n_steps=3, prior_structure=PriorStructure.LAYERWISE
    )
    ref.optimize_prior_precision("glm", "marglik", n_steps=3, prior_structure="layerwise")
    torch.testing.assert_close(la.prior_precision, ref.prior_precision, rtol=0, atol=0)
    la.optimize_hyperparameters(n_steps=2, prior_structure=PriorStructure.SCALAR)
    val = DataLoader(TensorDataset(X[:6], data.dataset.tensors[1][:6]), batch_size=3)
    la.optimize_prior_precision(
        PredType.NN, TuningMethod.GRIDSEARCH, val_loader=val, grid_size=3, link_approx=LinkApprox.MC
    )


@pytest.mark.parametrize("link", list(LinkApprox), ids=str)
def test_link_enums_in_classification(link):
    torch.manual_seed(0)
    model = mlp(2, 3, width=4)
    data, X = loader("classification")
    la = lfs.Laplace(model, Likelihood.CLASSIFICATION, hessian_structure=HessianStructure.DIAG)
    la.fit(data)
    g = torch.Generator()
    a = la(X[:5], link_approx=link, n_samples=4, generator=g.manual_seed(0))
    b = la(X[:5], link_approx=link.value, n_samples=4, generator=g.manual_seed(0))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_laplace_torchs_own_members_are_accepted():
    enums = pytest.importorskip("laplace.utils.enums", reason="laplace-torch is installed by `make install`")
    la = lfs.Laplace(
        mlp(2, 2, width=4),
        enums.Likelihood.REGRESSION,
        enums.SubsetOfWeights.ALL,
        enums.HessianStructure.DIAG,
    )
    assert (la.likelihood, la.subset_of_weights, la.hessian_structure) == ("regression", "all", "diag")
    assert type(la.hessian_structure) is str


def test_marglik_training_takes_enums():
    torch.manual_seed(0)
    data, _ = loader("regression")
    la, _, margliks, _ = lfs.marglik_training(
        mlp(2, 2, width=4),
        data,
        likelihood=Likelihood.REGRESSION,
        hessian_structure=HessianStructure.DIAG,
        prior_structure=PriorStructure.LAYERWISE,
        n_epochs=2,
        n_hypersteps=2,
    )
    assert la.hessian_structure == "diag" and type(la.hessian_structure) is str and len(margliks) > 0


def test_error_messages_print_strings_not_enum_members():
    model = mlp(2, 2, width=4)
    n = sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError) as err:
        lfs.Laplace(
            model,
            "regression",
            hessian_structure=HessianStructure.KRON,
            prior_precision=torch.ones(n, dtype=D),
        )
    print(err.value)
    assert "hessian_structure='kron'" in str(err.value) and "<" not in str(err.value)
    with pytest.raises(ValueError) as err:
        lfs.Laplace(model, likelihood=Likelihood.REWARD_MODELING)
    print(err.value)
    assert "got 'reward_modeling'" in str(err.value) and "<" not in str(err.value)
    gp = lfs.Laplace(model, "regression", hessian_structure=HessianStructure.GP)
    assert type(gp.hessian_structure) is str and gp.hessian_structure == "gp"
    la = lfs.Laplace(model, "regression")
    with pytest.raises(ValueError, match="pred_type must be one of \\('glm', 'nn', 'gp'\\), got 'mc'"):
        la.functional_samples(torch.zeros(2, 2, dtype=D), "mc")
    with pytest.raises(
        ValueError, match="prior_structure must be one of \\('scalar', 'layerwise'\\), got 'diag'"
    ):
        la.optimize_prior_precision(prior_structure=PriorStructure.DIAG)
