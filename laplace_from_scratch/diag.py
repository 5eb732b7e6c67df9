"""The exact diagonal of the GGN, layer by layer, without per-example Jacobians.

diag G = Σₙ Σ꜀ (Jₙᵀ sₙ꜀)² elementwise, sₙ꜀ the columns of Λₙ^½. Forming every Jₙ is
what :func:`~laplace_from_scratch.curvature.ggn_diagonal` does: exact for any network,
and slow. For a Linear layer the entry of Jₙᵀ sₙ꜀ for W_oi is gₙ꜀ₒ aₙᵢ (``layers.py``):

    diag G_W = Σₙ (Σ꜀ gₙ꜀²) ⊗ aₙ²,    diag G_b = Σₙ Σ꜀ gₙ꜀²,

one matrix product per layer after one forward and K backward passes. A Conv2d (or a
Linear on a sequence) shares W over T positions, so Σₜ gₙ꜀ₒₜ uₙᵢₜ is squared after the
sum: one product per example and column. Other layers: the Jacobian route.

Shapes: N examples, K outputs, P parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .layers import backprop_output_hessian_sqrt, supported_layers, unfold
from .likelihoods import Likelihood
from .posterior import DiagPosterior


class DiagGGN:
    """Accumulates diag(G) over batches: ``update(X)`` per batch, then ``diagonal()``
    (P,), in the order of ``model.parameters()`` (the flat θ of ``functional.py``).
    Every trainable parameter must belong to an ``nn.Linear`` or an ``nn.Conv2d`` (see
    :func:`~laplace_from_scratch.layers.supported_layers`)."""

    def __init__(self, model: nn.Module, likelihood: Likelihood):
        layers = supported_layers(model)
        if layers is None:
            raise ValueError(
                "the layer-wise diagonal needs every trainable parameter in an "
                "nn.Linear or nn.Conv2d; "
                "use curvature.ggn_diagonal (per-example Jacobians) for other networks"
            )
        self.model, self.likelihood, self.layers = model, likelihood, layers
        # one running sum per trainable parameter tensor, shaped like it
        self.sums = {
            (m, name): p.new_zeros(p.shape)
            for m in layers
            for name, p in m.named_parameters(recurse=False)
            if p.requires_grad
        }

    def update(self, X: Tensor) -> Tensor:
        """Add one batch (inputs X of ``model``); return its
        outputs f (n, K), detached.
        """
        bp = backprop_output_hessian_sqrt(self.model, self.layers, X, self.likelihood)
        for i, m in enumerate(self.layers):
            a, gs = bp.inputs[i], [g[i] for g in bp.grads]
            w, b = self.sums.get((m, "weight")), self.sums.get((m, "bias"))
            if isinstance(m, nn.Linear) and a.ndim == 2:
                g2 = sum(g.square() for g in gs)  # Σ꜀ gₙ꜀², (n, out)
                if w is not None:
                    w.addmm_(g2.T, a.square())  # Σₙ (Σ꜀ gₙ꜀²) aₙ²ᵀ, (out, in)
                if b is not None:
                    b += g2.sum(0)
                continue
            if isinstance(m, nn.Conv2d):
                # (n, in·kh·kw, T), (n, out, T)
                U, gs = (
                    unfold(m, a),
                    [g.flatten(2) for g in gs],
                )
            else:  # a Linear on (n, ..., in): the positions are the middle dimensions
                U = a.reshape(a.shape[0], -1, a.shape[-1]).mT
                gs = [g.reshape(g.shape[0], -1, g.shape[-1]).mT for g in gs]
            for (
                g
            ) in gs:  # per-example Σₜ gₙ꜀ₜ uₙₜᵀ, squared after the sum over positions
                if w is not None:
                    w += torch.bmm(g, U.mT).square().sum(0).reshape(w.shape)
                if b is not None:
                    b += g.sum(-1).square().sum(0)
        return bp.f

    def diagonal(self) -> Tensor:
        """diag(G), (P,)."""
        return torch.cat([d.reshape(-1) for d in self.sums.values()])

    def finish(self):
        """The diagonal's :class:`~laplace_from_scratch.posterior.DiagPosterior`."""
        return DiagPosterior(self.diagonal(), [d.numel() for d in self.sums.values()])


def ggn_diagonal_layerwise(
    model: nn.Module, X: Tensor, likelihood: Likelihood, batch_size: int = 256
) -> Tensor:
    """diag(Σₙ Jₙᵀ Λₙ Jₙ), (P,), layer by layer over batches of ``batch_size`` inputs
    (:class:`DiagGGN`)."""
    acc = DiagGGN(model, likelihood)
    for start in range(0, X.shape[0], batch_size):
        acc.update(X[start : start + batch_size])
    return acc.diagonal()
