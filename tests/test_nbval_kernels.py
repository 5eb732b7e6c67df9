"""tools/nbval_kernels.py: under pytest-xdist, a worker holds the kernel-start lock from picking
its kernel's ports until the kernel answers, and the workers' masked notebooks reach the
controller's summary once each."""

import fcntl
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("nbval")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools import nbval_cpu, nbval_kernels  # noqa: E402


def lock_is_free() -> bool:
    with open(nbval_kernels.LOCK, "w") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(other, fcntl.LOCK_UN)
        return True


def test_a_kernel_starts_under_the_lock_and_lets_go_after(monkeypatch):
    seen = []

    def start(*args, **kwargs):  # nbval's start_new_kernel, as a stub
        seen.append(lock_is_free())
        return "km", "kc"

    monkeypatch.setattr(nbval_kernels, "_start", start)
    assert nbval_kernels.start_new_kernel(kernel_name="python3") == ("km", "kc")
    assert seen == [False]  # held while the kernel started
    assert lock_is_free()  # and released after


def test_a_failed_start_releases_the_lock(monkeypatch):
    def start(*args, **kwargs):
        raise RuntimeError("kernel died")

    monkeypatch.setattr(nbval_kernels, "_start", start)
    with pytest.raises(RuntimeError, match="kernel died"):
        nbval_kernels.start_new_kernel()
    assert lock_is_free()


def test_nbval_starts_kernels_through_the_wrapper():
    import nbval.kernel

    assert nbval.kernel.start_new_kernel is nbval_kernels.start_new_kernel


def test_masked_notebooks_from_two_workers_are_reported_once(monkeypatch):
    monkeypatch.setattr(nbval_cpu, "masked", [])
    for names in (["a.ipynb", "b.ipynb"], ["a.ipynb", "b.ipynb"]):  # both collect both
        nbval_kernels.pytest_testnodedown(SimpleNamespace(workeroutput={"nbval_masked": names}), None)
    nbval_kernels.pytest_testnodedown(SimpleNamespace(), None)  # a worker that reported nothing
    assert nbval_cpu.masked == ["a.ipynb", "b.ipynb"]
