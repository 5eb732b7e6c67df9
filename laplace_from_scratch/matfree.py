"""Matrix-free Laplace: never form the P×P GGN, only products with it.

A GGN-vector product is a forward-mode product J v (one JVP), the output Hessian Λ J v (K×K per
example), and a reverse-mode product Jᵀ(Λ J v) (one VJP): about the cost of two passes over the
data, and memory O(P) instead of O(P²). With products P v = c·G v + p₀ ⊙ v of the posterior
precision (c = 1/(σ²T)) we get

* P⁻¹ b by conjugate gradients (CG), for J Σ Jᵀ at a few test inputs;
* log det P by stochastic Lanczos quadrature (SLQ): log det P = tr log P = E[zᵀ log(P) z] for
  Rademacher z, and zᵀ log(P) z ≈ ‖z‖² Σⱼ τⱼ² log θⱼ from the eigenpairs (θⱼ, τⱼ = first components)
  of the m×m Lanczos tridiagonal matrix started at z;
* samples θ* + P^{-½} ε with P^{-½} ε ≈ ‖ε‖ Q_m T_m^{-½} e₁ from the same Lanczos process.

Shapes: N examples, K outputs, P parameters.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.func import jvp, vjp, vmap

from .devices import rademacher, randn
from .functional import Functional
from .likelihoods import Likelihood

MatVec = Callable[[Tensor], Tensor]


def ggn_vector_product(
    f: Functional, theta: Tensor, X: Tensor, likelihood: Likelihood, v: Tensor, batch_size: int = 1024
) -> Tensor:
    """G v = Σₙ Jₙᵀ Λₙ Jₙ v by one JVP and one VJP per batch, without forming J or G.

    v: (P,) → (P,), or (P, R) → (P, R) for R vectors at once (``torch.func.vmap`` over the columns).
    """
    if v.ndim == 2:
        return vmap(lambda c: ggn_vector_product(f, theta, X, likelihood, c, batch_size), 1, 1)(v)
    out = torch.zeros_like(theta)
    for start in range(0, X.shape[0], batch_size):
        Xb = X[start : start + batch_size]

        def fb(th: Tensor, Xb: Tensor = Xb) -> Tensor:
            return f(th, Xb)

        f0, Jv = jvp(fb, (theta,), (v,))  # (n, K), (n, K)
        LJv = torch.einsum("nkl,nl->nk", likelihood.output_hessian(f0.detach()), Jv)
        _, pullback = vjp(fb, theta)
        out = out + pullback(LJv)[0]  # not in place: under vmap the sum becomes batched
    return out


def posterior_precision_matvec(
    f: Functional,
    theta: Tensor,
    X: Tensor,
    likelihood: Likelihood,
    prior_precision: Tensor,
    factor: float | Tensor = 1.0,
) -> MatVec:
    """v ↦ P v = factor·G v + p₀ ⊙ v, factor = 1/(σ²T); p₀ scalar or (P,). v: (P,) or (P, R)."""

    def matvec(v: Tensor) -> Tensor:
        p0 = prior_precision if v.ndim == 1 or prior_precision.ndim == 0 else prior_precision[:, None]
        return factor * ggn_vector_product(f, theta, X, likelihood, v) + p0 * v

    return matvec


def conjugate_gradient(
    matvec: MatVec, b: Tensor, tol: float = 1e-10, max_iter: int | None = None
) -> tuple[Tensor, int]:
    """Solve A x = b for SPD A given only v ↦ A v. b: (P,), or (P, R) for R independent solves that
    share each product A [p₁ … p_R] (``matvec`` must accept (P, R) then). A column stops at
    ‖r‖ ≤ tol·‖b‖. Returns (x, iterations of the slowest column)."""
    max_iter = max_iter or 10 * b.shape[0]
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = (r * r).sum(0)
    stop = (tol * b.norm(dim=0)) ** 2
    for i in range(max_iter):
        active = rr > stop
        if not active.any():
            return x, i
        Ap = matvec(p)
        # converged columns take no step (their α is 0), so nothing divides 0 by 0
        alpha = torch.where(active, rr / torch.where(active, (p * Ap).sum(0), 1), 0)
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = (r * r).sum(0)
        p = r + torch.where(active, rr_new / torch.where(active, rr, 1), 0) * p
        rr = rr_new
    return x, max_iter


def lanczos(matvec: MatVec, v0: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """m steps of Lanczos with full re-orthogonalisation from v0.

    Returns (T (m', m') tridiagonal, Q (P, m') orthonormal) with Qᵀ A Q = T; m' < m if the Krylov
    space is exhausted early.
    """
    P = v0.numel()
    m = min(m, P)
    Q = torch.zeros(P, m, dtype=v0.dtype, device=v0.device)
    alphas, betas = [], []
    q = v0 / v0.norm()
    beta = v0.new_zeros(())
    q_prev = torch.zeros_like(q)
    for j in range(m):
        Q[:, j] = q
        w = matvec(q) - beta * q_prev
        alpha = q @ w
        w = w - alpha * q
        w = w - Q[:, : j + 1] @ (Q[:, : j + 1].T @ w)  # re-orthogonalise (twice is enough)
        w = w - Q[:, : j + 1] @ (Q[:, : j + 1].T @ w)
        alphas.append(alpha)
        beta = w.norm()
        if j == m - 1 or beta <= 1e-12 * alphas[0].abs():
            break
        betas.append(beta)
        q_prev, q = q, w / beta
    k = len(alphas)
    T = torch.diag(torch.stack(alphas))
    if k > 1:
        off = torch.stack(betas[: k - 1])
        T = T + torch.diag(off, 1) + torch.diag(off, -1)
    return T, Q[:, :k]


def slq_log_det(
    matvec: MatVec,
    n_params: int,
    n_probes: int = 30,
    m: int = 30,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """log det A by stochastic Lanczos quadrature with Rademacher probes.

    ``dtype`` and ``device`` are those of the operator's vectors (default: torch's defaults); the probes
    are drawn by ``generator`` on its own device (a CPU generator works for a CUDA operator).
    Returns (estimate, standard error over the probes).
    """
    like = torch.empty(0, dtype=dtype or torch.get_default_dtype(), device=device)
    values = []
    for _ in range(n_probes):
        z = rademacher(n_params, like, generator)
        T, _ = lanczos(matvec, z, m)
        theta, U = torch.linalg.eigh(T)
        values.append(n_params * (U[0] ** 2 * theta.log()).sum())  # ‖z‖² = P
    v = torch.stack(values)
    return v.mean(), v.std() / n_probes**0.5


def lanczos_inv_sqrt(matvec: MatVec, b: Tensor, m: int = 50) -> Tensor:
    """A^{-½} b ≈ ‖b‖ Q T^{-½} e₁ from m Lanczos steps started at b (exact when m = P)."""
    T, Q = lanczos(matvec, b, m)
    theta, U = torch.linalg.eigh(T)
    return b.norm() * (Q @ (U @ (U[0] / theta.sqrt())))


def sample_matrix_free(
    matvec: MatVec, mean: Tensor, n_samples: int, m: int = 50, generator: torch.Generator | None = None
) -> Tensor:
    """θ = θ* + P^{-½} ε with ε ~ N(0, I), by Lanczos; (S, P). Covariance → P⁻¹ as m grows."""
    eps = randn((n_samples, mean.numel()), mean, generator)
    return mean + torch.stack([lanczos_inv_sqrt(matvec, e, m) for e in eps])


def functional_variance_cg(
    matvec: MatVec, J: Tensor, tol: float = 1e-10, max_iter: int | None = None
) -> Tensor:
    """J P⁻¹ Jᵀ per input by CG, all N·K rows of J solved together (``matvec`` takes (P, N·K)).
    J: (N, K, P) → (N, K, K)."""
    N, K, P = J.shape
    solves = conjugate_gradient(matvec, J.reshape(N * K, P).T, tol, max_iter)[0].T.reshape(N, K, P)
    return torch.einsum("nkp,nlp->nkl", J, solves)
