"""benchmarks/calibration_study.py's ``merge_records``: a study run in parts (networks or
seeds in separate invocations) becomes one record, and records of different studies do
not."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import calibration_study as cs  # noqa: E402


def record(nets, seeds, seconds, **extra):
    meta = {k: 0 for k in cs.SAME} | {"structures": ["LL KFAC", "KFAC"]}
    meta |= {"nets": nets, "seeds": seeds, "seconds": seconds, **extra}
    rows = [{"net": n, "seed": s, "method": "MAP"} for n in nets for s in seeds]
    return {"meta": meta, "rows": rows}


def test_merge_keeps_each_networks_seeds_time_and_ensemble():
    mlp = record(["MLP"], [0, 1, 2], 100)
    mlp = cs.merge_records(mlp, record(["MLP"], [3, 4], 50))
    both = cs.merge_records(mlp, record(["CNN"], [0], 900, ensemble=False))
    m = both["meta"]
    assert m["nets"] == ["MLP", "CNN"] and m["seeds"] == [0, 1, 2, 3, 4]
    assert m["seeds_per_net"] == {"MLP": [0, 1, 2, 3, 4], "CNN": [0]}
    assert m["seconds_per_net"] == {"MLP": 150, "CNN": 900} and m["seconds"] == 1050
    assert m["ensemble_per_net"] == {"MLP": True, "CNN": False}
    assert m["runs"] == [
        "--seeds 0 1 2 --no-full --nets MLP",
        "--seeds 3 4 --no-full --nets MLP",
        "--seeds 0 --no-full --no-ensemble --nets CNN",
    ]
    assert len(both["rows"]) == 6 and "ensemble" not in m


def test_one_runs_time_for_two_networks_is_not_split():
    both = cs.merge_records(record(["MLP", "CNN"], [0], 60), record(["MLP"], [1], 20))
    assert both["meta"]["seconds_per_net"] == {"MLP": None, "CNN": None}


def test_merge_refuses_records_of_different_studies():
    a = record(["MLP"], [0], 1)
    with pytest.raises(ValueError, match=r"\(network, seed\) \[\('MLP', 0\)\]"):
        cs.merge_records(a, record(["MLP"], [0], 1))
    with pytest.raises(ValueError, match="differ in \\['torch'\\]"):
        cs.merge_records(a, record(["CNN"], [0], 1, torch="2.0"))
    with pytest.raises(ValueError, match="ensemble in one record only"):
        cs.merge_records(a, record(["MLP"], [1], 1, ensemble=False))
