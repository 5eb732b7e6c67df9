"""pytest plugin for nbval under pytest-xdist: start one notebook kernel at a time.

``make nbval`` runs two notebooks at once (``-n 2 --dist loadfile``: every cell of a notebook on
one worker, in order). A kernel's ports are picked by binding to port 0 and letting go, and the
kernel binds them moments later; two workers starting kernels at once can be handed the same
port in that gap, and one kernel then fails with "Address already in use". This plugin makes
each worker hold a file lock from picking the ports until its kernel answers, so the second
worker picks its ports while the first kernel holds its own.

It also carries ``tools/nbval_cpu.py``'s list of masked notebooks from the workers to the
terminal summary, which only the controller prints.

    python -m pytest --nbval notebooks -n 2 --dist loadfile -p tools.nbval_cpu -p tools.nbval_kernels
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

import nbval.kernel
import pytest

from tools import nbval_cpu  # the module -p tools.nbval_cpu loaded

LOCK = Path(tempfile.gettempdir()) / f"nbval-kernel-start-{os.getuid()}.lock"
_start = nbval.kernel.start_new_kernel


def start_new_kernel(*args, **kwargs):
    """nbval's ``start_new_kernel`` (it returns once the kernel answers), one process at a time."""
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _start(*args, **kwargs)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


nbval.kernel.start_new_kernel = start_new_kernel  # RunningKernel looks it up at call time


def pytest_sessionfinish(session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the masked notebooks to the controller
        workeroutput["nbval_masked"] = list(nbval_cpu.masked)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    # every worker collects every notebook, so each reports the same names
    new = getattr(node, "workeroutput", {}).get("nbval_masked", [])
    nbval_cpu.masked.extend(name for name in new if name not in nbval_cpu.masked)
