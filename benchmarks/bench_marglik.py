"""Time hyperparameter tuning by the evidence: ours vs laplace-torch, in the same run.

Two-hidden-layer tanh MLPs on the sinusoid (N = 150), float32, full GGN over all
weights: width 50 (P = 2701) and width 100 (P = 10401). For each size:

* both libraries fit the curvature (laplace-torch with its fastest backend, BackPACK,
  and its default, curvlinops: the fit is the only step where the backend matters);
* laplace-torch's ``optimize_prior_precision`` (Adam on log δ, lr 0.1, 100 steps; a
  Cholesky and its backward at every step), ours with the same defaults, and ours tuning
  (δ, σ) jointly;
* the optima are compared.

laplace-torch's 100 steps take most of an hour at P ≈ 10k on 2 CPU threads, so above
``--full-steps-max-p`` we time ``--lt-steps`` of its steps, extrapolate linearly to 100
and say so; the optimum is then compared through laplace-torch's own evidence gradient
at our δ.

    python benchmarks/bench_marglik.py [--widths 50 100] [--lt-steps 2] [--device cpu]

Prints the ratios and writes results/bench_marglik_<date>.json (machine, versions,
date).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import platform
import time
from pathlib import Path

import laplace
import laplace_from_scratch as lfs
import torch
from laplace.curvature import BackPackGGN, CurvlinopsGGN
from laplace_from_scratch import helpers
from torch.utils.data import DataLoader, TensorDataset

from common import cpu_name  # benchmarks/common.py (the script's folder is on sys.path)

SIGMA, DELTA = 0.3, 1.0


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def run_size(width: int, device: str, lt_steps: int, full_steps_max_p: int) -> dict:
    data = helpers.sinusoid(dtype=torch.float32)
    X, y = data.X_train.to(device), data.y_train.to(device)
    model = helpers.mlp(1, 1, width=width, dtype=torch.float32).to(device)
    helpers.train_map(model, X, y, "regression", SIGMA, DELTA, n_steps=2000, lr=1e-2)
    loader = DataLoader(TensorDataset(X, y), batch_size=150)
    P = sum(p.numel() for p in model.parameters())
    print(f"\n== width {width}: P = {P}, N = {X.shape[0]}, float32, {device}")
    rec: dict = {"width": width, "P": P, "N": X.shape[0]}

    # ours
    ours = lfs.Laplace(model, "regression", sigma_noise=SIGMA, prior_precision=DELTA)
    _, rec["ours_fit_s"] = timed(lambda: ours.fit(loader))
    _, rec["ours_tune_delta_s"] = timed(
        lambda: ours.optimize_prior_precision(method="marglik")
    )
    rec["ours_delta"] = ours.prior_precision.item()
    rec["ours_lml_at_delta"] = ours.log_marginal_likelihood().item()
    ours_joint = lfs.Laplace(
        model, "regression", sigma_noise=SIGMA, prior_precision=DELTA
    )
    ours_joint.fit(loader)
    hist, rec["ours_tune_delta_sigma_s"] = timed(
        lambda: ours_joint.optimize_hyperparameters(n_steps=500, lr=0.1)
    )
    rec["ours_joint_delta"], rec["ours_joint_sigma"] = (
        ours_joint.prior_precision.item(),
        ours_joint.sigma_noise.item(),
    )
    rec["ours_joint_last_change"] = abs(hist[-1] - hist[-2])
    print(
        f"ours: fit {rec['ours_fit_s']:.2f} s | tune delta (100 steps) "
        f"{rec['ours_tune_delta_s']:.3f} s -> "
        f"delta {rec['ours_delta']:.6g} | tune (delta, sigma) (500 steps) "
        f"{rec['ours_tune_delta_sigma_s']:.3f} s -> "
        f"delta {rec['ours_joint_delta']:.4g}, sigma {rec['ours_joint_sigma']:.4g}"
    )

    # float64 reference optimum: the same model and data in float64 (eigen route, equal
    # to Cholesky)
    ref64 = lfs.Laplace(
        copy.deepcopy(model).double(),
        "regression",
        sigma_noise=SIGMA,
        prior_precision=DELTA,
    )
    ref64.fit(DataLoader(TensorDataset(X.double(), y.double()), batch_size=150))
    ref64.optimize_prior_precision(method="marglik")
    rec["ref64_delta"] = ref64.prior_precision.item()
    rec["ours_delta_rel_diff_to_ref64"] = abs(
        rec["ours_delta"] / rec["ref64_delta"] - 1
    )
    print(
        f"float64 reference: delta {rec['ref64_delta']:.6g}; ours (float32) differs by "
        f"{rec['ours_delta_rel_diff_to_ref64']:.1e}"
    )

    # laplace-torch: fit with both backends
    las = {}
    for name, backend in [("backpack", BackPackGGN), ("curvlinops", CurvlinopsGGN)]:
        la = laplace.Laplace(
            model,
            "regression",
            subset_of_weights="all",
            hessian_structure="full",
            sigma_noise=SIGMA,
            prior_precision=DELTA,
            backend=backend,
        )
        _, rec[f"lt_fit_{name}_s"] = timed(lambda la=la: la.fit(loader))
        las[name] = la
        print(f"laplace-torch ({name}): fit {rec[f'lt_fit_{name}_s']:.2f} s")
    # the tuning loop does not involve the backend; time it once
    la = las["backpack"]
    if P <= full_steps_max_p:
        _, t = timed(lambda: la.optimize_prior_precision(method="marglik"))
        rec["lt_tune_delta_s"], rec["lt_tune_extrapolated"] = t, False
        rec["lt_delta"] = la.prior_precision.item()
        rec["delta_rel_diff"] = abs(rec["ours_delta"] / rec["lt_delta"] - 1)
        rec["lt_delta_rel_diff_to_ref64"] = abs(
            rec["lt_delta"] / rec["ref64_delta"] - 1
        )
        print(
            f"laplace-torch: optimize_prior_precision (100 steps) {t:.1f} s -> delta "
            f"{rec['lt_delta']:.6g}; "
            f"relative difference to ours {rec['delta_rel_diff']:.1e}, "
            f"to the float64 reference {rec['lt_delta_rel_diff_to_ref64']:.1e}"
        )
    else:
        _, t = timed(
            lambda: la.optimize_prior_precision(method="marglik", n_steps=lt_steps)
        )
        rec["lt_tune_delta_s"], rec["lt_tune_extrapolated"] = t * 100 / lt_steps, True
        rec["lt_steps_timed"], rec["lt_steps_timed_s"] = lt_steps, t
        # same optimum? laplace-torch's own evidence and its gradient at our delta
        log_d = (
            torch.tensor(rec["ours_delta"], device=device).log().requires_grad_(True)
        )
        lml, t_step = timed(
            lambda: la.log_marginal_likelihood(prior_precision=log_d.exp())
        )
        (g,) = torch.autograd.grad(lml, log_d)
        rec["lt_lml_at_ours_delta"], rec["lt_grad_log_delta_at_ours_delta"] = (
            lml.item(),
            g.item(),
        )
        rec["lml_rel_diff_at_ours_delta"] = abs(
            rec["ours_lml_at_delta"] / lml.item() - 1
        )
        # where is laplace-torch's optimum? one Newton step from our δ with its gradient
        # and our curvature
        ld = (
            torch.tensor(rec["ours_delta"], dtype=torch.float64)
            .log()
            .requires_grad_(True)
        )
        (g1,) = torch.autograd.grad(
            ref64.log_marginal_likelihood(prior_precision=ld.exp()),
            ld,
            create_graph=True,
        )
        (g2,) = torch.autograd.grad(g1, ld)
        ref64.prior_precision = rec["ref64_delta"]
        rec["lt_delta_implied"] = rec["ours_delta"] * math.exp(-g.item() / g2.item())
        rec["delta_rel_diff_implied"] = abs(
            rec["lt_delta_implied"] / rec["ours_delta"] - 1
        )
        print(
            f"laplace-torch: {lt_steps} steps of optimize_prior_precision {t:.1f} s "
            f"-> 100 steps EXTRAPOLATED {rec['lt_tune_delta_s']:.0f} s"
        )
        print(
            f"laplace-torch at our delta: evidence {lml.item():.6g} (ours "
            f"{rec['ours_lml_at_delta']:.6g}, "
            f"relative difference {rec['lml_rel_diff_at_ours_delta']:.1e}); "
            f"d evidence / d log delta = {g.item():.2e}"
        )
        print(
            "  -> one Newton step with our curvature puts laplace-torch's optimum at "
            "delta "
            f"{rec['lt_delta_implied']:.6g}: relative difference to ours "
            f"{rec['delta_rel_diff_implied']:.1e} (implied)"
        )
    rec["ratio_tune_delta"] = rec["lt_tune_delta_s"] / rec["ours_tune_delta_s"]
    rec["ratio_tune_lt_delta_vs_ours_delta_sigma"] = (
        rec["lt_tune_delta_s"] / rec["ours_tune_delta_sigma_s"]
    )
    print(
        "ratio laplace-torch / ours, tuning delta (100 steps each): "
        f"{rec['ratio_tune_delta']:.0f}x"
        f"{' (laplace-torch extrapolated)' if rec['lt_tune_extrapolated'] else ''}"
    )
    print(
        f"ratio laplace-torch delta-only / ours (delta, sigma) to convergence: "
        f"{rec['ratio_tune_lt_delta_vs_ours_delta_sigma']:.0f}x"
    )
    return rec


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--widths", type=int, nargs="+", default=[50, 100])
    parser.add_argument("--lt-steps", type=int, default=2)
    parser.add_argument("--full-steps-max-p", type=int, default=5000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "results"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    meta = {
        "benchmark": "bench_marglik",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "cpu": cpu_name(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "laplace_torch": getattr(laplace, "__version__", "0.3"),
        "dtype": "float32",
    }
    print(json.dumps(meta, indent=1))
    results = [
        run_size(w, args.device, args.lt_steps, args.full_steps_max_p)
        for w in args.widths
    ]
    args.out.mkdir(exist_ok=True)
    path = args.out / f"bench_marglik_{meta['date'][:10]}_{args.device}.json"
    path.write_text(json.dumps({**meta, "results": results}, indent=1))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
