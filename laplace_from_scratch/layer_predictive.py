"""The GLM predictive layer by layer: J Σ Jᵀ without per-example Jacobians.

The diagonal and KFAC posteriors are block-diagonal over parameter tensors, each block
Σ_W = (Q_B ⊗ Q_A) diag(v) (Q_B ⊗ Q_A)ᵀ (diagonal: Q_B = Q_A = I), v read as an
(out, in) matrix. For z = W a + b the Jacobian of fₖ for W is gₖ aᵀ (``layers.py``:
gₖ = ∂fₖ/∂z), and (Q_B ⊗ Q_A)ᵀ (gₖ ⊗ a) = (Q_Bᵀgₖ) ⊗ (Q_Aᵀa), so

    (J Σ Jᵀ)ₖₗ from W = Σₒ uₖₒ uₗₒ wₒ,   u = Q_Bᵀ g (K, out),   w = v (Q_Aᵀ a)² (out,),

O(out·in + K·out² + in²) per input and layer (a bias: a = 1). A Conv2d or a Linear on
(n, ..., in) shares W over T positions: its Jacobian Σₜ gₖₜ uₜᵀ is formed per chunk of
inputs. Other layers: ``Laplace`` uses J.

Shapes: n inputs, K outputs, P parameters, T output positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .layers import forward_with_hooks, pull_back, unfold

# inputs per chunk: at most this many numbers (64 MiB in float32) in the largest
# per-layer object (K gradients of a layer's output, or a Conv2d's Jacobian block)
CHUNK_NUMBERS = 1 << 24


@dataclass
class LayerBlock:
    """One parameter tensor's covariance (Q_B ⊗ Q_A) diag(v) (Q_B ⊗ Q_A)ᵀ: ``v`` (size,)
    row-major; ``QB`` (out, out), ``QA`` (in, in) orthogonal, None for the identity."""

    v: Tensor
    QB: Tensor | None = None
    QA: Tensor | None = None


def _rank_one(g: Tensor, a: Tensor | None, block: LayerBlock) -> Tensor:
    """Σₒ uₖₒ uₗₒ wₒ for a Linear block: g (n, K, out), a (n, in) for a weight or None
    for a bias → (n, K, K)."""
    u = g if block.QB is None else g @ block.QB  # rows Q_Bᵀ gₖ
    if a is None:
        w = block.v.expand(g.shape[0], -1)
    else:
        s = (a if block.QA is None else a @ block.QA).square()  # (Q_Aᵀ a)², (n, in)
        w = s @ block.v.reshape(g.shape[-1], -1).T  # (n, out)
    return torch.einsum("nko,no,nlo->nkl", u, w, u)


def _shared(g: Tensor, U: Tensor | None, block: LayerBlock) -> Tensor:
    """J Σ_W Jᵀ for a block shared over positions: g (n, K, out, T), the patches U (n,
    in, T) for a weight or None for a bias → (n, K, K)."""
    if U is None:
        return _rank_one(g.sum(-1), None, block)
    J = torch.einsum("nkot,nit->nkoi", g, U)  # one input's Jacobian of W per output
    if block.QB is not None:
        J = block.QB.T @ J
    if block.QA is not None:
        J = J @ block.QA
    v = block.v.reshape(J.shape[-2:])
    return torch.einsum("nkoi,oi,nloi->nkl", J, v, J)


def _layer_variance(m: nn.Module, a: Tensor, g: Tensor, blocks: list) -> Tensor:
    """The contribution of layer ``m`` (its input a, its output gradients g (n, K,
    *out_shape)) with one :class:`LayerBlock` per trainable parameter tensor."""
    names = [n for n, p in m.named_parameters(recurse=False) if p.requires_grad]
    out = 0
    if isinstance(m, nn.Linear) and a.ndim == 2:
        for name, block in zip(names, blocks, strict=True):
            out = out + _rank_one(g, a if name == "weight" else None, block)
        return out
    if isinstance(m, nn.Conv2d):  # (n, in·kh·kw, T) and (n, K, out, T)
        U, g = unfold(m, a), g.flatten(3)
    else:  # a Linear on (n, ..., in): the positions are the middle dimensions
        U = a.reshape(a.shape[0], -1, a.shape[-1]).mT
        g = g.reshape(*g.shape[:2], -1, g.shape[-1]).mT
    for name, block in zip(names, blocks, strict=True):
        out = out + _shared(g, U if name == "weight" else None, block)
    return out


def glm_variance(
    forward: Callable[[Tensor], Tensor],
    model,
    layers,
    X: Tensor,
    blocks: list,
    keep_graph: bool = False,
) -> tuple[Tensor, Tensor]:
    """f_mu (n, K) and f_var = J Σ Jᵀ (n, K, K) at inputs X (differentiable in the
    blocks, e.g. in δ; with ``keep_graph`` also in X, as both are then) for one
    :class:`LayerBlock` per trainable parameter tensor of ``layers`` (holding all of
    ``model``'s), in ``model.parameters()`` order. ``forward``: the network at θ* with
    each layer's output requiring gradients."""
    sizes = [sum(p.requires_grad for p in m.parameters(recurse=False)) for m in layers]
    if sum(sizes) != len(blocks):
        raise ValueError(f"{len(blocks)} posterior blocks for {sum(sizes)} tensors")
    it = iter(blocks)
    per_layer = [[next(it) for _ in range(n)] for n in sizes]
    chunk = _chunk(model, layers, X)
    mus, variances = [], []
    for Xc in X.split(chunk):
        f, inputs, zs = forward_with_hooks(forward, model, layers, Xc, keep_graph)
        # grads[k][i]: ∂fₖ/∂zᵢ, shaped like zᵢ (with keep_graph: functions of Xc)
        grads = pull_back(f, zs, create_graph=keep_graph)
        f_var = f.new_zeros(f.shape[0], f.shape[1], f.shape[1])
        for i, m in enumerate(layers):
            g = torch.stack([gk[i] for gk in grads], 1)  # (n, K, *zᵢ.shape[1:])
            f_var += _layer_variance(m, inputs[i], g, per_layer[i])
        mus.append(f if keep_graph else f.detach())
        variances.append(f_var)  # differentiable in the blocks, not in θ
    return torch.cat(mus), torch.cat(variances)


def _chunk(model: nn.Module, layers: list[nn.Module], X: Tensor) -> int:
    """Inputs per chunk: :data:`CHUNK_NUMBERS` over the largest per-input object (K
    times a layer's output, or times a shared weight), from one input's forward pass."""
    if X.shape[0] <= 1:
        return 1
    sizes: list[int] = []

    def hook(m: nn.Module, args: tuple, out: Tensor) -> None:
        shared = isinstance(m, nn.Conv2d) or args[0].ndim > 2
        sizes.append(out[0].numel() + (m.weight.numel() if shared else 0))

    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        with torch.no_grad():
            K = model(X[:1]).shape[-1]
    finally:
        for h in handles:
            h.remove()
    return max(1, CHUNK_NUMBERS // (K * max(sizes)))
