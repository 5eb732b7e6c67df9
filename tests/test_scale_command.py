"""The GPU comparison command (``make bench-gpu``, i.e. ``benchmarks/scale.py --preset gpu``) runs end to
end at CPU size: the same code path, every structure and every laplace-torch backend, in seconds."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("laplace", reason="laplace-torch is installed by `make install`")

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_command_runs_at_cpu_size(tmp_path):
    out = tmp_path / "scale_smoke"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--preset", "gpu", "--device", "cpu"]
    cmd += ["--data", "digits", "--models", "mlp:8:1", "--n-train", "100", "--n-test", "50"]
    cmd += ["--n-query", "20", "--train-steps", "50", "--inprocess", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(out.with_suffix(".json").read_text())
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
