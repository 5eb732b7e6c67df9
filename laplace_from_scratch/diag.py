"""The exact diagonal of the GGN, layer by layer, without per-example Jacobians.

diag G = Σₙ Σ꜀ (Jₙᵀ sₙ꜀)², sₙ꜀ the columns of Sₙ, Λₙ = Sₙ Sₙᵀ
(``curvature.ggn_diagonal`` forms every Jₙ: any network, slow). For a Linear layer the
entry of Jₙᵀ sₙ꜀ for W_oi is gₙ꜀ₒ aₙᵢ (``layers.py``), so

    diag G_W = Σₙ (Σ꜀ gₙ꜀²) ⊗ aₙ²,    diag G_b = Σₙ Σ꜀ gₙ꜀²,

one matrix product per layer. A Conv2d (or a Linear on a sequence) shares W over T
positions: Σₜ gₙ꜀ₒₜ uₙᵢₜ is squared after the sum. Other layers: the Jacobian route
(:class:`DiagJacobianGGN`). Both builders make a :class:`DiagPosterior`.

Shapes: N examples, K outputs, P parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .curvature import FunctionalBuilder, ggn_diagonal, resume
from .devices import randn
from .layer_predictive import LayerBlock
from .layers import backprop_output_hessian_sqrt, supported_layers, unfold
from .likelihoods import Likelihood
from .posterior import prior_precision_diag


class DiagGGN:
    """Accumulates diag(G) (P,) in ``model.parameters()`` order: ``update(X)`` per
    batch, then ``diagonal()``. Every trainable parameter must be in an ``nn.Linear``
    or an ``nn.Conv2d``."""

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

    can_update = True

    def update(self, X: Tensor) -> Tensor:
        """Add one batch; return its outputs f (n, K), detached."""
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
                U, gs = unfold(m, a), [g.flatten(2) for g in gs]
            else:  # a Linear on (n, ..., in): the positions are the middle dimensions
                U = a.reshape(a.shape[0], -1, a.shape[-1]).mT
                gs = [g.reshape(g.shape[0], -1, g.shape[-1]).mT for g in gs]
            # per example Σₜ gₙ꜀ₜ uₙₜᵀ, squared after the sum over positions
            for g in gs:
                if w is not None:
                    w += torch.bmm(g, U.mT).square().sum(0).reshape(w.shape)
                if b is not None:
                    b += g.sum(-1).square().sum(0)
        return bp.f

    def diagonal(self) -> Tensor:
        """diag(G), (P,)."""
        return torch.cat([d.reshape(-1) for d in self.sums.values()])

    def finish(self) -> DiagPosterior:
        return DiagPosterior(self.diagonal(), [d.numel() for d in self.sums.values()])

    def resumed(self) -> DiagGGN:
        return resume(self, "sums")


def ggn_diagonal_layerwise(
    model: nn.Module, X: Tensor, likelihood: Likelihood, batch_size: int = 256
) -> Tensor:
    """diag(Σₙ Jₙᵀ Λₙ Jₙ), (P,), by :class:`DiagGGN` over batches of ``batch_size``."""
    acc = DiagGGN(model, likelihood)
    for Xb in X.split(batch_size):
        acc.update(Xb)
    return acc.diagonal()


class DiagJacobianGGN(FunctionalBuilder):
    """diag(G) from per-example Jacobians (``curvature.ggn_diagonal``), for networks
    with parameters outside Linear/Conv2d layers (:class:`DiagGGN` for the others)."""

    def __init__(self, *args):  # f, θ*, the likelihood, the parameter sizes
        super().__init__(*args)
        self.d = torch.zeros_like(self.theta)

    def update(self, X: Tensor) -> Tensor:
        out = self.outputs(X)
        self.d += ggn_diagonal(self.f, self.theta, X, self.likelihood)
        return out

    def finish(self) -> DiagPosterior:
        return DiagPosterior(self.d, self.param_sizes)

    def resumed(self) -> DiagJacobianGGN:
        return resume(self, "d")


class DiagPosterior:
    """A diagonal curvature d (P,): Σ⁻¹ = c·d + p₀, everything elementwise."""

    def __init__(self, d: Tensor, param_sizes: Sequence[int]):
        self.H, self.param_sizes, self.n_params = d, list(param_sizes), d.shape[0]

    def precision(self, prior: Tensor, c: Tensor) -> Tensor:
        """The diagonal of Σ⁻¹, (P,), as laplace-torch returns it."""
        return c * self.H + prior_precision_diag(prior, self.param_sizes)

    def log_det(self, prior: Tensor, c: Tensor) -> Tensor:
        return self.precision(prior, c).log().sum()

    def variance(self, prior: Tensor, c: Tensor) -> Tensor:
        return 1 / self.precision(prior, c)

    def covariance(self, prior: Tensor, c: Tensor) -> Tensor:
        return torch.diag(self.variance(prior, c))

    def functional_variance(self, J: Tensor, prior: Tensor, c: Tensor) -> Tensor:
        return torch.einsum("nkp,p,nlp->nkl", J, self.variance(prior, c), J)

    def layer_blocks(self, prior: Tensor, c: Tensor) -> list[LayerBlock]:
        """Σ per parameter tensor for ``layer_predictive.py``: the variances."""
        return [LayerBlock(v) for v in self.variance(prior, c).split(self.param_sizes)]

    def sample(self, n_samples: int, prior: Tensor, c: Tensor, generator=None):
        eps = randn((n_samples, self.n_params), self.H, generator)
        return eps * self.variance(prior, c).sqrt()
