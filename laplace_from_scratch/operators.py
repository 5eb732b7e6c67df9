"""A symmetric P×P matrix known by its products: the matrix-free GGN, and Σ⁻¹ and Σ of
the KFAC, low-rank and matrix-free structures. A subclass sets ``shape`` (P, P) and
``like`` (the dtype and device of results) and defines ``A @ v``; ``to_matrix()`` and
``diagonal()`` take P products unless overridden.

Shapes: P parameters, m vectors at once.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from .memory_limit import check_bytes, dense_bytes
from .posterior import default_block


def per_row(x: Tensor, v: Tensor) -> Tensor:
    """x (P,) shaped to scale the rows of v (P,) or (P, m); a scalar x as it is."""
    return x if x.ndim == 0 or v.ndim == 1 else x[:, None]


class Operator:
    """A symmetric (P, P) matrix A: ``A @ v`` (or ``A(v)``) for v (P,) or (P, m)."""

    shape: tuple[int, int]
    like: Tensor

    def __matmul__(self, v: Tensor) -> Tensor:
        raise NotImplementedError

    def __call__(self, v: Tensor) -> Tensor:
        return self @ v

    def _column_blocks(self) -> Iterator[tuple[int, Tensor]]:
        """(k, A E) for blocks E (P, b) of the identity's columns k, …, k + b − 1."""
        n = self.shape[0]
        b = default_block(n)
        for k in range(0, n, b):
            E = self.like.new_zeros(n, min(b, n - k))
            E[k : k + E.shape[1]].fill_diagonal_(1)
            yield k, self @ E

    def to_matrix(self) -> Tensor:
        """The dense matrix (P, P), after a check that it fits: small P only."""
        n = self.shape[0]
        check_bytes(
            dense_bytes(n, self.like.dtype),
            self.like.device,
            f"{type(self).__name__}.to_matrix() needs a dense {n}×{n} matrix",
            "Use its products (@), diagonal() or logdet() instead.",
        )
        out = self.like.new_empty(self.shape)
        for k, AE in self._column_blocks():
            out[:, k : k + AE.shape[1]] = AE
        return out

    def diagonal(self) -> Tensor:
        """diag(A), (P,), from P products (no P×P buffer)."""
        parts = [AE[k : k + AE.shape[1]].diagonal() for k, AE in self._column_blocks()]
        return torch.cat(parts)

    def logdet(self) -> Tensor:
        """log det A, a scalar, where the structure gives it."""
        raise NotImplementedError(f"{type(self).__name__} has no exact logdet()")
