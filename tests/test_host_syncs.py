"""Host synchronisations in ``fit`` and ``optimize_prior_precision``.

Reading a tensor's value on the host (``bool``, ``float``, ``int``, ``.item()``,
``.tolist()``, ``.cpu()``, ``.numpy()``) waits for the device. On a GPU, one per batch of
``fit`` or per step of the δ tuning stalls the device as often. The module's value checks
are read once per loop (``checks.deferred``), so the count is a small constant per call.
The one exception is the full structure's Cholesky factorisation: whether to add jitter is
decided on the host, once per factorisation, which costs O(P³) anyway.

Some operators also wait for the device inside ATen on a GPU: the ``torch.linalg``
factorisations that raise on failure read their status (``info``) on the host, and ops
whose output size depends on values (``nonzero``, ``unique``, ``masked_select``) read
that size. The GPU profile of 2026-11-28 (``results/profile_fit_2026-11-28_cuda-*``)
found one such wait per batch in every fit of ours: an ``eigh`` of Λ for its square root,
now the closed form ``output_hessian_sqrt``. They are counted here too.

The calls are counted with a ``TorchFunctionMode`` on the CPU (the same code runs on a
GPU), only where the module itself makes them: torch's Adam reads its CPU step counter
with ``.item()``, which waits for nothing.
"""

import traceback
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader, TensorDataset

from laplace_from_scratch import Laplace

READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
}
# operators that read a status or a size on the host on a GPU (their ``_ex`` forms and
# ``check_errors=False`` do not)
WAITING_OPS = {
    torch.linalg.eigh,
    torch.linalg.eigvalsh,
    torch.linalg.cholesky,
    torch.linalg.inv,
    torch.linalg.solve,
    torch.cholesky_solve,
    torch.nonzero,
    torch.Tensor.nonzero,
    torch.unique,
    torch.masked_select,
}
PACKAGE = "laplace_from_scratch"


class HostReads(TorchFunctionMode):
    """Counts the host reads of tensor values that the module's own code makes, by
    file and line."""

    def __init__(self):
        super().__init__()
        self.where: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS or func in WAITING_OPS:
            caller = traceback.extract_stack(limit=2)[0]
            if PACKAGE in caller.filename:
                name = caller.filename.split(PACKAGE)[-1].lstrip("/")
                self.where[f"{func.__name__} at {name}:{caller.lineno}"] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.where.values())


def problem(n_batches: int, likelihood: str):
    torch.manual_seed(0)
    X = torch.randn(240, 5)
    K = 3 if likelihood == "classification" else 2
    y = torch.randint(0, K, (240,)) if K == 3 else torch.randn(240, K)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, K))
    return model, DataLoader(TensorDataset(X, y), batch_size=240 // n_batches)


def reads(structure, likelihood, subset, n_batches, n_steps) -> tuple:
    """The host reads of one fit and one tuning."""
    model, loader = problem(n_batches, likelihood)
    la = Laplace(model, likelihood, subset_of_weights=subset, hessian_structure=structure)
    with HostReads() as fit:
        la.fit(loader)
    with HostReads() as tune:
        la.optimize_prior_precision(method="marglik", n_steps=n_steps)
    return fit, tune


# the constants: fit reads its deferred checks once; the tuning reads them once, its
# history once, and checks δ where it is set before and after the loop
FIT_MAX, TUNE_MAX = 2, 6


def beyond_factorisations(where: Counter) -> int:
    """The count less KFAC's eigendecompositions of its factors when the fit finishes
    (one per factor, O(d³) each: a constant per fit, not per batch)."""
    return sum(n for k, n in where.items() if not k.startswith("linalg_eigh at kron.py"))


@pytest.mark.parametrize("likelihood", ["classification", "regression"])
@pytest.mark.parametrize(
    "subset, structure",
    [("all", "full"), ("all", "diag"), ("all", "kron"), ("last_layer", "kron")],
)
def test_host_reads_do_not_grow_with_batches_or_steps(subset, structure, likelihood):
    few = reads(structure, likelihood, subset, n_batches=2, n_steps=5)
    many = reads(structure, likelihood, subset, n_batches=8, n_steps=20)
    for name, a, b in (("fit", few[0], many[0]), ("tune", few[1], many[1])):
        print(f"{name}: {a.total} reads (2 batches / 5 steps), {b.total} (8 / 20)")
        print("  ", dict(b.where))
    # fit: no read per batch
    assert few[0].total == many[0].total, dict(many[0].where)
    assert beyond_factorisations(many[0].where) <= FIT_MAX, dict(many[0].where)
    # tuning: no read per step, but for full's Cholesky (one per factorisation)
    per_step = (many[1].total - few[1].total) / (20 - 5)
    cholesky = [k for k in many[1].where if "posterior.py" in k]
    expected = 1 if structure == "full" else 0
    assert per_step == expected, dict(many[1].where)
    assert few[1].total - 5 * expected <= TUNE_MAX, dict(few[1].where)
    assert (structure == "full") == bool(cholesky), cholesky


def test_deferred_check_still_raises_with_its_message():
    """A label out of range in the last batch raises after the loop, naming it."""
    model, loader = problem(4, "classification")
    X, y = loader.dataset.tensors
    y = y.clone()
    y[-1] = 7
    la = Laplace(model, "classification", hessian_structure="diag")
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\), got \[0, 7\]"):
        la.fit(DataLoader(TensorDataset(X, y), batch_size=60))
    assert la.structure is None  # nothing changed


def test_deferred_check_names_the_cause_when_the_loop_fails():
    """A NaN output that makes a later step fail is reported as the NaN."""
    from laplace_from_scratch.checks import deferred, require

    with pytest.raises(ValueError, match="first"):
        with deferred():
            require(torch.tensor(False), "first")
            raise RuntimeError("a later failure")
    with pytest.raises(RuntimeError, match="later"):
        with deferred():
            require(torch.tensor(True), "fine")
            raise RuntimeError("a later failure")


def test_checks_are_immediate_again_after_an_interrupted_block():
    """A block left by KeyboardInterrupt (not an Exception) must not leave later checks
    deferred, where they would never be read."""
    from laplace_from_scratch.checks import deferred, require

    with pytest.raises(KeyboardInterrupt):
        with deferred():
            raise KeyboardInterrupt
    with pytest.raises(ValueError, match="now"):
        require(torch.tensor(False), "now")
