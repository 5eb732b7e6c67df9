"""The parity matrix: our Laplace against laplace-torch 0.3 on the same trained network, float64.

For each task in {regression, binary, multiclass, digits-cnn} and each (subset of weights, Hessian
structure) in {all, last layer} × {full, diag, kron}, :func:`parity_cell` fits both libraries on the
same data and network and returns the relative differences of

* ``H``: the curvature (dense for kron: only the Kronecker products enter the posterior),
* ``evidence``: the log marginal likelihood at a fixed δ,
* ``predictive``: f_var (regression) or the probit class probabilities (classification),
  on inputs inside the data and far outside it,
* ``delta``: the prior precision tuned by the evidence (``optimize_prior_precision(method="marglik")``,
  laplace-torch's defaults: 100 Adam steps on log δ at lr 0.1; ours takes the same steps).

Binary classification: laplace-torch 0.3 has no one-logit likelihood, so its reference is its
``"classification"`` on the two-logit network [0, f(x)] (``helpers.PinnedZeroLogit``), which has the
same loss, GGN and probit. For the *last layer* this embedding breaks inside laplace-torch (its
last-layer Jacobians take the output width from the last layer, 1, not from the network, 2: the
fit runs but prediction and the diagonal fail), so there the reference is the definition of
last-layer Laplace itself: laplace-torch's all-weights Laplace of the linear model
[0, W φ(x) + b] on the frozen features φ(x).

This file imports laplace-torch; the module ``laplace_from_scratch`` never does.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs
from laplace_from_scratch import helpers

TASKS = ("regression", "binary", "multiclass", "digits-cnn")
CELLS = (
    ("all", "full"),
    ("all", "diag"),
    ("all", "kron"),
    ("last_layer", "full"),
    ("last_layer", "diag"),
    ("last_layer", "kron"),
    ("subnetwork", "full"),
    ("subnetwork", "diag"),
)
QUANTITIES = ("H", "evidence", "predictive", "delta")
OUR_LIKELIHOOD = {
    "regression": "regression",
    "binary": "binary_classification",
    "multiclass": "classification",
    "digits-cnn": "classification",
}


@dataclass
class Problem:
    """A MAP-trained float64 network, its training data and query inputs (inside and far outside)."""

    task: str
    model: nn.Sequential
    X: torch.Tensor
    y: torch.Tensor
    Xq: torch.Tensor
    kw: dict

    @property
    def loader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.X, self.y), batch_size=50)

    def to(self, device: str | torch.device) -> Problem:
        """A copy with the network and the data on ``device``."""
        model = copy.deepcopy(self.model).to(device)
        X, y, Xq = (t.to(device) for t in (self.X, self.y, self.Xq))
        return Problem(self.task, model, X, y, Xq, self.kw)


class LaplaceTorchFailed(RuntimeError):
    """laplace-torch itself raised in a cell (for example its curvlinops backend on CUDA in 0.3)."""


def problem(task: str) -> Problem:
    """The network and data of one row of the matrix (deterministic; a few seconds to train)."""
    g = torch.Generator().manual_seed(1)
    if task == "regression":
        d = helpers.sinusoid(dtype=torch.float64)
        model = helpers.mlp(1, 1, width=20, seed=0, dtype=torch.float64)
        X, y, kw = d.X_train, d.y_train, dict(sigma_noise=0.3)
        helpers.fit_map(model, X, y, "regression", sigma_noise=0.3, adam_steps=500, lbfgs_steps=200)
        Xq = d.X_test[::10]  # 50 inputs on [−10, 13]: the data lie on [0, 10]
    elif task in ("binary", "multiclass"):
        d = (
            helpers.toy_nonlinear(n=120, dtype=torch.float64)
            if task == "binary"
            else helpers.toy_multiclass(n=150)
        )
        X, y, kw = d.X.to(torch.float64), d.y, {}
        model = helpers.mlp(2, 1 if task == "binary" else 3, width=10, seed=0, dtype=torch.float64)
        helpers.fit_map(model, X, y, OUR_LIKELIHOOD[task], adam_steps=500, lbfgs_steps=200)
        Xq = torch.cat([X[:25], 5 * torch.randn(25, 2, generator=g, dtype=torch.float64)])
    elif task == "digits-cnn":  # real images and Conv2d layers (KFAC for convolutions included)
        d = helpers.image_data("digits", n_train=120, n_test=25, dtype=torch.float64)
        X, y, kw = d.X_train, d.y_train, {}
        model = helpers.cnn(10, image_size=8, channels=(4, 8), seed=0, dtype=torch.float64)
        helpers.fit_map(model, X, y, "classification", adam_steps=300, lbfgs_steps=100)
        Xq = torch.cat(
            [d.X_test, helpers.invert(d.X_test), torch.rand(25, 1, 8, 8, generator=g, dtype=torch.float64)]
        )
    else:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return Problem(task, model, X, y, Xq, kw)


def _dense(A: torch.Tensor) -> torch.Tensor:
    return A.to_matrix() if hasattr(A, "to_matrix") else A


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).norm() / b.norm()).item()


BACKENDS = ("default", "backpack", "curvlinops")


def _backend(name: str) -> dict:
    """laplace-torch's ``backend=`` argument for a backend name (``"default"``: its own choice)."""
    if name == "default":
        return {}
    from laplace.curvature import BackPackGGN, CurvlinopsGGN

    return {"backend": {"backpack": BackPackGGN, "curvlinops": CurvlinopsGGN}[name]}


def subnetwork(p: Problem, subset: str) -> dict:
    """``subnetwork_indices`` for a subnetwork cell: every third weight of the network (the same flat indices
    in the [0, f] wrapper of the binary task, which adds no parameters)."""
    if subset != "subnetwork":
        return {}
    P = sum(q.numel() for q in p.model.parameters())
    return {"subnetwork_indices": torch.arange(0, P, 3, device=p.X.device)}


def reference_laplace(
    p: Problem, subset: str, structure: str, prior_precision: float, backend: str = "default"
):
    """laplace-torch's Laplace for this cell, fitted; and the inputs to query it with (for the binary
    last layer these are the frozen features φ(Xq))."""
    import laplace

    model, loader, Xq = p.model, p.loader, p.Xq
    lik = "regression" if p.task == "regression" else "classification"
    if p.task == "binary":
        if subset == "last_layer":  # the definition of last-layer Laplace, on frozen features
            with torch.no_grad():
                phi, Xq = model[:-1](p.X), model[:-1](p.Xq)
            loader = DataLoader(TensorDataset(phi, p.y), batch_size=50)
            model, subset = copy.deepcopy(model[-1]), "all"
        model = helpers.PinnedZeroLogit(model)
    ref = laplace.Laplace(
        model,
        lik,
        subset_of_weights=subset,
        hessian_structure=structure,
        prior_precision=prior_precision,
        **p.kw,
        **_backend(backend),
        **subnetwork(p, subset),
    )
    ref.fit(loader)
    return ref, Xq


@contextmanager
def float64_default() -> Iterator[None]:
    """float64 as the default dtype inside the block: laplace-torch's curvlinops backend builds dense
    matrices with eye() in the *default* dtype, which would round a float64 H to float32 accuracy."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def parity_cell(
    p: Problem, subset: str, structure: str, prior_precision: float = 0.5, backend: str = "default"
) -> dict[str, float]:
    """Relative differences ours vs laplace-torch for one cell: keys :data:`QUANTITIES`.

    Runs on the device of ``p`` (see :meth:`Problem.to`). An exception raised inside laplace-torch is
    re-raised as :class:`LaplaceTorchFailed`, so that a caller can record it as laplace-torch's result.
    """
    with float64_default():
        try:
            ref, Xq_ref = reference_laplace(p, subset, structure, prior_precision, backend)
            ref_ev = ref.log_marginal_likelihood()
            if p.task == "regression":
                ref_pred = ref(Xq_ref, pred_type="glm")[1]
            else:
                ref_pred = ref(Xq_ref, pred_type="glm", link_approx="probit")
        except Exception as e:  # laplace-torch's own failure, reported as such
            raise LaplaceTorchFailed(
                f"laplace-torch ({backend} backend) failed: {type(e).__name__}: {e}"
            ) from e
        ours = lfs.Laplace(
            p.model,
            OUR_LIKELIHOOD[p.task],
            subset_of_weights=subset,
            hessian_structure=structure,
            prior_precision=prior_precision,
            **p.kw,
            **subnetwork(p, subset),
        )
        ours.fit(p.loader)
        out = {
            "H": _rel(_dense(ours.H), _dense(ref.H)),
            "evidence": _rel(ours.log_marginal_likelihood(), ref_ev),
            "predictive": _rel(ours(p.Xq)[1] if p.task == "regression" else ours(p.Xq), ref_pred),
        }
        with warnings.catch_warnings():  # its reminder that link_approx defaults to probit
            warnings.simplefilter("ignore", UserWarning)
            try:
                ref.optimize_prior_precision(method="marglik")
            except Exception as e:
                raise LaplaceTorchFailed(
                    f"laplace-torch ({backend} backend) failed in optimize_prior_precision: "
                    f"{type(e).__name__}: {e}"
                ) from e
        ours.optimize_prior_precision(method="marglik")
        out["delta"] = _rel(ours.prior_precision, ref.prior_precision)
        return out


def parity_matrix(tasks: tuple[str, ...] = TASKS, cells: tuple = CELLS) -> list[dict]:
    """Every cell of the matrix: one dict per (task, subset, structure) with the relative differences."""
    rows = []
    for task in tasks:
        p = problem(task)
        for subset, structure in cells:
            rows.append(
                {"task": task, "subset": subset, "structure": structure, **parity_cell(p, subset, structure)}
            )
    return rows


# The training loop's row of the matrix: lfs.marglik_training against laplace-torch's marglik_training (online
# marginal likelihood, notebook 07b) on the same initial weights and unshuffled batches, float64. The schedule
# is short so that the row runs in seconds: 7 epochs, 2 of burn-in, an evidence step of 4 hypersteps every 2.
TRAINING_SCHEDULE = dict(
    n_epochs=7,
    n_epochs_burnin=2,
    marglik_frequency=2,
    n_hypersteps=4,
    lr_hyp=0.1,
    optimizer_kwargs={"lr": 1e-2},
    prior_prec_init=0.7,
    sigma_noise_init=0.8,
    temperature=1.0,
)
# laplace-torch's backends whose curvature convention is ours: BackPACK for full and diag; for KFAC
# curvlinops (its ASDL KFAC treats biases differently)
TRAINING_BACKEND = {"full": "BackPackGGN", "diag": "BackPackGGN", "kron": "CurvlinopsGGN"}
TRAINING_CASES = tuple(
    (likelihood, structure, prior)
    for likelihood in ("regression", "classification")
    for structure in ("full", "kron", "diag")
    for prior in ("scalar", "layerwise", "diag")
    if (structure, prior) != ("kron", "diag")  # KFAC takes no diagonal prior
)
TRAINING_QUANTITIES = ("losses", "evidences", "delta", "sigma", "weights", "evidence")


def kfac_sigma_gradients(log_sigma: float = -0.2, h: float = 1e-5) -> dict[str, float]:
    """d evidence / d log σ of all-weights KFAC in regression (:func:`training_problem`, δ = 0.7): ours and
    laplace-torch's by autograd, and a central finite difference of our evidence (step ``h``), with the
    relative difference of the two evidences (``"evidence"``).

    laplace-torch 0.3 scales its KFAC eigenvalues by 1/(σ²T) with ``math.pow`` (``KronDecomposed.__mul__``),
    which turns the tensor into a Python float, so the log determinant's part drops out of its gradient."""
    import laplace
    from laplace.curvature import CurvlinopsGGN

    model, loader = training_problem("regression")
    ours = lfs.Laplace(model, "regression", hessian_structure="kron")
    ours.fit(loader)
    theirs = laplace.Laplace(model, "regression", "all", "kron", backend=CurvlinopsGGN)
    theirs.fit(loader)
    delta = torch.tensor([0.7], dtype=torch.float64)

    def grad(la) -> tuple[float, float]:
        ls = torch.tensor([log_sigma], dtype=torch.float64, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # laplace-torch's float conversion warns
            e = la.log_marginal_likelihood(delta, ls.exp())
        e.backward()
        return e.item(), ls.grad.item()

    def evidence(ls: float) -> float:
        s = torch.tensor([math.exp(ls)], dtype=torch.float64)
        return ours.log_marginal_likelihood(delta, s).item()

    (e_ours, g_ours), (e_theirs, g_theirs) = grad(ours), grad(theirs)
    fd = (evidence(log_sigma + h) - evidence(log_sigma - h)) / (2 * h)
    return {"finite difference": fd, "ours": g_ours, "laplace-torch": g_theirs,
            "evidence": abs(e_ours - e_theirs) / abs(e_theirs)}


def training_problem(likelihood: str) -> tuple[nn.Module, DataLoader]:
    """40 examples, unshuffled batches of 10, a 3-8-8-K tanh MLP in float64 (K = 2 outputs for regression,
    3 classes)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 3, generator=g, dtype=torch.float64)
    if likelihood == "regression":
        y = torch.stack([X[:, 0].sin(), X[:, 1] * X[:, 2]], 1)
        y = y + 0.1 * torch.randn(y.shape, generator=g, dtype=torch.float64)
    else:
        y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()
    loader = DataLoader(TensorDataset(X, y), batch_size=10, shuffle=False)
    K = 2 if likelihood == "regression" else 3
    return helpers.mlp(3, K, width=8, depth=2, seed=1, dtype=torch.float64), loader


def training_cell(likelihood: str, structure: str, prior_structure: str) -> dict:
    """Both libraries' ``marglik_training`` on :func:`training_problem`: the relative differences of
    :data:`TRAINING_QUANTITIES` (every epoch's loss, every hyperstep's negative evidence, the final δ, σ and
    weights, and the evidence of the returned Laplace), and how far δ moved from its start (``"moved"``).

    Regression with KFAC runs with σ fixed: laplace-torch 0.3's KFAC evidence is not differentiable in σ
    (its ``KronDecomposed`` scales eigenvalues with ``math.pow``; tests/test_marglik_training.py shows it).
    """
    import laplace
    from laplace import curvature

    model, loader = training_problem(likelihood)
    theirs_model = copy.deepcopy(model)
    kw = dict(TRAINING_SCHEDULE, likelihood=likelihood, hessian_structure=structure)
    kw["prior_structure"] = prior_structure
    kw["fix_sigma_noise"] = likelihood == "regression" and structure == "kron"
    backend = getattr(curvature, TRAINING_BACKEND[structure])
    la, ours, margliks, losses = lfs.marglik_training(model, loader, backend=backend, **copy.deepcopy(kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lap, theirs, t_margliks, t_losses = laplace.marglik_training(
            theirs_model, loader, backend=backend, **copy.deepcopy(kw)
        )
    if len(margliks) != len(t_margliks) or len(losses) != len(t_losses):
        raise AssertionError("the two trajectories have different lengths")
    w = nn.utils.parameters_to_vector(ours.parameters())
    w_theirs = nn.utils.parameters_to_vector(theirs.parameters())
    delta = torch.as_tensor(la.prior_precision).flatten()
    return {
        "losses": _rel(losses, t_losses),
        "evidences": _rel(margliks, t_margliks),
        "delta": _rel(delta, torch.as_tensor(lap.prior_precision).flatten()),
        "sigma": _rel(la.sigma_noise, lap.sigma_noise),
        "weights": _rel(w, w_theirs),
        "evidence": _rel(la.log_marginal_likelihood(), lap.log_marginal_likelihood()),
        "moved": _rel(delta, torch.full_like(delta, 0.7)),
        "steps": len(margliks),
        "epochs": len(losses),
    }


if __name__ == "__main__":
    for r in parity_matrix():
        vals = "  ".join(f"{q} {r[q]:.1e}" for q in QUANTITIES)
        print(f"{r['task']:>10} {r['subset']:>10} {r['structure']:>4}: {vals}")
