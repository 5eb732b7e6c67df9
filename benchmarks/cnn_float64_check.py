"""Is the 1e-3 gap between ours and laplace-torch on the CNN of the CPU scale record
float32's?

One model of ``results/scale_2026-11-23_cpu.json`` (cnn:8:16 on MNIST, N = 1000, 200
test queries, δ = 1, the record's settings) is trained again by
``benchmarks/scale.py``'s own ``train`` (float32; other weights than the record's, so
its float32 differences are not the record's own), and each (structure, implementation)
cell is measured by its own ``measure`` in this process twice on the same weights: in
float32, as recorded, and with the model, the data and the default dtype in float64.
Agreement as in the record: relative difference of the evidence at δ = 1 and of the
tuned δ, and the largest absolute difference of a probit probability.

laplace-torch's backend: curvlinops (the default, where the record's largest differences
came from) for the last layer; BackPACK for all weights, where curvlinops ran out of
memory (full) or took 10 GB (diagonal). KFAC of all weights is left out: both backends
that compute ours took 10 GB there in float32, too much for this machine in float64.
Times are not recorded: this ran beside other jobs.

    PYTHONPATH=. python benchmarks/cnn_float64_check.py

writes results/cnn_float64_check_<date>_cpu.json. On a GPU, where PyTorch runs cuDNN
convolutions in TF32 by default, the question is whether TF32 makes the gap:

    PYTHONPATH=. python benchmarks/cnn_float64_check.py --device cuda \
        --modes float32 float32-no-tf32 --cells full:backpack kron:backpack \
        ll-full:backpack diag:backpack --out results/cnn_tf32_check_<date>_<device>.json

``float32`` is PyTorch's default (TF32 allowed in cuDNN convolutions, as in the GPU
scale record); ``float32-no-tf32`` turns TF32 off in convolutions and matrix products.
On ``cuda`` (or with ``--gpu-settings``) the data are those of ``scale.py --preset gpu``
(N = 4000, 500 queries), and on ``cuda`` its tuning too (δ tuned for full and last-layer
full up to P = 40,000).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from laplace_from_scratch import helpers  # noqa: E402

import scale  # noqa: E402
from common import machine_meta  # noqa: E402

CELLS = [  # (structure, laplace-torch backend)
    ("ll-full", "curvlinops"),
    ("ll-kron", "curvlinops"),
    ("ll-diag", "curvlinops"),
    ("diag", "backpack"),
    ("full", "backpack"),
]
CFG = dict(
    device="cpu",
    data="mnist",
    n_train=1000,
    n_test=500,
    n_query=200,
    batch_size=100,
    delta0=1.0,
    train_steps=300,
    matfree_query=4,
    tune_max_p=5000,
    inprocess=True,
    model="cnn:8:16",
)


BUILD = scale.build_model  # float32


def in_dtype(dtype: torch.dtype) -> None:
    """scale.measure's model and data in ``dtype`` (the weights are loaded into it)."""
    scale.build_model = lambda spec, data, dev: BUILD(spec, data, dev).to(dtype)
    scale.load_data = lambda cfg: helpers.image_data(
        cfg["data"], cfg["n_train"], cfg["n_test"], dtype=dtype
    )
    torch.set_default_dtype(dtype)


MODES = {  # mode: (dtype, TF32 allowed)
    "float32": (torch.float32, True),
    "float32-no-tf32": (torch.float32, False),
    "float64": (torch.float64, False),
}


def set_tf32(allowed: bool) -> None:
    """TF32 in cuDNN convolutions and in matrix products (PyTorch's defaults: allowed
    in convolutions, not in matrix products; ``float32`` keeps them)."""
    torch.backends.cudnn.allow_tf32 = allowed
    torch.backends.cuda.matmul.allow_tf32 = False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--modes", nargs="+", default=["float32", "float64"], choices=MODES)
    ap.add_argument(
        "--cells", nargs="+", default=[f"{s}:{b}" for s, b in CELLS], metavar="S:B"
    )
    ap.add_argument(
        "--gpu-settings",
        action="store_true",
        help="the data and tuning settings of scale.py --preset gpu (always on cuda)",
    )
    ap.add_argument("--model", default=CFG["model"], help="one of scale.py's models")
    ap.add_argument("--out", default=None, help="default results/cnn_float64_check_…")
    args = ap.parse_args()
    CFG["device"], CFG["model"] = args.device, args.model
    if args.device == "cuda" or args.gpu_settings:  # the GPU record's data
        gpu = scale.PRESETS["gpu"]
        CFG.update({k: gpu[k] for k in ("n_train", "n_test", "n_query")})
    if args.device == "cuda":  # and its tuning (on the CPU, tuning dense
        CFG["tune_max_p"] = scale.PRESETS["gpu"]["tune_max_p"]  # P ≈ 8k: minutes)
    cells = [tuple(c.split(":")) for c in args.cells]
    work = Path(tempfile.mkdtemp())
    weights = work / "cnn.pt"
    trained = scale.train(CFG, weights)
    rows = []
    meta = machine_meta(
        args.device,
        settings=CFG,
        map=trained,
        cells=cells,
        modes=args.modes,
        script="benchmarks/cnn_float64_check.py",
    )
    path = args.out or ROOT / "results" / f"cnn_float64_check_{meta['date']}_cpu.json"
    for mode in args.modes:
        dtype, tf32 = MODES[mode]
        in_dtype(dtype)
        set_tf32(tf32)
        for structure, backend in cells:
            out = {}
            for impl in ("ours", backend):
                cfg = dict(CFG, structure=structure, impl=impl, weights=str(weights))
                cfg["probs_file"] = str(work / f"{structure}_{impl}_{mode}.npy")
                r = scale.measure(cfg)
                r["probs"] = np.load(cfg["probs_file"]) if "error" not in r else None
                out[impl] = r
                print(mode, structure, impl, r.get("error", "ok"), flush=True)
            o, t = out["ours"], out[backend]
            row = {
                "dtype": str(dtype).removeprefix("torch."),
                "mode": mode,
                "structure": structure,
                "backend": backend,
                "P": scale.posterior_size(
                    scale.build_model(CFG["model"], scale.load_data(CFG), "cpu"),
                    structure,
                ),
            }
            if "error" in o or "error" in t:
                row["error"] = o.get("error") or t.get("error")
            else:
                row["evidence_ours"] = o["evidence"]
                row["evidence_rel"] = abs(t["evidence"] - o["evidence"]) / abs(
                    o["evidence"]
                )
                row["probs_maxabs"] = float(np.abs(t["probs"] - o["probs"]).max())
                if "delta" in o and "delta" in t:
                    row["delta_rel"] = abs(t["delta"] - o["delta"]) / o["delta"]
            print(row, flush=True)
            rows.append(row)  # written after every row: a stopped run keeps its rows
            Path(path).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    torch.set_default_dtype(torch.float32)
    print("wrote", path)


if __name__ == "__main__":
    main()
