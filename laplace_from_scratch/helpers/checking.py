"""The notebooks' reading aids: a printed, asserted comparison of the reader's version
of an algorithm with the module's; the module function's signature and docstring
summary (not its body: the reader wrote that); and :func:`keep_yours`, which lets a
folded solution stand in for a function the reader has not written yet."""

from __future__ import annotations

import dis
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


def is_stub(fn: Callable) -> bool:
    """Whether ``fn``'s body does nothing: a docstring and ``...`` or ``pass``, the stub
    a notebook gives the reader to fill in. A class is a stub when every method it
    defines is."""
    if inspect.isclass(fn):
        methods = [v for v in vars(fn).values() if inspect.isfunction(v)]
        return all(is_stub(m) for m in methods)
    steps = [i for i in dis.get_instructions(fn) if i.opname not in ("RESUME", "NOP")]
    return all(
        i.opname in ("LOAD_CONST", "RETURN_VALUE", "RETURN_CONST") and i.argval is None
        for i in steps
    )


def keep_yours(yours: Callable) -> Callable[[Callable], Callable]:
    """Decorator for a notebook's folded solution: returns ``yours``, the reader's
    function, once its body is written, and the decorated solution while ``yours`` is
    still a stub (:func:`is_stub`). So the check after it tests the reader's version,
    and "Run all" works before the reader has written anything."""

    def pick(solution: Callable) -> Callable:
        return solution if is_stub(yours) else yours

    return pick
