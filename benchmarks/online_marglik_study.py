"""Does learning δ while training fix all-weights Laplace? The study behind notebook
07b's answer to the question notebook 09 leaves open.

Notebook 09's study (``calibration_study.py``) trains the MAP with a fixed δ₀ and tunes
δ after the fact: by the evidence, all-weights diag and KFAC come out far too wide; by
validation they are close to MAP. Here, for one seed (the same data split, the same
initial network as notebook 09's MLP):

- the MAP network of notebook 09, with diag and KFAC over all weights and last-layer
  KFAC, δ tuned after training by validation (grid search) and by the evidence;
- the same initial network trained by online marginal likelihood
  (``lfs.marglik_training``, a δ per parameter tensor, Adam with a cosine schedule) with
  diag and KFAC, its δ the one learned while training;
- a control: the same initial network and schedule with δ fixed at δ₀ (no evidence
  step), which separates what the schedule does from what the learned prior does;

and every predictive (probit and MC links) is scored on the test digits and the four OOD
sets, as in notebook 09:

    python benchmarks/online_marglik_study.py                 # 8×8 digits, seeds 0-4
    LFS_SIZE=large python benchmarks/online_marglik_study.py  # MNIST-5k MLP
    # a run in parts (other seeds) is merged into one record with
    python benchmarks/online_marglik_study.py --merge RECORD.json OTHER.json

writes results/online_marglik_study_<size>_<date>_cpu.{json,log}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import laplace_from_scratch as lfs
import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_study as cs  # noqa: E402

# post hoc: the MAP network of notebook 09 and these structures (keys of cs.STRUCTURES)
POST_HOC = ("LL KFAC", "diag", "KFAC")
# online: these structures over all weights (name: hessian_structure)
ONLINE = {"diag": "diag", "KFAC": "kron"}
# the online schedule: laplace-torch's defaults (Adam, lr_hyp 0.1, a δ per tensor, δ
# from 1) with more epochs, an evidence step every 5 epochs of 50 hypersteps, and a
# cosine decay of the learning rate so that the weights settle
SCHEDULE = dict(
    n_epochs=500,
    n_epochs_burnin=10,
    marglik_frequency=5,
    n_hypersteps=50,
    lr_hyp=0.1,
    prior_structure="layerwise",
    optimizer_kwargs={"lr": 1e-3},
)
BATCH = 256


def online(net: torch.nn.Module, data: cs.Data, structure: str, **schedule):
    """``lfs.marglik_training`` on the training split with SCHEDULE (overridden by
    ``schedule``); returns (la, margliks, losses), the network trained in place."""
    loader = DataLoader(TensorDataset(data.X, data.y), batch_size=BATCH)
    kw = SCHEDULE | schedule
    steps = kw["n_epochs"] * len(loader)
    la, net, margliks, losses = lfs.marglik_training(
        net,
        loader,
        "classification",
        structure,
        scheduler_cls=torch.optim.lr_scheduler.CosineAnnealingLR,
        scheduler_kwargs={"T_max": steps},
        **kw,
    )
    net.eval()
    return la, margliks, losses


def run_seed(size: str, seed: int, data: cs.Data, schedule: dict | None = None):
    """Every row of one seed, and extras (the networks, the online runs' trajectories
    and learned δ) for plots."""
    sets = {"test": data.Xt, **data.ood}
    loader = DataLoader(TensorDataset(data.X, data.y), batch_size=BATCH)
    val_loader = DataLoader(TensorDataset(data.Xv, data.yv), batch_size=500)
    rows, extras = [], {"nets": {}, "runs": {}, "seconds": {}}

    def softmax_of(net):
        with torch.no_grad():
            return {s: cs.batched(lambda Z: torch.softmax(net(Z), -1), Z)
                    for s, Z in sets.items()}  # fmt: skip

    def laplace_rows(la, method: str, rule: str, d):
        by_set = {s: cs.laplace_links(la, Z, seed) for s, Z in sets.items()}
        for link in cs.LINKS:
            probs = {s: links[link] for s, links in by_set.items()}
            rows.append(cs.score(probs, data, seed, net="MLP", method=method,
                                 rule=rule, link=link, tuned=d))  # fmt: skip

    t0 = time.perf_counter()
    net = cs.train(cs.make_net("MLP", data, size, 1000 * seed), data)
    extras["nets"]["MAP"] = net
    rows.append(cs.score(softmax_of(net), data, seed, net="MLP", method="MAP",
                         rule="-", link="-", tuned=None))  # fmt: skip
    for method in POST_HOC:
        subset, structure = cs.STRUCTURES[method]
        la = lfs.Laplace(net, "classification", subset_of_weights=subset,
                         hessian_structure=structure)  # fmt: skip
        la.fit(loader)
        la.optimize_prior_precision(method="marglik")
        d_ev = la.prior_precision.item()
        la.optimize_prior_precision(method="gridsearch", val_loader=val_loader,
                                    **cs.GRID)  # fmt: skip
        d_val = la.prior_precision.item()
        for rule, d in (("validation", d_val), ("evidence", d_ev)):
            la.prior_precision = d
            laplace_rows(la, method, rule, d)
    extras["seconds"]["MAP + post hoc"] = time.perf_counter() - t0
    for method, structure in ONLINE.items():
        t0 = time.perf_counter()
        net = cs.make_net("MLP", data, size, 1000 * seed)
        la, margliks, losses = online(net, data, structure, **(schedule or {}))
        extras["nets"][f"online {method}"] = net
        delta = la.prior_precision.tolist()
        extras["runs"][method] = {
            "margliks": margliks,
            "losses": losses,
            "delta": delta,
        }
        rows.append(cs.score(softmax_of(net), data, seed, net="MLP",
                             method=f"online {method}, network", rule="-", link="-",
                             tuned=None))  # fmt: skip
        laplace_rows(la, f"online {method}", "online evidence", delta)
        extras["seconds"][f"online {method}"] = time.perf_counter() - t0
    # the control: the same schedule with δ fixed at δ₀ (the burn-in outlasts training,
    # so no evidence step is taken), which separates the schedule's effect from the
    # learned prior's
    t0 = time.perf_counter()
    net = cs.make_net("MLP", data, size, 1000 * seed)
    n_epochs = (SCHEDULE | (schedule or {}))["n_epochs"]
    online(net, data, "diag", **((schedule or {}) | {"n_epochs_burnin": n_epochs + 1}))
    extras["nets"]["same schedule, δ fixed"] = net
    rows.append(cs.score(softmax_of(net), data, seed, net="MLP",
                         method="same schedule, δ fixed, network", rule="-", link="-",
                         tuned=cs.DELTA0))  # fmt: skip
    extras["seconds"]["same schedule, δ fixed"] = time.perf_counter() - t0
    return rows, extras


# what two records must share to be one study
SAME = ("device", "device_name", "threads", "torch", "laplace_torch", "python", "size")
SAME += ("n_train", "n_val", "n_test", "delta0", "grid", "post_hoc", "online")
SAME += ("schedule", "batch", "env")


def merge_records(record: dict, other: dict) -> dict:
    """One record from two runs of the study on other seeds: the rows, seeds, seconds
    and online trajectories of both, and each run's seeds. Raises ValueError if the
    records differ in machine, versions, data or settings, or share a seed."""
    m, o = record["meta"], other["meta"]
    differ = [k for k in SAME if m.get(k) != o.get(k)]
    if differ:
        raise ValueError(f"the records differ in {differ}: not one study")
    if set(m["seeds"]) & set(o["seeds"]):
        raise ValueError(f"both records have seeds {set(m['seeds']) & set(o['seeds'])}")
    meta = m | {
        "seeds": sorted(m["seeds"] + o["seeds"]),
        "seconds": m["seconds"] + o["seconds"],
        "runs": m["runs"] | o["runs"],
        "parts": m.get("parts", [m["seeds"]]) + o.get("parts", [o["seeds"]]),
    }
    return {"meta": meta, "rows": record["rows"] + other["rows"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument(
        "--size", default=os.environ.get("LFS_SIZE", "small"), choices=list(cs.SIZES)
    )
    parser.add_argument("--out", default=None)
    from common import machine_meta, merge, merge_args, write_record

    merge_args(parser, "seeds")
    args = parser.parse_args()
    if merge(args, merge_records):
        return
    torch.set_default_dtype(torch.float32)

    data, rows, runs, t0, done = cs.load(args.size), [], {}, time.perf_counter(), []
    for seed in args.seeds:
        t = time.perf_counter()
        seed_rows, extras = run_seed(args.size, seed, data)
        rows, done = rows + seed_rows, done + [seed]
        runs[seed] = extras["runs"]
        print(
            f"seed {seed}: {time.perf_counter() - t:.0f} s ("
            + ", ".join(f"{k} {v:.0f} s" for k, v in extras["seconds"].items())
            + ")",
            flush=True,
        )
        # written after every seed: a run stopped early keeps the seeds it finished
        meta = machine_meta(
            "cpu", size=args.size, seeds=done, seconds=round(time.perf_counter() - t0)
        )
        meta |= dict(
            n_train=len(data.y), n_val=len(data.yv), n_test=len(data.yt),
            delta0=cs.DELTA0, grid=cs.GRID, post_hoc=POST_HOC, online=ONLINE,
            schedule=SCHEDULE, batch=BATCH, runs=runs,
        )  # fmt: skip
        pins = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")
        meta["env"] = {k: os.environ.get(k) for k in pins}
        path = write_record(f"online_marglik_study_{args.size}", meta, rows, args.out)
    print(json.dumps({k: v for k, v in meta.items() if k != "runs"}))
    print("wrote", path)


if __name__ == "__main__":
    main()
