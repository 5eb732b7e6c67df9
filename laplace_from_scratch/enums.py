"""laplace-torch's option enums (``laplace.utils.enums``, 0.3), with the same names
and values, so that a script written for laplace-torch imports them from here. Each
member is a ``str`` equal to its value (``HessianStructure.KRON == "kron"``), and every
check of an option (``checks.check_choice``) reads it, or laplace-torch's own member, as
that string. Members name laplace-torch's options; those this module does not have
(``Likelihood.REWARD_MODELING``, ``PriorStructure.DIAG`` in
``optimize_prior_precision``) are refused by the same checks as their strings.
``PredType.GP`` is the GLM predictive (``laplace.PRED_TYPES``). Our own options without
a laplace-torch member (``hessian_structure="matfree"``, ``"binary_classification"``)
are passed as strings.
"""

from __future__ import annotations

from enum import StrEnum


class SubsetOfWeights(StrEnum):
    """``subset_of_weights``."""

    ALL = "all"
    LAST_LAYER = "last_layer"
    SUBNETWORK = "subnetwork"


class HessianStructure(StrEnum):
    """``hessian_structure``."""

    FULL = "full"
    KRON = "kron"
    DIAG = "diag"
    LOWRANK = "lowrank"
    GP = "gp"


class Likelihood(StrEnum):
    """``likelihood``."""

    REGRESSION = "regression"
    CLASSIFICATION = "classification"
    REWARD_MODELING = "reward_modeling"


class PredType(StrEnum):
    """``pred_type``."""

    GLM = "glm"
    NN = "nn"
    GP = "gp"


class LinkApprox(StrEnum):
    """``link_approx``."""

    MC = "mc"
    PROBIT = "probit"
    BRIDGE = "bridge"
    BRIDGE_NORM = "bridge_norm"


class TuningMethod(StrEnum):
    """``method`` of ``optimize_prior_precision``."""

    MARGLIK = "marglik"
    GRIDSEARCH = "gridsearch"


class PriorStructure(StrEnum):
    """``prior_structure`` of ``optimize_prior_precision``."""

    SCALAR = "scalar"
    DIAG = "diag"
    LAYERWISE = "layerwise"
