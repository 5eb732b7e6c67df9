"""Calibration, OOD detection and the baselines, over seeds: the study behind notebook
09.

For one seed (network initialisation, dropout masks, ensemble members), :func:`run_seed`
trains an MLP and a CNN to the MAP, fits five Laplace structures, tunes δ by validation
(grid search) and by the evidence, builds the baselines (temperature scaling, a 5-member
deep ensemble, MC dropout), and scores every predictive on the test digits and four OOD
sets. Notebook 09 runs seed 0 live with these functions; this script runs several seeds
and records them:

    python benchmarks/calibration_study.py            # digits, seeds 0-4
    # MNIST-5k; the CNN's trainings take ~2.5 h per seed on 2 CPU cores
    LFS_SIZE=large python benchmarks/calibration_study.py --no-full --nets MLP
    # a run in parts, e.g. the CNN alone, is merged into one record with
    python benchmarks/calibration_study.py --merge RECORD.json OTHER.json

writes results/calibration_study_<size>_<date>_cpu.{json,log}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import laplace_from_scratch as lfs
import torch
from laplace_from_scratch import helpers
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

SIZES = {
    # data set, image side, MLP width, CNN channels, validation images held out of the
    # training split
    "small": dict(name="digits", side=8, width=50, channels=(8, 16), n_val=258),
    "large": dict(name="mnist", side=28, width=100, channels=(16, 32), n_val=500),
}
STRUCTURES = {  # name: (subset_of_weights, hessian_structure)
    "LL KFAC": ("last_layer", "kron"),
    "LL full": ("last_layer", "full"),
    "diag": ("all", "diag"),
    "KFAC": ("all", "kron"),
    "full": ("all", "full"),
}
# the prior precision the MAP is trained with (weight decay 1/N on the mean loss)
DELTA0 = 1.0
# 2 values per decade
GRID = dict(log_prior_prec_min=-2, log_prior_prec_max=5, grid_size=15)
N_OOD, N_ENSEMBLE, N_MC = 300, 5, 1000
# the links of the Laplace rows; the baselines' rows have link "-"
LINKS = ("probit", "MC")


def current_rows(rows: list[dict]) -> list[dict]:
    """The rows of a record whose link this study still computes: the baselines (link
    "-") and the Laplace predictives with a link in LINKS.

    The records of 2026-11-23 also have "sum-zero probit" rows: probit applied to (μ,
    CVC), the centred covariance with the uncentred mean, an inconsistent pair (probit
    is not invariant to a common shift of μ; see ``lfs.sum_zero``). They are withdrawn
    (results/README.md), and every reader of a record goes through this function.
    """
    return [r for r in rows if r.get("link", "-") in ("-", *LINKS)]


@dataclass
class Data:
    X: Tensor
    y: Tensor
    Xv: Tensor
    yv: Tensor
    Xt: Tensor
    yt: Tensor
    ood: dict[str, Tensor]
    side: int
    n_classes: int


def photo_patches(n: int, side: int, seed: int = 0) -> Tensor:
    """Grey-scale crops of scikit-learn's two sample photographs, averaged down to side
    × side, in [0, 1]."""
    from sklearn.datasets import load_sample_images

    g = torch.Generator().manual_seed(seed)
    imgs = [
        torch.as_tensor(im.mean(-1) / 255, dtype=torch.float32)
        for im in load_sample_images().images
    ]
    crop, patches = 4 * side, []
    for i in range(n):
        im = imgs[i % len(imgs)]
        r = int(torch.randint(0, im.shape[0] - crop, (1,), generator=g))
        c = int(torch.randint(0, im.shape[1] - crop, (1,), generator=g))
        patches.append(
            nn.functional.avg_pool2d(im[r : r + crop, c : c + crop][None, None], 4)[0]
        )
    P = torch.stack(patches).to(torch.get_default_dtype())
    lo, hi = P.amin((1, 2, 3), keepdim=True), P.amax((1, 2, 3), keepdim=True)
    return (P - lo) / (hi - lo)


def load(size: str = "small") -> Data:
    """The training/validation/test split (fixed: the seed of the study varies the
    networks, not the data) and the four OOD sets."""
    cfg = SIZES[size]
    d = helpers.image_data(cfg["name"], n_val=cfg["n_val"])
    X, side = d.X_train, cfg["side"]
    ood = {
        "uniform": helpers.noise_images(N_OOD, (1, side, side), seed=1),
        "salt": helpers.noise_images(
            N_OOD, (1, side, side), seed=2, kind="bernoulli", density=X.mean().item()
        ),
        "inverted": helpers.invert(d.X_test),
        "photos": photo_patches(N_OOD, side),
    }
    return Data(
        X, d.y_train, d.X_val, d.y_val, d.X_test, d.y_test, ood, side, d.n_classes
    )


def make_net(
    kind: str, data: Data, size: str, seed: int, dropout: float = 0.0
) -> nn.Module:
    cfg = SIZES[size]
    if kind == "MLP":
        layers = helpers.mlp(
            data.side**2, data.n_classes, width=cfg["width"], seed=seed, dropout=dropout
        )
        return nn.Sequential(nn.Flatten(), *layers)
    return helpers.cnn(
        data.n_classes,
        image_size=data.side,
        channels=cfg["channels"],
        seed=seed,
        dropout=dropout,
    )


def train(net: nn.Module, data: Data, lbfgs: bool = True) -> nn.Module:
    """MAP with δ₀: 1000 Adam steps, then (without dropout) 1000 L-BFGS iterations; eval
    mode after."""
    helpers.fit_map(
        net,
        data.X,
        data.y,
        "classification",
        prior_precision=DELTA0,
        adam_steps=1000,
        lbfgs_steps=1000 if lbfgs else 0,
    )
    return net.eval()


def grad_norm(net: nn.Module, data: Data) -> float:
    """‖∇_θ L(θ)‖ of the MAP objective (summed NLL + ½δ₀‖θ‖²) at the trained weights."""
    objective = helpers.map_objective(
        net, data.X, data.y, "classification", prior_precision=DELTA0
    )
    grads = torch.autograd.grad(
        objective, [p for p in net.parameters() if p.requires_grad]
    )
    return torch.cat([g.flatten() for g in grads]).norm().item()


def batched(fn, Z: Tensor, size: int = 500) -> Tensor:
    return torch.cat([fn(Zb) for Zb in Z.split(size)])


def laplace_links(la: lfs.Laplace, Z: Tensor, seed: int) -> dict[str, Tensor]:
    """The GLM predictive at Z with each link of LINKS: probit and MC (1000
    samples)."""
    f_mu, f_var = zip(*(la.glm_predictive(Zb) for Zb in Z.split(500)), strict=True)
    f_mu, f_var = torch.cat(f_mu), torch.cat(f_var)
    g = torch.Generator().manual_seed(seed)
    return {
        "probit": lfs.probit(f_mu, f_var),
        "MC": lfs.mc_softmax(f_mu, f_var, N_MC, g),
    }


def run_seed(
    size: str = "small",
    seed: int = 0,
    data: Data | None = None,
    structures: dict[str, list[str]] | None = None,
    ensemble: bool = True,
    dropout: bool = True,
):
    """Everything for one seed. Returns (rows, extras): rows are JSON-ready dicts, one
    per (network, predictive, tuning rule, link); extras keeps the networks, posteriors
    and probabilities for plots.

    ``structures``: the Laplace structures (keys of STRUCTURES) per network, default all
    of them for both; ``ensemble``/``dropout``: train the deep ensemble and the
    MC-dropout network (the slow baselines).
    """
    data = data or load(size)
    if structures is None:
        structures = {"MLP": list(STRUCTURES), "CNN": list(STRUCTURES)}
    loader = DataLoader(TensorDataset(data.X, data.y), batch_size=256)
    val_loader = DataLoader(TensorDataset(data.Xv, data.yv), batch_size=500)
    sets = {"test": data.Xt, **data.ood}
    rows, extras = (
        [],
        {"nets": {}, "laplace": {}, "probs": {}, "grad_norm": {}, "seconds": {}},
    )
    for kind in structures:
        t0 = time.perf_counter()
        net = train(make_net(kind, data, size, 1000 * seed), data)
        extras["nets"][kind], extras["grad_norm"][kind] = net, grad_norm(net, data)
        with torch.no_grad():
            T = helpers.fit_temperature(batched(net, data.Xv), data.yv)
        predictives = {  # (method, rule, link) -> function of images
            ("MAP", "-", "-"): lambda Z, net=net: torch.softmax(net(Z), -1),
            ("MAP + temperature", "validation", "-"): lambda Z, net=net, T=T: (
                torch.softmax(net(Z) / T, -1)
            ),
        }
        # the MAP network and N_ENSEMBLE - 1 more, from other initialisations
        if ensemble:
            more = [
                train(make_net(kind, data, size, 1000 * seed + m), data)
                for m in range(1, N_ENSEMBLE)
            ]
            members = [net, *more]
            predictives["ensemble (5)", "-", "-"] = lambda Z, ms=members: (
                helpers.ensemble_probs(ms, Z)
            )
        # the same architecture with dropout 0.1, trained by Adam alone (its loss is
        # random)
        if dropout:
            d_net = train(
                make_net(kind, data, size, 1000 * seed, dropout=0.1), data, lbfgs=False
            )
            predictives["MC dropout", "-", "-"] = lambda Z, d=d_net: (
                helpers.mc_dropout_probs(d, Z, 100, seed)
            )
        tuned = {
            ("MAP + temperature", "validation", "-"): T
        }  # T for temperature scaling, δ for Laplace
        with torch.no_grad():
            for key, fn in predictives.items():
                for s, Z in sets.items():
                    extras["probs"][(kind, *key, s)] = batched(fn, Z)
        extras["seconds"][kind, "train + baselines"] = time.perf_counter() - t0
        for method in structures[kind]:
            subset, structure = STRUCTURES[method]
            t0 = time.perf_counter()
            la = lfs.Laplace(
                net,
                "classification",
                subset_of_weights=subset,
                hessian_structure=structure,
            )
            la.fit(loader)
            la.optimize_prior_precision(method="marglik")
            d_ev = la.prior_precision.item()
            la.optimize_prior_precision(
                method="gridsearch", val_loader=val_loader, **GRID
            )
            d_val = la.prior_precision.item()
            for rule, d in (("validation", d_val), ("evidence", d_ev)):
                la.prior_precision = d
                for s, Z in sets.items():
                    for link, p in laplace_links(la, Z, seed).items():
                        extras["probs"][(kind, method, rule, link, s)] = p
                for link in LINKS:
                    tuned[(method, rule, link)] = d
            extras["laplace"][kind, method] = la
            extras["seconds"][kind, method] = time.perf_counter() - t0
        for key in [*predictives, *(k for k in tuned if k not in predictives)]:
            probs = {s: extras["probs"][(kind, *key, s)] for s in sets}
            method, rule, link = key
            rows.append(score(probs, data, seed, net=kind, method=method, rule=rule,
                              link=link, tuned=tuned.get(key)))  # fmt: skip
    return rows, extras


def score(probs: dict[str, Tensor], data: Data, seed: int, **key) -> dict:
    """One row of a record: ``key`` (net, method, rule, link, tuned), then accuracy,
    NLL, Brier, ECE and mean confidence of ``probs["test"]`` and, for each OOD set, the
    AUROC of ``probs["test"]`` against ``probs[set]`` with its bootstrap interval."""
    p = probs["test"]
    row = {"seed": seed, **key, "acc": helpers.accuracy(p, data.yt)}
    row |= {
        "nll": helpers.nll(p, data.yt),
        "brier": helpers.brier(p, data.yt),
        "ece": helpers.ece(p, data.yt),
        "confidence": p.max(-1).values.mean().item(),
    }
    for s in data.ood:
        v, lo, hi = helpers.ood_auroc_interval(p, probs[s], seed=seed)
        row[f"auroc_{s}"], row[f"auroc_{s}_ci"] = v, [lo, hi]
    return row


# what two records must share to be one study
SAME = ("device", "device_name", "threads", "torch", "laplace_torch", "python", "size")
SAME += ("structures", "n_train", "n_val", "n_test", "delta0", "grid", "env")


def per_net(meta: dict, field: str) -> dict:
    """meta's ``<field>_per_net``, or the record-wide ``field`` for each network (a
    record of one invocation)."""
    if f"{field}_per_net" in meta:
        return meta[f"{field}_per_net"]
    # records made before --no-ensemble existed all have the ensemble
    value = meta.get(field, True if field == "ensemble" else None)
    if field == "seconds" and len(meta["nets"]) > 1:
        value = None  # one run's time for several networks: not split
    return {net: value for net in meta["nets"]}


def merge_records(record: dict, other: dict) -> dict:
    """One record from two invocations of the same study (a long run split by network
    or by seeds): the rows of both; meta keeps each network's seeds, seconds and
    whether it has the ensemble, and the command line of each run.

    Rows of withdrawn links (not in LINKS, see :func:`current_rows`) are left out.
    Raises ValueError if the records differ in machine, versions, data or settings
    (``SAME``), if both have a (network, seed), or if a network has the ensemble in one
    and not the other.
    """
    m, o = record["meta"], other["meta"]
    differ = [k for k in SAME if m.get(k) != o.get(k)]
    if differ:
        raise ValueError(f"the records differ in {differ}: not one study")
    both = {(r["net"], r["seed"]) for r in record["rows"]}
    both &= {(r["net"], r["seed"]) for r in other["rows"]}
    if both:
        raise ValueError(f"both records have (network, seed) {sorted(both)}")
    seeds, seconds, ensemble = ({}, {}, {})
    for meta in (m, o):
        for net in meta["nets"]:
            seeds[net] = sorted(seeds.get(net, []) + per_net(meta, "seeds")[net])
            t = per_net(meta, "seconds")[net]
            seconds[net] = (
                None if None in (t, seconds.get(net, 0)) else t + seconds.get(net, 0)
            )
            flag = per_net(meta, "ensemble")[net]
            if ensemble.setdefault(net, flag) != flag:
                raise ValueError(f"{net} has the ensemble in one record only")

    def runs(meta: dict) -> list[str]:
        # the command line of an unmerged record, from its meta
        flags = "" if "full" in meta["structures"] else " --no-full"
        flags += "" if meta.get("ensemble", True) else " --no-ensemble"
        seed_list = " ".join(map(str, meta["seeds"]))
        return [f"--seeds {seed_list}{flags} --nets {' '.join(meta['nets'])}"]

    nets = list(dict.fromkeys([*m["nets"], *o["nets"]]))
    meta = m | {
        "nets": nets,
        "seeds": sorted(set().union(*seeds.values())),
        "seconds": m["seconds"] + o["seconds"],
        "seeds_per_net": seeds,
        "seconds_per_net": seconds,
        "ensemble_per_net": ensemble,
        "runs": m.get("runs", runs(m)) + o.get("runs", runs(o)),
    }
    meta.pop("ensemble", None)
    return {"meta": meta, "rows": current_rows(record["rows"] + other["rows"])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument(
        "--size", default=os.environ.get("LFS_SIZE", "small"), choices=list(SIZES)
    )
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--no-full", action="store_true", help="skip all-weights full Laplace (large P)"
    )
    parser.add_argument(
        "--nets",
        nargs="+",
        default=["MLP", "CNN"],
        choices=["MLP", "CNN"],
        help="networks to study (the large CNN's trainings take most of the time)",
    )
    parser.add_argument(
        "--no-ensemble",
        action="store_true",
        help="skip the deep ensemble (four more trainings per network)",
    )
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import machine_meta, merge, merge_args, write_record

    merge_args(parser, "rows")
    args = parser.parse_args()
    if merge(args, merge_records):
        return
    torch.set_default_dtype(torch.float32)

    data, rows, t0, done = load(args.size), [], time.perf_counter(), []
    for seed in args.seeds:
        t = time.perf_counter()
        names = [m for m in STRUCTURES if not (args.no_full and m == "full")]
        seed_rows, extras = run_seed(
            args.size,
            seed,
            data,
            {net: names for net in args.nets},
            ensemble=not args.no_ensemble,
        )
        rows, done = rows + seed_rows, done + [seed]
        print(
            f"seed {seed}: {time.perf_counter() - t:.0f} s, ‖∇L‖ at the MAP "
            + ", ".join(f"{k} {v:.2g}" for k, v in extras["grad_norm"].items()),
            flush=True,
        )
        # written after every seed, so that a long run stopped early keeps the seeds it
        # finished
        meta = machine_meta(
            "cpu",
            size=args.size,
            seeds=done,
            nets=args.nets,
            structures=names,
            ensemble=not args.no_ensemble,
            seconds=round(time.perf_counter() - t0),
        )
        meta |= dict(
            n_train=len(data.y),
            n_val=len(data.yv),
            n_test=len(data.yt),
            delta0=DELTA0,
            grid=GRID,
        )
        pins = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")
        meta["env"] = {k: os.environ.get(k) for k in pins}
        path = write_record(f"calibration_study_{args.size}", meta, rows, args.out)
    print(json.dumps(meta))
    print("wrote", path)


if __name__ == "__main__":
    main()
