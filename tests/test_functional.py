import pytest
import torch
from conftest import mlp

from laplace_from_scratch import flatten_params, make_functional, unflatten_params, vector_to_model


def test_functional_call_equals_module():
    model = mlp(3, 2)
    X = torch.randn(5, 3, dtype=torch.float64)
    f, theta = make_functional(model)
    assert theta.shape == (sum(p.numel() for p in model.parameters()),)
    torch.testing.assert_close(f(theta, X), model(X), rtol=0, atol=0)


def test_flatten_order_matches_torch_parameters_to_vector():
    model = mlp(3, 2)
    expected = torch.nn.utils.parameters_to_vector(model.parameters())
    torch.testing.assert_close(flatten_params(model), expected, rtol=0, atol=0)


def test_vector_to_model_round_trip():
    model = mlp(3, 2)
    theta = torch.randn_like(flatten_params(model))
    vector_to_model(theta, model)
    torch.testing.assert_close(flatten_params(model), theta, rtol=0, atol=0)


def test_wrong_length_raises():
    model = mlp(3, 2)
    with pytest.raises(ValueError, match="parameters"):
        unflatten_params(torch.zeros(7, dtype=torch.float64), model)
