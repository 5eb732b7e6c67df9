"""The notebooks' prose reads right in JupyterLab: every quoted number is its code cell's glued output,
and no MyST role that only the book understands is left in a markdown cell (tools/prose.py)."""

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import prose  # noqa: E402

NOTEBOOKS = prose.notebooks([ROOT / "notebooks"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_matches_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert prose.problems(nb) == []


def test_problems_are_found():
    nb = nbformat.v4.new_notebook()
    glue_out = nbformat.v4.new_output(
        "display_data",
        data={prose.RECORD: "'4.6'"},
        metadata={"scrapbook": {"name": "x", "mime_prefix": "application/papermill.record/"}},
    )
    code = nbformat.v4.new_code_cell("glue('x', '4.6')", outputs=[glue_out])
    md = nbformat.v4.new_markdown_cell(
        'a <span data-glue="x">4.5</span>, a <span data-glue="y">1</span>, '
        "a {glue:text}`x` and {cite:p}`key`\n\n```{note}\nhi\n```"
    )
    nb.cells = [code, md]
    found = prose.problems(nb)
    assert len(found) == 5, found  # stale x, missing y, two raw roles, one raw directive
    with pytest.raises(KeyError):
        prose.fill(nb)
    md.source = 'a <span data-glue="x">4.5</span> and <span data-glue="x">?</span>'
    assert prose.fill(nb) == 2
    assert md.source == 'a <span data-glue="x">4.6</span> and <span data-glue="x">4.6</span>'
    assert prose.problems(nb) == []


@pytest.mark.parametrize("page", prose.PAGES)
def test_pages_quote_the_notebooks_outputs(page):
    """The README and the landing page quote notebook 00's numbers in glue spans: each equals its output."""
    values = prose.all_glued([ROOT / "notebooks"])
    assert prose.span_problems((ROOT / page).read_text(), values) == []


def test_page_spans_are_filled_and_checked():
    values = {"nb00_x": "0.27"}
    text = 'NLL <span data-glue="nb00_x">0.3</span>, <span data-glue="nb00_y">1</span>'
    assert len(prose.span_problems(text, values)) == 2
    with pytest.raises(KeyError):
        prose.fill_text(text, values)
    text, changed = prose.fill_text('NLL <span data-glue="nb00_x">0.3</span>', values)
    assert text == 'NLL <span data-glue="nb00_x">0.27</span>' and changed == 1
    assert prose.span_problems(text, values) == []
