"""``benchmarks/scale.py`` times both libraries warm: a one-time cost of the first call (an
import, library initialisation) is paid in :func:`scale.warm_up` before any timer starts,
and recorded apart as the cold time. Checked with a stub library whose first ``fit`` and
first ``optimize_prior_precision`` in the process sleep, as a first ``torch.optim.Adam``
does while it imports ``torch._dynamo``. The stub's one-time cost advances a fake clock that
stands in for ``scale``'s ``time.perf_counter`` and nothing else does, so the check reads
where the cost landed, not how fast this machine is."""

import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import scale  # noqa: E402

ONE_TIME_S = 0.5


class FakeClock:
    """``scale``'s clock: it moves only when a stub pays a one-time cost."""

    now = 0.0

    @staticmethod
    def perf_counter() -> float:
        return FakeClock.now


class FirstCallSleeps:
    """A Laplace stand-in: the first ``fit`` and the first ``optimize_prior_precision``
    of the process pay ONE_TIME_S on the fake clock, as one-time costs do; every other
    call takes no time on it."""

    paid: set[str] = set()

    def __init__(self, model):
        self.model, self.prior_precision = model, torch.tensor(1.0)

    def _once(self, what: str) -> None:
        if what not in FirstCallSleeps.paid:
            FirstCallSleeps.paid.add(what)
            FakeClock.now += ONE_TIME_S

    def fit(self, loader) -> None:
        self._once("fit")
        for X, _ in loader:
            self.model(X)

    def log_marginal_likelihood(self) -> torch.Tensor:
        return torch.tensor(-1.0)

    def __call__(self, x, link_approx="probit", **kw) -> torch.Tensor:
        return torch.softmax(self.model(x), -1)

    def optimize_prior_precision(self, method="marglik") -> None:
        self._once("tune")
        self.prior_precision = torch.tensor(2.0)


@pytest.mark.parametrize("structure", ["diag", "full"])
def test_warm_times_exclude_the_one_time_cost(tmp_path, monkeypatch, structure):
    data = scale.load_data({"data": "digits", "n_train": 64, "n_test": 16})
    model = scale.build_model("mlp:8:1", data, "cpu")
    weights = tmp_path / "w.pt"
    torch.save(model.state_dict(), weights)
    cfg = {"data": "digits", "n_train": 64, "n_test": 16, "n_query": 8, "batch_size": 32,
           "device": "cpu", "model": "mlp:8:1", "weights": str(weights), "delta0": 1.0,
           "structure": structure, "impl": "ours", "tune_max_p": 10**9,
           "probs_file": str(tmp_path / "p.npy"), "inprocess": True}  # fmt: skip
    FirstCallSleeps.paid, FakeClock.now = set(), 0.0
    monkeypatch.setattr(scale, "time", types.SimpleNamespace(perf_counter=FakeClock.perf_counter))
    monkeypatch.setattr(scale, "make_laplace", lambda cfg, model, *a: FirstCallSleeps(model))
    out = scale.measure(cfg)
    assert "error" not in out, out
    print({k: round(v, 3) for k, v in out.items() if k.endswith("_s")})
    for what in ("fit", "tune"):
        assert out[f"cold_{what}_s"] == ONE_TIME_S, (what, out)  # paid in the warm-up
        assert out[f"{what}_s"] == 0.0, (what, out)  # and not again inside the timer
