"""Fit time and peak memory of each curvature structure: ours vs laplace-torch (every
backend), same run.

Two-hidden-layer tanh MLPs on the sinusoid (N = 150 regression), float32. For each width
and each structure in {full, diag, kron, last-layer full}, fit ours and laplace-torch
0.3 with each of its backends (curvlinops = its default, BackPACK, ASDL). Every
measurement runs in a fresh subprocess:

* time: the faster of two ``fit`` calls after a warm-up call (which pays one-off costs);
* peak memory: on CPU the peak resident set size during the fits, sampled every 0.5 ms
  from ``/proc/self/statm`` by a thread, minus the resident size just before (so: what
  the fit itself allocates; a spike shorter than the sampling interval can be missed,
  and values of a few MiB or less are at the resolution of this method); on CUDA the
  growth of ``torch.cuda.max_memory_allocated``.

Failures (unsupported combination, out of memory) are caught and recorded.
laplace-torch's curvlinops full GGN is skipped above ``--curvlinops-full-max-p`` (at P ≈
10k it already takes ~14 s and ~5 GB on 2 CPU threads; it grows as P²).

    python benchmarks/bench_fit.py [--widths 50 100 150] [--device cpu|cuda]

Prints a table with ratios (laplace-torch time / ours) and writes
results/bench_fit_<date>_<device>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

from common import (  # benchmarks/common.py (the script's folder is on sys.path)
    RssPeak,
    child,
    cpu_name,
    make_laplace,
    run_fresh,
)

STRUCTURES = [("all", "full"), ("all", "diag"), ("all", "kron"), ("last_layer", "full")]
BACKENDS = ["curvlinops", "backpack", "asdl"]


def measure(cfg: dict) -> dict:
    """One measurement, meant to run in its own process."""
    import torch
    from laplace_from_scratch import helpers
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    device = cfg["device"]
    data = helpers.sinusoid(dtype=torch.float32)
    X, y = data.X_train.to(device), data.y_train.to(device)
    model = helpers.mlp(1, 1, width=cfg["width"], dtype=torch.float32).to(device)
    loader = DataLoader(TensorDataset(X, y), batch_size=150)
    kw = dict(
        subset_of_weights=cfg["subset"],
        hessian_structure=cfg["structure"],
        sigma_noise=0.3,
    )
    la = make_laplace(cfg["impl"], model, "regression", **kw)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    # warm-up: one-off costs (lazy initialisation, kernel loading) stay out of both
    # numbers
    la.fit(loader)
    times = []
    with RssPeak() as rss:
        for _ in range(2):
            t0 = time.perf_counter()
            la.fit(loader)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = rss.peak - rss.base
    P = sum(p.numel() for p in model.parameters())
    return {"P": P, "fit_s": min(times), "peak_bytes": max(peak, 0)}


def run(cfg: dict, timeout: int) -> dict:
    return run_fresh(__file__, cfg, timeout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", type=int, nargs="+", default=[50, 100, 150])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--curvlinops-full-max-p", type=int, default=11_000)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if child(args, measure):
        return

    import laplace  # noqa: F401  (fail early if the reference is missing)
    import torch

    rows = []
    for width in args.widths:
        for subset, structure in STRUCTURES:
            for impl in ["ours", *BACKENDS]:
                cfg = dict(
                    width=width,
                    subset=subset,
                    structure=structure,
                    impl=impl,
                    device=args.device,
                )
                # 1-w-w-1 MLP: 2w + (w² + w) + (w + 1)
                P = width * width + 4 * width + 1
                if (
                    impl == "curvlinops"
                    and (subset, structure) == ("all", "full")
                    and P > args.curvlinops_full_max_p
                ):
                    rows.append(
                        {
                            **cfg,
                            "P": P,
                            "error": f"skipped: P > {args.curvlinops_full_max_p}",
                        }
                    )
                else:
                    rows.append(run(cfg, args.timeout))
                r = rows[-1]
                status = (
                    r.get("error")
                    or f"{r['fit_s']:8.3f} s  {r['peak_bytes'] / 2**20:8.1f} MiB"
                )
                print(
                    f"width {width:4d} {subset:>10} {structure:>4} {impl:>10}: "
                    f"{status}",
                    flush=True,
                )

    print("\nratio = laplace-torch fit time / ours (same structure, same run)")
    for width in args.widths:
        for subset, structure in STRUCTURES:
            same = [
                r
                for r in rows
                if (r["width"], r["subset"], r["structure"])
                == (width, subset, structure)
            ]
            ours = next(r for r in same if r["impl"] == "ours")
            if "error" in ours:
                continue
            parts = [
                f"P={ours['P']:6d} {subset:>10} {structure:>4}: ours "
                f"{ours['fit_s']:.3f} s"
            ]
            for r in same:
                if r["impl"] != "ours":
                    parts.append(
                        f"{r['impl']} "
                        + (
                            "n/a"
                            if "error" in r
                            else f"{r['fit_s'] / ours['fit_s']:.1f}×"
                        )
                    )
            print(" | ".join(parts))

    import laplace as lt

    meta = {
        "date": datetime.date.today().isoformat(),
        "device": args.device,
        "device_name": torch.cuda.get_device_name()
        if args.device == "cuda"
        else cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "laplace_torch": getattr(lt, "__version__", "0.3"),
        "python": platform.python_version(),
        "data": "sinusoid N=150, K=1, float32, 1-w-w-1 tanh MLP",
        "memory": "CPU: peak RSS (sampled every 0.5 ms) during two fits minus RSS "
        "before; "
        "CUDA: max_memory_allocated growth",
    }
    out = (
        Path(__file__).resolve().parent.parent
        / "results"
        / f"bench_fit_{meta['date']}_{args.device}.json"
    )
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
