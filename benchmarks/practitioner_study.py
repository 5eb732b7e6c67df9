"""Where post-hoc Laplace earns its keep: networks trained the way practitioners train
them, over seeds. The study behind notebooks 00 and 09.

The recipe (``RECIPE``): Adam on the mean cross-entropy with weight decay 5e-4 (an L2
penalty, so the trained weights are the MAP under the prior δ₀ = N·wd,
``helpers.weight_decay_to_prior_precision``), mini-batches of 128, 60 epochs, the
learning rate decayed to 0 by a cosine; training loss near zero. The networks: an MLP
with two ReLU layers of 256 and a LeNet-style CNN (two 3×3 conv-ReLU-pool blocks of 16
and 32 channels, a hidden layer of 128). For one seed (initialisations, batch order,
dropout masks) :func:`run_seed` trains both and scores, on the test digits, four OOD
sets and 500 test digits rotated by 0°-180°:

- MAP; MAP with temperature scaling (T on the validation split); a deep ensemble of 5;
  MC dropout (p = 0.1, the same recipe, 100 passes);
- Laplace with last-layer KFAC, last-layer full, all-weights diag and all-weights KFAC,
  post hoc on the MAP network, with δ from the weight decay (δ₀), by the evidence
  (laplace-torch's default tuning) and by validation (grid search, per link);
- online marginal likelihood (Immer et al., 2021; ``lfs.marglik_training``, a δ per
  tensor learned while training from δ₀, the same recipe): all-weights diag and KFAC
  with their own Laplace, and the last-layer structures on the online KFAC network with
  the δ it learned for the last layer;

each Laplace predictive with two links, Monte Carlo (``N_MC`` samples; a second run with
``N_MC_CHECK`` samples measures its error) and probit (laplace-torch's default).

    python benchmarks/practitioner_study.py                    # MNIST-5k, seeds 0-4
    python benchmarks/practitioner_study.py --size digits      # the calibrated contrast
    python benchmarks/practitioner_study.py --merge A.json B.json   # a run in parts

writes results/practitioner_study_<size>_<date>_cpu.{json,log} after every seed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import laplace_from_scratch as lfs
import torch
from laplace_from_scratch import helpers
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_study as cs  # noqa: E402

SIZES = {"mnist": "large", "digits": "small"}  # calibration_study's split of each set
RECIPE = dict(epochs=60, batch_size=128, lr=1e-3, weight_decay=5e-4)
STRUCTURES = {  # name: (subset_of_weights, hessian_structure)
    "LL KFAC": ("last_layer", "kron"),
    "LL full": ("last_layer", "full"),
    "diag": ("all", "diag"),
    "KFAC": ("all", "kron"),
}
ONLINE = {"diag": "diag", "KFAC": "kron"}  # online marginal likelihood, all weights
# the online schedule: the recipe's epochs, batches and cosine decay; after a burn-in
# of 10 epochs, an evidence step of 50 Adam steps on log δ every 5 epochs
SCHEDULE = dict(n_epochs_burnin=10, marglik_frequency=5, n_hypersteps=50, lr_hyp=0.1)
GRID = dict(log_prior_prec_min=-2, log_prior_prec_max=6, grid_size=17)
N_ENSEMBLE, N_DROPOUT, DROPOUT = 5, 100, 0.1
N_MC, N_MC_CHECK = 1000, 10_000
# the rotation curve: the first N_ROT test digits, turned by each angle
ANGLES, N_ROT = tuple(range(0, 181, 15)), 500
LINKS = ("MC", "probit")
LINK_ARGS = {"MC": dict(link_approx="mc", n_samples=N_MC), "probit": {}}


def make_net(kind: str, data: cs.Data, seed: int, dropout: float = 0.0) -> nn.Module:
    """The MLP (two ReLU layers of 256) or the CNN (``helpers.cnn`` with channels (16,
    32) and a hidden layer of 128), initialised from ``seed``."""
    if kind == "MLP":
        layers = helpers.mlp(
            data.side**2,
            data.n_classes,
            width=256,
            activation=nn.ReLU,
            seed=seed,
            dropout=dropout,
        )
        return nn.Sequential(nn.Flatten(), *layers)
    return helpers.cnn(
        data.n_classes,
        image_size=data.side,
        channels=(16, 32),
        hidden=128,
        seed=seed,
        dropout=dropout,
    )


def train(net: nn.Module, data: cs.Data, seed: int) -> nn.Module:
    """The recipe on the training split; eval mode after."""
    helpers.train_minibatch(net, data.X, data.y, seed=seed, **RECIPE)
    return net


def delta0(data: cs.Data) -> float:
    """The prior precision the recipe's weight decay stands for: δ₀ = N·wd."""
    return helpers.weight_decay_to_prior_precision(RECIPE["weight_decay"], len(data.y))


def shift_sets(data: cs.Data) -> dict[str, Tensor]:
    """The inputs every predictive is scored on: the test digits, the OOD sets and the
    first N_ROT test digits rotated ("rot0", "rot15", ...)."""
    rotated = {f"rot{a}": helpers.rotate(data.Xt[:N_ROT], a) for a in ANGLES}
    return {"test": data.Xt, **data.ood, **rotated}


def glm(la: lfs.Laplace, Z: Tensor) -> tuple[Tensor, Tensor]:
    f_mu, f_var = zip(*(la.glm_predictive(Zb) for Zb in Z.split(500)), strict=True)
    return torch.cat(f_mu), torch.cat(f_var)


def linked(f_mu: Tensor, f_var: Tensor, link: str, seed: int, n: int = N_MC) -> Tensor:
    """Class probabilities of one GLM predictive by ``link``; MC from a generator
    seeded with ``seed``."""
    if link == "probit":
        return lfs.probit(f_mu, f_var)
    return lfs.mc_softmax(f_mu, f_var, n, torch.Generator().manual_seed(seed))


def shift_scores(p: Tensor, y: Tensor) -> dict[str, float]:
    return {
        "acc": helpers.accuracy(p, y),
        "nll": helpers.nll(p, y),
        "ece": helpers.ece(p, y),
        "confidence": p.max(-1).values.mean().item(),
    }


def row(probs: dict[str, Tensor], data: cs.Data, seed: int, **key) -> dict:
    """``cs.score`` (test metrics, OOD AUROCs with intervals) plus accuracy, NLL, ECE
    and confidence at every angle (``rot``: {angle: {...}}, on the first N_ROT test
    digits)."""
    r = cs.score(probs, data, seed, **key)
    r["rot"] = {a: shift_scores(probs[f"rot{a}"], data.yt[:N_ROT]) for a in ANGLES}
    return r


def grid_delta(la: lfs.Laplace, data: cs.Data, link: str, seed: int) -> float:
    """δ with the lowest validation NLL on GRID, scored with ``link`` (MC from a seeded
    state, so the choice repeats)."""
    val_loader = DataLoader(TensorDataset(data.Xv, data.yv), batch_size=500)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        la.optimize_prior_precision(
            method="gridsearch", val_loader=val_loader, **LINK_ARGS[link], **GRID
        )
    return la.prior_precision.item()


def online(net: nn.Module, data: cs.Data, structure: str, seed: int):
    """``lfs.marglik_training`` with the recipe and SCHEDULE, from δ₀; the network is
    trained in place (and left in eval mode). Returns (la, margliks)."""
    loader = DataLoader(
        TensorDataset(data.X, data.y),
        batch_size=RECIPE["batch_size"],
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    la, net, margliks, _ = lfs.marglik_training(
        net,
        loader,
        "classification",
        structure,
        optimizer_kwargs={"lr": RECIPE["lr"]},
        scheduler_cls=torch.optim.lr_scheduler.CosineAnnealingLR,
        scheduler_kwargs={"T_max": RECIPE["epochs"] * len(loader)},
        n_epochs=RECIPE["epochs"],
        prior_structure="layerwise",
        prior_prec_init=delta0(data),
        **SCHEDULE,
    )
    net.eval()
    return la, margliks


def mackay(la: lfs.Laplace) -> dict[str, float]:
    """P, ‖θ‖² of the Laplace weights and MacKay's effective number of parameters γ =
    P − Σᵢ δᵢ Σᵢᵢ (the number of directions the data determine). With a scalar δ and
    prior mean 0, the evidence is stationary in δ exactly where δ‖θ‖² = γ."""
    delta = la.prior_precision_diag.expand_as(la.mean)
    gamma = la.mean.numel() - (delta * la.posterior_variance).sum()
    theta_sq = (la.mean**2).sum()
    return {
        "n_params": la.mean.numel(),
        "theta_sq": theta_sq.item(),
        "gamma": gamma.item(),
    }


def norms(net: nn.Module, init: nn.Module) -> dict[str, float]:
    """‖θ‖² of a trained network and ‖θ − θ_init‖², how far training moved it."""
    theta = nn.utils.parameters_to_vector(net.parameters()).detach()
    theta0 = nn.utils.parameters_to_vector(init.parameters()).detach()
    return {
        "theta_sq": (theta**2).sum().item(),
        "moved_sq": ((theta - theta0) ** 2).sum().item(),
    }


def run_seed(data: cs.Data, seed: int, nets=("MLP", "CNN"), baselines: bool = True):
    """Every row of one seed, and extras (networks, posteriors, δs, seconds)."""
    sets = shift_sets(data)
    loader = DataLoader(TensorDataset(data.X, data.y), batch_size=256)
    rows, extras = [], {"nets": {}, "laplace": {}, "seconds": {}, "online": {}}

    def add(
        kind: str,
        probs: dict[str, Tensor],
        method: str,
        rule="-",
        link="-",
        tuned=None,
        **more,
    ) -> None:
        rows.append(
            row(
                probs,
                data,
                seed,
                net=kind,
                method=method,
                rule=rule,
                link=link,
                tuned=tuned,
                **more,
            )
        )

    def plain(fn: Callable[[Tensor], Tensor]) -> dict[str, Tensor]:
        with torch.no_grad():
            return {s: cs.batched(fn, Z) for s, Z in sets.items()}

    def laplace_rows(
        kind: str, la: lfs.Laplace, method: str, rule: str, links=LINKS
    ) -> None:
        d, diagnostics = la.prior_precision.tolist(), mackay(la)
        by_set = {s: glm(la, Z) for s, Z in sets.items()}
        # MC's own error: a second run with ten times the samples, on the test set
        check = linked(*by_set["test"], "MC", seed + 1, N_MC_CHECK)
        diagnostics["nll_mc_check"] = helpers.nll(check, data.yt)
        for link in links:
            probs = {s: linked(*fv, link, seed) for s, fv in by_set.items()}
            add(kind, probs, method, rule, link, d, **diagnostics)

    for kind in nets:
        t0 = time.perf_counter()
        base = 1000 * seed
        net = train(make_net(kind, data, base), data, seed)
        extras["nets"][kind] = net
        add(
            kind,
            plain(lambda Z, n=net: torch.softmax(n(Z), -1)),
            "MAP",
            **norms(net, make_net(kind, data, base)),
        )
        with torch.no_grad():
            T = helpers.fit_temperature(cs.batched(net, data.Xv), data.yv)
        add(
            kind,
            plain(lambda Z, n=net, T=T: torch.softmax(n(Z) / T, -1)),
            "MAP + temperature",
            "validation",
            tuned=T,
        )
        if baselines:
            members = [net] + [
                train(make_net(kind, data, base + m), data, seed + m)
                for m in range(1, N_ENSEMBLE)
            ]
            add(
                kind,
                plain(lambda Z, ms=members: helpers.ensemble_probs(ms, Z)),
                f"ensemble ({N_ENSEMBLE})",
            )
            d_net = train(make_net(kind, data, base, dropout=DROPOUT), data, seed)
            add(
                kind,
                plain(
                    lambda Z, d=d_net: helpers.mc_dropout_probs(d, Z, N_DROPOUT, seed)
                ),
                "MC dropout",
            )
        extras["seconds"][kind, "MAP + baselines"] = time.perf_counter() - t0
        for method, (subset, structure) in STRUCTURES.items():
            t0 = time.perf_counter()
            la = lfs.Laplace(
                net,
                "classification",
                subset_of_weights=subset,
                hessian_structure=structure,
                prior_precision=delta0(data),
            )
            la.fit(loader)
            laplace_rows(kind, la, method, "weight decay")
            la.optimize_prior_precision(method="marglik")
            laplace_rows(kind, la, method, "evidence")
            for link in LINKS:  # δ by validation, scored with the link it serves
                la.prior_precision = grid_delta(la, data, link, seed)
                laplace_rows(kind, la, method, "validation", links=(link,))
            extras["laplace"][kind, method] = la
            extras["seconds"][kind, method] = time.perf_counter() - t0
        for method, structure in ONLINE.items():
            t0 = time.perf_counter()
            o_net = make_net(kind, data, base)
            la, margliks = online(o_net, data, structure, seed)
            extras["online"][kind, method] = {
                "margliks": margliks,
                "delta": la.prior_precision.tolist(),
            }
            add(
                kind,
                plain(lambda Z, n=o_net: torch.softmax(n(Z), -1)),
                f"online {method}, network",
                **norms(o_net, make_net(kind, data, base)),
            )
            laplace_rows(kind, la, method, "online")
            if method == "KFAC":  # the last layer of the online network, its learned δ
                last = la.prior_precision[-2:]  # the last weight and bias tensors
                for ll, (subset, structure) in STRUCTURES.items():
                    if subset != "last_layer":
                        continue
                    la_ll = lfs.Laplace(
                        o_net,
                        "classification",
                        subset_of_weights=subset,
                        hessian_structure=structure,
                        prior_precision=last,
                    )
                    la_ll.fit(loader)
                    laplace_rows(kind, la_ll, ll, "online")
            extras["seconds"][kind, f"online {method}"] = time.perf_counter() - t0
        print(
            f"seed {seed} {kind}: "
            + ", ".join(
                f"{m} {t:.0f} s" for (k, m), t in extras["seconds"].items() if k == kind
            ),
            flush=True,
        )
    return rows, extras


# what two records must share to be one study
SAME = ("device", "device_name", "threads", "torch", "laplace_torch", "python", "size")
SAME += ("recipe", "schedule", "grid", "n_train", "n_val", "n_test", "delta0", "env")


def merge_records(record: dict, other: dict) -> dict:
    """One record from two runs on other seeds or networks."""
    m, o = record["meta"], other["meta"]
    differ = [k for k in SAME if m.get(k) != o.get(k)]
    if differ:
        raise ValueError(f"the records differ in {differ}: not one study")
    key = lambda r: (r["net"], r["seed"])  # noqa: E731
    both = {key(r) for r in record["rows"]} & {key(r) for r in other["rows"]}
    if both:
        raise ValueError(f"both records have (network, seed) {sorted(both)}")
    meta = m | {
        "seeds": sorted(set(m["seeds"]) | set(o["seeds"])),
        "nets": list(dict.fromkeys([*m["nets"], *o["nets"]])),
        "seconds": m["seconds"] + o["seconds"],
        "online": m["online"] + o["online"],
        "parts": m.get("parts", [m["argv"]]) + o.get("parts", [o["argv"]]),
    }
    return {"meta": meta, "rows": record["rows"] + other["rows"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--size", default="mnist", choices=list(SIZES))
    parser.add_argument(
        "--nets", nargs="+", default=["MLP", "CNN"], choices=["MLP", "CNN"]
    )
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--epochs",
        type=int,
        default=RECIPE["epochs"],
        help="the recipe's epochs (a smoke test uses a few)",
    )
    from common import machine_meta, merge, merge_args, write_record

    merge_args(parser, "rows")
    args = parser.parse_args()
    if merge(args, merge_records):
        return
    torch.set_default_dtype(torch.float32)
    RECIPE["epochs"] = args.epochs

    data = cs.load(SIZES[args.size])
    rows, online_runs, t0, done = [], [], time.perf_counter(), []
    for seed in args.seeds:
        t = time.perf_counter()
        seed_rows, extras = run_seed(data, seed, args.nets)
        rows, done = rows + seed_rows, done + [seed]
        online_runs += [
            {"seed": seed, "net": k, "structure": m, **v}
            for (k, m), v in extras["online"].items()
        ]
        print(
            f"seed {seed}: {time.perf_counter() - t:.0f} s ("
            + ", ".join(
                f"{' '.join(k)} {v:.0f} s" for k, v in extras["seconds"].items()
            )
            + ")",
            flush=True,
        )
        meta = machine_meta(
            "cpu",
            size=args.size,
            seeds=done,
            nets=args.nets,
            seconds=round(time.perf_counter() - t0),
        )
        meta |= dict(
            recipe=RECIPE,
            schedule=SCHEDULE,
            grid=GRID,
            structures=STRUCTURES,
            n_train=len(data.y),
            n_val=len(data.yv),
            n_test=len(data.yt),
            delta0=delta0(data),
            n_mc=N_MC,
            n_mc_check=N_MC_CHECK,
            angles=ANGLES,
            n_rot=N_ROT,
            online=online_runs,
            argv=sys.argv[1:],
        )
        pins = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")
        meta["env"] = {k: os.environ.get(k) for k in pins}
        path = write_record(f"practitioner_study_{args.size}", meta, rows, args.out)
    print(json.dumps({k: v for k, v in meta.items() if k != "online"}))
    print("wrote", path)


if __name__ == "__main__":
    main()


# ----- reading a record (notebook 09) --------------------------------------------
SHORT = {"MAP + temperature": "MAP + T", "ensemble (5)": "ensemble"}


def label(method: str, rule: str, link: str) -> str:
    """A predictive's name in the tables: "MAP", "LL KFAC · evidence" (MC link),
    "LL KFAC · evidence · probit"."""
    if link == "-":
        return SHORT.get(method, method)
    return f"{method} · {rule}" + (" · probit" if link == "probit" else "")


def frame(record: dict):
    """The record's rows as a DataFrame, one row per (network, seed, predictive), with
    ``name`` (:func:`label`) and ``auroc`` the mean AUROC over the OOD sets."""
    import pandas as pd

    df = pd.DataFrame(record["rows"])
    df["name"] = [label(*k) for k in zip(df.method, df.rule, df.link, strict=True)]
    sets = [
        c.removeprefix("auroc_")
        for c in df
        if c.startswith("auroc_") and "_ci" not in c
    ]
    df["auroc"] = df[[f"auroc_{s}" for s in sets]].mean(axis=1)
    return df


def mean_se(values) -> tuple[float, float]:
    """Mean and standard error over seeds."""
    v = list(values)
    m = sum(v) / len(v)
    var = sum((x - m) ** 2 for x in v) / max(len(v) - 1, 1)
    return m, (var / len(v)) ** 0.5


def mean_pm_se(m: float, se: float, signed: bool = False) -> str:
    """``m ± se`` as the tables print it: the mean to 3 decimals and the standard error
    to 4, so that a small one does not read 0.000; a mean and standard error both below
    what that shows (a predictive that matches the MAP's) in scientific notation."""
    sign = "+" if signed else ""
    if se >= 5e-5 or abs(m) >= 5e-4:
        return f"{m:{sign}.3f} ± {se:.4f}"
    return f"{m:{sign}.1e} ± {se:.0e}"


def summary(
    df, net: str, names: list[str], cols: list[str], paired: tuple[str, ...] = ()
):
    """Mean ± SE over seeds of ``cols`` for the predictives ``names`` of one network,
    and for each column in ``paired`` the mean ± SE of the per-seed difference from MAP
    (seed-to-seed variation shared with MAP cancels); cells by :func:`mean_pm_se`."""
    import pandas as pd

    d = df[df.net == net]
    base = d[d.name == "MAP"].set_index("seed")
    out = {}
    for name in names:
        r = d[d.name == name].set_index("seed")
        cells = {}
        for c in cols:
            m, se = mean_se(r[c])
            cells[c] = mean_pm_se(m, se)
        for c in paired:
            if name == "MAP":
                cells[f"{c} − MAP"] = ""
                continue
            m, se = mean_se((r[c] - base[c]).dropna())
            cells[f"{c} − MAP"] = mean_pm_se(m, se, signed=True)
        out[name] = cells
    return pd.DataFrame(out).T
