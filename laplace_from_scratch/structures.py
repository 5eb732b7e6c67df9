"""Which curvature builder makes which posterior: the one place that maps a
``hessian_structure`` name to code, so that ``Laplace`` never branches on it. Every
builder has ``update(X) -> f(X)`` per batch and ``finish() -> Posterior``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from .curvature import DiagJacobianGGN, FullGGN
from .diag import DiagGGN
from .kron import KFAC
from .layers import supported_layers
from .likelihoods import Likelihood
from .lowrank import LowRankGGN
from .matfree import MatfreeGGN, MatfreePosterior
from .posterior import PRIOR_KINDS
from .weights import Weights


def _diag(w: Weights, lik: Likelihood, sizes: list[int]):
    # the layer-wise route for Linear/Conv2d networks; per-example Jacobians otherwise
    if supported_layers(w.module) is not None:
        return DiagGGN(w.module, lik)
    return DiagJacobianGGN(w.f_in, w.theta, lik, sizes)


BUILDERS: dict[str, Callable] = {
    "full": lambda w, lik, sizes, **o: FullGGN(w.f_in, w.theta, lik, sizes, **o),
    "diag": _diag,
    "kron": lambda w, lik, sizes: KFAC(w.module, lik),
    "lowrank": lambda w, lik, sizes, **o: LowRankGGN(w.f_in, w.theta, lik, sizes, **o),
    "matfree": lambda w, lik, sizes, **o: MatfreeGGN(w.f_in, w.theta, lik, sizes, **o),
}
STRUCTURES = tuple(BUILDERS)


def _keywords(cls) -> tuple[str, ...]:
    """The options of a builder class: its constructor's arguments with a default."""
    params = inspect.signature(cls.__init__).parameters.values()
    return tuple(p.name for p in params if p.default is not inspect.Parameter.empty)


# the keyword options each structure takes (Laplace(..., **options))
OPTIONS = {s: () for s in STRUCTURES} | {
    "full": _keywords(FullGGN),
    "lowrank": _keywords(LowRankGGN),
    "matfree": _keywords(MatfreePosterior),
}
# the prior precisions each structure can express (``posterior.prior_kind``): KFAC's
# eigendecompositions take one value per block at most
PRIORS = {s: PRIOR_KINDS[:2] if s == "kron" else PRIOR_KINDS for s in STRUCTURES}


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
    weights: Weights,
    likelihood: Likelihood,
    sizes: list[int],
    **options,
):
    """The builder for ``structure`` over ``weights`` (``weights.module`` is None where
    only f(θ, x) exists: a subnetwork, which :func:`check_combination` allows with
    ``"full"`` only)."""
    return BUILDERS[structure](weights, likelihood, sizes, **options)
