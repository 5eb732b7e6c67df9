"""Where the module's tensors live: one device policy, and the few helpers that keep it.

The policy (followed by every file of the module):

* Every tensor the module creates lives on the device, and has the dtype, of what it
  approximates: the parameters θ* of the model, or the input it is derived from (f_var
  from f_mu, a grid from the tensor it indexes). Nothing is silently made on the CPU,
  nor on torch's default device.
* Hyperparameters (prior precision, σ, prior mean, temperature) may be given as Python
  numbers or as tensors on any device; they are converted to θ*'s device and dtype when
  they are set.
* Random draws take an optional ``torch.Generator`` on the CPU *or* on the model's
  device. A CPU generator draws on the CPU and the numbers are then moved, so a seeded
  notebook gives the same numbers whichever device the model is on.
* Data on another device than the model is an error that names both devices (no silent
  copies of a whole data set in the inner loop).
* The data sets of :mod:`.data` and the noise images of :mod:`.shift` are made on the
  CPU, where their seeded generators live: move them with ``.to(device)``.

A test runs the whole public API with torch's default device set to ``meta`` while the
model and the data are on the CPU: any factory call that forgets ``device=`` then makes
a meta tensor and fails, exactly as it would fail on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class InputTypeError(TypeError, ValueError):
    """A hyperparameter of the wrong type (a string, None, a complex tensor).

    A ``TypeError``, as Python's convention asks, and also a ``ValueError``, which is
    what laplace-torch raises for the same input: code written for either library
    catches it (NumPy's ``AxisError`` is both a ``ValueError`` and an ``IndexError`` for
    the same reason).
    """


def randn(
    shape: Sequence[int], like: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """Standard normal draws of ``shape`` on the device and in the dtype of ``like``.

    With a ``generator`` on another device (typically a seeded CPU generator for a CUDA
    model) the numbers are drawn on the generator's device and moved: the same seed
    gives the same numbers.
    """
    where = like.device if generator is None else generator.device
    eps = torch.randn(tuple(shape), generator=generator, dtype=like.dtype, device=where)
    return eps.to(like.device)


def rademacher(
    n: int, like: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """n random signs ±1 (Rademacher), in the dtype and on the device of ``like``; see
    :func:`randn`."""
    where = like.device if generator is None else generator.device
    bits = torch.randint(0, 2, (n,), generator=generator, device=where)
    return (2 * bits - 1).to(dtype=like.dtype, device=like.device)


def as_like(value: float | Tensor, like: Tensor, name: str) -> Tensor:
    """``value`` (a number or a tensor on any device) as a tensor in ``like``'s dtype
    and device.

    Differentiable for tensors (``Tensor.to`` keeps the autograd graph). Strings, None
    and other non-numbers raise :class:`InputTypeError` naming ``name``.
    """
    if isinstance(value, Tensor):
        if value.is_complex() or value.dtype == torch.bool:
            raise InputTypeError(
                f"{name} must be a real number or a real tensor, got dtype "
                f"{value.dtype}"
            )
        if value.is_meta and not like.is_meta:
            raise InputTypeError(
                f"{name} is a meta tensor, which holds no values: pass a number or a "
                f"tensor with values (on any device; it is moved to {like.device})"
            )
        return value.to(dtype=like.dtype, device=like.device)
    if value is None or isinstance(value, (bool, str)):
        raise InputTypeError(
            f"{name} must be a number or a tensor, got {type(value).__name__}"
        )
    try:  # numbers, lists and NumPy values convert
        return torch.as_tensor(value, dtype=like.dtype, device=like.device)
    except (TypeError, ValueError, RuntimeError):
        raise InputTypeError(
            f"{name} must be a number or a tensor, got {type(value).__name__}"
        ) from None


def check_device(x: Tensor, like: Tensor, what: str) -> None:
    """Raise a ``ValueError`` naming both devices if ``x`` is not
    on ``like``'s device.
    """
    if isinstance(x, Tensor) and x.device != like.device:
        raise ValueError(
            f"{what} is on {x.device} but the model's parameters are on {like.device}: "
            f"move it with .to({str(like.device)!r}) (or move the model)"
        )
