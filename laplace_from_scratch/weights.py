"""Which weights Laplace is over: all of them, the last layer, or a subnetwork.

Each choice becomes a function f(θ, x) of a flat vector θ of the chosen weights, the
others held at the MAP, plus what the curvature builders need to see of the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from .checks import check_indices
from .functional import (
    Functional,
    LastLayerFeatures,
    find_last_layer,
    flatten_params,
    make_functional,
    vector_to_model,
)


@dataclass
class Weights:
    """The weights Laplace is over: f(θ, x), θ* (P,), the tensor sizes, and what the
    builders see: ``module`` (None: only f) on inputs ``features(x)`` (None: x itself),
    and ``f_module``, f of ``module`` on those inputs."""

    f: Functional
    theta: Tensor
    sizes: list[int]
    module: nn.Module | None
    features: LastLayerFeatures | None
    f_module: Functional
    write: Callable[[Tensor], None]  # copies a θ (P,) into the model's chosen weights


def select_weights(model: nn.Module, subset: str, indices=None, last_layer_name=None):
    """The :class:`Weights` of ``subset``: "all", "last_layer" (the ``nn.Linear``
    ``last_layer_name``, by default the model's last) or "subnetwork" (the flat
    parameter ``indices`` (M,)); θ then has shape (P,), (P_last,) or (M,)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            "the model has no trainable parameters (all have requires_grad=False)"
        )
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    if not dtypes <= {torch.float32, torch.float64}:
        raise ValueError(
            f"Laplace needs float32 or float64 parameters (its Cholesky and eigen "
            f"decompositions do), got {sorted(map(str, dtypes))}: convert the model "
            "with model.float() or model.double()"
        )
    if subset == "last_layer":
        name, last = find_last_layer(model, last_layer_name)
        features = LastLayerFeatures(model, name, last)
        g, theta = make_functional(last)

        def f_last(theta: Tensor, X: Tensor) -> Tensor:  # W φ(X)ᵀ + b, linear in θ
            return g(theta, features(X))

        sizes = [p.numel() for p in last.parameters() if p.requires_grad]
        write = partial(vector_to_model, model=last)
        return Weights(f_last, theta, sizes, last, features, g, write)
    f_all, theta_all = make_functional(model)
    if subset == "all":
        sizes = [p.numel() for p in model.parameters() if p.requires_grad]
        write = partial(vector_to_model, model=model)
        return Weights(f_all, theta_all, sizes, model, None, f_all, write)
    idx = check_indices(indices, theta_all.numel())

    def f_sub(theta_s: Tensor, X: Tensor) -> Tensor:  # the other weights stay at θ*
        return f_all(theta_all.index_put((idx,), theta_s), X)

    def write_sub(theta_s: Tensor) -> None:
        vector_to_model(flatten_params(model).index_put((idx,), theta_s), model)

    return Weights(f_sub, theta_all[idx], [idx.numel()], None, None, f_sub, write_sub)
