"""Per-example Jacobians J = ∂f(x; θ)/∂θ, shape (N, K, P), two ways: the didactic
:func:`jacobian_loop` (N·K backward passes) and the fast :func:`jacobian`
(``torch.func.vmap`` over examples of ``jacrev``, K backward passes per example, or
``jacfwd``, P forward passes: reverse mode wins when K ≪ P, the usual case).

Shapes: N examples, K outputs, P parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import jacfwd, jacrev, vmap

from .functional import Functional


def jacobian_loop(f: Functional, theta: Tensor, X: Tensor) -> Tensor:
    """J (N, K, P) by N·K calls of ``torch.autograd.grad``: slow, obviously right."""
    theta = theta.detach().requires_grad_(True)
    out = f(theta, X)  # (N, K)
    N, K = out.shape
    J = torch.empty(N, K, theta.numel(), dtype=out.dtype, device=out.device)
    for n in range(N):
        for k in range(K):
            (J[n, k],) = torch.autograd.grad(out[n, k], theta, retain_graph=True)
    return J


def jacobian(
    f: Functional,
    theta: Tensor,
    X: Tensor,
    mode: str = "rev",
    chunk_size: int | None = None,
) -> Tensor:
    """J (N, K, P) with ``vmap`` over the N examples of ``jacrev`` (``mode="rev"``) or
    ``jacfwd``; ``chunk_size`` bounds how many examples ``vmap`` takes at once."""
    if mode not in ("rev", "fwd"):
        raise ValueError(f"mode must be 'rev' or 'fwd', got {mode!r}")
    jac = jacrev if mode == "rev" else jacfwd

    def f_one(th: Tensor, x: Tensor) -> Tensor:  # (P,), (...) → (K,)
        return f(th, x.unsqueeze(0)).squeeze(0)

    return vmap(jac(f_one), in_dims=(None, 0), chunk_size=chunk_size)(theta.detach(), X)


def last_layer_jacobian(phi: Tensor, n_outputs: int) -> Tensor:
    """Closed-form Jacobian of f = W φ + b for θ = [vec W, b] (W (K, D) row-major):
    ∂fₖ/∂W_kj = φⱼ, ∂fₖ/∂bₖ = 1, so Jₙ = [I_K ⊗ φₙᵀ, I_K]. (N, D) → (N, K, K·D + K)."""
    N, D = phi.shape
    eye = torch.eye(n_outputs, dtype=phi.dtype, device=phi.device)
    JW = torch.einsum("kl,nd->nkld", eye, phi).reshape(N, n_outputs, n_outputs * D)
    return torch.cat([JW, eye.expand(N, n_outputs, n_outputs)], dim=-1)
