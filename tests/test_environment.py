"""environment.yml (conda) and pyproject.toml (pip) describe the same environment."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_TO_PIP = {"pytorch": "torch"}
# conda-only entries: the interpreter, pip itself, and torchvision, which conda-forge builds
# against its own pytorch (with pip we leave it out: see pyproject.toml and the README)
CONDA_ONLY = {"python", "pip", "torchvision"}


def _name(req: str) -> str:
    name = re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _pyproject_names() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for group in project["optional-dependencies"].values():
        reqs += group
    return {_name(r) for r in reqs}


def _conda_names() -> set[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    names = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            names |= {_name(r) for r in dep["pip"] if not r.startswith("-e")}
        else:
            names.add(CONDA_TO_PIP.get(_name(dep), _name(dep)))
    return names - CONDA_ONLY


def test_environment_yml_names_the_same_packages_as_pyproject():
    assert _conda_names() == _pyproject_names()


def test_environment_yml_uses_conda_forge_and_installs_the_module():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e ." in pip


def test_pinned_versions_agree():
    """Where both files pin a version, they pin the same one."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {
        _name(r): r.split("==")[1] for g in project["optional-dependencies"].values() for r in g if "==" in r
    }
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    for r in pip:
        if "==" in r:
            assert pins[_name(r)] == r.split("==")[1], r
