"""Matrix-free Laplace: never form the P×P GGN, only products with it.

A GGN-vector product is one JVP J v, Λ J v and one VJP Jᵀ(Λ J v): about two passes
over the data and O(P) memory. From Σ⁻¹ v = c·G v + p₀ ⊙ v: Σ b by conjugate gradients
(J Σ Jᵀ); log det Σ⁻¹ = E[zᵀ log(Σ⁻¹) z] (Rademacher z) by stochastic Lanczos
quadrature, zᵀ log(Σ⁻¹) z ≈ ‖z‖² Σⱼ τⱼ² log θⱼ (eigenpairs of the Lanczos tridiagonal
T started at z, τⱼ their first components); samples Σ^½ ε ≈ ‖ε‖ Q T^{-½} e₁.

Shapes: N examples, K outputs, P parameters.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.func import jvp, vjp, vmap

from .checks import check_count
from .curvature import FunctionalBuilder, resume
from .devices import rademacher, randn
from .functional import Functional
from .layer_ggn import LayerPass, check_layerwise, layer_pass, layerwise_ggn_product
from .layers import supported_layers
from .likelihoods import Likelihood
from .memory_limit import check_bytes
from .operators import Operator, per_row
from .posterior import PerPrior, log_det_with_gradients, prior_precision_diag

MatVec = Callable[[Tensor], Tensor]


def ggn_vector_product(
    f: Functional, theta: Tensor, X: Tensor, likelihood: Likelihood, v, batch_size=1024
) -> Tensor:
    """G v = Σₙ Jₙᵀ Λₙ Jₙ v by one JVP and one VJP per batch, without forming J or G.
    v: (P,) → (P,), or (P, R) → (P, R) (``torch.func.vmap`` over the columns)."""
    if v.ndim == 2:
        return vmap(
            lambda c: ggn_vector_product(f, theta, X, likelihood, c, batch_size), 1, 1
        )(v)
    out = torch.zeros_like(theta)
    for Xb in X.split(batch_size):

        def fb(th: Tensor, Xb: Tensor = Xb) -> Tensor:
            return f(th, Xb)

        f0, Jv = jvp(fb, (theta,), (v,))  # (n, K), (n, K)
        LJv = torch.einsum("nkl,nl->nk", likelihood.output_hessian(f0.detach()), Jv)
        _, pullback = vjp(fb, theta)
        out = out + pullback(LJv)[0]  # not in place: under vmap the sum becomes batched
    return out


def posterior_precision_matvec(
    f: Functional, theta: Tensor, X: Tensor, likelihood, prior_precision: Tensor, c=1.0
) -> MatfreeMatrix:
    """Σ⁻¹ = c·G + diag(p₀) of the data X (p₀ scalar or (P,)), as a
    :class:`MatfreeMatrix`: a function v ↦ Σ⁻¹ v."""
    return MatfreeMatrix(GGNOperator(f, theta, likelihood, [X]), prior_precision, c)


def conjugate_gradient(
    matvec: MatVec,
    b: Tensor,
    tol: float = 1e-10,
    max_iter: int | None = None,
    precondition: MatVec | None = None,
) -> tuple[Tensor, int]:
    """Solve A x = b for SPD A given only v ↦ A v. b: (P,), or (P, R) for R independent
    solves that share each product A [p₁ … p_R] (``matvec`` must accept (P, R) then). A
    column stops at ‖r‖ ≤ tol·‖b‖. ``precondition``: v ↦ M⁻¹ v for an SPD M ≈ A
    (preconditioned CG: fewer iterations the closer M is to A; the same stopping
    rule). Returns (x, iterations of the slowest column)."""
    max_iter = 10 * b.shape[0] if max_iter is None else max_iter
    check_count("max_iter", max_iter)
    if not torch.isfinite(b).all():
        raise ValueError("the right-hand side b contains NaN or inf")
    M = precondition or (lambda v: v)
    x, r = torch.zeros_like(b), b.clone()
    z = M(r)
    p, rz = z.clone(), (r * z).sum(0)
    stop = (tol * b.norm(dim=0)) ** 2
    for i in range(max_iter):
        active = (r * r).sum(0) > stop
        if not active.any():
            return x, i
        Ap = matvec(p)
        pAp = (p * Ap).sum(0)
        if bool((active & ~(pAp > 0)).any()):  # also catches NaN
            worst = pAp[active].min().item()
            raise ValueError(
                "conjugate gradients needs a positive-definite operator: "
                f"pᵀAp = {worst:.3g} at iteration {i} "
                "(is the prior precision positive? does the operator return NaN?)"
            )
        # converged columns take no step (their α is 0), so nothing divides 0 by 0
        alpha = torch.where(active, rz / torch.where(active, pAp, 1), 0)
        x += alpha * p  # in place: x, r and p are CG's own
        r -= alpha * Ap
        z = M(r)
        rz_new = (r * z).sum(0)
        p.mul_(torch.where(active, rz_new / torch.where(active, rz, 1), 0)).add_(z)
        rz = rz_new
    rr = (r * r).sum(0)
    residual = (rr.sqrt() / b.norm(dim=0)).max().item()
    warnings.warn(
        f"conjugate gradients did not reach tol={tol} in max_iter={max_iter} "
        f"iterations (relative residual {residual:.2e})",
        RuntimeWarning,
        stacklevel=2,
    )
    return x, max_iter


def check_basis_fits(n_params: int, m: int, like: Tensor) -> None:
    """Raise ``MemoryError`` before a Lanczos basis of m vectors of length P (dtype
    and device of ``like``) is allocated, if it cannot fit."""
    check_bytes(
        n_params * m * like.element_size(),
        like.device,
        f"Lanczos with {m} steps needs a {n_params}×{m} "
        f"{str(like.dtype).removeprefix('torch.')} basis",
        "Use fewer steps (rank, preconditioner_rank, lanczos_steps or sample_steps), "
        "preconditioner='none' or hessian_structure='diag' or 'kron'.",
    )


def lanczos(matvec: MatVec, v0: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """m steps of Lanczos with full re-orthogonalisation from v0: T (m', m')
    tridiagonal and Q (P, m') orthonormal, Qᵀ A Q = T (m' < m if the space ends)."""
    P = v0.numel()
    if not v0.norm() > 0:  # also False for NaN
        raise ValueError("Lanczos needs a non-zero, finite start vector")
    check_count("the number of Lanczos steps", m)
    m = min(m, P)
    check_basis_fits(P, m, v0)
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
        # re-orthogonalise (twice is enough)
        w = w - Q[:, : j + 1] @ (Q[:, : j + 1].T @ w)
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


def slq_log_det_and_inverse_diagonal(
    matvec: MatVec, like: Tensor, n_probes: int, m: int, generator=None
) -> tuple[Tensor, Tensor, Tensor]:
    """SLQ for log det A and, from the same probes z, the Hutchinson estimate
    E[z ⊙ A⁻¹z] of diag(A⁻¹), with A⁻¹ z ≈ ‖z‖ Q U diag(1/θ) τ. ``like`` (P,) gives
    the dtype and device; ``n_probes`` ≥ 2. Returns (log det, its standard error over
    the probes, diag(A⁻¹) (P,))."""
    P = like.numel()
    values, diag = [], torch.zeros_like(like)
    for _ in range(n_probes):
        z = rademacher(P, like, generator)
        T, Q = lanczos(matvec, z, m)
        theta, U = torch.linalg.eigh(T)
        if not bool((theta > 0).all()):  # also catches NaN
            raise ValueError(
                "the operator is not positive definite: "
                f"Lanczos found an eigenvalue {theta.min().item():.3g} ≤ 0"
            )
        tau = U[0]
        values.append(P * (tau**2 * theta.log()).sum())  # ‖z‖² = P
        diag += z * (z.norm() * (Q @ (U @ (tau / theta))))
    v = torch.stack(values)
    return v.mean(), v.std() / n_probes**0.5, diag / n_probes


def slq_log_det(
    matvec, n_params: int, n_probes=30, m=30, generator=None, dtype=None, device=None
) -> tuple[Tensor, Tensor]:
    """log det A (A: ``n_params`` × ``n_params``, vectors of ``dtype`` on ``device``)
    by SLQ with Rademacher probes drawn by ``generator`` on its own device. Returns
    (estimate, standard error over the probes)."""
    check_count("n_probes", n_probes, minimum=2)  # two for a standard error
    dtype = dtype or torch.get_default_dtype()
    like = torch.zeros(n_params, dtype=dtype, device=device)
    return slq_log_det_and_inverse_diagonal(matvec, like, n_probes, m, generator)[:2]


def lanczos_inv_sqrt(matvec: MatVec, b: Tensor, m: int = 50) -> Tensor:
    """A^{-½} b ≈ ‖b‖ Q T^{-½} e₁ from m Lanczos steps started at b (exact if m = P)."""
    T, Q = lanczos(matvec, b, m)
    theta, U = torch.linalg.eigh(T)
    return b.norm() * (Q @ (U @ (U[0] / theta.sqrt())))


def sample_matrix_free(matvec, mean: Tensor, n_samples: int, m=50, generator=None):
    """θ = θ* + Σ^½ ε with ε ~ N(0, I), by Lanczos (``matvec``: products with Σ⁻¹);
    (S, P). Covariance → Σ as m grows."""
    eps = randn((n_samples, mean.numel()), mean, generator)
    return mean + torch.stack([lanczos_inv_sqrt(matvec, e, m) for e in eps])


def jacobian_sandwich_cg(
    matvec: MatVec, J: Tensor, tol=1e-10, max_iter=None, precondition=None
) -> tuple[Tensor, int]:
    """J Σ Jᵀ per input by CG, all N·K rows of J solved together (``matvec``: products
    with Σ⁻¹, taking (P, N·K); ``precondition``: :func:`conjugate_gradient`'s). J:
    (N, K, P) → ((N, K, K), CG's iterations), differentiable in J (not in
    ``matvec``). What ``tol`` buys: a variance bᵀΣb (b a row of J) is read as bᵀx
    from CG's x, whose error is eᵀΣ⁻¹e = rᵀΣr ≤ ‖r‖² λ_max(Σ); as bᵀΣb ≥ ‖b‖² λ_min(Σ),
    its relative error is at most κ·tol², κ the condition number of Σ⁻¹ (with or
    without a preconditioner); the covariances between outputs only to O(tol)."""
    N, K, P = J.shape
    with torch.no_grad():  # J's gradient comes from the identity below, not from CG
        B = J.reshape(N * K, P).T
        solves, iterations = conjugate_gradient(matvec, B, tol, max_iter, precondition)
    S = solves.T.reshape(N, K, P)  # Σ Jᵀ, one row per row of J
    fvar = torch.einsum("nkp,nlp->nkl", J.detach(), S)
    if J.requires_grad:
        # d(J Σ Jᵀ) = dJ (Σ Jᵀ) + (J Σ) dJᵀ: the same value, and J's gradient
        dJ = J - J.detach()  # zero, carrying J's graph
        fvar = fvar + torch.einsum("nkp,nlp->nkl", dJ, S) + S @ dJ.mT
    return fvar, iterations


# ----- matrix-free Laplace as a posterior structure -----------------------------


# elements of saved activations (examples × vectors × saved per example) one pass of
# a GGN product may hold: passes this large run at full speed on a CPU
PRODUCT_ELEMENTS = 2**24
# the most elements the layer-wise passes of the stored data may keep between products
PASS_CACHE_ELEMENTS = 2**26


class GGNOperator(Operator):
    """The GGN G = Σₙ Jₙᵀ Λₙ Jₙ over stored batches: ``G @ v`` for v (P,) or (P, m).
    A product with m vectors runs on chunks of the stored inputs (batches joined or
    split) of about ``PRODUCT_ELEMENTS`` / (m · what a backward pass saves for one
    example) rows: many passes of few rows are slow, one pass of many rows and many
    vectors runs out of memory. Linear networks take the layer-wise product
    (``layer_ggn.py``), whose per-chunk passes are kept for the next product if they
    hold at most ``PASS_CACHE_ELEMENTS`` numbers; other networks JVPs under ``vmap``."""

    def __init__(self, f, theta: Tensor, likelihood: Likelihood, batches, module=None):
        self.f, self.theta = f, theta
        self.likelihood, self.batches = likelihood, batches
        self.like, self.shape = theta, (theta.numel(), theta.numel())
        self.saved_per_example: int | None = None
        self.module, self._layers = module, None  # f's network, if it has one
        self._passes: tuple[int, list[LayerPass]] | None = None  # (rows, passes)

    def __matmul__(self, v: Tensor) -> Tensor:
        rows = self.rows_per_pass(1 if v.ndim == 1 else v.shape[1])
        layers = self.layers()
        if not layers:
            return sum(
                ggn_vector_product(self.f, self.theta, X, self.likelihood, v, rows)
                for X in chunks(self.batches, rows)
            )
        V = v if v.ndim == 2 else v[:, None]
        out = sum(layerwise_ggn_product(layers, lp, V) for lp in self.passes(rows))
        return out if v.ndim == 2 else out[:, 0]

    def passes(self, rows: int):
        """The layer-wise passes of the stored data in chunks of ``rows``: kept from
        the last product with as many rows, or made (and kept if small enough)."""
        if self._passes is not None and self._passes[0] == rows:
            yield from self._passes[1]
            return
        self._passes, kept, size = None, [], 0
        args = self.forward, self.module, self.layers()
        for X in chunks(self.batches, rows):
            lp = layer_pass(*args, X, self.likelihood)
            size += lp.numel()
            if kept is not None:
                kept = kept + [lp] if size <= PASS_CACHE_ELEMENTS else None
            yield lp
        if kept is not None:
            self._passes = rows, kept

    def forward(self, X: Tensor) -> Tensor:
        """f(θ*, X) with each layer's output in a graph (for the layer-wise product)."""
        return self.f(self.theta.detach().requires_grad_(), X)

    def layers(self) -> list[nn.Module]:
        """The layers of the layer-wise product (``layer_ggn.py``): the network's Linear
        layers if they hold all of θ and it supports them; else [] (JVPs)."""
        if self._layers is None:
            layers = None if self.module is None else supported_layers(self.module)
            try:
                if layers:
                    x = self.batches[0][:1]
                    check_layerwise(self.forward, self.module, layers, x)
            except NotImplementedError:
                layers = None
            self._layers = layers or []
        return self._layers

    def rows_per_pass(self, m: int) -> int:
        if self.saved_per_example is None:
            self.saved_per_example = saved_elements(self.f, self.theta, self.batches)
        return max(1, PRODUCT_ELEMENTS // (m * self.saved_per_example))


def saved_elements(f: Functional, theta: Tensor, batches: list[Tensor]) -> int:
    """Elements autograd saves for the backward pass of f(θ, x) on one example."""
    count = 0

    def pack(t: Tensor) -> Tensor:
        nonlocal count
        count += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.enable_grad():
            f(theta.detach().requires_grad_(), batches[0][:1])
    return max(1, count)


def chunks(batches: list[Tensor], rows: int):
    """The rows of ``batches`` in order, ``rows`` at a time (the last: fewer)."""
    pending: list[Tensor] = []
    n = 0
    for X in batches:
        pending.append(X)
        n += X.shape[0]
        while n >= rows:
            joined = torch.cat(pending) if len(pending) > 1 else pending[0]
            yield joined[:rows]
            pending, n = [joined[rows:]], n - rows
    if n:
        yield torch.cat(pending) if len(pending) > 1 else pending[0]


class MatfreeMatrix(Operator):
    """Σ⁻¹ v = c·G v + p₀ ⊙ v (p₀ scalar or (P,), v (P,) or (P, m)); with
    ``inverse=True`` the covariance Σ, each product a CG solve to ``cg_tol``."""

    def __init__(
        self,
        G,
        prior,
        c,
        inverse=False,
        cg_tol=1e-6,
        cg_max_iter=None,
        precondition=None,
    ):
        self.G, self.prior, self.c, self.inverse = G, prior, c, inverse
        self.cg_tol, self.cg_max_iter = cg_tol, cg_max_iter
        self.precondition = precondition  # for CG: v ↦ M⁻¹ v, M ≈ Σ⁻¹
        self.like, self.shape = G.like, G.shape

    def precision_product(self, v: Tensor) -> Tensor:
        """Σ⁻¹ v, whether this is Σ⁻¹ or Σ."""
        return self.c * (self.G @ v) + per_row(self.prior, v) * v

    def __matmul__(self, v: Tensor) -> Tensor:
        if not self.inverse:
            return self.precision_product(v)
        args = self.cg_tol, self.cg_max_iter, self.precondition
        return conjugate_gradient(self.precision_product, v, *args)[0]

    def logdet(self) -> Tensor:
        raise NotImplementedError(
            "matrix-free Laplace has no exact log-determinant; "
            "Laplace.log_det_posterior_precision is its SLQ estimate"
        )


class MatfreeGGN(FunctionalBuilder):
    """Builder: ``update(X)`` stores each batch (and returns f(X)); ``finish()`` returns
    a :class:`MatfreePosterior` over them, made with ``options``. ``preconditioner``:
    None, or a function that returns a fresh builder (low-rank, diagonal or KFAC) whose
    posterior, fitted on the same batches when first needed, preconditions CG."""

    def __init__(self, *args, preconditioner=None, module=None, **options):
        super().__init__(*args)  # f, θ*, the likelihood, the parameter sizes
        self.options, self.batches, self.pre = options, [], preconditioner
        self.module = module  # f's network, for the layer-wise products

    def update(self, X: Tensor) -> Tensor:
        self.batches.append(X)
        return self.outputs(X)

    def operator(self) -> GGNOperator:
        """The GGN of the stored batches, as products."""
        lik, module = self.likelihood, self.module
        return GGNOperator(self.f, self.theta, lik, self.batches, module)

    def finish(self) -> MatfreePosterior:
        return MatfreePosterior(
            self.operator(), self.param_sizes, preconditioner=self.pre, **self.options
        )

    def resumed(self) -> MatfreeGGN:
        return resume(self, "batches")


class MatfreePosterior:
    """The ``posterior.Posterior`` protocol by products: ``log_det`` by SLQ
    (``n_probes`` probes of ``lanczos_steps`` steps, seeded with ``seed`` at every call;
    standard error ``log_det_se``), differentiable through the Hutchinson estimate of
    diag Σ from the same probes, which is also ``variance``; ``functional_variance``
    and products with Σ by CG to ``cg_tol`` (iterations in ``cg_iterations``);
    ``sample`` by Lanczos. Memory O(P·lanczos_steps).

    ``preconditioner`` (None, or a function returning a builder): CG is preconditioned
    by that builder's posterior Σ_pre, fitted on the stored batches at its first use
    (so a fit for the evidence alone never pays for it). Its error costs iterations,
    never accuracy. The low-rank one, U diag(1/(cλ + δ)) Uᵀ + (I − UUᵀ)/δ from the top
    eigenpairs of G, leaves the P − rank(G) eigenvalues of Σ⁻¹ = c·G + δI that equal δ
    where they are and takes out the largest: 153 → 33 iterations at P = 9,550 (rank
    100; results/bench_matfree_*.json). The diagonal and KFAC ones spread that cluster
    and barely pay (tests/test_matfree.py prints the counts)."""

    def __init__(
        self,
        G: GGNOperator,
        param_sizes: list[int],
        n_probes: int = 30,
        lanczos_steps: int = 30,
        cg_tol: float = 1e-6,
        cg_max_iter: int | None = None,
        sample_steps: int = 50,
        seed: int = 0,
        preconditioner=None,
    ):
        check_count("n_probes", n_probes, minimum=2)  # two for a standard error
        self.H, self.param_sizes, self.n_params = G, list(param_sizes), G.shape[0]
        self.n_probes, self.lanczos_steps = n_probes, lanczos_steps
        self.sample_steps, self.seed = sample_steps, seed
        self.cg_tol, self.cg_max_iter = cg_tol, cg_max_iter
        self.log_det_se: Tensor | None = None
        self.make_pre, self.pre, self.cg_iterations = preconditioner, None, None
        self.cache = PerPrior()  # the SLQ estimate of the last (p₀, c)

    def _prior_diag(self, prior: Tensor) -> Tensor:
        return prior_precision_diag(prior, self.param_sizes).to(self.H.theta.dtype)

    def _estimate(self, prior: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(log det Σ⁻¹, its standard error, diag Σ) by SLQ."""
        g = torch.Generator().manual_seed(self.seed)
        args = self.H.theta, self.n_probes, self.lanczos_steps, g
        estimate = lambda: slq_log_det_and_inverse_diagonal(
            self.precision(prior, c), *args
        )
        return self.cache(self._prior_diag(prior).detach(), c, estimate)

    def log_det(self, prior: Tensor, c: Tensor) -> Tensor:
        value, self.log_det_se, variance = self._estimate(prior, c)
        return log_det_with_gradients(
            value, self._prior_diag(prior), c, lambda: variance
        )

    def variance(self, prior: Tensor, c: Tensor) -> Tensor:
        return self._estimate(prior, c)[2]

    def functional_variance(self, J: Tensor, prior: Tensor, c: Tensor) -> Tensor:
        prec, M = self.precision(prior, c), self._preconditioner(prior, c)
        fvar, self.cg_iterations = jacobian_sandwich_cg(
            prec, J, self.cg_tol, self.cg_max_iter, M
        )
        return fvar

    def _preconditioner(self, prior: Tensor, c: Tensor) -> MatVec | None:
        """v ↦ Σ_pre v, the preconditioner's covariance at the same (p₀, c)."""
        if self.make_pre is None:
            return None
        if self.pre is None:  # first use: fit it on the stored batches
            builder = self.make_pre()
            for X in self.H.batches:
                builder.update(X)
            self.pre = builder.finish()
        c = torch.as_tensor(c, device=self.H.theta.device).detach()
        if isinstance(self.pre.H, Tensor) and self.pre.H.ndim == 1:  # diagonal d
            var = self.pre.variance(prior.detach(), c)
            return lambda v: per_row(var, v) * v
        cov = self.pre.covariance(prior.detach(), c)
        return lambda v: cov @ v

    def sample(self, n_samples: int, prior: Tensor, c: Tensor, generator=None):
        zero = torch.zeros_like(self.H.theta)
        prec = self.precision(prior, c)
        return sample_matrix_free(prec, zero, n_samples, self.sample_steps, generator)

    def _matrix(self, prior: Tensor, c: Tensor, inverse: bool) -> MatfreeMatrix:
        """Σ⁻¹ (or Σ, by CG) at p₀ and c detached: the evidence's gradients come from
        :meth:`log_det`'s own estimate."""
        p0 = self._prior_diag(prior).detach()
        c = torch.as_tensor(c, device=p0.device).detach()
        M = self._preconditioner(prior, c) if inverse else None
        args = self.cg_tol, self.cg_max_iter, M
        return MatfreeMatrix(self.H, p0, c, inverse, *args)

    def precision(self, prior: Tensor, c: Tensor) -> MatfreeMatrix:
        return self._matrix(prior, c, inverse=False)

    def covariance(self, prior: Tensor, c: Tensor) -> MatfreeMatrix:
        return self._matrix(prior, c, inverse=True)
