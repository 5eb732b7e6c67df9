"""Which curvature builder makes which posterior: the one place that maps a
``hessian_structure`` name to code, so that ``Laplace`` never branches on it.

Every builder has ``update(X) -> f(X)`` per batch and ``finish() -> Posterior``
(``posterior.py``). ``make_builder`` receives the module Laplace is over (the whole
network, or its last layer with the features as inputs), its functional form f(θ, x)
with θ* and the parameter tensor sizes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import Tensor, nn

from .curvature import DiagJacobianGGN, FullGGN
from .diag import DiagGGN
from .functional import Functional
from .kron import KFAC
from .layers import supported_layers
from .likelihoods import Likelihood
from .lowrank import LowRankGGN
from .matfree import MatfreeGGN, MatfreePosterior


def _diag(module, f, theta, lik, sizes):
    # the layer-wise route for Linear/Conv2d networks; per-example Jacobians for
    # anything else
    if supported_layers(module) is not None:
        return DiagGGN(module, lik)
    return DiagJacobianGGN(f, theta, lik, sizes)


BUILDERS: dict[str, Callable] = {
    "full": lambda module, f, theta, lik, sizes, **o: FullGGN(
        f, theta, lik, sizes, **o
    ),
    "diag": _diag,
    "kron": lambda module, f, theta, lik, sizes: KFAC(module, lik),
    "lowrank": lambda module, f, theta, lik, sizes, **o: LowRankGGN(
        f, theta, lik, sizes, **o
    ),
    "matfree": lambda module, f, theta, lik, sizes, **o: MatfreeGGN(
        f, theta, lik, sizes, **o
    ),
}
STRUCTURES = tuple(BUILDERS)


def _keywords(cls) -> tuple[str, ...]:
    """The options of a builder class: its constructor's arguments with a default."""
    params = inspect.signature(cls.__init__).parameters.values()
    return tuple(p.name for p in params if p.default is not inspect.Parameter.empty)


# the keyword options each structure takes (Laplace(..., **options))
OPTIONS = {
    "full": _keywords(FullGGN),
    "diag": (),
    "kron": (),
    "lowrank": _keywords(LowRankGGN),
    "matfree": _keywords(MatfreePosterior),
}
# the prior precisions each structure can express: "scalar", "layerwise" (one per
# parameter tensor), "diag" (one per parameter)
PRIORS = {
    "full": ("scalar", "layerwise", "diag"),
    "diag": ("scalar", "layerwise", "diag"),
    "kron": ("scalar", "layerwise"),
    "lowrank": ("scalar", "layerwise", "diag"),
    "matfree": ("scalar", "layerwise", "diag"),
}


def check_options(structure: str, options: dict) -> None:
    """Refuse an option the structure does not take (instead of ignoring it)."""
    unknown = sorted(set(options) - set(OPTIONS[structure]))
    if unknown:
        takes = ", ".join(OPTIONS[structure]) or "none"
        raise TypeError(
            f"hessian_structure={structure!r} takes no option {', '.join(unknown)} "
            f"(its options: {takes})"
        )


def check_combination(subset_of_weights: str, structure: str) -> None:
    """A subnetwork has no layers, so only the structures built from f(θ, x) alone apply
    (laplace-torch's ``SubnetLaplace`` is full too)."""
    if subset_of_weights == "subnetwork" and structure != "full":
        raise ValueError(
            "subset_of_weights='subnetwork' supports hessian_structure='full' (as "
            "laplace-torch)"
        )


def make_builder(
    structure: str,
    module: nn.Module | None,
    f: Functional,
    theta: Tensor,
    likelihood: Likelihood,
    param_sizes: list[int],
    **options,
):
    """The builder for ``structure``; ``module`` is None where only f(θ, x) exists (a
    subnetwork, which :func:`check_combination` allows with ``"full"`` only)."""
    return BUILDERS[structure](module, f, theta, likelihood, param_sizes, **options)
