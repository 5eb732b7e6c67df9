"""pytest plugin for nbval: compare a notebook's numbers only on the CPU vendor that computed them.

The committed outputs are reproducible to the bit on machines of the CPU vendor they were computed on
(the Makefile pins torch's vector kernels, oneDNN and the thread count), but not across vendors:
torch's CPU wheel calls Intel's MKL for matrix products and factorisations, and MKL picks its code path
by vendor, so an Intel Xeon and an AMD EPYC round differently, and a training run or an L-BFGS path
carries that into the printed digits (seen 2026-11-28: notebook 01's gradient ratio 2.7e-3 on an EPYC,
7.6e-3 on a Xeon; ``MKL_CBWR`` did not make them agree).

``tools/run_notebooks.py`` records the vendor in each notebook's metadata
(``laplace_from_scratch.cpu``). On a machine of that vendor nbval compares every output as it is. On
another vendor this plugin adds sanitising rules for that notebook: every number (a bound such as
``<1e-12`` and a lone dash for a missing number included) is replaced by ``#`` and runs of white
space by one space, so nbval still runs every cell, fails on any error or
failed assertion (the notebooks' checks assert their tolerances), and compares the words of every
output, but not the digits. The run prints which notebooks were compared that way.

    python -m pytest --nbval notebooks -p tools.nbval_cpu   # from the repository root, as the Makefile
"""

from __future__ import annotations

import platform
from pathlib import Path

import nbformat
import pytest

# a number as the notebooks print it: signs, digits, separators, exponents, superscript powers
NUMBER = r"[-+−]?(?:\d[\d,.\u202f]*(?:[eE][-+]?\d+)?|[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)"
# then a bound ("<1e-12") or a dash standing for a missing number ("–") reads as a number too,
# and runs of white space (a table's column widths, a wrapped line) as one space
MASK = {NUMBER: "#", r"[<≤]\s*#": "#", r"(?<![^\s>|])[–-](?![^\s<|])": "#", r"\s+": " "}
masked: list[str] = []


def cpu_vendor() -> str:
    """This machine's CPU vendor ("AuthenticAMD", "GenuineIntel", ...), or its architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() or "unknown"


def recorded_vendor(nb: nbformat.NotebookNode) -> str | None:
    """The CPU vendor that computed the notebook's outputs (None: never run by run_notebooks)."""
    return nb.metadata.get("laplace_from_scratch", {}).get("cpu")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    here = cpu_vendor()
    files = {item.parent for item in items if hasattr(item.parent, "sanitize_patterns")}
    for nbfile in files:
        if recorded_vendor(nbfile.nb) == here:  # the notebook nbval read when collecting
            continue
        setup = nbfile.setup_sanitize_files

        def with_mask(setup=setup, nbfile=nbfile) -> None:
            setup()
            nbfile.sanitize_patterns.update(MASK)

        nbfile.setup_sanitize_files = with_mask
        masked.append(Path(nbfile.fspath).name)


def pytest_terminal_summary(terminalreporter) -> None:
    if masked:
        terminalreporter.write_line(
            f"nbval_cpu: this CPU ({cpu_vendor()}) is not the one that computed the committed outputs "
            f"of {len(masked)} notebook(s); their numbers were masked (cells run, assertions and words "
            f"compared): {', '.join(sorted(masked))}"
        )
