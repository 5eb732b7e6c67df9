"""benchmarks/practitioner_study.py, the study behind notebooks 00 and 09: one seed end to end at a
tiny size, MacKay's identity for its diagnostics, and merging a run in parts."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import calibration_study as cs  # noqa: E402
import practitioner_study as ps  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    d = cs.load("small")
    ood = {k: v[:40] for k, v in d.ood.items()}
    return replace(
        d, X=d.X[:150], y=d.y[:150], Xv=d.Xv[:60], yv=d.yv[:60], Xt=d.Xt[:80], yt=d.yt[:80], ood=ood
    )


def test_delta0_is_n_times_the_weight_decay(tiny):
    assert ps.delta0(tiny) == pytest.approx(150 * ps.RECIPE["weight_decay"], rel=1e-12)


@pytest.mark.parametrize("structure", ["kron", "diag", "full"])
def test_mackay_identity_at_the_evidence_optimum(tiny, structure):
    """At the evidence's optimum over a scalar δ (prior mean 0), δ‖θ‖² = γ = P − δ tr Σ."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    ps.helpers.train_minibatch(net, tiny.X, tiny.y, epochs=5)
    la = lfs.Laplace(net, "classification", hessian_structure=structure)
    la.fit(DataLoader(TensorDataset(tiny.X, tiny.y), batch_size=50))
    la.optimize_prior_precision(method="marglik", n_steps=1000)
    m = ps.mackay(la)
    delta = la.prior_precision.item()
    gap = abs(delta * m["theta_sq"] - m["gamma"]) / m["gamma"]
    print(
        f"{structure}: δ‖θ‖² = {delta * m['theta_sq']:.4f}, γ = {m['gamma']:.4f},",
        f"relative gap {gap:.1e} (tolerance 1e-4)",
    )
    assert m["n_params"] == 650 and 0 < m["gamma"] < 650 and gap < 1e-4
    # away from the optimum the identity does not hold
    la.prior_precision = 10 * delta
    m10 = ps.mackay(la)
    assert abs(10 * delta * m10["theta_sq"] - m10["gamma"]) / m10["gamma"] > 0.5


def test_one_seed_end_to_end(tiny, monkeypatch):
    for name, value in dict(
        N_ENSEMBLE=2,
        N_DROPOUT=3,
        N_MC=20,
        N_MC_CHECK=40,
        ANGLES=(0, 90),
        N_ROT=30,
        GRID=dict(log_prior_prec_min=-1, log_prior_prec_max=3, grid_size=3),
        STRUCTURES={"LL KFAC": ("last_layer", "kron"), "diag": ("all", "diag")},
        ONLINE={"KFAC": "kron"},
        SCHEDULE=dict(n_epochs_burnin=0, marglik_frequency=1, n_hypersteps=2, lr_hyp=0.1),
        RECIPE=ps.RECIPE | {"epochs": 2},
    ).items():
        monkeypatch.setattr(ps, name, value)
    monkeypatch.setitem(ps.LINK_ARGS, "MC", dict(link_approx="mc", n_samples=20))
    rows, extras = ps.run_seed(tiny, seed=0, nets=("MLP",))
    keys = {(r["method"], r["rule"], r["link"]) for r in rows}
    baselines = {("MAP", "-", "-"), ("MAP + temperature", "validation", "-"), ("ensemble (2)", "-", "-")}
    baselines |= {("MC dropout", "-", "-"), ("online KFAC, network", "-", "-")}
    laplace = {
        (m, rule, link)
        for m in ("LL KFAC", "diag")
        for rule in ("weight decay", "evidence", "validation")
        for link in ("MC", "probit")
    }
    laplace |= {(m, "online", link) for m in ("KFAC", "LL KFAC") for link in ("MC", "probit")}
    assert keys == baselines | laplace and len(rows) == len(keys)
    for r in rows:
        assert set(r["rot"]) == {0, 90} and 0 <= r["acc"] <= 1 and r["nll"] > 0
        assert all(f"auroc_{s}" in r for s in tiny.ood)
    wd = [r for r in rows if r["rule"] == "weight decay"]
    assert all(r["tuned"] == pytest.approx(ps.delta0(tiny)) for r in wd)
    # the last-layer rows of the online network use the δ it learned for its last two tensors
    learned = extras["online"]["MLP", "KFAC"]["delta"]
    ll = [r for r in rows if r["method"] == "LL KFAC" and r["rule"] == "online"]
    assert all(r["tuned"] == pytest.approx(learned[-2:]) for r in ll)
    assert rows[0]["moved_sq"] > 0 and rows[0]["theta_sq"] > 0


def record(net, seeds, **meta):
    m = {k: 0 for k in ps.SAME} | {"seeds": seeds, "nets": [net], "seconds": 1, "online": [], "argv": [net]}
    return {"meta": m | meta, "rows": [{"net": net, "seed": s} for s in seeds]}


def test_merge_joins_networks_and_refuses_other_studies():
    both = ps.merge_records(record("MLP", [0, 1]), record("CNN", [0, 1]))
    assert both["meta"]["nets"] == ["MLP", "CNN"] and len(both["rows"]) == 4
    assert both["meta"]["parts"] == [["MLP"], ["CNN"]] and both["meta"]["seconds"] == 2
    with pytest.raises(ValueError, match="differ in"):
        ps.merge_records(record("MLP", [0]), record("CNN", [0], recipe=1))
    with pytest.raises(ValueError, match="both records have"):
        ps.merge_records(record("MLP", [0]), record("MLP", [0]))


def test_mean_pm_se_shows_a_small_standard_error():
    assert ps.mean_pm_se(0.2691, 0.0003) == "0.269 ± 0.0003"
    assert ps.mean_pm_se(-0.0034, 0.0003, signed=True) == "-0.003 ± 0.0003"
    # a difference from the MAP too small for 3 decimals is not printed as +0.000 ± 0.0000
    assert ps.mean_pm_se(1.5e-5, 4.8e-6, signed=True) == "+1.5e-05 ± 5e-06"
