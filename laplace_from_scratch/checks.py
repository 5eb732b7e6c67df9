"""Checks of user input, each raising an error that names the problem and its fix;
``Laplace`` runs them before it changes any state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import Enum

import torch
from torch import Tensor, nn

from .devices import check_device

# ----- checks of tensor values, read once per loop ------------------------------------
# Reading a tensor's value on the host (``bool(t)``, ``t.item()``) waits for the device:
# a check per batch or per step would stall a GPU as often. Inside ``deferred()`` the
# checks are kept and read together when the loop ends.
_PENDING: ContextVar[list | None] = ContextVar("pending_checks", default=None)


def require(ok: Tensor, message: str | Callable[[], str]) -> None:
    """Raise ``ValueError(message)`` unless the boolean tensor ``ok`` holds (all of
    it); inside :func:`deferred`, at the block's end. ``message`` may be a function,
    called only on failure (to read the values it names then)."""
    pending = _PENDING.get()
    if pending is not None:
        pending.append((ok.all(), message))
    elif not bool(ok.all()):
        raise ValueError(message() if callable(message) else message)


def _raise_failed(pending: list) -> None:
    """The first failed check of ``pending``, read with one host sync."""
    if not pending:
        return
    held = torch.stack([ok.to(pending[0][0].device) for ok, _ in pending]).tolist()
    for good, (_, message) in zip(held, pending, strict=True):
        if not good:
            raise ValueError(message() if callable(message) else message)


@contextmanager
def deferred() -> Iterator[None]:
    """Checks by :func:`require` in this block are read when it ends, all with one
    host sync, and the first that failed raises; if the block raises, a failed check
    raises instead (it names the cause). Nested blocks leave the reading to the
    outermost."""
    if _PENDING.get() is not None:
        yield
        return
    pending: list = []
    token = _PENDING.set(pending)
    try:
        yield
    except Exception:
        _raise_failed(pending)
        raise
    finally:  # also after KeyboardInterrupt: later checks are not deferred
        _PENDING.reset(token)
    _raise_failed(pending)


def plain(value):
    """A str-valued enum member (laplace-torch's or ``enums.py``'s, e.g.
    ``HessianStructure.KRON``) as its string ("kron"); anything else as it is."""
    return value.value if isinstance(value, str) and isinstance(value, Enum) else value


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """``value`` (a string, or a str-valued enum member) as a plain string of
    ``choices``; ``ValueError`` naming the choices otherwise."""
    value = plain(value)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_backend(backend, backend_kwargs: dict | None = None) -> None:
    """laplace-torch's ``backend=`` (a curvature class: BackPACK, ASDL, curvlinops) and
    ``backend_kwargs=``. Every GGN backend computes the same GGN, which ours computes
    with ``torch.func``, so a GGN backend (or ``None``) is accepted and not used. The
    empirical Fisher and the exact Hessian are other curvatures: refused, as are
    backend options (e.g. a stochastic GGN), instead of being silently replaced. The
    class is recognised by name (laplace-torch is not imported)."""
    if backend is not None:
        names = [c.__name__ for c in getattr(backend, "__mro__", ())]
        if "GGNInterface" not in names and not (names and names[0].endswith("GGN")):
            raise ValueError(
                f"backend={getattr(backend, '__name__', backend)!r}: ours computes "
                "the GGN (with torch.func), so only a GGN backend (BackPackGGN, "
                "AsdlGGN, CurvlinopsGGN) or None is accepted; the empirical Fisher "
                "and the exact Hessian are not curvatures of this Laplace"
            )
    if backend_kwargs:
        raise ValueError(
            f"backend_kwargs={backend_kwargs!r}: ours has no curvature backend to "
            "configure (its GGN is exact)"
        )


def check_count(name: str, value, minimum: int = 1) -> None:
    """An integer ``value`` (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        need = (
            "a positive integer" if minimum == 1 else f"at least {minimum} (an integer)"
        )
        raise ValueError(f"{name} must be {need}, got {value!r}")


def check_positive(name: str, value) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def check_indices(indices: Tensor | None, n_params: int) -> Tensor:
    ok = isinstance(indices, Tensor) and indices.dtype == torch.long
    if not (ok and indices.ndim == 1 and indices.numel() > 0):
        raise ValueError(
            "subnetwork_indices must be a non-empty 1-D LongTensor "
            "of flat parameter indices"
        )
    if indices.min() < 0 or indices.max() >= n_params:
        raise ValueError(
            f"subnetwork_indices must lie in [0, {n_params}), "
            f"got [{indices.min()}, {indices.max()}]"
        )
    if indices.unique().numel() != indices.numel():
        raise ValueError("subnetwork_indices must not repeat an index")
    return indices


MODE_DEPENDENT = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)


def check_eval_mode(model: nn.Module) -> None:
    """Dropout and batch norm behave differently in training mode (and batch norm would
    update its statistics): refuse before touching anything."""
    busy = [m for m in model.modules() if m.training and isinstance(m, MODE_DEPENDENT)]
    busy = [type(m).__name__ for m in busy]
    if busy:
        raise ValueError(
            f"the model is in training mode and has {', '.join(sorted(set(busy)))}: "
            "call model.eval() first"
        )


def check_batch(batch, like: Tensor) -> tuple[Tensor, Tensor]:
    """An (X, y) batch of tensors on ``like``'s device, a floating X in its dtype, with
    a batch dimension."""
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        got = f"a {type(batch).__name__}" + (
            f" of {len(batch)} items" if isinstance(batch, (tuple, list)) else ""
        )
        raise TypeError(f"each batch must be an (X, y) pair of tensors, got {got}")
    X, y = batch
    if not isinstance(X, Tensor) or not isinstance(y, Tensor):
        raise TypeError(
            "each batch must be an (X, y) pair of tensors, "
            f"got ({type(X).__name__}, {type(y).__name__})"
        )
    check_device(X, like, "the inputs X")
    check_device(y, like, "the targets y")
    if X.ndim == 0 or y.ndim == 0 or X.shape[0] != y.shape[0]:
        raise ValueError(
            f"X {tuple(X.shape)} and y {tuple(y.shape)} must share a first (batch) "
            "dimension; DataLoader(batch_size=None) yields single examples without one"
        )
    if X.is_floating_point() and X.dtype != like.dtype:
        raise ValueError(
            f"X has dtype {X.dtype} but the model's parameters are {like.dtype}: "
            "convert one of them"
        )
    if y.is_floating_point():
        require(torch.isfinite(y), "the targets y contain NaN or inf")
    return X, y


def check_outputs(f: Tensor) -> None:
    """The model's outputs f must be (N, K)."""
    if f.ndim != 2:
        raise ValueError(
            f"the model's outputs must be (N, K), got {tuple(f.shape)} "
            "(reshape to (N, 1)?)"
        )


def check_inputs(x, like: Tensor) -> None:
    """Inputs x to predict at: a tensor (N, ...) with a batch dimension, on ``like``'s
    device."""
    if not isinstance(x, Tensor) or x.ndim < 2:
        got = getattr(x, "shape", type(x))
        raise ValueError(
            f"x must be a tensor of shape (N, ...) with a batch dimension, got {got}"
        )
    check_device(x, like, "x")
