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
from torch.func import jvp, vjp

from .functional import Functional
from .likelihoods import Likelihood

MatVec = Callable[[Tensor], Tensor]


def ggn_vector_product(
    f: Functional, theta: Tensor, X: Tensor, likelihood: Likelihood, v: Tensor, batch_size: int = 1024
) -> Tensor:
    """G v = Σₙ Jₙᵀ Λₙ Jₙ v by one JVP and one VJP per batch, without forming J or G. v: (P,) → (P,)."""
    out = torch.zeros_like(theta)
    for start in range(0, X.shape[0], batch_size):
        Xb = X[start : start + batch_size]

        def fb(th: Tensor, Xb: Tensor = Xb) -> Tensor:
            return f(th, Xb)

        f0, Jv = jvp(fb, (theta,), (v,))  # (n, K), (n, K)
        LJv = torch.einsum("nkl,nl->nk", likelihood.output_hessian(f0.detach()), Jv)
        _, pullback = vjp(fb, theta)
        out += pullback(LJv)[0]
    return out


def posterior_precision_matvec(
    f: Functional,
    theta: Tensor,
    X: Tensor,
    likelihood: Likelihood,
    prior_precision: Tensor,
    factor: float | Tensor = 1.0,
) -> MatVec:
    """v ↦ P v = factor·G v + p₀ ⊙ v, factor = 1/(σ²T); p₀ scalar or (P,)."""
    return lambda v: factor * ggn_vector_product(f, theta, X, likelihood, v) + prior_precision * v


def conjugate_gradient(
    matvec: MatVec, b: Tensor, tol: float = 1e-10, max_iter: int | None = None
) -> tuple[Tensor, int]:
    """Solve A x = b for SPD A given only v ↦ A v. Stops at ‖r‖ ≤ tol·‖b‖. Returns (x, iterations)."""
    max_iter = max_iter or 10 * b.numel()
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = r @ r
    stop = (tol * b.norm()) ** 2
    for i in range(max_iter):
        if rr <= stop:
            return x, i
        Ap = matvec(p)
        alpha = rr / (p @ Ap)
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = r @ r
        p = r + (rr_new / rr) * p
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
    beta = torch.zeros((), dtype=v0.dtype)
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
) -> tuple[Tensor, Tensor]:
    """log det A by stochastic Lanczos quadrature with Rademacher probes.

    Returns (estimate, standard error over the probes).
    """
    dtype = dtype or torch.get_default_dtype()
    values = []
    for _ in range(n_probes):
        z = torch.randint(0, 2, (n_params,), generator=generator).to(dtype) * 2 - 1
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
    eps = torch.randn(n_samples, mean.numel(), generator=generator, dtype=mean.dtype)
    return mean + torch.stack([lanczos_inv_sqrt(matvec, e, m) for e in eps])


def functional_variance_cg(matvec: MatVec, J: Tensor, tol: float = 1e-10) -> Tensor:
    """J P⁻¹ Jᵀ per input by one CG solve per row of J. J: (N, K, P) → (N, K, K)."""
    N, K, P = J.shape
    rows = J.reshape(N * K, P)
    solves = torch.stack([conjugate_gradient(matvec, r, tol)[0] for r in rows]).reshape(N, K, P)
    return torch.einsum("nkp,nlp->nkl", J, solves)
