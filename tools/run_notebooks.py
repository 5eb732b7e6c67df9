"""Execute notebooks in place, re-running only those whose code (or the module) changed.

A notebook's key is a hash of its code cells, the sources of ``laplace_from_scratch``
and the kernel's Python/torch versions; it is stored in the notebook's metadata after
a successful run. ``make book`` calls this before building the site, so the site and
nbval see the same committed outputs. After each run the numbers that the prose quotes are written into
its markdown cells from the run's own glued outputs (``tools/prose.py``).

    python tools/run_notebooks.py notebooks [--force]
    python tools/run_notebooks.py notebooks/02_jacobians_ggn.ipynb --force   # just one
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient
from nbval_cpu import cpu_vendor
from prose import fill, fill_pages, notebooks

ROOT = Path(__file__).resolve().parents[1]

# The same bits on every machine (the Makefile's NB_ENV, which nbval runs under): torch's vector kernels
# and oneDNN pinned to AVX2, two threads. The kernels started below inherit this environment.
PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "2",
    "MKL_NUM_THREADS": "2",
}


def key(nb: nbformat.NotebookNode) -> str:
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(cell.source.encode())
    for path in sorted((ROOT / "laplace_from_scratch").rglob("*.py")):  # helpers/ included
        h.update(path.read_bytes())
    h.update(f"{sys.version_info[:2]} torch {torch.__version__}".encode())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("paths", type=Path, nargs="+", help="notebook files or folders")
    parser.add_argument("--force", action="store_true", help="re-run every notebook")
    args = parser.parse_args()
    os.environ.update(PINNED)
    for path in notebooks(args.paths):
        nb = nbformat.read(path, as_version=4)
        k = key(nb)
        if not args.force and nb.metadata.get("laplace_from_scratch", {}).get("key") == k:
            print(f"unchanged: {path.name}")
            continue
        t0 = time.perf_counter()
        NotebookClient(
            nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
        ).execute()
        for cell in nb.cells:  # drop per-cell timestamps: they would change every run
            cell.metadata.pop("execution", None)
            for out in cell.get("outputs", []):  # widgets need a live kernel: keep text/plain
                out.get("data", {}).pop("application/vnd.jupyter.widget-view+json", None)
        # No saved widget state: the book would load require.js and the widget manager from CDNs
        # for it (notebook 05's explorer is interactive only in Jupyter; the book shows figures).
        nb.metadata.pop("widgets", None)
        fill(nb)  # the prose's numbers from this run's outputs
        # the CPU vendor that computed these outputs: nbval compares their digits on that vendor only
        # (tools/nbval_cpu.py)
        nb.metadata["laplace_from_scratch"] = {"key": k, "cpu": cpu_vendor()}
        nbformat.write(nb, path)
        print(f"executed:  {path.name} ({time.perf_counter() - t0:.0f} s)")
    fill_pages(ROOT)  # the README and landing page quote the notebooks' values too


if __name__ == "__main__":
    main()
