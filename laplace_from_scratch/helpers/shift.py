"""Inputs that move away from the training distribution, for images X (N, 1, H, W) in
[0, 1].

* Dataset shift: :func:`rotate` (a gradual shift, by angle) and :func:`invert` (white on
  black becomes black on white).
* Out-of-distribution inputs: :func:`noise_images`, images of pure noise.
* Adversarial inputs: :func:`fgsm`, the fast gradient sign method (Goodfellow et al.,
  2015).

Everything works for any number of channels C in X (N, C, H, W); the notebooks use C =
1.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

NOISE_KINDS = ("uniform", "bernoulli")
FGSM_LOSSES = ("ce", "bce")


def rotate(X: Tensor, degrees: float) -> Tensor:
    """Each image rotated by ``degrees`` about its centre, counter-clockwise as
    displayed by ``imshow`` (row 0 at the top); negative angles turn clockwise. (N, C,
    H, W) → (N, C, H, W).

    Bilinear interpolation (``affine_grid`` + ``grid_sample``, ``align_corners=False``);
    pixels rotated in from outside the image are 0. For a square image a multiple of 90°
    maps pixel centres onto pixel centres, so ``rotate(X, 90)`` is ``torch.rot90(X, 1,
    dims=(-2, -1))`` up to rounding, and ``rotate(X, 0)`` is X. The grid is built and
    sampled in float64 and the result cast back: in float32 the sample positions (up to
    W − 1 pixels) carry rounding errors of ~1e-6 pixel, which would show up as errors of
    that size at 0° and 90°.
    """
    if X.ndim != 4:
        raise ValueError(f"X must be images (N, C, H, W), got {tuple(X.shape)}")
    N, _, H, W = X.shape
    t = math.radians(degrees)
    c, s = math.cos(t), math.sin(t)
    # Output pixel at offset (u, v) from the centre (v pointing down) reads the input at
    # [[c, −s], [s, c]] (u, v): with v down this turns the picture counter-clockwise.
    # affine_grid works in coordinates scaled to [−1, 1] per axis, hence the
    # aspect-ratio factors H/W and W/H.
    theta = torch.tensor(
        [[c, -s * H / W, 0.0], [s * W / H, c, 0.0]],
        dtype=torch.float64,
        device=X.device,
    )
    grid = F.affine_grid(
        theta.expand(N, 2, 3), [N, X.shape[1], H, W], align_corners=False
    )
    out = F.grid_sample(
        X.double(), grid, mode="bilinear", padding_mode="zeros", align_corners=False
    )
    return out.to(X.dtype)


def invert(X: Tensor) -> Tensor:
    """Photographic negative 1 − X of images in [0, 1]."""
    return 1 - X


def noise_images(
    n: int,
    shape: tuple[int, ...],
    seed: int = 0,
    kind: str = "uniform",
    density: float | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> Tensor:
    """``n`` images of pure noise, (n, *shape), e.g. shape (1, 28, 28); the same for the
    same seed.

    Drawn on the CPU by a generator seeded with ``seed`` (the same images on every
    device), then moved to ``device``.

    * ``"uniform"``: every pixel independently U[0, 1]. Far from digits in every way,
      including its mean brightness 0.5 (digits: ~0.13 for MNIST), so it is the easy OOD
      set.
    * ``"bernoulli"``: salt noise: every pixel independently 1 with probability
      ``density``, else 0. Pass the training images' mean pixel value
      (``X_train.mean()``) so the noise has the digits' expected brightness and ink is
      the only cue; a fairer, harder OOD set.
    """
    g = torch.Generator().manual_seed(seed)
    size = (n, *shape)
    if kind == "uniform":
        X = torch.rand(size, generator=g, dtype=torch.float64, device="cpu")
    elif kind == "bernoulli":
        if density is None or not 0 <= density <= 1:
            raise ValueError(
                f"kind='bernoulli' needs a density in [0, 1], got {density}"
            )
        X = (
            torch.rand(size, generator=g, dtype=torch.float64, device="cpu") < density
        ).to(torch.float64)
    else:
        raise ValueError(f"kind must be one of {NOISE_KINDS}, got {kind!r}")
    return X.to(dtype=dtype or torch.get_default_dtype(), device=device)


def fgsm(
    f: Callable[[Tensor], Tensor], X: Tensor, y: Tensor, eps: float, loss: str = "ce"
) -> Tensor:
    """Fast gradient sign method: clamp(X + eps · sign(∇_X L(f(X), y)), 0, 1), detached.

    ``f`` maps inputs X (N, ...) to logits (N, K). ``loss="ce"``: softmax cross-entropy,
    K ≥ 2 classes, y (N,) int64 labels; ``loss="bce"``: one logit (K = 1) through a
    sigmoid, y (N,) in {0, 1}. L is summed over the inputs, so each image moves along
    its own loss gradient. ``eps = 0`` returns a copy of X. The gradient is taken with
    respect to X only (``torch.autograd.grad``): the ``.grad`` of the model's parameters
    is left as it was.
    """
    if eps < 0:
        raise ValueError(f"eps must be non-negative, got {eps}")
    if loss not in FGSM_LOSSES:
        raise ValueError(f"loss must be one of {FGSM_LOSSES}, got {loss!r}")
    if eps == 0:
        return X.detach().clone()
    X_ = X.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = f(X_)
        if logits.ndim != 2 or logits.shape[0] != X.shape[0]:
            raise ValueError(
                f"f must return logits (N, K) = ({X.shape[0]}, K), got "
                f"{tuple(logits.shape)}"
            )
        K = logits.shape[1]
        if loss == "ce":
            if K < 2:
                raise ValueError(
                    "loss='ce' needs K ≥ 2 logits; use loss='bce' for one logit"
                )
            L = F.cross_entropy(logits, y, reduction="sum")
        else:
            if K != 1:
                raise ValueError(f"loss='bce' needs one logit (K = 1), got K = {K}")
            L = F.binary_cross_entropy_with_logits(
                logits.squeeze(1), y.to(logits.dtype), reduction="sum"
            )
        (g,) = torch.autograd.grad(L, X_)
    return (X.detach() + eps * g.sign()).clamp(0, 1)
