"""laplace_from_scratch: the Laplace approximation for deep networks, built piece by piece.

One file per idea; see the notebooks for the story.
"""

from .curvature import empirical_fisher, exact_hessian, ggn, ggn_from_jacobians, residual_term
from .data import sinusoid, toy_linear, toy_nonlinear
from .functional import flatten_params, make_functional, unflatten_params, vector_to_model
from .jacobians import jacobian, jacobian_loop
from .likelihoods import Categorical, Gaussian, get_likelihood
from .training import (
    map_objective,
    mean_objective,
    minimize,
    prior_precision_to_weight_decay,
    train_map,
    weight_decay_to_prior_precision,
)

__all__ = [
    "Categorical",
    "Gaussian",
    "empirical_fisher",
    "exact_hessian",
    "flatten_params",
    "get_likelihood",
    "ggn",
    "ggn_from_jacobians",
    "jacobian",
    "jacobian_loop",
    "make_functional",
    "map_objective",
    "mean_objective",
    "minimize",
    "prior_precision_to_weight_decay",
    "residual_term",
    "sinusoid",
    "toy_linear",
    "toy_nonlinear",
    "train_map",
    "unflatten_params",
    "vector_to_model",
    "weight_decay_to_prior_precision",
]
