"""``benchmarks/scale_report.py`` counts, for notebook 08's verdict, the rows where ours
is slower (over ``SLOWER``× laplace-torch's best and at least ``TIME_FLOOR_S``: each time
is one measurement) and where its peak memory is lower, the same or higher (peaks within
``MEMORY_BAND``× of each other, or both below ``MEMORY_FLOOR_MIB``, are the same)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import scale_report as report  # noqa: E402

MIB = 2**20


def device(key: str, pairs: dict) -> dict:
    """A device as :func:`scale_report.read` returns it, with only ``key``'s pairs."""
    keys = ("fit_s", "predict_s", "tune_s", "peak_bytes")
    return {"pairs": {k: pairs if k == key else {} for k in keys}}


def test_slower_needs_the_ratio_and_the_time_floor():
    floor, band = report.TIME_FLOOR_S, report.SLOWER
    dev = device(
        "fit_s",
        {
            ("a", "full"): (2.0, 1.0),  # 2×, seconds: slower
            ("b", "diag"): (0.004, 0.002),  # 2×, milliseconds: noise
            ("c", "kron"): (1.05, 1.0),  # within the band
            ("d", "ll-diag"): (0.5, 1.0),  # faster
            ("e", "ll-kron"): (floor, floor / (band + 0.01)),  # at the floor: counted
        },
    )
    counted, noise, n = report.slower(dev, "fit_s")
    assert counted == [("a", "full"), ("e", "ll-kron")]
    assert noise == [("b", "diag")]
    assert n == 5
    assert report.counted(dev, "fit_s") == "2 of 5"
    # restricted to some rows (notebook 08: the warm record's)
    assert report.counted(dev, "fit_s", {("a", "full"), ("c", "kron")}) == "1 of 2"
    assert report.counted(device("fit_s", {}), "fit_s") == "–"


def test_memory_floor_and_band_count_as_the_same():
    floor = report.MEMORY_FLOOR_MIB * MIB
    dev = device(
        "peak_bytes",
        {
            ("a", "diag"): (0.2 * MIB, 4 * MIB),  # 20× lower, both under the floor
            ("b", "kron"): (0.2 * MIB, 80 * MIB),  # lower: one above the floor
            ("c", "full"): (1000 * MIB, 950 * MIB),  # within the band
            ("d", "ll-full"): (1200 * MIB, 1000 * MIB),  # higher
            ("e", "ll-kron"): (floor, floor / 2),  # at the floor: counted
        },
    )
    assert report.memory(dev) == {
        "lower": [("b", "kron")],
        "equal": [("a", "diag"), ("c", "full")],
        "higher": [("d", "ll-full"), ("e", "ll-kron")],
    }


@pytest.mark.parametrize("key", ["fit_s", "predict_s", "tune_s", "peak_bytes"])
def test_read_keeps_the_times_behind_each_ratio(key):
    dev = report.read([ROOT / "results" / "scale_2026-11-28_cpu.json"])
    assert dev["pairs"][key].keys() == dev["ratio"][key].keys()
    for k, (ours, best) in dev["pairs"][key].items():
        assert dev["ratio"][key][k] == pytest.approx(ours / best)


def test_verdict_counts_the_cpu_record():
    dev = report.read([ROOT / "results" / "scale_2026-11-28_cpu.json"])
    col = report.verdict({"CPU": dev})["CPU"]
    mem = report.memory(dev)
    assert col["lower peak memory"] == f"{len(mem['lower'])} of 17"
    assert col["higher peak memory"] == f"{len(mem['higher'])} of 17"
    assert col["fits slower"] == report.counted(dev, "fit_s")
    # the small MLP's last-layer rows: milliseconds, above 1.1× but not counted
    _, noise, _ = report.slower(dev, "predict_s")
    assert noise and all(m == "mlp:12:1" and s.startswith("ll-") for m, s in noise)


def test_profiles_read_the_tables_beside_the_record(capsys):
    path = ROOT / "results" / "profile_fit_2026-11-28_cuda-nvidia-h200.json"
    rows = report.profiles(path)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "profiled: MLP 784-1000-1000-10, N = 4,000 in 40 batches"
    assert len(out) == 1 + len(rows)  # the model, then one line per fit
    for r in rows:
        assert 0 < r["gpu_s"] < r["fit_s"]  # host-bound: kernels fill part of the fit
        assert r["eigh"] >= 0 and r["syncs_per_batch"] > 0


def test_a_newer_record_replaces_a_cell_and_keeps_older_failures(tmp_path):
    """``read`` takes a (model, structure) cell's times from the newest record holding it,
    so ours and laplace-torch are compared within one run; a backend that failed in an
    older record and was not run in the newer one stays as a failure."""
    import json

    meta = {"date": "2026-11-28", "device": "cuda", "device_name": "GPU", "threads": 1}
    meta |= {"torch": "t", "laplace_torch": "0.3", "args": {"n_train": 10}}
    meta["models"] = {"mlp:12:1": {"P": 9550}}

    def row(impl: str, fit: float, **extra) -> dict:
        r = {"model": "mlp:12:1", "structure": "ll-full", "impl": impl, "P": 9550, "data": "mnist"}
        return r | ({} if "error" in extra else {"fit_s": fit, "predict_s": fit}) | extra

    old = [row("ours", 4.0), row("backpack", 1.0), row("curvlinops", 0, error="RuntimeError at warm-up")]
    new = [row("ours", 0.5), row("backpack", 1.0)]
    paths = []
    for name, rows in (("2026-11-28", old), ("2026-11-28b", new)):
        paths.append(tmp_path / f"scale_{name}_cuda-gpu.json")
        paths[-1].write_text(json.dumps({"meta": meta, "rows": rows}))
    dev = report.read(paths)
    cell = dev["cells"][("mlp:12:1", "ll-full")]
    assert {r["impl"]: r.get("fit_s") for r in cell} == {"ours": 0.5, "backpack": 1.0, "curvlinops": None}
    assert dev["pairs"]["fit_s"][("mlp:12:1", "ll-full")] == (0.5, 1.0)
    assert [r["impl"] for r in dev["failed_default"]] == ["curvlinops"]
    assert dev["table"]["record"].tolist() == ["11-28b"]


def test_the_table_shows_delta_tuning_times_and_marks_cold_ones():
    """The device table prints ours / laplace-torch's fastest δ tuning where a row was
    tuned, blank where it was not, and "cold" for a record that tuned without a warm-up."""
    dev = report.read([ROOT / "results" / "scale_2026-11-28_cpu.json"])
    tune = dev["table"]["δ tuning s"]
    cell = dev["cells"][("mlp:12:1", "diag")]
    ours = next(r["tune_s"] for r in cell if r["impl"] == "ours")
    assert tune[("mlp:12:1", "diag")].startswith(f"{ours:.2g} / ")
    assert tune[("mlp:12:1", "full")] == ""  # not tuned at this P (--tune-max-p)
    assert not any("cold" in v for v in tune)
    cols = list(dev["table"].columns)
    assert cols.index("predict s") + 1 == cols.index("δ tuning s")
    h100 = report.read([ROOT / "results" / "scale_2026-11-24_cuda-nvidia-h100-80gb-hbm3.json"])
    assert any(v.endswith(" cold") for v in h100["table"]["δ tuning s"])


def test_ratio_figure_has_a_tuning_panel_and_marks_uncounted_rows_hollow(monkeypatch):
    """Four panels (fit, predict, δ tuning, memory), one labelled row per network and
    structure (its posterior's P in the label); in the time panels a dashed line at SLOWER,
    red markers for the rows the verdict counts as slower and hollow ones for rows over
    SLOWER that ours timed under TIME_FLOOR_S, which it leaves out; in the memory panel
    hollow markers for peaks counted as the same."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    monkeypatch.setattr(plt, "show", lambda: None)
    dev = report.read([ROOT / "results" / "scale_2026-11-28_cpu.json"])
    report.ratio_figure(dev)
    fig = plt.gcf()
    axes = [ax for ax in fig.axes if ax.get_title()]
    keys = ("fit_s", "predict_s", "tune_s", "peak_bytes")
    assert [ax.get_title() for ax in axes] == [report.RATIO_NAMES[k] for k in keys]
    labels = [t.get_text() for t in axes[0].get_yticklabels()]
    shown = {k for key in keys for k in dev["ratio"][key]}
    assert len(labels) == len(set(labels)) == len(shown)
    assert "MLP 784-12-10, last-layer KFAC (P = 130)" in labels  # a last layer at its own P

    def markers(ax) -> tuple[int, int]:
        """(hollow, red) markers of a panel."""
        faces = [c.get_facecolors() for c in ax.collections]
        edges = [tuple(c.get_edgecolors()[0]) for c in ax.collections]
        hollow = sum(f.size == 0 or f[0][3] == 0 for f in faces)
        return hollow, sum(e == to_rgba("C3") for e in edges)

    for ax, key in zip(axes[:3], ("fit_s", "predict_s", "tune_s"), strict=True):
        assert len(ax.collections) == len(dev["ratio"][key])
        pairs = dev["pairs"][key].values()
        excused = sum(o < report.TIME_FLOOR_S and o > report.SLOWER * t for o, t in pairs)
        assert markers(ax) == (excused, len(report.slower(dev, key)[0]))
        assert any(line.get_linestyle() == "--" for line in ax.lines)
    assert markers(axes[2])[1] > 0  # the CPU record's slower δ tunings are red
    # the memory panel: hollow where the peaks count as the same, a dashed band
    mem = report.memory(dev)
    assert markers(axes[3]) == (len(mem["equal"]), len(mem["higher"])) and mem["equal"]
    assert sum(line.get_linestyle() == "--" for line in axes[3].lines) == 2
    plt.close(fig)


def test_ours_is_timed_against_backends_that_compute_our_approximation():
    """BackPACK's KFAC of a CNN is another approximation (notebook 08's parity matrix):
    the yardstick for ours is the fastest and smallest of the backends that compute ours."""
    dev = report.read([ROOT / "results" / "scale_2026-11-28_cpu.json"])
    cell = dev["cells"][("cnn:8:16", "kron")]
    same = [r for r in cell if r["impl"] not in ("ours", "backpack") and "error" not in r]
    assert same and any(r["impl"] == "backpack" and "error" not in r for r in cell)
    for key in ("fit_s", "predict_s", "peak_bytes"):
        assert dev["pairs"][key][("cnn:8:16", "kron")][1] == min(r[key] for r in same)
