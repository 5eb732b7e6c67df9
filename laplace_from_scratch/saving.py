"""Saving and loading a fitted posterior as a dict of tensors and plain values, for
``torch.save(la.state_dict(), path)`` and ``torch.load(path)`` (``weights_only=True``).
A posterior is rebuilt from the fields its table entry names (``structures.py``) by
the entry's ``load``, so it computes exactly what the saved one did. The matrix-free
structure holds the training batches, not a curvature, and is not saved.
"""

from __future__ import annotations

from .posterior import Posterior
from .structures import STRUCTURES


def posterior_state(structure: str, post: Posterior) -> dict:
    """The tensors and settings that rebuild ``post``, a posterior of ``structure``
    (:func:`posterior_from_state`). (A full posterior whose H the memory-limit layer
    overwrote with L raises: it cannot be rebuilt.)"""
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
