"""Saving and loading a fitted posterior as a dict of tensors and plain values, for
``torch.save(la.state_dict(), path)`` and ``torch.load(path)`` (``weights_only=True``).
A posterior is rebuilt by its own constructor from what it was made of, so it computes
exactly what the saved one did. The matrix-free structure holds the training batches,
not a curvature, and is not saved.
"""

from __future__ import annotations

from .kron import KronBlock, KronPosterior
from .lowrank import LowRankPosterior
from .posterior import DiagPosterior, FullPosterior

# kind and constructor arguments (attributes of the same names) of each posterior
SAVED = {
    FullPosterior: (
        "full",
        ("H", "param_sizes", "Jw", "route", "one_buffer", "in_place"),
    ),
    DiagPosterior: ("diag", ("H", "param_sizes")),
    LowRankPosterior: ("lowrank", ("V", "eigvals", "param_sizes")),
}


def posterior_state(post) -> dict:
    """The tensors and settings that rebuild ``post`` (:func:`posterior_from_state`)."""
    if isinstance(post, KronPosterior):
        blocks = post.blocks
        return {"kind": "kron", "B": [b.B for b in blocks], "A": [b.A for b in blocks]}
    for cls, (kind, keys) in SAVED.items():
        if isinstance(post, cls):  # (FullPosterior.H raises if one_buffer overwrote it)
            return {"kind": kind} | {key: getattr(post, key) for key in keys}
    raise NotImplementedError(
        f"a {type(post).__name__} cannot be saved: the matrix-free structure keeps the "
        "training batches, not a curvature (fit it again after loading the model)"
    )


def posterior_from_state(state: dict):
    """The posterior that :func:`posterior_state` described."""
    kind = state["kind"]
    if kind == "kron":
        return KronPosterior(
            [KronBlock(B, A) for B, A in zip(state["B"], state["A"], strict=True)]
        )
    for cls, (name, keys) in SAVED.items():
        if kind == name:
            return cls(*(state[key] for key in keys))
    raise ValueError(f"unknown posterior kind {kind!r} in the state")
