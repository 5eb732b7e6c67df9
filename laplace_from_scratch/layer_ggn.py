"""GGN products layer by layer: G V for m vectors at once as a few matrix products.

``matfree.ggn_vector_product`` computes G v with one JVP and one VJP per vector,
``torch.func.vmap``-ed over the m vectors. For a Linear layer z = W a + b the Jacobian
of fₖ(xₙ) for W is gₙₖ aₙᵀ (``layers.py``: gₙₖ = ∂fₖ/∂zₙ), so with Wᵥ, bᵥ the layer's
part of a vector v,

    (J v)ₙₖ = Σ_layers gₙₖᵀ (Wᵥ aₙ + bᵥ),     (Jᵀ w) for W = Σₙ (Σₖ wₙₖ gₙₖ) aₙᵀ.

A layer's m tangents Wᵥ aₙ are one matrix product (n, in) × (in, m·out), its m
gradients one (m·out, n) × (n, in); the a, the g (K backward passes) and Λ of a chunk
of examples are the same for every product (:class:`LayerPass`, kept by
``matfree.GGNOperator`` while they fit its cache). The same G V as ``vmap`` (tests check
it), faster on a CPU (results/bench_matfree_*.json). For Conv2d layers this route (one
convolution with m·out filters) measured no faster than ``vmap``: networks with one use
``ggn_vector_product``.

Shapes: n examples, K outputs, m vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .layers import forward_with_hooks, pull_back
from .likelihoods import Likelihood


def check_layerwise(forward: Callable[[Tensor], Tensor], model, layers, x) -> None:
    """Raise ``NotImplementedError`` unless every layer is an ``nn.Linear`` on (n, in)
    inputs with all its parameters trainable (one example ``x`` is run)."""
    if not all(isinstance(m, nn.Linear) for m in layers):
        raise NotImplementedError("only Linear layers")
    if not all(p.requires_grad for m in layers for p in m.parameters()):
        raise NotImplementedError("a layer with a frozen parameter")
    _, inputs, _ = forward_with_hooks(forward, model, layers, x)
    if any(a.ndim != 2 for a in inputs):
        raise NotImplementedError("a Linear layer on inputs (n, ..., in)")


@dataclass
class LayerPass:
    """What a product needs of one chunk of examples, whatever the vectors: each
    layer's input a (n, in), the gₙₖ (n, K, out) at its output, and Λ (n, K, K)."""

    inputs: list[Tensor]
    g: list[Tensor]
    Lam: Tensor

    def numel(self) -> int:
        return sum(t.numel() for t in [*self.inputs, *self.g, self.Lam])


def layer_pass(forward, model, layers, X: Tensor, likelihood: Likelihood) -> LayerPass:
    """One forward pass of X with hooks on ``layers``, K backward passes for the g.
    ``forward``: ``model`` at θ* with each layer's output requiring gradients; the
    layers pass :func:`check_layerwise`."""
    f, inputs, zs = forward_with_hooks(forward, model, layers, X)
    grads = pull_back(f, zs)  # grads[k][i]: ∂fₖ/∂zᵢ, (n, out)
    g = [torch.stack([gk[i] for gk in grads], 1) for i in range(len(layers))]
    return LayerPass(inputs, g, likelihood.output_hessian(f.detach()))


def layerwise_ggn_product(layers: list[nn.Linear], lp: LayerPass, V: Tensor) -> Tensor:
    """G V = Σₙ Jₙᵀ Λₙ Jₙ V over the examples of ``lp``, V (P, m) → (P, m). P: the
    parameters of ``layers`` (all of the network's), in ``model.parameters()``
    order."""
    sizes = [p.numel() for m in layers for p in m.parameters()]
    pieces = iter(V.T.split(sizes, dim=1))  # (m, numel) per tensor
    n, R = lp.Lam.shape[0], V.shape[1]
    JV = 0
    for m, a, gi in zip(layers, lp.inputs, lp.g, strict=True):
        out = m.out_features
        u = (a @ next(pieces).reshape(R * out, -1).T).reshape(n, R, out)  # Wᵥ a
        if m.bias is not None:
            u = u + next(pieces)  # + bᵥ
        JV = JV + gi @ u.transpose(1, 2)  # (n, K, m)
    w = lp.Lam @ JV  # Λ J V, (n, K, m)
    GV: list[Tensor] = []
    for m, a, gi in zip(layers, lp.inputs, lp.g, strict=True):
        h = gi.mT @ w  # Σₖ wₙₖ gₙₖ, (n, out, m)
        GV.append((h.permute(2, 1, 0).reshape(-1, n) @ a).reshape(R, -1))  # W
        if m.bias is not None:
            GV.append(h.sum(0).T)  # b
    return torch.cat(GV, 1).T
