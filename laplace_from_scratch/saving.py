"""Saving and loading a fitted posterior: its curvature as a dict of tensors and plain
values, so that ``torch.save(la.state_dict(), path)`` and
``torch.load(path)`` (``weights_only=True``, torch's default) round-trip it.

A posterior is rebuilt from what it was made of, by its own constructor: the loaded
object computes exactly what the saved one did. The matrix-free structure holds the
training batches, not a curvature, and is not saved.
"""

from __future__ import annotations

from .kron import KronBlock, KronPosterior
from .lowrank import LowRankPosterior
from .posterior import DiagPosterior, FullPosterior


def posterior_state(post) -> dict:
    """The tensors and settings that rebuild ``post`` (:func:`posterior_from_state`)."""
    if isinstance(post, FullPosterior):
        return {
            "kind": "full",
            "H": post.H,  # raises if one_buffer overwrote it with the factor
            "param_sizes": post.param_sizes,
            "Jw": post.Jw,
            "route": post.route,
            "one_buffer": post.one_buffer,
            "in_place": post.in_place,
        }
    if isinstance(post, DiagPosterior):
        return {"kind": "diag", "H": post.H, "param_sizes": post.param_sizes}
    if isinstance(post, KronPosterior):
        return {
            "kind": "kron",
            "B": [b.B for b in post.blocks],
            "A": [b.A for b in post.blocks],
        }
    if isinstance(post, LowRankPosterior):
        V, eigvals = post.H
        return {
            "kind": "lowrank",
            "V": V,
            "eigvals": eigvals,
            "param_sizes": post.param_sizes,
        }
    raise NotImplementedError(
        f"a {type(post).__name__} cannot be saved: the matrix-free structure keeps the "
        "training batches, not a curvature (fit it again after loading the model)"
    )


def posterior_from_state(state: dict):
    """The posterior that :func:`posterior_state` described."""
    kind = state["kind"]
    if kind == "full":
        return FullPosterior(
            state["H"],
            state["param_sizes"],
            state["Jw"],
            state["route"],
            one_buffer=state["one_buffer"],
            in_place=state["in_place"],
        )
    if kind == "diag":
        return DiagPosterior(state["H"], state["param_sizes"])
    if kind == "kron":
        return KronPosterior(
            [KronBlock(B, A) for B, A in zip(state["B"], state["A"], strict=True)]
        )
    if kind == "lowrank":
        return LowRankPosterior(state["V"], state["eigvals"], state["param_sizes"])
    raise ValueError(f"unknown posterior kind {kind!r} in the state")
