"""The GPU comparison command (``make bench-gpu``, i.e. ``benchmarks/scale.py --preset gpu``) runs end to
end at CPU size: the same code path, every structure and every laplace-torch backend, in seconds. Its plan
of pieces for a borrowed GPU (``--plan``) covers the preset exactly once, and pieces run one after the
other, resuming one record, give the cells of one run."""

import itertools
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("laplace", reason="laplace-torch is installed by `make install`")

ROOT = Path(__file__).resolve().parents[1]
SCALE = [sys.executable, str(ROOT / "benchmarks" / "scale.py")]
SMALL = ["--preset", "gpu", "--device", "cpu", "--data", "digits", "--models", "mlp:8:1", "--n-train", "100"]
SMALL += ["--n-test", "50", "--n-query", "20", "--train-steps", "50", "--inprocess"]
STRUCTURES = ("full", "diag", "kron", "ll-full", "ll-diag", "ll-kron", "matfree")
IMPLS = ("ours", "curvlinops", "backpack", "asdl")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    return run


def _cells(record: dict) -> list[tuple[str, str, str]]:
    return [(r["model"], r["structure"], r["impl"]) for r in record["rows"]]


def _options(command: str) -> dict[str, list[str]]:
    """The options of a command line, each with its values."""
    words = shlex.split(command)
    out, key = {"": words[:2]}, ""
    for w in words[2:]:
        if w.startswith("--"):
            key = w
            out[key] = []
        else:
            out[key].append(w)
    return out


@pytest.fixture(scope="module")
def one_run(tmp_path_factory) -> dict:
    """The GPU command at CPU size, in one run."""
    out = tmp_path_factory.mktemp("one") / "scale_smoke"
    _run([*SCALE, *SMALL, "--out", str(out)])
    return {"record": json.loads(out.with_suffix(".json").read_text()), "out": out}


def test_gpu_command_runs_at_cpu_size(one_run):
    record, out = one_run["record"], one_run["out"]
    assert record["meta"]["device"] == "cpu" and record["meta"]["laplace_torch"]
    cells = {(r["structure"], r["impl"]) for r in record["rows"] if "error" not in r}
    for s in ("full", "diag", "kron", "ll-full", "ll-diag", "ll-kron"):
        for impl in ("ours", "curvlinops", "backpack", "asdl"):
            assert (s, impl) in cells, f"{s}/{impl} did not finish"
    assert ("matfree", "ours") in cells
    # matfree (through Laplace): SLQ's evidence within 4 of its standard errors of full's,
    # probabilities to CG's tolerance (1e-6 on f_var)
    (mf,) = [r for r in record["rows"] if r["structure"] == "matfree"]
    assert mf["vs"] == "ours full" and mf["evidence_z"] < 4 and mf["probs_maxabs"] < 1e-5, mf
    # every laplace-torch cell agrees with ours (float32, a 610-parameter MLP)
    for r in record["rows"]:
        if "evidence_rel" in r and r["structure"] != "matfree":
            assert r["evidence_rel"] < 1e-4 and r["probs_maxabs"] < 1e-4, r
    assert out.with_suffix(".md").read_text().startswith("# Ours vs laplace-torch at scale")
    assert out.with_suffix(".png").stat().st_size > 0
    (run,) = record["meta"]["runs"]
    assert run["finished"] and run["rows_added"] == len(record["rows"]) == 25


def test_plan_covers_the_gpu_preset_once():
    pieces = json.loads(_run([*SCALE, "--preset", "gpu", "--plan", "--json"]).stdout)
    assert all(0 < p["estimate_s"] <= 480 for p in pieces), pieces
    scale, memory = [], []
    for p in pieces:
        o = _options(p["command"])
        assert "--resume" in o and int(o["--timeout"][0]) <= 420, p
        if o[""][1].endswith("bench_full_memory.py"):
            assert not scale, "bench_full_memory.py's pieces come first"
            cells = list(itertools.product(map(int, o["--widths"]), o["--impls"]))
            memory += cells
        else:
            assert o["--preset"] == ["gpu"], p
            cells = itertools.product(o["--models"], o["--structures"], o["--impls"])
            cells = [c for c in cells if c[1] != "matfree" or c[2] == "ours"]
            scale += cells
        assert p["cells"] == len(cells), p
    # every (model, structure, implementation) cell of the preset exactly once: 8 models x
    # (6 structures x 4 implementations + matfree, ours only)
    assert len(scale) == len(set(scale)) == 8 * 25
    models = {c[0] for c in scale}
    expected = {(m, s, i) for m in models for s in STRUCTURES for i in IMPLS if s != "matfree" or i == "ours"}
    assert set(scale) == expected
    # bench_full_memory.py at the Makefile's widths, every implementation, exactly once
    make = (ROOT / "Makefile").read_text()
    widths = [int(w) for w in re.search(r"bench_full_memory\.py .*--widths ([\d ]+)", make)[1].split()]
    assert len(memory) == len(set(memory)) == len(widths) * 4 and {w for w, _ in memory} == set(widths)
    # most valuable first: full Laplace at the memory limit, matfree at P ≈ 1e7, every structure at 1.8M
    options = [_options(p["command"]) for p in pieces]
    assert options[0]["--widths"][0] == str(max(widths))
    after = [o for o in options if "--models" in o]
    assert (after[0]["--models"], after[0]["--structures"]) == (["mlp:2800:2"], ["matfree"])
    assert after[1]["--models"] == ["mlp:1000:2"]


def test_pieces_resume_one_record(one_run, tmp_path):
    out = tmp_path / "pieces"
    # the plan of a small sweep (ours and BackPACK, five structures) is one piece: run it
    # as two, ours then BackPACK, one after the other, into one record
    some, impls = list(STRUCTURES[1:6]), ["ours", "backpack"]
    small = [*SMALL, "--full-memory-widths", "--out", str(out), "--structures", *some, "--impls", *impls]
    (piece,) = json.loads(_run([*SCALE, *small, "--plan", "--json"]).stdout)
    words = shlex.split(piece["command"])
    assert words[:2] == ["python3", "benchmarks/scale.py"] and words[-3:] == ["--impls", *impls]
    assert words[words.index("--structures") + 1 : -3] == some
    for impl in impls:
        _run([sys.executable, *words[1:-2], impl])
    record = json.loads(out.with_suffix(".json").read_text())
    one = [c for c in _cells(one_run["record"]) if c[1] in some and c[2] in impls]
    assert sorted(_cells(record)) == sorted(one)
    assert [r["rows_added"] for r in record["meta"]["runs"]] == [5, 5]
    # BackPACK against ours of the piece before: both on the weights trained once
    assert all("evidence_rel" in r for r in record["rows"] if r["impl"] != "ours")
    # a piece run again: its cells are recorded, nothing is added
    again = _run([sys.executable, *words[1:-2], "ours"])
    assert "5 cells recorded" in again.stdout
    rerun = json.loads(out.with_suffix(".json").read_text())
    assert rerun["rows"] == record["rows"]
    assert [r["rows_added"] for r in rerun["meta"]["runs"]] == [5, 5, 0]
    assert all(r["finished"] and r["device_name"] and r["torch"] for r in rerun["meta"]["runs"])


def test_full_memory_pieces_resume(tmp_path):
    out = tmp_path / "fm.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_full_memory.py"), "--widths", "1"]
    cmd += ["--n-train", "100", "--curvlinops-max-p", "0", "--resume", "--out", str(out)]
    _run([*cmd, "--impls", "ours-one-buffer"])
    second = _run([*cmd, "--impls", "ours-one-buffer", "curvlinops"])
    assert "recorded in" in second.stdout
    record = json.loads(out.read_text())
    assert [(r["width"], r["impl"]) for r in record["rows"]] == [(1, "ours-one-buffer"), (1, "curvlinops")]
    assert record["rows"][0]["predict_peak_buffers"] > 0 and "probs" not in record["rows"][0]
    assert record["rows"][1]["error"].startswith("skipped")
    assert [r["rows_added"] for r in record["meta"]["runs"]] == [1, 1]


PLOT = """
import json, sys
import matplotlib
matplotlib.use("Agg")
sys.path.insert(0, "benchmarks")
import scale
rows = json.loads(sys.stdin.read())
fig = scale.plot(rows)
print(json.dumps({ax.get_ylabel(): [[ln.get_gid(), [int(x) for x in ln.get_xdata()],
                                     [float(y) for y in ln.get_ydata()]]
                                    for ln in ax.get_lines()] for ax in fig.axes if ax.get_ylabel()}))
"""


def test_plot_never_joins_two_architectures_and_puts_last_layers_at_their_own_P():
    """The scale figure, in each of its three panels (fit time, prediction time, peak memory): no
    line joins models of two architectures (another depth, a CNN), models of one architecture at
    other widths are joined, and the last-layer structures sit at the last layer's parameter count,
    not the network's (the x data are exact; markers at one P are only drawn side by side). Failed
    cells are not plotted."""
    from laplace_from_scratch import helpers

    nets = {  # on the 8×8 digits: 64 inputs, 10 classes
        "mlp:12:1": helpers.mlp(64, 10, width=12, depth=1),
        "mlp:50:1": helpers.mlp(64, 10, width=50, depth=1),
        "mlp:30:2": helpers.mlp(64, 10, width=30, depth=2),
        "cnn:4:8": helpers.cnn(10, image_size=8, channels=(4, 8)),
    }
    arch = {"mlp:12:1": "mlp1", "mlp:50:1": "mlp1", "mlp:30:2": "mlp2", "cnn:4:8": "cnn"}
    size = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    P = {spec: size(net) for spec, net in nets.items()}
    P_last = {spec: size(net[-1]) for spec, net in nets.items()}
    assert P_last["mlp:12:1"] == 130 and len(set(P.values()) | set(P_last.values())) == 8
    rows = [
        {
            "model": spec,
            "data": "digits",
            "P": P[spec],
            "structure": s,
            "impl": impl,
            "fit_s": 0.1 + k,
            "predict_s": 0.2 + k,
            "peak_bytes": 2**20 * (100 - k),  # asdl smallest, backpack fastest
        }
        for k, (spec, s, impl) in enumerate(
            itertools.product(nets, ("full", "kron", "ll-kron"), ("ours", "backpack", "asdl"))
        )
    ]
    rows.append(
        {
            "model": "mlp:12:1",
            "data": "digits",
            "P": P["mlp:12:1"],
            "structure": "diag",
            "impl": "ours",
            "error": "out of memory at fit",
        }
    )
    run = subprocess.run(
        [sys.executable, "-c", PLOT],
        input=json.dumps(rows),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    panels = json.loads(run.stdout)
    # every plotted P is one model's: the network's for full and KFAC, the last layer's for ll-kron
    model_at = {P[m]: m for m in nets} | {P_last[m]: m for m in nets}
    assert set(panels) == {"fit time (s)", "prediction time (s)", "peak memory (MiB)"}
    # laplace-torch's points are its best backend in each panel's own quantity
    ref_y = {
        label: sorted(y for gid, _, ys in lines if gid.split("|")[1] == "ref" for y in ys)
        for label, lines in panels.items()
    }
    done = [r for r in rows if "error" not in r and r["impl"] != "ours"]
    cells = {(r["model"], r["structure"]) for r in done}

    def best(key):  # per cell, the smallest over laplace-torch's backends
        return sorted(min(r[key] for r in done if (r["model"], r["structure"]) == c) for c in cells)

    assert ref_y["fit time (s)"] == pytest.approx(best("fit_s"))
    assert ref_y["prediction time (s)"] == pytest.approx(best("predict_s"))
    assert ref_y["peak memory (MiB)"] == pytest.approx([b / 2**20 for b in best("peak_bytes")])
    for lines in panels.values():
        lines = [line[:2] for line in lines]
        assert len(lines) == 3 * 2 * 3  # structures × (ours, laplace-torch) × architectures
        for gid, xs in lines:
            structure = gid.split("|")[0]
            assert structure != "diag", "a failed cell is plotted"
            own = P_last if structure.startswith("ll-") else P
            assert set(xs) <= set(own.values()), (gid, xs)
            assert len({arch[model_at[x]] for x in xs}) == 1, f"{gid} joins two architectures: {xs}"
        # the one-hidden-layer MLPs at their two widths are joined, per structure and implementation
        joined = sorted(xs for gid, xs in lines if len(xs) > 1)
        assert joined == sorted([[P["mlp:12:1"], P["mlp:50:1"]]] * 4 + [[130, P_last["mlp:50:1"]]] * 2)


def test_repeats_record_every_run_and_their_median(tmp_path):
    """``--repeats 3``: three warm fits and predictions per cell, the medians as the figures."""
    out = tmp_path / "scale_repeats"
    cmd = [*SCALE, *SMALL, "--structures", "diag", "ll-kron", "--impls", "ours", "backpack"]
    _run([*cmd, "--repeats", "3", "--out", str(out)])
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert len(rows) == 4
    for r in rows:
        for key in ("fit_s", "predict_s"):
            runs = r[f"{key}_runs"]
            assert len(runs) == 3 and all(t > 0 for t in runs)
            assert r[key] == sorted(runs)[1]
