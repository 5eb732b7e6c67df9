"""KFAC: a block-diagonal GGN with each layer's weight block a Kronecker product.

For a Linear layer z = W a + b the GGN block of W is Σₙ (Jzₙᵀ Λₙ Jzₙ) ⊗ (aₙ aₙᵀ),
Jzₙ = ∂f(xₙ)/∂zₙ (K, out). KFAC replaces the sum of products by a product of sums,

    B ⊗ A   with   B = Σₙ Jzₙᵀ Λₙ Jzₙ  (out, out),   A = (1/N) Σₙ aₙ aₙᵀ  (in, in),

keeps the bias block B alone and drops the blocks between parameter tensors
(laplace-torch with curvlinops). In the eigenbases of B and A,
c·(B ⊗ A) + δ I = (Q_B ⊗ Q_A) diag(c·λ_B ⊗ λ_A + δ) (Q_B ⊗ Q_A)ᵀ: log det, inverse,
square root and J Σ Jᵀ cost O(out³ + in³) per layer.

A Conv2d (groups = 1) is a Linear layer on the unfolded patch uₙₜ at each of T output
positions; as curvlinops' KFAC-"expand" (Eschenhagen et al. 2023), B sums over the
positions and A = (1/(N·T)) Σₙ Σₜ uₙₜ uₙₜᵀ averages over them. W flattens row-major:
entry (o, i) is index o·in + i, as in B ⊗ A.

Shapes: N examples, K outputs, P parameters, T output positions of a Conv2d.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .curvature import resume
from .devices import randn
from .layer_predictive import LayerBlock
from .layers import backprop_output_hessian_sqrt, conv_padding, supported_layers, unfold
from .likelihoods import Likelihood
from .memory_limit import check_bytes
from .operators import Operator
from .posterior import prior_precision_diag


@dataclass
class KronBlock:
    """One parameter tensor's block: B ⊗ A for a weight, B alone for a bias (A None)."""

    B: Tensor
    A: Tensor | None = None

    @property
    def size(self) -> int:
        return self.B.shape[0] * (1 if self.A is None else self.A.shape[0])


class KFAC:
    """The KFAC factors (B summed, A averaged) over batches of inputs, for a ``model``
    of ``nn.Linear`` and ``nn.Conv2d`` layers: one forward, K backward passes each."""

    def __init__(self, model: nn.Module, likelihood: Likelihood):
        self.model, self.likelihood = model, likelihood
        layers = supported_layers(model)
        if layers is None:
            raise ValueError(
                "hessian_structure='kron' supports networks whose parameters "
                "all belong to nn.Linear or nn.Conv2d layers"
            )
        self.layers = layers
        for m in layers:
            if isinstance(m, nn.Conv2d):
                conv_padding(m)  # unsupported convolutions fail here, before any data
        # weight (out, in) or (out, in, kh, kw): B is out × out, A is in × in or
        # in·kh·kw × in·kh·kw; a very wide layer can make A alone too large
        sides = [n for m in layers for n in (m.weight.shape[0], m.weight[0].numel())]
        w = layers[0].weight
        check_bytes(
            sum(n * n for n in sides) * torch.finfo(w.dtype).bits // 8,
            w.device,
            f"Kronecker factors of sizes {sides} (squared)",
            "Use hessian_structure='diag' or a narrower first layer.",
        )
        self.B = {m: m.weight.new_zeros((m.weight.shape[0],) * 2) for m in layers}
        self.A = {m: m.weight.new_zeros((m.weight[0].numel(),) * 2) for m in layers}
        self.n = 0

    @staticmethod
    def _input_outer(m: nn.Module, x: Tensor) -> Tensor:
        """Σₙ aₙ aₙᵀ for a Linear layer; (1/T) Σₙ Σₜ uₙₜ uₙₜᵀ over the unfolded patches
        for a Conv2d."""
        if isinstance(m, nn.Linear):
            if x.ndim != 2:
                raise NotImplementedError(
                    "hessian_structure='kron' supports nn.Linear layers on (n, in) "
                    f"inputs; one gets {tuple(x.shape)} (a sequence): use "
                    "hessian_structure='diag' or 'full'"
                )
            return x.T @ x
        U = unfold(m, x)  # (n, in·kh·kw, T)
        return torch.einsum("nit,njt->ij", U, U) / U.shape[-1]

    def update(self, X: Tensor) -> Tensor:
        """Add one batch to the factors; return its outputs (n, K), detached."""
        bp = backprop_output_hessian_sqrt(self.model, self.layers, X, self.likelihood)
        for m, a in zip(self.layers, bp.inputs, strict=True):
            self.A[m] += self._input_outer(m, a)
        # one column c of S (Λ = SSᵀ) at a time: row n (and position t) of g: Jzₙₜᵀ sₙ꜀
        for grads in bp.grads:
            for m, g in zip(self.layers, grads, strict=True):
                # Conv2d: (n, out, h, w) → (n·h·w, out)
                g = g.movedim(1, -1).reshape(-1, g.shape[1])
                self.B[m] += g.T @ g
        self.n += X.shape[0]
        return bp.f

    def blocks(self) -> list[KronBlock]:
        """One block per parameter tensor, in the order of ``model.parameters()``."""
        return [
            KronBlock(self.B[m], self.A[m] / self.n if name == "weight" else None)
            for m in self.layers
            for name, p in m.named_parameters(recurse=False)
            if p.requires_grad
        ]

    can_update = True

    def finish(self) -> KronPosterior:
        return KronPosterior(self.blocks())

    def resumed(self) -> KFAC:
        return resume(self, "B", "A")


def kfac(model: nn.Module, X: Tensor, likelihood: Likelihood, batch_size=256) -> list:
    """The KFAC blocks of the GGN over inputs X, one per parameter tensor."""
    acc = KFAC(model, likelihood)
    for Xb in X.split(batch_size):
        acc.update(Xb)
    return acc.blocks()


def _eigh(M: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """Eigenvalues (clamped at 0) and eigenvectors of a symmetric M, or None, None."""
    if M is None:
        return None, None
    lam, Q = torch.linalg.eigh(M)
    return lam.clamp(min=0), Q


class KronPosterior:
    """The ``posterior.Posterior`` protocol for eigendecomposed KFAC blocks, Σ⁻¹ =
    block-diag(c·Bₗ ⊗ Aₗ + δₗ I), δ a scalar or one per block; ``H`` a KronMatrix."""

    def __init__(self, blocks: list[KronBlock]):
        self.blocks = blocks
        # the saved fields (``structures.py``): B and A of every block
        self.B, self.A = [b.B for b in blocks], [b.A for b in blocks]
        # (λ_B, Q_B, λ_A, Q_A) per block, eigenvalues clamped at 0, None without A
        self.eig = [(*_eigh(b.B), *_eigh(b.A)) for b in blocks]
        self.sizes = [b.size for b in blocks]
        self.n_params = sum(self.sizes)

    @property
    def H(self) -> KronMatrix:
        """block-diag(Bₗ ⊗ Aₗ) in the blocks' eigenbases (eigenvalues clamped at 0)."""
        return KronMatrix(self, [self._eigvals(i) for i in range(len(self.blocks))])

    def _eigvals(self, i: int) -> Tensor:
        lB, _, lA, _ = self.eig[i]
        return lB if lA is None else torch.outer(lB, lA).reshape(-1)

    def precision_eigvals(self, prior: Tensor, c: Tensor) -> list[Tensor]:
        """c·λ + δₗ for each block, in the block's eigenbasis."""
        deltas = prior_precision_diag(prior, self.sizes, per_tensor=True)  # per block
        return [c * self._eigvals(i) + deltas[i] for i in range(len(self.blocks))]

    def log_det(self, prior: Tensor, c: Tensor) -> Tensor:
        return sum(ev.log().sum() for ev in self.precision_eigvals(prior, c))

    def _rotate(self, i: int, V: Tensor, inverse: bool = False) -> Tensor:
        """(Q_B ⊗ Q_A)ᵀ v (or Q v with ``inverse``) for each row of V (M, size)."""
        _, QB, _, QA = self.eig[i]
        if QA is None:
            return V @ QB.T if inverse else V @ QB
        W = V.reshape(-1, QB.shape[0], QA.shape[0])
        W = QB @ W @ QA.T if inverse else QB.T @ W @ QA
        return W.reshape(V.shape[0], -1)

    def functional_variance(self, J: Tensor, prior: Tensor, c: Tensor) -> Tensor:
        """J Σ Jᵀ per input, block by block in the eigenbases; (N, K, P) → (N, K, K)."""
        N, K, P = J.shape
        J2 = J.reshape(N * K, P)
        out = torch.zeros(N, K, K, dtype=J.dtype, device=J.device)
        start = 0
        for i, ev in enumerate(self.precision_eigvals(prior, c)):
            Jt = self._rotate(i, J2[:, start : start + self.sizes[i]]).reshape(N, K, -1)
            out = out + torch.einsum("nkp,p,nlp->nkl", Jt, 1 / ev, Jt)
            start += self.sizes[i]
        return out

    def layer_blocks(self, prior: Tensor, c: Tensor) -> list[LayerBlock]:
        """Σ per block, for the layer-wise predictive (``layer_predictive.py``): the
        eigenbases Q_B, Q_A and the reciprocal eigenvalues of the precision."""
        return [
            LayerBlock(1 / ev, QB, QA)
            for ev, (_, QB, _, QA) in zip(
                self.precision_eigvals(prior, c), self.eig, strict=True
            )
        ]

    def variance(self, prior: Tensor, c: Tensor) -> Tensor:
        return self.covariance(prior, c).diag()

    def sample(self, n_samples: int, prior: Tensor, c: Tensor, generator=None):
        """Q diag(ev)^-½ ε per block."""
        parts = []
        for i, ev in enumerate(self.precision_eigvals(prior, c)):
            eps = randn((n_samples, ev.numel()), ev, generator)
            parts.append(self._rotate(i, eps / ev.sqrt(), inverse=True))
        return torch.cat(parts, dim=1)

    def precision(self, prior: Tensor, c: Tensor) -> KronMatrix:
        return KronMatrix(self, self.precision_eigvals(prior, c))

    def covariance(self, prior: Tensor, c: Tensor) -> KronMatrix:
        return KronMatrix(self, [1 / v for v in self.precision_eigvals(prior, c)])


class KronMatrix(Operator):
    """block-diag((Q_B ⊗ Q_A) diag(vₗ) (Q_B ⊗ Q_A)ᵀ) in a :class:`KronPosterior`'s
    eigenbases (its H, Σ⁻¹ or Σ), with laplace-torch's ``KronDecomposed`` methods."""

    def __init__(self, structure: KronPosterior, values: list[Tensor]):
        self.structure, self.values = structure, values
        self.like, self.shape = values[0], (structure.n_params, structure.n_params)

    def __matmul__(self, v: Tensor) -> Tensor:
        """Block by block: Qᵀ, then diag(vₗ), then Q, on the block's rows of v."""
        rows = v.reshape(v.shape[0], -1).T  # (m, P): one row per vector
        parts, start = [], 0
        for i, val in enumerate(self.values):
            x = self.structure._rotate(i, rows[:, start : start + val.numel()])
            parts.append(self.structure._rotate(i, x * val, inverse=True))
            start += val.numel()
        return torch.cat(parts, 1).T.reshape(v.shape)

    def logdet(self) -> Tensor:
        return sum(v.log().sum() for v in self.values)

    def diag(self, exponent: float = 1) -> Tensor:
        """diag of the matrix to the power ``exponent``, (P,), block by block."""
        parts = []
        for v, (_, QB, _, QA) in zip(self.values, self.structure.eig, strict=True):
            if QA is None:
                parts.append(QB**2 @ v**exponent)
            else:  # diag((Q_B ⊗ Q_A) D (Q_B ⊗ Q_A)ᵀ) = vec(Q_B² D Q_A²ᵀ), D (out, in)
                D = (v**exponent).reshape(QB.shape[0], -1)
                parts.append((QB**2 @ D @ (QA**2).T).reshape(-1))
        return torch.cat(parts)

    diagonal = diag

    def to_matrix(self, exponent: float = 1) -> Tensor:
        """The dense (P, P) matrix to the power ``exponent``: for small P only."""
        powered = KronMatrix(self.structure, [v**exponent for v in self.values])
        return Operator.to_matrix(powered)
