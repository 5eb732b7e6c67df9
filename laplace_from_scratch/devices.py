"""Where the module's tensors live: one device policy, and the helpers that keep it.

* Every tensor the module creates has the device and dtype of θ* or of the input it
  comes from; nothing is made on the CPU or on torch's default device by accident.
* Hyperparameters (numbers, or tensors on any device) move to θ*'s device and dtype.
* Random draws take an optional ``torch.Generator`` on the CPU or the model's device
  (a CPU one draws there, then moves the numbers): the same numbers on every device.
* Data on another device than the model is an error naming both.

A test runs the public API with torch's default device set to ``meta``: a factory call
that forgets ``device=`` then fails, as it would on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class InputTypeError(TypeError, ValueError):
    """A hyperparameter of the wrong type (a string, None, a complex tensor): a
    ``TypeError`` (Python's convention) and a ``ValueError`` (laplace-torch's)."""


def randn(shape: Sequence[int], like: Tensor, generator=None) -> Tensor:
    """Standard normal draws of ``shape`` in the dtype and on the device of ``like``,
    drawn on the ``generator``'s device (e.g. a seeded CPU one) and moved there."""
    where = like.device if generator is None else generator.device
    eps = torch.randn(tuple(shape), generator=generator, dtype=like.dtype, device=where)
    return eps.to(like.device)


def rademacher(n: int, like: Tensor, generator=None) -> Tensor:
    """n random signs ±1 (Rademacher), in the dtype and on the device of ``like``; see
    :func:`randn`."""
    where = like.device if generator is None else generator.device
    bits = torch.randint(0, 2, (n,), generator=generator, device=where)
    return (2 * bits - 1).to(dtype=like.dtype, device=like.device)


def as_like(value: float | Tensor, like: Tensor, name: str) -> Tensor:
    """``value`` (a number, or a tensor on any device: differentiable) in ``like``'s
    dtype and device; :class:`InputTypeError` naming ``name`` for anything else."""
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
    """Raise a ``ValueError`` naming both devices if ``x`` is not on ``like``'s."""
    if isinstance(x, Tensor) and x.device != like.device:
        raise ValueError(
            f"{what} is on {x.device} but the model's parameters are on {like.device}: "
            f"move it with .to({str(like.device)!r}) (or move the model)"
        )
