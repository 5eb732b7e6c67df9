"""Notebook helpers: toy data, models, MAP training, metrics, distribution shift,
baselines and plotting for the notebooks. Not part of the Laplace approximation.

The Laplace approximation itself is the top level, ``laplace_from_scratch``; nothing
there imports from here. The notebooks import both, side by side::

    import laplace_from_scratch as lfs
    from laplace_from_scratch import helpers

    data = helpers.sinusoid()
    model = helpers.mlp(1, 1)
    helpers.fit_map(model, data.X_train, data.y_train, "regression", sigma_noise=0.3)
    la = lfs.Laplace(model, "regression", sigma_noise=0.3)

* ``data.py``: deterministic toy data sets and the bundled digits (:func:`image_data`);
* ``models.py``: small MLPs and CNNs; :class:`PinnedZeroLogit`, one logit as two;
* ``training.py``: MAP training with a summed loss, weight decay ↔ prior precision;
* ``metrics.py``: accuracy, NLL, Brier, calibration (ECE) and OOD AUROC;
* ``shift.py``: rotated, inverted, noise and FGSM-perturbed inputs;
* ``baselines.py``: temperature scaling, deep ensembles, MC dropout;
* ``checking.py``: ``compare`` (the reader's algorithm against the module's, printed
  and asserted), ``brief`` (a module function's signature and docstring summary) and
  ``keep_yours`` (a folded solution stands in for a function the reader has not
  written yet);
* ``plotting.py``: regression bands, 2-D contours, reliability diagrams. Imported on
  first use (``helpers.plotting``), so that importing the helpers does not load
  matplotlib's pyplot.
* ``quickstart_plot.py``: notebook 00's figure (reliability and confidence on
  non-digits); imported on first use, as ``plotting``.
"""

import importlib

from . import baselines, data, metrics, models, shift, training
from .baselines import ensemble_probs, fit_temperature, mc_dropout_probs
from .checking import is_stub, keep_yours
from .data import (
    ImageData,
    image_data,
    sinusoid,
    toy_linear,
    toy_multiclass,
    toy_nonlinear,
)
from .metrics import (
    accuracy,
    auroc,
    auroc_difference_interval,
    auroc_interval,
    brier,
    calibration_curve,
    ece,
    nll,
    ood_auroc,
    ood_auroc_interval,
    ood_score,
)
from .models import PinnedZeroLogit, cnn, mlp
from .shift import fgsm, invert, noise_images, rotate
from .training import (
    converge_to_mode,
    fit_map,
    gradient_ratio,
    map_objective,
    mean_objective,
    minimize,
    prior_precision_to_weight_decay,
    train_map,
    train_minibatch,
    weight_decay_to_prior_precision,
)


def __getattr__(name: str):
    # ``helpers.plotting`` without importing pyplot when the helpers are imported
    if name in ("plotting", "quickstart_plot"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    # modules
    "baselines",
    "data",
    "metrics",
    "models",
    "plotting",
    "quickstart_plot",
    "shift",
    "training",
    # data.py
    "ImageData",
    "image_data",
    "sinusoid",
    "toy_linear",
    "toy_multiclass",
    "toy_nonlinear",
    # models.py
    "PinnedZeroLogit",
    "cnn",
    "mlp",
    # training.py
    "converge_to_mode",
    "fit_map",
    "gradient_ratio",
    "map_objective",
    "mean_objective",
    "minimize",
    "prior_precision_to_weight_decay",
    "train_map",
    "train_minibatch",
    "weight_decay_to_prior_precision",
    # metrics.py
    "accuracy",
    "auroc",
    "auroc_difference_interval",
    "auroc_interval",
    "brier",
    "calibration_curve",
    "ece",
    "nll",
    "ood_auroc",
    "ood_auroc_interval",
    "ood_score",
    # shift.py
    "fgsm",
    "invert",
    "noise_images",
    "rotate",
    # baselines.py
    "ensemble_probs",
    "fit_temperature",
    "mc_dropout_probs",
    # checking.py
    "is_stub",
    "keep_yours",
]
