"""Numbers in the notebooks' prose that read the same in JupyterLab, on Binder and in the book.

A number that a sentence quotes is computed in a code cell and recorded there with myst-nb's ``glue``
(``glue("nb01_grad_shortcut", f"{x:.2g}", display=False)``: an output that nbval checks like any other).
The markdown cell that quotes it holds the value inside a marked span,

    the leftover gradient is <span data-glue="nb01_grad_shortcut">4.6</span> times the data term's

which plain Markdown renders everywhere: JupyterLab, Binder, GitHub and the book show the number, with no
MyST role left raw. This tool writes the values into the spans from the notebook's own outputs; nobody
types them. ``tools/run_notebooks.py`` calls :func:`fill` after every execution, and
``tests/test_notebook_prose.py`` fails on a span that disagrees with its output, a span without an
output, or a MyST role (``{glue:text}``, ``{cite:p}``, ``{doc}``, ...) that JupyterLab would show raw.

    python tools/prose.py fill notebooks/01_map_training.ipynb   # write the values into the spans
    python tools/prose.py check notebooks                         # exit 1 on any problem

Both also fill or check the same spans in the README and the landing page (``PAGES``), from the notebooks'
outputs.
"""

from __future__ import annotations

import argparse
import ast
import html
import re
import sys
from pathlib import Path

import nbformat

SPAN = re.compile(r'<span data-glue="(?P<key>[^"]+)">(?P<value>.*?)</span>', re.S)
# MyST roles and directives that only the book understands: JupyterLab shows them as typed.
RAW_ROLE = re.compile(r"\{[a-z][a-z0-9:_-]*\}`")
RAW_DIRECTIVE = re.compile(r"^(```|:::)\{[a-z][a-z0-9:_-]*\}", re.M)
RECORD = "application/papermill.record/text/plain"


def glued(nb: nbformat.NotebookNode) -> dict[str, str]:
    """Every value that a code cell glued, as the text the book's ``{glue:text}`` would show."""
    values: dict[str, str] = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name is None or RECORD not in out.get("data", {}):
                continue
            text = out["data"][RECORD]
            try:  # a glued str is stored as its repr
                value = ast.literal_eval(text)
                text = value if isinstance(value, str) else text
            except (ValueError, SyntaxError):
                pass
            values[name] = text
    return values


def _cell_text(value: str) -> str:
    # a value goes into Markdown as text: escape what Markdown or HTML would interpret
    return html.escape(value, quote=False).replace("*", r"\*").replace("_", r"\_")


def shown(text: str) -> str:
    """A span's text as the rendered page shows it: the inverse of the escaping above."""
    return html.unescape(text).replace(r"\*", "*").replace(r"\_", "_")


def fill_text(text: str, values: dict[str, str], where: str = "") -> tuple[str, int]:
    """``text`` with each span's value written from ``values``, and how many changed. Raises on a span
    with no value (``where`` names the place in the message)."""
    changed = 0

    def put(m: re.Match) -> str:
        nonlocal changed
        key = m["key"]
        if key not in values:
            raise KeyError(f"{where}no glued output for {key!r}")
        value = _cell_text(values[key])
        changed += value != m["value"]
        return f'<span data-glue="{key}">{value}</span>'

    return SPAN.sub(put, text), changed


def span_problems(text: str, values: dict[str, str]) -> list[str]:
    """The spans of ``text`` whose key has no value in ``values`` or whose value differs from it."""
    found = []
    for m in SPAN.finditer(text):
        key = m["key"]
        if key not in values:
            found.append(f"span {key!r} has no glued output")
        elif m["value"] != _cell_text(values[key]):
            found.append(
                f"span {key!r} shows {m['value']!r}, its output is {values[key]!r} "
                "(run `python tools/prose.py fill`)"
            )
    return found


def fill(nb: nbformat.NotebookNode) -> int:
    """Write each glued value into its spans; returns how many changed. Raises on a span with no value."""
    values, changed = glued(nb), 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            cell.source, n = fill_text(cell.source, values, f"cell {i}: ")
            changed += n
    return changed


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """What a reader in JupyterLab would see wrong in markdown cells: raw MyST, stale or missing values."""
    values = glued(nb)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        found += [f"cell {i}: {p}" for p in span_problems(cell.source, values)]
        for pattern in (RAW_ROLE, RAW_DIRECTIVE):
            for m in pattern.finditer(cell.source):
                line = cell.source[max(0, m.start() - 30) : m.end() + 30].replace("\n", " ")
                found.append(f"cell {i}: MyST markup that JupyterLab shows raw: ...{line}...")
    return found


NOTEBOOK_GLOB = "[0-9A][0-9]*_*.ipynb"
# Markdown pages outside the notebooks that quote a notebook's glued values in the same spans (keys are
# unique across notebooks: nb00_..., nb08_...): the landing page and the README.
PAGES = ("README.md", "book/intro.md")


def all_glued(paths: list[Path]) -> dict[str, str]:
    """Every glued value of the notebooks under ``paths``, by key."""
    values: dict[str, str] = {}
    for path in notebooks(paths):
        values |= glued(nbformat.read(path, as_version=4))
    return values


def fill_pages(root: Path) -> None:
    """Write the notebooks' glued values (under ``root/notebooks``) into the spans of ``PAGES``."""
    values = all_glued([root / "notebooks"])
    for name in PAGES:
        page = root / name
        page.write_text(fill_text(page.read_text(), values, f"{name}: ")[0])


def notebooks(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        # 01_..., 07b_... (a notebook between two numbers), A1_... (appendices)
        out += sorted(p.glob(NOTEBOOK_GLOB)) if p.is_dir() else [p]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["fill", "check"])
    parser.add_argument("paths", type=Path, nargs="+", help="notebook files or folders")
    args = parser.parse_args()
    bad = 0
    for path in notebooks(args.paths):
        nb = nbformat.read(path, as_version=4)
        if args.command == "fill":
            if n := fill(nb):
                nbformat.write(nb, path)
            print(f"{path.name}: {n} value(s) updated")
        else:
            found = problems(nb)
            bad += bool(found)
            print(f"{path.name}: {'ok' if not found else f'{len(found)} problem(s)'}")
            for p in found:
                print(f"    {p}")
    root = Path(__file__).resolve().parents[1]
    if args.command == "fill":
        fill_pages(root)
        return 0
    values = all_glued([root / "notebooks"])
    for name in PAGES:
        found = span_problems((root / name).read_text(), values)
        bad += bool(found)
        print(f"{name}: {'ok' if not found else f'{len(found)} problem(s)'}")
        for p in found:
            print(f"    {p}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
