"""The network as a function f(θ, x) of one flat parameter vector θ ∈ ℝᴾ: the GGN is
P×P and samples are P-vectors. The parameters are flattened once and the dict rebuilt
on every call with ``torch.func.functional_call``; Jacobians, JVPs and VJPs with
respect to θ are then one ``torch.func`` call each.

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
    """All trainable parameters of ``model`` as one detached vector, shape (P,), in
    ``model.named_parameters()`` order (laplace-torch's ``parameters_to_vector``)."""
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
    # one split, not a slice per tensor: under vmap(jacrev) each slice's backward fills
    # a zero θ-gradient, split's is one concatenation (14× faster at P = 1.8·10⁶)
    chunks = theta.split([p.numel() for _, p in named])
    return {name: c.view_as(p) for (name, p), c in zip(named, chunks, strict=True)}


# torch's module-level dicts of global backward hooks (``torch.nn.modules.module``)
GLOBAL_BACKWARD_HOOKS = ("_global_backward_hooks", "_global_backward_pre_hooks")


@contextmanager
def backward_hooks_off(model: nn.Module) -> Iterator[None]:
    """Set module backward hooks (every submodule's and the global ones) aside while we
    differentiate ``model``: full backward hooks (BackPACK, ASDL, user code) wrap a
    module in an ``autograd.Function`` that ``torch.func`` cannot transform. torch has
    no public way to suspend a hook someone else registered, and ``Module.__call__``
    reads private dicts (``_backward_hooks``, ``_backward_pre_hooks``,
    :data:`GLOBAL_BACKWARD_HOOKS`): those holding a hook are swapped for empty ones and
    restored; a model without one touches nothing private (``tests/test_functional.py``
    checks the names against torch)."""
    hooked = [m for m in model.modules() if m._backward_hooks or m._backward_pre_hooks]
    names = [n for n in GLOBAL_BACKWARD_HOOKS if getattr(module_globals, n)]
    saved = [(m, m._backward_hooks, m._backward_pre_hooks) for m in hooked]
    globals_saved = {n: getattr(module_globals, n) for n in names}
    try:
        for m in hooked:
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
    """``(f, theta)`` with ``f(theta, X) == model(X)``: θ (P,) a detached copy of the
    parameters, X (N, ...) → (N, K). Buffers (e.g. batch-norm statistics) are the
    model's as they are; backward hooks are off during the call."""
    buffers = dict(model.named_buffers())

    def f(theta: Tensor, X: Tensor) -> Tensor:
        params = unflatten_params(theta, model)
        with backward_hooks_off(model):
            return functional_call(model, (params, buffers), (X,))

    return f, flatten_params(model)


def vector_to_model(theta: Tensor, model: nn.Module) -> None:
    """Copy the flat vector θ (P,) into the parameters of ``model`` in place."""
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        for p, v in zip(params, unflatten_params(theta, model).values(), strict=True):
            p.copy_(v)


def find_last_layer(model: nn.Module, name: str | None = None) -> tuple[str, nn.Linear]:
    """``(name, layer)``: the ``nn.Linear`` called ``name``, by default the last one."""
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if name is not None:
        found = [(n, m) for n, m in linears if n == name]
        if not found:
            raise ValueError(
                f"last_layer_name={name!r} is not an nn.Linear of the model; its "
                f"nn.Linear layers are {[n for n, _ in linears]}"
            )
        return found[0]
    if not linears:
        raise ValueError(
            "subset_of_weights='last_layer' needs an nn.Linear that makes the model's "
            f"outputs, and this {type(model).__name__} has no nn.Linear"
        )
    return linears[-1]


class LastLayerFeatures:
    """φ(X): the last layer's input, (N, D), caught by a forward hook while the model
    runs without gradients, or, when X requires them (``enable_backprop``), with the
    weights as constants: φ(X) is then differentiable in X and in nothing else.
    ``ValueError`` unless the model's output is that layer's (only then is f(θ, X) =
    W φ(X)ᵀ + b the model)."""

    def __init__(self, model: nn.Module, name: str, layer: nn.Linear):
        self.model, self.name, self.layer = model, name, layer
        tail = model  # an nn.Sequential's output is its last module's: check now
        while isinstance(tail, nn.Sequential) and len(tail) > 0:
            tail = tail[-1]
        if isinstance(model, nn.Sequential) and tail is not layer:
            raise self._not_last(f" (the Sequential ends in {type(tail).__name__})")

    def _not_last(self, why: str = "") -> ValueError:
        return ValueError(
            "subset_of_weights='last_layer': the model's output is not the output of "
            f"its nn.Linear {self.name!r}{why}; pass last_layer_name= naming the "
            "nn.Linear that makes the outputs (nothing may follow it)"
        )

    def __call__(self, X: Tensor) -> Tensor:
        seen: dict[str, Tensor] = {}

        def catch(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor):
            seen["phi"], seen["out"] = inputs[0], output

        handle = self.layer.register_forward_hook(catch)
        try:
            if torch.is_grad_enabled() and X.requires_grad:
                weights = {n: p.detach() for n, p in self.model.named_parameters()}
                with backward_hooks_off(self.model):
                    out = functional_call(self.model, weights, (X,))
            else:
                with torch.no_grad():
                    out = self.model(X)
        finally:
            handle.remove()
        last = seen.get("out")
        if last is None or not (
            out is last or (out.shape == last.shape and torch.equal(out, last))
        ):
            raise self._not_last()
        return seen["phi"]
