"""One table entry per ``hessian_structure``: its builder, options (each with a check),
priors and saved fields. ``Laplace``, ``saving.py`` and the tests read
:data:`STRUCTURES`; none of them branches on a structure's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .checks import check_choice, check_count, check_positive
from .curvature import Builder
from .diag import DiagGGN, DiagJacobianGGN, DiagPosterior
from .full import ROUTES, FullGGN, full_posterior
from .gp import GPBuilder, GPPosterior
from .kron import KFAC, KronBlock, KronPosterior
from .layers import supported_layers
from .likelihoods import Likelihood
from .lowrank import LowRankGGN, LowRankPosterior
from .matfree import MatfreeGGN
from .posterior import PRIOR_KINDS, Posterior
from .weights import Weights

Check = Callable[[str, object], None]  # check(name, value) raises on a bad value


def _choice(*choices: str) -> Check:
    return lambda name, value: check_choice(name, value, choices)


def _count(minimum: int = 1, optional: bool = False) -> Check:
    def check(name: str, value) -> None:
        if not (optional and value is None):
            check_count(name, value, minimum)

    return check


def _flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


@dataclass(frozen=True)
class Structure:
    """Everything the module knows about one structure."""

    # (weights, likelihood, param_sizes, **options) → its ``curvature.Builder``
    build: Callable[..., Builder]
    options: dict[str, Check] = field(default_factory=dict)  # keyword → its check
    priors: tuple[str, ...] = PRIOR_KINDS  # the kinds of prior precision it can express
    saved: tuple[str, ...] = ()  # the posterior's attributes that a state_dict holds
    load: Callable[..., Posterior] | None = None  # posterior from them (None: unsaved)
    layerwise: bool = False  # its posterior has layer_blocks (``layer_predictive.py``)


def _diag(w: Weights, lik: Likelihood, sizes: list[int]) -> Builder:
    # the layer-wise route for Linear/Conv2d networks; per-example Jacobians otherwise
    # (and for a subnetwork, which has no layers)
    if w.module is not None and supported_layers(w.module) is not None:
        return DiagGGN(w.module, lik)
    return DiagJacobianGGN(w.f_module, w.theta, lik, sizes)


def _full(w: Weights, lik: Likelihood, sizes: list[int], **options) -> Builder:
    return FullGGN(w.f_module, w.theta, lik, sizes, **options)  # f(θ, x) only


def _lowrank(w: Weights, lik: Likelihood, sizes: list[int], **options) -> Builder:
    # f(θ, x), and the network (if any) for layer-wise GGN products
    return LowRankGGN(w.f_module, w.theta, lik, sizes, module=w.module, **options)


def _matfree(w: Weights, lik: Likelihood, sizes: list[int], **options) -> Builder:
    # CG preconditioned by the low-rank, diagonal or KFAC posterior of the same batches,
    # made when CG first needs it
    f, theta = w.f_module, w.theta
    rank = options.pop("preconditioner_rank", 100)
    pre = {
        "lowrank": lambda: _lowrank(w, lik, sizes, rank=rank),
        "diag": lambda: _diag(w, lik, sizes),
        "kron": lambda: KFAC(w.module, lik),
    }
    make = pre.get(options.pop("preconditioner", "lowrank"))  # None for "none"
    return MatfreeGGN(
        f, theta, lik, sizes, preconditioner=make, module=w.module, **options
    )


STRUCTURES: dict[str, Structure] = {
    "full": Structure(
        _full,
        dict(evidence_route=_choice(*ROUTES), one_buffer=_flag, in_place=_flag),
        saved=("H", "param_sizes", "Jw", "route", "one_buffer", "in_place"),
        load=full_posterior,
    ),
    "diag": Structure(
        _diag, saved=("H", "param_sizes"), load=DiagPosterior, layerwise=True
    ),
    # KFAC's eigendecompositions take one prior value per block at most
    "kron": Structure(
        lambda w, lik, sizes: KFAC(w.module, lik),
        priors=PRIOR_KINDS[:2],
        saved=("B", "A"),
        load=lambda B, A: KronPosterior(
            [KronBlock(b, a) for b, a in zip(B, A, strict=True)]
        ),
        layerwise=True,
    ),
    "lowrank": Structure(
        _lowrank,
        dict(rank=_count(), n_iter=_count(optional=True)),
        saved=("V", "eigvals", "param_sizes"),
        load=LowRankPosterior,
    ),
    # the matrix-free structure keeps the training batches, not a curvature: unsaved
    "matfree": Structure(
        _matfree,
        dict(
            preconditioner=_choice("lowrank", "none", "diag", "kron"),
            preconditioner_rank=_count(),
            n_probes=_count(2),
            lanczos_steps=_count(),
            cg_tol=check_positive,
            cg_max_iter=_count(optional=True),
            sample_steps=_count(),
            seed=_count(0),
        ),
    ),
    # function space (laplace-torch's FunctionalLaplace): an isotropic prior only
    "gp": Structure(
        lambda w, lik, sizes, **options: GPBuilder(
            w.f_module, w.theta, lik, sizes, **options
        ),
        dict(
            n_subset=_count(optional=True),
            independent_outputs=_flag,
            seed=_count(0),
        ),
        priors=PRIOR_KINDS[:1],
        saved=("eigvecs", "eigvals", "scale", "n_params", "dtype"),
        load=GPPosterior.from_state,
    ),
}


def check_options(structure: str, options: dict) -> None:
    """Refuse an option the structure does not take (instead of ignoring it), and an
    invalid value of one it takes, before any data is seen."""
    takes = STRUCTURES[structure].options
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise TypeError(
            f"hessian_structure={structure!r} takes no option {', '.join(unknown)} "
            f"(its options: {', '.join(takes) or 'none'})"
        )
    for name, value in options.items():
        takes[name](name, value)


SUBNETWORK = ("full", "diag")  # laplace-torch 0.3's SubnetLaplace, DiagSubnetLaplace


def check_combination(subset_of_weights: str, structure: str) -> None:
    """A subnetwork has no layers, so only structures built from f(θ, x) and
    per-example Jacobians apply: full and diag, as in laplace-torch 0.3."""
    if subset_of_weights == "subnetwork" and structure not in SUBNETWORK:
        raise ValueError(
            f"subset_of_weights='subnetwork' supports hessian_structure in "
            f"{SUBNETWORK} (laplace-torch 0.3's SubnetLaplace and DiagSubnetLaplace), "
            f"got {structure!r}"
        )
