"""The layer structure of a network: curvature that never forms per-example Jacobians.

For a layer z = W a + b, pull every column sₙ꜀ (K,) of Sₙ back to the layer's output:
gₙ꜀ = Jzₙᵀ sₙ꜀ (out,), Jzₙ = ∂f(xₙ)/∂zₙ (K, out), where Λₙ = Sₙ Sₙᵀ (the
likelihood's ``output_hessian_sqrt``). Restricted to W, Jₙᵀ sₙ꜀ = gₙ꜀ aₙᵀ, so
the layer's GGN is a sum of products of two small vectors: K backward passes give every
g, one forward pass with hooks every a (KFAC in ``kron.py``, the exact diagonal in
``diag.py``). A Conv2d is a Linear layer on the unfolded patch at each output position.

Shapes: N examples (n in a batch), K outputs, T output positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .functional import backward_hooks_off

LAYERS = (nn.Linear, nn.Conv2d)


def supported_layers(model: nn.Module) -> list[nn.Module] | None:
    """The Linear and Conv2d layers of ``model`` in ``model.modules()`` order, or None
    if some trainable parameter lives in another kind of module."""
    layers = [m for m in model.modules() if isinstance(m, LAYERS)]
    owned = {id(p) for m in layers for p in m.parameters()}
    if any(id(p) not in owned for p in model.parameters() if p.requires_grad):
        return None
    return layers


def conv_padding(m: nn.Conv2d) -> tuple[int, int]:
    """The Conv2d's zero padding as integers (``"same"`` only if symmetric)."""
    if m.groups != 1 or m.padding_mode != "zeros":
        raise NotImplementedError(
            "layer-wise curvature supports Conv2d with groups=1 and zero padding"
        )
    if m.padding == "valid":
        return (0, 0)
    if m.padding == "same":
        total = [d * (k - 1) for d, k in zip(m.dilation, m.kernel_size, strict=True)]
        if any(t % 2 for t in total):
            raise NotImplementedError(
                "layer-wise curvature needs padding='same' to be symmetric"
            )
        return (total[0] // 2, total[1] // 2)
    return m.padding


def unfold(m: nn.Conv2d, x: Tensor) -> Tensor:
    """The Conv2d's input patches uₙₜ, (n, in·kh·kw, T), zero padding included, in the
    weight's row-major (in, kh, kw) order."""
    return F.unfold(
        x, m.kernel_size, dilation=m.dilation, padding=conv_padding(m), stride=m.stride
    )


@dataclass
class Backprop:
    """One batch through the network: the outputs ``f`` (n, K), ``inputs[i]`` layer
    i's input a (detached) and ``grads[c][i]`` the gₙ꜀ at layer i's output, shaped
    like it."""

    f: Tensor
    inputs: list[Tensor]
    grads: list[list[Tensor]]


def forward_with_hooks(
    forward: Callable[[Tensor], Tensor], model, layers, X: Tensor, keep_graph=False
):
    """``forward(X)`` (``model`` or a functional call of it) with hooks on ``layers``:
    the outputs f (n, K), each layer's input (detached, unless ``keep_graph``: then in
    the graph from X) and output z (in the graph)."""
    inputs: dict[nn.Module, Tensor] = {}
    outputs: dict[nn.Module, Tensor] = {}

    def hook(m: nn.Module, args: tuple, out: Tensor) -> None:
        inputs[m], outputs[m] = args[0] if keep_graph else args[0].detach(), out

    handles = [m.register_forward_hook(hook) for m in layers]
    try:  # backward hooks are attached in the forward pass: none on our graph
        with torch.enable_grad(), backward_hooks_off(model):
            f = forward(X)
    finally:
        for h in handles:
            h.remove()
    return f, [inputs[m] for m in layers], [outputs[m] for m in layers]


def pull_back(
    f: Tensor, zs: list[Tensor], S: Tensor | None = None, create_graph: bool = False
):
    """``grads[c][i]``: Σₙ sₙ꜀ᵀ f(xₙ) differentiated with respect to layer i's output
    zs[i], whose row n is gₙ꜀ = Jzₙᵀ sₙ꜀. S (n, K, K) holds the columns sₙ꜀; None
    means the unit vectors, so that gₙₖ = ∂fₖ(xₙ)/∂zₙ. One backward pass per column;
    ``create_graph``: the g are differentiable (e.g. in the inputs X)."""
    K = f.shape[1]
    with torch.enable_grad():  # also under the caller's no_grad
        cols = [f[:, c] if S is None else (S[:, :, c] * f).sum(1) for c in range(K)]
        return [
            list(
                torch.autograd.grad(
                    col.sum(),
                    zs,
                    retain_graph=create_graph or c < K - 1,
                    create_graph=create_graph,
                )
            )
            for c, col in enumerate(cols)
        ]


def backprop_output_hessian_sqrt(model, layers, X: Tensor, likelihood) -> Backprop:
    """One forward pass of X with hooks on ``layers``, then K backward passes of the
    columns of S, Λ = S Sᵀ (``output_hessian_sqrt``)."""
    f, inputs, zs = forward_with_hooks(model, model, layers, X)
    S = likelihood.output_hessian_sqrt(f.detach())  # Λ = S Sᵀ, (n, K, K)
    return Backprop(f.detach(), inputs, pull_back(f, zs, S))
