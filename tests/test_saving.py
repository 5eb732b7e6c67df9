"""Saving and loading a fitted Laplace: ``state_dict`` / ``load_state_dict`` round-trip through
``torch.save`` / ``torch.load`` (weights only) into a fresh model of the same shape, and give identical
evidence, predictions, variances and samples; a state of another shape or kind is refused."""

import copy
import io

import pytest
import torch
from conftest import mlp
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs
from laplace_from_scratch.structures import STRUCTURES

D = torch.float64
SAVED = [s for s in STRUCTURES if s != "matfree"]  # matfree keeps the batches, not a curvature


def _data(likelihood):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(30, 2, generator=g, dtype=D)
    y = X.sum(1, keepdim=True).sin() if likelihood == "regression" else (X[:, 0] > 0).long()
    return X, DataLoader(TensorDataset(X, y), batch_size=10)


def _roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("structure", SAVED)
@pytest.mark.parametrize("subset", ["all", "last_layer"])
@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_state_dict_round_trip_gives_identical_results(structure, subset, likelihood):
    X, loader = _data(likelihood)
    k = 1 if likelihood == "regression" else 2
    torch.manual_seed(0)
    model = mlp(2, k, width=6)
    kw = dict(subset_of_weights=subset, hessian_structure=structure)
    kw.update(rank=5) if structure == "lowrank" else None
    sigma = dict(sigma_noise=0.4) if likelihood == "regression" else {}
    la = lfs.Laplace(model, likelihood, prior_precision=0.8, temperature=0.9, **sigma, **kw)
    la.fit(loader)
    state = _roundtrip(la.state_dict())
    # the same network, its Laplace weights moved (a last-layer Laplace needs the fitted features)
    other = copy.deepcopy(model)
    moved = other if subset == "all" else other[-1]
    lfs.vector_to_model(lfs.flatten_params(moved) + 1.0, moved)
    la2 = lfs.Laplace(other, likelihood, **kw)
    la2.load_state_dict(state)
    assert torch.equal(la2.mean, la.mean)
    assert torch.equal(lfs.flatten_params(other), lfs.flatten_params(model))  # θ* written into the model
    assert torch.equal(la2.log_marginal_likelihood(), la.log_marginal_likelihood())
    out, out2 = la(X[:5]), la2(X[:5])
    for a, b in zip(*(o if isinstance(o, tuple) else (o,) for o in (out, out2)), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(la2.posterior_variance, la.posterior_variance)
    s = la.sample(4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(la2.sample(4, generator=torch.Generator().manual_seed(3)), s)


def test_full_subnetwork_round_trip():
    X, loader = _data("regression")
    torch.manual_seed(0)
    idx = torch.tensor([0, 3, 7, 20])
    model = mlp(2, 1, width=6)
    la = lfs.Laplace(model, "regression", subset_of_weights="subnetwork", subnetwork_indices=idx)
    la.fit(loader)
    other = copy.deepcopy(model)
    theta = lfs.flatten_params(other)
    theta[idx] += 1.0  # the subnetwork moved, the rest as fitted
    lfs.vector_to_model(theta, other)
    la2 = lfs.Laplace(other, "regression", subset_of_weights="subnetwork", subnetwork_indices=idx)
    la2.load_state_dict(_roundtrip(la.state_dict()))
    assert torch.equal(lfs.flatten_params(other), lfs.flatten_params(model))
    assert torch.equal(la2.log_marginal_likelihood(), la.log_marginal_likelihood())
    assert torch.equal(la2(X[:4])[1], la(X[:4])[1])


def test_a_state_of_another_shape_or_kind_is_refused_and_changes_nothing():
    _, loader = _data("regression")
    torch.manual_seed(0)
    la = lfs.Laplace(mlp(2, 1, width=6), "regression")
    la.fit(loader)
    state = la.state_dict()
    wider = lfs.Laplace(mlp(2, 1, width=7), "regression", prior_precision=2.0)
    with pytest.raises(ValueError, match=r"saved for P = 67 parameters .* chosen weights have P = 85"):
        wider.load_state_dict(state)
    assert wider.structure is None and wider.prior_precision.item() == 2.0
    with pytest.raises(ValueError, match="hessian_structure='full', this one has hessian_structure='diag'"):
        lfs.Laplace(mlp(2, 1, width=6), "regression", hessian_structure="diag").load_state_dict(state)
    with pytest.raises(ValueError, match="likelihood"):
        lfs.Laplace(mlp(2, 1, width=6), "classification").load_state_dict(state)
    loaded = lfs.Laplace(mlp(2, 1, width=6), "regression")
    loaded.load_state_dict(state)
    with pytest.raises(ValueError, match="loaded from a state_dict cannot be updated"):
        loaded.fit(loader, override=False)
    matfree = lfs.Laplace(mlp(2, 1, width=6), "regression", hessian_structure="matfree")
    matfree.fit(loader)
    with pytest.raises(NotImplementedError, match="matrix-free structure keeps the training batches"):
        matfree.state_dict()
