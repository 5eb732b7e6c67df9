"""The memory-limit layer of full Laplace: a reader of the taught path (``full.py``) may
skip this file. ``torch.linalg.cholesky`` returns a new matrix (even with ``out=``), so
on one GPU the number of P×P buffers, not the flops, decides how far full Laplace goes.

* free-memory probing: :func:`available_bytes`; :func:`check_fits` refuses an
  allocation that cannot fit before it is made (every structure uses it);
* the blocked in-place Cholesky :func:`cholesky_` (right-looking: L₁₁ = chol(A₁₁),
  L₂₁ = A₂₁ L₁₁⁻ᵀ, A₂₂ ← A₂₂ − L₂₁ L₂₁ᵀ), one panel, O(P·b), beyond A;
* one buffer (:class:`InPlaceCholesky`): Σ⁻¹ formed and factored beside H, or in H;
* the route choice (:func:`layer`).

Shapes: P rows and columns, b the block size.
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import Tensor

from .posterior import default_block, with_jitter

# the structures that never allocate P×P, named in the error of check_fits
SMALLER = (
    "hessian_structure='diag', 'kron', 'lowrank' or 'matfree', or "
    "subset_of_weights='last_layer' (or a subnetwork)"
)


def available_bytes(device: torch.device) -> int | None:
    """Free bytes on ``device``: CUDA's free memory plus its allocator's unused cache;
    on the CPU ``MemAvailable`` (and the address-space limit, if set). None: unknown."""
    if device.type == "cuda":
        cuda = torch.cuda
        unused = cuda.memory_reserved(device) - cuda.memory_allocated(device)
        return cuda.mem_get_info(device)[0] + unused
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        avail = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:  # (resource is POSIX only)
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            with open(f"/proc/{os.getpid()}/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            avail = min(avail, soft - used)
    except (ImportError, OSError, ValueError):
        pass
    return avail


def dense_bytes(n: int, dtype: torch.dtype, n_buffers: float = 1) -> int:
    """Bytes of ``n_buffers`` dense n×n matrices of ``dtype``."""
    return int(n_buffers * n * n * torch.finfo(dtype).bits // 8)


def fits(n_bytes: int, device: torch.device) -> bool:
    avail = available_bytes(device)
    return avail is None or n_bytes <= avail


def check_bytes(n_bytes: int, device: torch.device, what: str, instead: str) -> None:
    """Raise ``MemoryError`` naming ``what`` (the allocation), ``n_bytes``, the bytes
    available on ``device`` and what to use ``instead``, if ``n_bytes`` do not fit."""
    avail = available_bytes(device)
    if avail is not None and n_bytes > avail:
        raise MemoryError(
            f"{what}: {n_bytes / 2**30:.2f} GiB, but {avail / 2**30:.2f} GiB are "
            f"available on {device}. {instead}"
        )


def check_fits(n: int, dtype, device, n_buffers: float = 1, what: str = "") -> None:
    """:func:`check_bytes` for ``n_buffers`` n×n matrices, naming the structures that
    would fit."""
    check_bytes(
        dense_bytes(n, dtype, n_buffers),
        device,
        f"{what or 'full Laplace'} needs {n_buffers:g} dense {n}×{n} "
        f"{str(dtype).removeprefix('torch.')} matrix(es)",
        f"Use {SMALLER}.",
    )


class NotPositiveDefinite(ValueError):
    """The factorisation met a non-positive pivot at row ``row``."""

    def __init__(self, row: int):
        super().__init__(
            f"the matrix is not positive definite (pivot {row} is not positive)"
        )
        self.row = row


def cholesky_(A: Tensor, block_size: int | None = None) -> Tensor:
    """Factor a symmetric positive-definite A (P, P) in place into L (lower triangle,
    zeros above) with A = L Lᵀ; returns A. Raises :class:`NotPositiveDefinite` (A is
    then partly overwritten)."""
    P = A.shape[0]
    b = default_block(P) if block_size is None else max(1, int(block_size))
    for k in range(0, P, b):
        e = min(k + b, P)
        L11, info = torch.linalg.cholesky_ex(A[k:e, k:e])
        if info != 0 or not torch.isfinite(L11).all():
            raise NotPositiveDefinite(k + max(int(info) - 1, 0))
        A[k:e, k:e].copy_(L11)
        if e == P:
            break
        # L₂₁ = A₂₁ L₁₁⁻ᵀ: the solve returns a (P−e)×b temporary, copied back
        panel = A[e:, k:e]
        L21 = torch.linalg.solve_triangular(L11.mT, panel, upper=True, left=False)
        panel.copy_(L21)
        # A₂₂ ← A₂₂ − L₂₁ L₂₁ᵀ, lower triangle, one block column at a time
        for j in range(e, P, b):
            je = min(j + b, P)
            A[j:, j:je].addmm_(panel[j - e :], panel[j - e : je - e].mT, alpha=-1)
    return A.tril_()


class InPlaceCholesky:
    """L Lᵀ = Σ⁻¹ = c·H + diag(p₀), formed and factored in place (:func:`cholesky_`) in
    one P×P buffer reused for every (p₀, c): a second one beside H, or H itself (when a
    second does not fit or with ``one_buffer=True``; a warning: H is then lost)."""

    def __init__(self, H: Tensor, one_buffer: bool = False):
        self._H, self.one_buffer = H, one_buffer
        self.buffer: Tensor | None = None
        self.overwritten = False  # whether L now sits in H's memory

    @property
    def H(self) -> Tensor:
        if self.overwritten:
            raise RuntimeError(
                "the GGN was overwritten by its Cholesky factor (one P×P buffer: "
                "memory was short or one_buffer=True); fit again to get it back, or "
                "use the eigen route for a scalar prior (evidence_route='eigen')"
            )
        return self._H

    def L(self, p0: Tensor, c: Tensor) -> Tensor:
        """L (P, P) in the buffer, for p₀ (P,) and c."""
        H = self.H
        if self.buffer is None:
            n = H.shape[0]
            self.buffer = H
            if not self.one_buffer and fits(dense_bytes(n, H.dtype), H.device):
                self.buffer = torch.empty_like(H)  # a second buffer beside H
            else:
                warnings.warn(
                    f"one P×P buffer only (P = {n}): the GGN is overwritten by the "
                    "factor of the posterior precision; a later change of δ or σ needs "
                    "the eigen route or a new fit",
                    RuntimeWarning,
                    stacklevel=5,
                )
        buf = self.buffer
        diag = c * H.diagonal() + p0
        if not torch.isfinite(diag).all():
            raise ValueError(
                "the posterior precision contains NaN or inf "
                "(check the curvature and δ, σ)"
            )

        def attempt(jitter: Tensor | float) -> Tensor | None:
            if torch.is_tensor(jitter) and buf is H:
                raise ValueError(
                    "the posterior precision is not positive definite, and with one "
                    "P×P buffer it cannot be rebuilt for jitter: use a larger prior "
                    "precision, or fit again with memory for two"
                )
            if buf is not H:
                buf.copy_(H)
            buf.mul_(c)
            buf.diagonal().add_(p0 + jitter)
            try:
                return cholesky_(buf)
            except NotPositiveDefinite:
                return None

        L = with_jitter(attempt, diag.abs().mean())
        self.overwritten = buf is H
        return L


def layer(H: Tensor, one_buffer: bool = False, in_place: bool = False):
    """The route choice, when a full posterior is built: :class:`InPlaceCholesky` with
    ``in_place`` or ``one_buffer``, or when two more P×P buffers (Σ⁻¹ and L) do not fit
    now; None (the taught path's ``posterior.cholesky``) otherwise."""
    n = H.shape[0]
    if in_place or one_buffer or not fits(dense_bytes(n, H.dtype, 2), H.device):
        return InPlaceCholesky(H, one_buffer)
    return None
