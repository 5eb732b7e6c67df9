"""laplace-torch's per-structure class names, over our one ``Laplace`` class.

laplace-torch builds a class per (weights, structure): ``KronLLLaplace``,
``DiagSubnetLaplace``, ... Here one ``Laplace`` class holds every combination, and these
names exist so that a laplace-torch script runs with its import changed:

    la = FullLLLaplace(model, "regression", sigma_noise=0.3)
    # = Laplace(model, "regression", "last_layer", "full", sigma_noise=0.3)
    isinstance(la, FullLaplace), isinstance(la, LLLaplace)  # True, True (laplace-torch)
    type(la) is Laplace  # True: no class of its own

Calling a name builds ``Laplace(model, likelihood, subset, structure, ...)`` with
laplace-torch's positional order for that class; ``isinstance(la, Name)`` asks whether
``la``'s weights and structure are the ones laplace-torch's class (or a subclass of it)
stands for; ``FullLaplace`` covers full last-layer and subnetwork posteriors too, as
laplace-torch's ``FullLLLaplace`` subclasses its ``FullLaplace``. The abstract names
(``ParametricLaplace``, ``LLLaplace``, ``SubnetLaplace``) are for ``isinstance`` only.
"""

from __future__ import annotations

from .laplace import Laplace
from .structures import STRUCTURES

ANY = ("all", "last_layer", "subnetwork")
# laplace-torch's positional arguments after (model, likelihood)
HYPER = ("sigma_noise", "prior_precision", "prior_mean", "temperature")


class LaplaceTorchName(type):
    """The metaclass of a laplace-torch class name: calling it builds a ``Laplace``,
    ``isinstance`` compares the weights and the structure."""

    subsets: tuple[str, ...]
    structures: tuple[str, ...]
    builds: tuple[str, str] | None  # (subset_of_weights, hessian_structure)
    positional: tuple[str, ...]

    def __instancecheck__(cls, obj) -> bool:
        return (
            isinstance(obj, Laplace)
            and obj.subset_of_weights in cls.subsets
            and obj.hessian_structure in cls.structures
        )

    def __call__(cls, model, likelihood, *args, **kwargs) -> Laplace:
        if cls.builds is None:
            raise TypeError(
                f"{cls.__name__} is abstract (in laplace-torch too): build with "
                "Laplace(...) or a concrete name such as FullLaplace"
            )
        if len(args) > len(cls.positional):
            raise TypeError(
                f"{cls.__name__} takes at most {len(cls.positional)} positional "
                f"arguments after (model, likelihood): {', '.join(cls.positional)}"
            )
        for name, value in zip(cls.positional, args, strict=False):
            if name in kwargs:
                raise TypeError(f"{cls.__name__} got two values for {name}")
            kwargs[name] = value
        return Laplace(model, likelihood, *cls.builds, **kwargs)


def _name(name, subsets, structures, builds=None, third=()) -> LaplaceTorchName:
    attrs = dict(
        subsets=subsets,
        structures=structures,
        builds=builds,
        positional=tuple(third) + HYPER,
        __doc__=f"laplace-torch's {name}: "
        + (
            f"builds Laplace(model, likelihood, {builds[0]!r}, {builds[1]!r}, ...)"
            if builds
            else "abstract, for isinstance only"
        ),
        __module__=__name__,
    )
    return LaplaceTorchName(name, (), attrs)


# every weight-space structure: all but the function-space one
PARAMETRIC = tuple(s for s in STRUCTURES if s != "gp")
ParametricLaplace = _name("ParametricLaplace", ANY, PARAMETRIC)
FullLaplace = _name("FullLaplace", ANY, ("full",), ("all", "full"))
DiagLaplace = _name("DiagLaplace", ANY, ("diag",), ("all", "diag"))
KronLaplace = _name("KronLaplace", ANY, ("kron",), ("all", "kron"))
LowRankLaplace = _name(
    "LowRankLaplace", ANY, ("lowrank",), ("all", "lowrank"), ("backend",)
)
LLLaplace = _name("LLLaplace", ("last_layer",), PARAMETRIC)
FullLLLaplace = _name(
    "FullLLLaplace", ("last_layer",), ("full",), ("last_layer", "full")
)
DiagLLLaplace = _name(
    "DiagLLLaplace", ("last_layer",), ("diag",), ("last_layer", "diag")
)
KronLLLaplace = _name(
    "KronLLLaplace", ("last_layer",), ("kron",), ("last_layer", "kron")
)
SubnetLaplace = _name("SubnetLaplace", ("subnetwork",), PARAMETRIC)
FullSubnetLaplace = _name(
    "FullSubnetLaplace",
    ("subnetwork",),
    ("full",),
    ("subnetwork", "full"),
    ("subnetwork_indices",),
)
DiagSubnetLaplace = _name(
    "DiagSubnetLaplace",
    ("subnetwork",),
    ("diag",),
    ("subnetwork", "diag"),
    ("subnetwork_indices",),
)
FunctionalLaplace = _name(
    "FunctionalLaplace", ANY, ("gp",), ("all", "gp"), ("n_subset",)
)
FunctionalLLLaplace = _name(
    "FunctionalLLLaplace", ("last_layer",), ("gp",), ("last_layer", "gp"), ("n_subset",)
)
