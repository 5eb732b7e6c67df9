"""Open every notebook in the project's own JupyterLab in headless Chromium; fail on what a reader sees wrong.

    python tools/lab_check.py [notebooks ...] [--shots DIR] [--require-browser]

It starts ``jupyter lab`` from this environment on a loopback port (the repository as its root, as
``make lab`` does; windowing off, so that every cell of a long notebook is in the page; no news or update
checks), opens each notebook, and fails on
  - a MyST role left raw in the rendered markdown (``{glue:text}``, ``{cite:p}``, ``{doc}``, ... as text),
  - a markdown cell that did not render, or rendered empty,
  - a number that the prose quotes (a ``<span data-glue>`` filled from the notebook's outputs by
    ``tools/prose.py``) missing from its rendered cell,
  - TeX left untypeset in the rendered markdown once MathJax has run,
  - a console error or an uncaught script error, or a request that leaves the machine.
It saves a screenshot of the top of each notebook and of every markdown cell with a problem, under
--shots (default book/_build/lab-check/).

The browser is the one the site check uses (Debian's ``chromium`` or $CHROMIUM, through Playwright's Python
client); without it the check says SKIPPED and exits 0, or exits 1 with --require-browser.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
from playwright.sync_api import Error as PlaywrightError
from prose import SPAN, notebooks, shown
from site_check import FLAGS, RAW_TEX, find_browser, report

ROOT = Path(__file__).resolve().parents[1]
VIEWPORT = {"width": 1280, "height": 900}
RAW_ROLE = re.compile(r"\{(?:glue(?::\w+)?|cite(?::\w+)?|doc|ref|numref|eval|term|download|abbr|math)\}")
# JupyterLab settings for the check: every cell attached to the page, nothing fetched from outside.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}

# In the page: each markdown cell's rendered state and text (outside math and code), its filled values
# and how many math elements are still raw.
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"  # the notebook on show
CELLS_PROBE = r"""
() => [...document.querySelectorAll(PANEL + ' .jp-Cell')].map(cell => {
  const md = cell.classList.contains('jp-MarkdownCell');
  if (!md) return {md};
  const out = cell.querySelector('.jp-MarkdownOutput');
  const texts = [];
  if (out) {
    const walker = document.createTreeWalker(out, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      const n = walker.currentNode;
      if (!n.parentElement.closest('mjx-container, pre, code, .MathJax')) texts.push(n.textContent);
    }
  }
  return {
    md,
    rendered: cell.classList.contains('jp-mod-rendered') && !!out,
    text: texts.join(''),
    html: out ? out.innerHTML.length : 0,
  };
})
""".replace("PANEL", repr(PANEL))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(settings_dir: Path, root: Path = ROOT) -> tuple[subprocess.Popen, str, str]:
    for name, value in SETTINGS.items():
        path = settings_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    port, token = free_port(), secrets.token_hex(16)
    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [
        str(jupyter),
        "lab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={settings_dir}",
        f"--LabApp.workspaces_dir={settings_dir / 'workspaces'}",
        "--LabApp.extension_manager=readonly",  # no package index queried
    ]
    if os.geteuid() == 0:  # CI runs as root
        cmd.append("--allow-root")
    log = open(settings_dir / "lab.log", "w")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            return proc, base, token
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    proc.kill()
    sys.exit("lab check: JupyterLab did not start:\n" + (settings_dir / "lab.log").read_text()[-3000:])


def expected_values(path: Path) -> list[list[str]]:
    """For each markdown cell in order, the values its spans show (as text, once rendered)."""
    nb = nbformat.read(path, as_version=4)
    out = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            out.append([shown(m["value"]) for m in SPAN.finditer(cell.source)])
    return out


def check_notebook(page, base: str, token: str, root: Path, rel: str, shots: Path) -> list[str]:
    problems: list[str] = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text[:300]}"))
    page.on("pageerror", lambda e: problems.append(f"script error: {str(e)[:300]}"))

    def on_route(route) -> None:
        url = route.request.url
        if url.startswith(base) or url.startswith("data:") or url.startswith("blob:"):
            route.continue_()
        else:
            problems.append(f"request leaves the machine: {url}")
            route.abort()

    page.route("**/*", on_route)
    # a workspace of its own, so that JupyterLab does not reopen the notebooks checked before
    page.goto(f"{base}/lab/workspaces/{Path(rel).stem}/tree/{rel}?reset&token={token}", wait_until="load")
    page.wait_for_selector(f"{PANEL} .jp-Cell", timeout=120_000)
    expected = expected_values(root / rel)
    # wait until every markdown cell has rendered and MathJax has typeset (or a minute has passed)
    deadline = time.monotonic() + 60
    while True:
        cells = [c for c in page.evaluate(CELLS_PROBE) if c["md"]]
        done = len(cells) == len(expected) and all(c["rendered"] and c["html"] for c in cells)
        if done and not any(RAW_TEX.search(c["text"]) for c in cells):
            break
        if time.monotonic() > deadline:
            break
        page.wait_for_timeout(500)
    if len(cells) != len(expected):
        problems.append(f"{len(cells)} markdown cells in the page, {len(expected)} in the notebook")
    page.screenshot(path=str(shots / "top.png"))
    locators = page.locator(f"{PANEL} .jp-MarkdownCell")
    for i, (cell, values) in enumerate(zip(cells, expected, strict=False)):
        where = f"markdown cell {i + 1}"
        if not cell["rendered"] or cell["html"] == 0:
            problems.append(f"{where} did not render")
            continue
        text, before = cell["text"], len(problems)
        if m := RAW_ROLE.search(text):
            problems.append(f"{where}: raw MyST role ...{text[max(0, m.start() - 40) : m.end() + 40]!r}...")
        if m := RAW_TEX.search(text):
            problems.append(f"{where}: raw TeX ...{text[max(0, m.start() - 30) : m.end() + 30]!r}...")
        rest = text
        for v in values:
            if v == "?":
                problems.append(f"{where}: a value was never filled in (run `python tools/prose.py fill`)")
            elif v not in rest:
                problems.append(f"{where}: the value {v!r} is missing from the rendered text")
            rest = rest.replace(v, "", 1)
        if values and len(problems) > before:  # a picture of each cell with a problem
            try:
                locators.nth(i).screenshot(path=str(shots / f"cell-{i + 1:02d}.png"), timeout=10_000)
            except PlaywrightError as e:
                problems.append(f"{where} could not be shown: {str(e).splitlines()[0][:200]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", type=Path, nargs="*", default=[ROOT / "notebooks"])
    parser.add_argument("--shots", type=Path, default=ROOT / "book/_build/lab-check")
    parser.add_argument("--require-browser", action="store_true")
    parser.add_argument("--root", type=Path, default=ROOT, help="JupyterLab's root (default: the repository)")
    args = parser.parse_args()
    root = args.root.resolve()
    browser_path = find_browser()
    if browser_path is None:
        print("lab check SKIPPED: no Chromium found (apt-get install chromium, or set CHROMIUM=/path)")
        return 1 if args.require_browser else 0
    from playwright.sync_api import sync_playwright

    paths = notebooks([p.resolve() for p in args.paths])
    shutil.rmtree(args.shots, ignore_errors=True)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="lab-check-") as tmp:
        proc, base, token = start_lab(Path(tmp), root)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=browser_path, args=FLAGS)
                for path in paths:
                    rel = path.relative_to(root).as_posix()
                    shots = args.shots / path.stem
                    shots.mkdir(parents=True)
                    context = browser.new_context(viewport=VIEWPORT, service_workers="block")
                    page = context.new_page()
                    problems = check_notebook(page, base, token, root, rel, shots)
                    context.close()
                    failures += report(rel, problems)
                browser.close()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"lab check: {len(paths)} notebooks, {failures} with problems; screenshots in {args.shots}/")
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    sys.exit(main())
