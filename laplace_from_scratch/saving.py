"""Saving a fitted posterior as tensors and plain values (``torch.save``,
``torch.load(weights_only=True)``), rebuilt by its table entry's ``load`` from the
fields the entry names (``structures.py``): it computes exactly what the saved one did.
"""

from __future__ import annotations

from .posterior import Posterior
from .structures import STRUCTURES


def posterior_state(structure: str, post: Posterior) -> dict:
    """The tensors and settings that rebuild ``post`` (raises for a full posterior whose
    H the memory-limit layer overwrote with L)."""
    spec = STRUCTURES[structure]
    if spec.load is None:
        raise NotImplementedError(
            f"a {type(post).__name__} cannot be saved: the matrix-free structure keeps "
            "the training batches, not a curvature (fit it again after loading the "
            "model)"
        )
    return {"kind": structure} | {key: getattr(post, key) for key in spec.saved}


def posterior_from_state(state: dict) -> Posterior:
    """The posterior that :func:`posterior_state` described."""
    spec = STRUCTURES.get(state["kind"])
    if spec is None or spec.load is None:
        raise ValueError(f"unknown posterior kind {state['kind']!r} in the state")
    return spec.load(*(state[key] for key in spec.saved))
