"""The network as a function f(θ, x) of one flat parameter vector θ.

Laplace works with θ ∈ ℝᴾ as a single vector: the Hessian and the GGN are P×P
matrices, samples are P-vectors. PyTorch stores parameters as a dict of tensors,
so we flatten them once and rebuild the dict on every call with
``torch.func.functional_call``. Then Jacobians, JVPs and VJPs with respect to θ
are one ``torch.func`` call each.

Shapes: N examples, K outputs, P parameters.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.modules import module as module_globals

Functional = Callable[[Tensor, Tensor], Tensor]


def flatten_params(model: nn.Module) -> Tensor:
    """All trainable parameters of ``model`` as one detached vector, shape (P,).

    The order is ``model.named_parameters()``, the same order laplace-torch uses
    (``parameters_to_vector``).
    """
    return torch.cat(
        [p.detach().reshape(-1) for p in model.parameters() if p.requires_grad]
    )


def unflatten_params(theta: Tensor, model: nn.Module) -> dict[str, Tensor]:
    """Split a flat vector θ of shape (P,) into a ``{name: tensor}`` dict shaped like
    ``model``."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    n_params = sum(p.numel() for _, p in named)
    if theta.shape != (n_params,):
        raise ValueError(
            f"theta has shape {tuple(theta.shape)} but the model has {n_params} "
            "parameters"
        )
    params, i = {}, 0
    for name, p in named:
        params[name] = theta[i : i + p.numel()].view_as(p)
        i += p.numel()
    return params


@contextmanager
def backward_hooks_off(model: nn.Module) -> Iterator[None]:
    """Switch off module backward hooks while we differentiate ``model``.

    A full backward hook wraps a module's inputs and outputs in an
    ``autograd.Function`` that ``torch.func`` cannot transform, so ``jacrev`` and
    ``vmap`` fail deep inside torch. BackPACK, ASDL and user code register such hooks.
    They only watch or rewrite gradients, never the forward value, and our Jacobians
    must be those of the function itself, so we set them aside (on every submodule
    and the global ones) and put them back on exit, also after an error. Forward hooks
    still run.
    """
    saved = [(m, m._backward_hooks, m._backward_pre_hooks) for m in model.modules()]
    names = ("_global_backward_hooks", "_global_backward_pre_hooks")
    globals_saved = {n: getattr(module_globals, n) for n in names}
    try:
        for m, _, _ in saved:
            m._backward_hooks, m._backward_pre_hooks = OrderedDict(), OrderedDict()
        for n in names:
            setattr(module_globals, n, OrderedDict())
        yield
    finally:
        for m, hooks, pre_hooks in saved:
            m._backward_hooks, m._backward_pre_hooks = hooks, pre_hooks
        for n, hooks in globals_saved.items():
            setattr(module_globals, n, hooks)


def make_functional(model: nn.Module) -> tuple[Functional, Tensor]:
    """Return ``(f, theta)`` with ``f(theta, X) == model(X)``.

    ``theta`` (P,) is a detached copy of the current parameters; ``f`` maps
    θ (P,) and inputs X (N, ...) to outputs (N, K). Buffers (e.g. batch-norm
    statistics) are taken from ``model`` as they are. Backward hooks are off during
    the call (``backward_hooks_off``).
    """
    buffers = dict(model.named_buffers())

    def f(theta: Tensor, X: Tensor) -> Tensor:
        params = unflatten_params(theta, model)
        with backward_hooks_off(model):
            return functional_call(model, (params, buffers), (X,))

    return f, flatten_params(model)


def vector_to_model(theta: Tensor, model: nn.Module) -> None:
    """Copy the flat vector θ (P,) into the parameters of ``model`` in place."""
    with torch.no_grad():
        for p, v in zip(
            (p for p in model.parameters() if p.requires_grad),
            unflatten_params(theta, model).values(),
            strict=True,
        ):
            p.copy_(v)


def last_layer_functional(model: nn.Module) -> tuple[Functional, Tensor, list[int]]:
    """``(f, theta, sizes)`` for the last ``nn.Linear`` of an ``nn.Sequential``, the
    rest held fixed.

    f(θ, X) = W φ(X)ᵀ + b with features φ = ``model[:-1]`` at their current weights and
    θ = [vec W, b] (laplace-torch's order); ``sizes`` are the sizes of W and b. φ
    carries no gradient: f is linear in θ.
    """
    if not isinstance(model, nn.Sequential) or not isinstance(model[-1], nn.Linear):
        raise ValueError(
            "subset_of_weights='last_layer' needs an nn.Sequential whose last module "
            "is an nn.Linear, "
            f"got {type(model).__name__}"
            + (
                f" ending in {type(model[-1]).__name__}"
                if isinstance(model, nn.Sequential)
                else ""
            )
        )
    features, last = model[:-1], model[-1]
    g, theta = make_functional(last)

    def f(theta: Tensor, X: Tensor) -> Tensor:
        with torch.no_grad():
            phi = features(X)
        return g(theta, phi)

    return f, theta, [p.numel() for p in last.parameters() if p.requires_grad]
