"""laplace_from_scratch: the Laplace approximation for deep networks, built piece by
piece; one file per idea, in layers (README, Layout), and the notebooks for the story.

This top level is the Laplace approximation only. The notebooks' support code (toy
data, models, MAP training, metrics, distribution shift, baselines, plotting) lives
apart, in ``laplace_from_scratch.helpers``, and nothing here imports it. Every tensor
the module creates follows one device policy (``devices.py``). The names imported
below are the public API.
"""

# ruff: noqa: F401  (re-exports)

from .curvature import (
    empirical_fisher,
    exact_hessian,
    ggn,
    ggn_from_jacobians,
    residual_term,
)
from .devices import InputTypeError
from .eigen import EigenPosterior
from .enums import (
    HessianStructure,
    Likelihood,
    LinkApprox,
    PredType,
    PriorStructure,
    SubsetOfWeights,
    TuningMethod,
)
from .flavours import (
    DiagLaplace,
    DiagLLLaplace,
    DiagSubnetLaplace,
    FullLaplace,
    FullLLLaplace,
    FullSubnetLaplace,
    FunctionalLaplace,
    FunctionalLLLaplace,
    KronLaplace,
    KronLLLaplace,
    LLLaplace,
    LowRankLaplace,
    ParametricLaplace,
    SubnetLaplace,
)
from .functional import (
    flatten_params,
    make_functional,
    unflatten_params,
    vector_to_model,
)
from .jacobians import jacobian, jacobian_loop
from .laplace import BaseLaplace, Laplace
from .likelihoods import Bernoulli, Categorical, Gaussian, get_likelihood
from .marglik_training import marglik_training
from .posterior import (
    cholesky,
    covariance_from_cholesky,
    log_det_from_cholesky,
    posterior_precision,
    prior_precision_diag,
    sample_from_cholesky,
)
from .predictive import (
    entropy,
    gaussian_samples,
    jacobian_sandwich,
    laplace_bridge,
    linearized_predictive,
    linearized_samples,
    mc_sigmoid,
    mc_softmax,
    nn_samples,
    probit,
    probit_binary,
    sum_zero,
    two_class,
)
