"""The notebooks' two reading aids: a printed, asserted comparison of the reader's
version of an algorithm with the module's, and the module function's signature and
docstring summary (not its body: the reader wrote that)."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable

import torch


def compare(what: str, ours, reference, tol: float = 1e-12) -> float:
    """Print max |ours − reference| / max |reference| against ``tol`` and assert it is
    below; returns it. ``ours``, ``reference``: tensors (or numbers) of one shape."""
    ours, reference = torch.as_tensor(ours), torch.as_tensor(reference)
    d = ((ours - reference).abs().max() / reference.abs().max()).item()
    print(f"{what}: max |difference| / max |value| = {d:.1e} (tolerance {tol:.0e})")
    assert d < tol, d
    return d


def brief(fn: Callable) -> None:
    """Print ``fn``'s signature (without annotations) and the first paragraph of its
    docstring, as ``lfs.module.name(...)``."""
    sig = inspect.signature(fn)
    sig = sig.replace(
        parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
        return_annotation=sig.empty,
    )
    doc = " ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split())
    where = fn.__module__.replace("laplace_from_scratch", "lfs")
    print(f"{where}.{fn.__qualname__}{sig}")
    print(textwrap.fill(doc, 88, initial_indent="    ", subsequent_indent="    "))
