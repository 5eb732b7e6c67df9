"""The matrix-free predictive's levers, each measured in the same run (issue 46).

scale.py's CPU cells for matrix-free Laplace: MNIST-5k, N = 1000 training images in
batches of 100, the 784-12-10 tanh MLP (``mlp:12:1``, P = 9,550) and the CNN
(``cnn:8:16``, P = 9,098) trained as scale.py trains them (300 full-batch Adam steps,
δ = 1), float32. Its predictive is probit on Q = 4 test images: f_var = J Σ Jᵀ by CG on
Σ⁻¹ = G + δI with all Q·K = 40 rows of J as right-hand sides, ``cg_tol=1e-6``.

The levers, switched on one after another (``--configs``):

* ``before``: the module before these levers: G V by JVPs ``vmap``-ed over the
  vectors, one pass per stored batch of 100 rows, plain CG;
* ``chunks``: passes over chunks of the stored rows sized by the vectors (few rows for
  many vectors, all of them for one; ``matfree.GGNOperator``);
* ``layerwise``: G V as matrix products layer by layer (``layer_ggn.py``; Linear
  networks only, so the CNN's row equals ``chunks``);
* ``lowrank``: CG preconditioned by the rank-100 low-rank posterior of the same
  batches (the default), made by the first predictive (timed on its own: one query).

The earlier levers are switched off by replacing two ``GGNOperator`` methods in this
process (the module has no option for them). For each: the fit, the SLQ evidence, a
first predictive on one query (with the preconditioner's Lanczos, if any), the
predictive (the faster of ``--repeats``), CG's iterations, and the largest difference
of the probabilities from full Laplace's (dense Cholesky, same model).

python benchmarks/bench_matfree.py [--models mlp:12:1 cnn:8:16] [--repeats 3]
python benchmarks/bench_matfree.py --float64 --out results/bench_matfree_<date>_cpu.json
(the second adds the float64 check: the default predictive's variances against full
Laplace's dense ones)

Writes results/bench_matfree_<date>_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import machine_meta, write_json, write_record
from scale import build_model, inputs, load_data

CONFIGS = ("before", "chunks", "layerwise", "lowrank")
SETTINGS = {"data": "mnist", "n_train": 1000, "n_test": 500, "batch_size": 100}
# GGNOperator's own rows_per_pass and layers, kept by main() before switch_off patches
ORIGINAL: dict = {}


def switch_off(config: str) -> None:
    """Switch the levers after ``config`` (``CONFIGS`` order) off: methods patched."""
    from laplace_from_scratch import matfree

    G = matfree.GGNOperator
    G.rows_per_pass = ORIGINAL["rows"]
    G.layers = ORIGINAL["layers"]
    if config == "before":  # one pass per stored batch
        G.rows_per_pass = lambda self, m: max(len(X) for X in self.batches)
    if config in ("before", "chunks"):
        G.layers = lambda self: []


def measure(model, X, y, Xq, config: str, repeats: int, ref) -> dict:
    import laplace_from_scratch as lfs
    from torch.utils.data import DataLoader, TensorDataset

    switch_off(config)
    loader = DataLoader(TensorDataset(X, y), batch_size=SETTINGS["batch_size"])
    pre = "lowrank" if config == "lowrank" else "none"
    la = lfs.Laplace(
        model,
        "classification",
        hessian_structure="matfree",
        prior_precision=1.0,
        n_probes=8,
        lanczos_steps=30,
        cg_tol=1e-6,
        cg_max_iter=300,
        preconditioner=pre,
    )
    t0 = time.perf_counter()
    la.fit(loader)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    la.log_marginal_likelihood()
    evidence_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    la(Xq[:1], link_approx="probit")  # warm-up; makes the preconditioner (lowrank)
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        probs = la(Xq, link_approx="probit")
        times.append(time.perf_counter() - t0)
    G = la.structure.H
    return {
        "config": config,
        "fit_s": fit_s,
        "evidence_s": evidence_s,
        "first_predict_s": first_s,
        "predict_s": min(times),
        "predict_all_s": times,
        "cg_iterations": la.structure.cg_iterations,
        "rows_per_pass_40": G.rows_per_pass(Xq.shape[0] * probs.shape[1]),
        "layerwise": bool(G.layers()),
        "max_abs_dp_vs_full": (probs - ref).abs().max().item(),
    }


def trained(spec: str):
    """The model trained as scale.py trains it (seed 0, float32), its training inputs
    and labels, and the 4 query images."""
    import torch
    from laplace_from_scratch import helpers

    torch.manual_seed(0)
    data = load_data(SETTINGS)
    model = build_model(spec, data, "cpu")
    X, y = inputs(spec, data.X_train), data.y_train
    helpers.train_map(
        model, X, y, "classification", prior_precision=1.0, n_steps=300, lr=3e-3
    )
    return model, X, y, inputs(spec, data.X_test[:4])


def run_model(spec: str, configs, repeats: int) -> list[dict]:
    import laplace_from_scratch as lfs
    from torch.utils.data import DataLoader, TensorDataset

    model, X, y, Xq = trained(spec)
    full = lfs.Laplace(model, "classification", prior_precision=1.0)
    full.fit(DataLoader(TensorDataset(X, y), batch_size=SETTINGS["batch_size"]))
    ref = full(Xq, link_approx="probit")
    rows = []
    for config in configs:
        r = {"model": spec, "P": full.n_params} | measure(
            model, X, y, Xq, config, repeats, ref
        )
        print(
            f"{spec:9s} {config:9s}: fit {r['fit_s']:7.2f} s  evidence "
            f"{r['evidence_s']:6.2f} s  first (1 query) {r['first_predict_s']:6.2f} s  "
            f"predict {r['predict_s']:7.2f} s  CG "
            f"{r['cg_iterations']:3d} iterations  |Δp| vs full "
            f"{r['max_abs_dp_vs_full']:.1e}",
            flush=True,
        )
        rows.append(r)
    first = rows[0]["predict_s"]
    for r in rows:
        r["speed_up_vs_first"] = first / r["predict_s"]
    return rows


def float64_check(spec: str) -> dict:
    """The default matrix-free predictive (low-rank preconditioner, ``cg_tol=1e-6``)
    of the model in float64 against full Laplace's dense f_var: the largest relative
    difference of the variances."""
    import laplace_from_scratch as lfs
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    model, X, y, Xq = trained(spec)
    model, X, Xq = model.double(), X.double(), Xq.double()
    loader = DataLoader(TensorDataset(X, y), batch_size=SETTINGS["batch_size"])
    variances = []
    for structure in ["full", "matfree"]:
        la = lfs.Laplace(
            model, "classification", hessian_structure=structure, prior_precision=1.0
        )
        la.fit(loader)
        variances.append(torch.diagonal(la.glm_predictive(Xq)[1], 0, 1, 2))
        its = getattr(la.structure, "cg_iterations", None)
    full, mf = variances
    rel = ((mf - full).abs() / full).max().item()
    print(f"{spec:9s} float64: matrix-free f_var vs full, max relative {rel:.1e}")
    return {"model": spec, "config": "lowrank", "dtype": "float64",
            "cg_iterations": its, "max_rel_fvar_vs_full": rel}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp:12:1", "cnn:8:16"])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument(
        "--cnn-configs",
        nargs="+",
        default=["chunks", "lowrank"],
        choices=CONFIGS,
        help="the CNN's: its 'layerwise' equals 'chunks' (no layer-wise product for a "
        "Conv2d), its 'before' timed out at 600 s in scale.py's CPU record",
    )
    ap.add_argument("--repeats", type=int, default=3, help="(the CNN: 1)")
    ap.add_argument("--out", default=None, help="the record's path (default: results/)")
    ap.add_argument(
        "--float64",
        action="store_true",
        help="only the float64 check of the MLPs, added to the record at --out",
    )
    args = ap.parse_args()
    from laplace_from_scratch import matfree

    G = matfree.GGNOperator
    ORIGINAL.update(rows=G.rows_per_pass, layers=G.layers)
    rows = []
    if args.float64:
        path = Path(args.out) if args.out else None
        record = json.loads(path.read_text()) if path and path.exists() else None
        rows = [float64_check(s) for s in args.models if s.startswith("mlp")]
        if record:
            record["rows"] += rows
            write_json(path, record)
            print("added to", path)
        return
    for spec in args.models:
        cnn = spec.startswith("cnn")
        configs = args.cnn_configs if cnn else args.configs
        rows += run_model(spec, configs, 1 if cnn else args.repeats)
    meta = machine_meta("cpu", settings=SETTINGS, args=vars(args))
    print("wrote", write_record("bench_matfree", meta, rows, args.out))


if __name__ == "__main__":
    main()
