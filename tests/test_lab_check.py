"""The lab check (tools/lab_check.py) fails on what it is there to catch: a MyST role left raw in JupyterLab,
a quoted value that was never filled in, and a value that is not in the rendered text. It opens JupyterLab
in headless Chromium on a temporary folder; skipped without a browser (CI installs one)."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import prose  # noqa: E402
from site_check import find_browser  # noqa: E402


def notebook(markdown: list[str]) -> nbformat.NotebookNode:
    out = nbformat.v4.new_output(
        "display_data",
        data={prose.RECORD: "'0.42'"},
        metadata={"scrapbook": {"name": "x", "mime_prefix": "application/papermill.record/"}},
    )
    code = nbformat.v4.new_code_cell("glue('x', '0.42', display=False)", outputs=[out])
    nb = nbformat.v4.new_notebook()
    nb.cells = [code, *(nbformat.v4.new_markdown_cell(m) for m in markdown)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.mark.skipif(find_browser() is None, reason="no Chromium (apt-get install chromium)")
def test_lab_check_catches_raw_markup_and_missing_values(tmp_path):
    good = notebook(['# Good\n\nThe value is <span data-glue="x">0.42</span> and $\\alpha^2$ is math.'])
    bad = notebook(
        [
            "# Bad\n\nA role: {glue:text}`x`, a citation {cite:p}`key`.",
            'Never filled: <span data-glue="x">?</span>.',
            'Stale: <span data-glue="x">0.41</span>.',
            'Not shown: <!-- <span data-glue="x">0.42</span> -->',
        ]
    )
    nbformat.write(good, tmp_path / "01_good.ipynb")
    nbformat.write(bad, tmp_path / "02_bad.ipynb")
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools/lab_check.py"), str(tmp_path), "--root", str(tmp_path),
         "--shots", str(tmp_path / "shots"), "--require-browser"],
        capture_output=True, text=True, timeout=600,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "01_good.ipynb: ok" in out, out
    assert "02_bad.ipynb: 3 problem(s)" in out, out
    assert "raw MyST role" in out and "{glue:text}" in out, out
    assert "never filled in" in out, out
    assert "markdown cell 4: the value '0.42' is missing" in out, out
    assert "the value '0.41' is missing" not in out  # a stale value renders; tests/test_notebook_prose.py
    # a picture of each notebook's top, and of each cell with a problem only
    assert (tmp_path / "shots/01_good/top.png").is_file()
    assert not (tmp_path / "shots/01_good/cell-01.png").exists()
    assert (tmp_path / "shots/02_bad/cell-02.png").is_file()
