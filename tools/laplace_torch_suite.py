"""Run laplace-torch's own test suite against ``laplace_from_scratch.Laplace``.

    git clone https://github.com/aleximmer/Laplace /tmp/Laplace   # on a machine with network
    .venv/bin/python tools/laplace_torch_suite.py /tmp/Laplace

laplace-torch's tests are not part of its wheel, so they are read from a checkout of its
repository; nothing of them is copied into this project. The script copies the checkout's
``tests/`` to a temporary folder and adds a ``conftest.py`` that replaces laplace-torch's
``Laplace`` and each of its class names (``FullLaplace``, ``KronLLLaplace``, ...) with ours
(``laplace_from_scratch/flavours.py``), the names a script would import. Only two of
laplace-torch's arguments, at the defaults that mean nothing (``feature_reduction=None``,
``asdl_fisher_kwargs=None``), are dropped before they reach ours; every other argument
(``backend=`` included) reaches ours as a script's would. torchvision (which
laplace-torch's tests import for one large model) is stubbed. It runs pytest twice, on
laplace-torch itself and with the shim, and prints how many of the cases laplace-torch passes
also pass with ours and, for the others, one line per (test, error) with its count. Cases whose
code exercises what ours does not claim (``NOT_CLAIMED``: a pattern on the case id and the reason,
read from the tests' code, not from their outcome) are counted apart; the headline share is over
the rest, the features our README claims, and the share over all cases is printed beside it.

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

FILES = [
    "test_baselaplace.py",
    "test_lllaplace.py",
    "test_laplace.py",
    "test_subnetlaplace.py",
    "test_functional_laplace.py",
    "test_functional_laplace_unit.py",
]

SHIM = """
import laplace
import laplace.baselaplace
import laplace.laplace
import laplace.lllaplace
import laplace.subnetlaplace

import laplace_from_scratch as lfs

# laplace-torch's defaults that mean "nothing": dropped; any other value reaches ours
DEFAULTS = {"feature_reduction": None, "asdl_fisher_kwargs": None}
init = lfs.Laplace.__init__


def __init__(self, *args, **kw):
    for k, default in DEFAULTS.items():
        if k in kw and kw[k] is default:
            del kw[k]
    init(self, *args, **kw)


lfs.Laplace.__init__ = __init__
NAMES = \"\"\"Laplace BaseLaplace ParametricLaplace FullLaplace KronLaplace DiagLaplace
    LowRankLaplace LLLaplace FullLLLaplace KronLLLaplace DiagLLLaplace SubnetLaplace
    FullSubnetLaplace DiagSubnetLaplace FunctionalLaplace FunctionalLLLaplace\"\"\"
for name in NAMES.split():
    for mod in (laplace, laplace.baselaplace, laplace.laplace, laplace.lllaplace,
                laplace.subnetlaplace):
        if hasattr(mod, name):
            setattr(mod, name, getattr(lfs, name))
"""

# torchvision (which laplace-torch's tests import for one large model, and its examples'
# helpers for data sets) is stubbed on both runs; tools/laplace_torch_examples.py uses it too
STUB = """
import sys
import types

import laplace  # (before the stub: torchmetrics looks for torchvision's spec on import)

tv, tvm = types.ModuleType("torchvision"), types.ModuleType("torchvision.models")


def wide_resnet50_2(*args, **kwargs):
    raise RuntimeError("torchvision is stubbed: no wide_resnet50_2")


tvm.wide_resnet50_2, tv.models = wide_resnet50_2, tvm
sys.modules.setdefault("torchvision", tv)
sys.modules.setdefault("torchvision.models", tvm)
for name in ("datasets", "transforms"):  # imported, unused, by the examples' helpers
    setattr(tv, name, types.ModuleType("torchvision." + name))
    sys.modules.setdefault("torchvision." + name, getattr(tv, name))
"""


# Cases counted apart, each for what its code exercises (read from laplace-torch's tests, not
# from whether ours passes): (a pattern on the case id, the reason). Every other case exercises
# a feature our README claims; the headline share is over those.
NOT_CLAIMED = [
    (r"(EF|EFInterface|Hessian)[-\]]|diagEF", "an EF or Hessian curvature backend (ours: GGN only)"),
    (r"reward_modeling", "the reward_modeling likelihood (not supported)"),
    (
        r"test_lllaplace\.py::test_laplace_functionality\[(pick_first|pick_last|average)-",
        "feature_reduction (not supported)",
    ),
    (
        r"test_lllaplace\.py::test_laplace_functionality\[None-",
        "internal: ends on lap.backend.last_layer_jacobians",
    ),
    (
        r"test_subnetlaplace\.py::test_(custom_subnetwork_indices|score_based_subnet_masks|"
        r"layer_subnet_masks)\[",
        "internal: reads lap.backend.subnetwork_indices",
    ),
    (r"::test_(laplace|subnet_laplace)_large_init\[|::test_laplace_init\[", "internal: _init_H"),
    (r"::test_functional_variance_fast\[", "internal: functional_variance_fast"),
    (
        r"test_functional_laplace_unit\.py::test_(sod_data_loader|store_K_batch)",
        "internal: _get_SoD_data_loader, _init_K_MM",
    ),
    (
        r"::test_(overriding|online)_fit\[Kron",
        "internal: type(lap.H) is laplace-torch's KronDecomposed",
    ),
]


def not_claimed(case: str) -> str | None:
    """The reason ``case`` is counted apart, or None for a claimed feature's case."""
    return next((why for pattern, why in NOT_CLAIMED if re.search(pattern, case)), None)


def run(tests: Path, files: list[str], conftest: str) -> tuple[set, collections.Counter]:
    """pytest on a copy of ``tests`` with ``conftest``: the passing case ids, and the
    failures counted per (test, error)."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(tests, Path(tmp) / "tests")
        (Path(tmp) / "conftest.py").write_text(conftest)
        env = dict(os.environ, PYTHONPATH=tmp, COLUMNS="400")
        cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "--tb=no", "-W", "ignore"]
        cmd += ["-p", "no:randomly", "-p", "no:cacheprovider"]
        cmd += [f"tests/{f}" for f in files]
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    passed, failures = set(), collections.Counter()
    for line in out.stdout.splitlines():
        if line.startswith("PASSED "):
            passed.add(line.split(" ", 1)[1].strip())
        elif line.startswith(("FAILED ", "ERROR ")):
            test, _, error = line.split(" ", 1)[1].partition(" - ")
            failures[(test.strip(), error[:120])] += 1
    if not passed and not failures:
        sys.exit(out.stdout[-2000:] + out.stderr[-2000:])
    return passed, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a clone of aleximmer/Laplace")
    parser.add_argument("--files", nargs="+", default=FILES, help="test files to run")
    args = parser.parse_args()
    tests = args.checkout / "tests"
    if not tests.is_dir():
        parser.error(f"{tests} does not exist: pass the root of a laplace-torch checkout")
    theirs, _ = run(tests, args.files, STUB)  # laplace-torch as it is
    ours, failures = run(tests, args.files, STUB + SHIM)
    counts = collections.Counter()
    for (test, error), n in failures.items():
        if test in theirs and not_claimed(test) is None:  # claimed, laplace-torch passes
            name = re.sub(r"\[.*?\]", "", test).removeprefix("tests/")
            counts[f"{name}: {error}"] += n
    print("Claimed features, failing with ours (cases laplace-torch passes):")
    for what, n in counts.most_common():
        print(f"{n:4d}  {what}")
    apart = collections.defaultdict(lambda: [0, 0])  # reason -> [cases, ours passes]
    for case in theirs:
        if (why := not_claimed(case)) is not None:
            apart[why][0] += 1
            apart[why][1] += case in ours
    print("\nCounted apart (not claimed), cases laplace-torch passes, of which ours passes:")
    for why, (n, n_ours) in sorted(apart.items(), key=lambda kv: -kv[1][0]):
        print(f"{n:4d}  {why} (ours passes {n_ours})")
    claimed = {c for c in theirs if not_claimed(c) is None}
    share = lambda a, b: f"{len(a)} of the {len(b)} ({100 * len(a) / max(len(b), 1):.1f}%)"
    print(
        f"\nclaimed features: ours passes {share(ours & claimed, claimed)} cases "
        f"laplace-torch passes here\nall cases: ours passes {share(ours & theirs, theirs)}; "
        f"{len(ours - theirs)} more that laplace-torch fails"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
