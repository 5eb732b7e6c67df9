"""Every benchmark record names the code that made it (benchmarks/common.machine_meta)."""

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import common  # noqa: E402


def test_a_record_names_the_module_code_it_ran(monkeypatch, tmp_path):
    meta = common.machine_meta("cpu")
    assert len(meta["module_sha256"]) == 12 and int(meta["module_sha256"], 16) >= 0
    assert meta["module_sha256"] == common.module_hash()  # the same code, the same hash
    assert meta["commit"] is None or len(meta["commit"].split("+")[0]) == 40
    # a copy of the module with one byte changed hashes differently
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "laplace_from_scratch", copy / "laplace_from_scratch")
    (copy / "benchmarks").mkdir()
    monkeypatch.setattr(common, "__file__", str(copy / "benchmarks" / "common.py"))
    assert common.module_hash() == meta["module_sha256"]
    f = copy / "laplace_from_scratch" / "curvature.py"
    f.write_text(f.read_text() + "\n")
    assert common.module_hash() != meta["module_sha256"]
