"""Run laplace-torch's own test suite against ``laplace_from_scratch.Laplace``.

    git clone https://github.com/aleximmer/Laplace /tmp/Laplace   # on a machine with network
    .venv/bin/python tools/laplace_torch_suite.py /tmp/Laplace

laplace-torch's tests are not part of its wheel, so they are read from a checkout of its
repository; nothing of them is copied into this project. The script copies the checkout's
``tests/`` to a temporary folder and adds a ``conftest.py`` that replaces each laplace-torch
class (``FullLaplace``, ``KronLLLaplace``, ...) with our ``Laplace`` with that class's
``subset_of_weights`` and ``hessian_structure`` fixed, and ``laplace.Laplace`` with ours. The
arguments we do not have (``backend``, ``enable_backprop``, ``feature_reduction``, ...) are
accepted and ignored, so a test fails on behaviour, not on a keyword. torchvision (which
laplace-torch's tests import for one large model) is stubbed. It then runs pytest and prints
how many cases pass and, for the failures, one line per (test, error) with its count.

It needs laplace-torch installed next to our module (``make install`` does that) and does
not run in CI (no network there to fetch the repository).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FILES = ["test_baselaplace.py", "test_lllaplace.py", "test_laplace.py"]

SHIM = """
import sys
import types

import laplace
import laplace.baselaplace
import laplace.laplace
import laplace.lllaplace

from laplace_from_scratch import Laplace as Ours

IGNORED = ("backend", "backend_kwargs", "asdl_fisher_kwargs", "enable_backprop",
           "dict_key_x", "dict_key_y", "feature_reduction")


def flavour(name, subset, structure):
    def __init__(self, model, likelihood, sigma_noise=1.0, prior_precision=1.0,
                 prior_mean=0.0, temperature=1.0, **kw):
        for k in IGNORED:
            kw.pop(k, None)
        if subset != "last_layer":
            kw.pop("last_layer_name", None)
        Ours.__init__(self, model, likelihood, subset, structure, sigma_noise=sigma_noise,
                      prior_precision=prior_precision, prior_mean=prior_mean,
                      temperature=temperature, **kw)

    return type(name, (Ours,), {"__init__": __init__})


CLASSES = {
    "FullLaplace": ("all", "full"), "KronLaplace": ("all", "kron"),
    "DiagLaplace": ("all", "diag"), "LowRankLaplace": ("all", "lowrank"),
    "FullLLLaplace": ("last_layer", "full"), "KronLLLaplace": ("last_layer", "kron"),
    "DiagLLLaplace": ("last_layer", "diag"),
}
for name, (subset, structure) in CLASSES.items():
    cls = flavour(name, subset, structure)
    for mod in (laplace, laplace.baselaplace, laplace.lllaplace):
        if hasattr(mod, name):
            setattr(mod, name, cls)
laplace.laplace.Laplace = laplace.Laplace = Ours

tv, tvm = types.ModuleType("torchvision"), types.ModuleType("torchvision.models")


def wide_resnet50_2(*args, **kwargs):
    raise RuntimeError("torchvision is stubbed: no wide_resnet50_2")


tvm.wide_resnet50_2, tv.models = wide_resnet50_2, tvm
sys.modules.setdefault("torchvision", tv)
sys.modules.setdefault("torchvision.models", tvm)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a clone of aleximmer/Laplace")
    parser.add_argument("--files", nargs="+", default=FILES, help="test files to run")
    args = parser.parse_args()
    tests = args.checkout / "tests"
    if not tests.is_dir():
        parser.error(f"{tests} does not exist: pass the root of a laplace-torch checkout")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(tests, Path(tmp) / "tests")
        (Path(tmp) / "conftest.py").write_text(SHIM)
        env = dict(os.environ, PYTHONPATH=tmp, COLUMNS="400")
        cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--tb=no", "-W", "ignore"]
        cmd += ["-p", "no:randomly", "-p", "no:cacheprovider"]
        cmd += [f"tests/{f}" for f in args.files]
        run = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    lines = run.stdout.splitlines()
    counts = collections.Counter()
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ")):
            test, _, error = line.split(" ", 1)[1].partition(" - ")
            test = re.sub(r"\[.*?\]", "", test).removeprefix("tests/")
            counts[f"{test}: {error[:120]}"] += 1
    for what, n in counts.most_common():
        print(f"{n:4d}  {what}")
    print(lines[-1] if lines else run.stderr[-2000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
