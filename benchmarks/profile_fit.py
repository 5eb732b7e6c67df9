"""Where a warm ``fit`` spends its time: ours against one laplace-torch backend
(issue 46's rows where ours fits slower on a GPU).

For each ``structure:backend`` pair, on the weights that ``scale.py``'s ``train``
gives (same data and settings as ``scale.py --preset gpu``), each side goes through
``scale.warm_up`` (one-batch fit, predict, tune; a matmul, a Cholesky, a first Adam),
then fits once untimed and once timed, and then once under ``torch.profiler`` (CPU and
CUDA activities). For each profiled fit it records the wall time, the number of kernel
launches, of device-to-host copies and synchronisations, of ``aten::item`` calls, and
the operators with the largest self CPU and self CUDA times.

    PYTHONPATH=. python benchmarks/profile_fit.py --device cuda --model mlp:1000:2 \\
        --pairs diag:backpack ll-diag:curvlinops ll-full:backpack kron:backpack \\
        --out results/profile_fit_<date>_<device>

writes ``<out>.json`` (counts and times) and ``<out>.txt`` (the operator tables).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import scale  # noqa: E402
from common import machine_meta  # noqa: E402

# profiler event names that stand for a host-device round trip or a launch
COUNTED = {
    "launches": ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"),
    "syncs": ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"),
    "memcpy": ("cudaMemcpyAsync", "cudaMemcpy"),
    "item": ("aten::_local_scalar_dense",),
}


def counts(prof) -> dict[str, int]:
    """How many times each group of :data:`COUNTED` events occurred."""
    avg = {e.key: e.count for e in prof.key_averages()}
    return {k: sum(avg.get(n, 0) for n in names) for k, names in COUNTED.items()}


def profile_cell(cfg: dict, structure: str, impl: str) -> tuple[dict, str]:
    """Warm-up, a timed fit and a profiled fit of one cell; its row and its tables."""
    from torch.profiler import ProfilerActivity, profile

    dev, spec = cfg["device"], cfg["model"]
    cell = cfg | {"structure": structure, "impl": impl}
    _, loader, one, Xq, make = scale.prepare(cell)
    sync = functools.partial(scale.device_sync, dev)
    kw = {} if impl == "ours" else {"pred_type": "glm"}
    scale.warm_up(make, one, Xq, kw, True, sync)
    make().fit(loader)
    sync()
    t0 = time.perf_counter()
    make().fit(loader)
    sync()
    fit_s = time.perf_counter() - t0
    activities = [ProfilerActivity.CPU]
    if dev == "cuda":
        activities.append(ProfilerActivity.CUDA)
    la = make()
    with profile(activities=activities) as prof:
        la.fit(loader)
        sync()
    n = counts(prof)
    row = {"structure": structure, "impl": impl, "fit_s": fit_s} | n
    avg = prof.key_averages()
    tables = [f"## {spec} {structure} {impl}: fit {fit_s:.4f} s, {n}"]
    tables.append(avg.table(sort_by="self_cpu_time_total", row_limit=15))
    if dev == "cuda":
        tables.append(avg.table(sort_by="self_cuda_time_total", row_limit=15))
    return row, "\n".join(tables)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model", default="mlp:1000:2")
    ap.add_argument("--pairs", nargs="+", default=["diag:backpack"])
    ap.add_argument("--out", required=True, help="output stem")
    args = ap.parse_args()
    gpu = scale.PRESETS["gpu"]
    cfg = {
        "device": args.device,
        "model": args.model,
        "delta0": 1.0,
        "train_steps": 300,
        "batch_size": 100,
        "n_query": 2,  # the warm-up's two-input predict
    } | {k: gpu[k] for k in ("data", "n_train", "n_test")}
    cfg["weights"] = str(Path(tempfile.mkdtemp()) / "w.pt")
    trained = scale.train(cfg, Path(cfg["weights"]))
    rows, text = [], []
    stem = Path(args.out)
    meta = machine_meta(args.device, settings=cfg, map=trained, pairs=args.pairs)
    for pair in args.pairs:
        structure, backend = pair.split(":")
        for impl in ("ours", backend):
            row, tables = profile_cell(cfg, structure, impl)
            print(
                {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()},
                flush=True,
            )
            rows.append(row)
            text.append(tables)
            stem.with_suffix(".json").write_text(
                json.dumps({"meta": meta, "rows": rows}, indent=1)
            )
            stem.with_suffix(".txt").write_text("\n\n".join(text))
    print("wrote", stem.with_suffix(".json"), stem.with_suffix(".txt"))


if __name__ == "__main__":
    main()
