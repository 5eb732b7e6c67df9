"""Open every page of the built book in headless Chromium and fail on what a reader would see wrong.

    python tools/site_check.py [book/_build/html] [--shots DIR] [--require-browser]

For every HTML page of the site, served over a loopback HTTP server, the check fails on
  - a console error or an uncaught script error,
  - a failed request (a 4xx/5xx answer, a network error, or any request that leaves the loopback:
    the site must work offline),
  - raw TeX outside rendered math (``$...$``, ``\\(``, ``\\frac`` and friends in the page text or title),
  - a broken local link or anchor,
  - a code cell, an output or a table that is wider than the content column (needs horizontal scrolling),
  - an image in the content that is shown at less than half its pixel width without a link to the full size.
It saves a full-page screenshot of every page under --shots (default book/_build/site-check/).

The browser is Debian's ``chromium`` (or $CHROMIUM), driven with Playwright's Python client; nothing is
downloaded at run time. Without a browser the check says SKIPPED and exits 0, or exits 1 with
--require-browser (CI installs the browser and passes it).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import re
import shutil
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

VIEWPORT = {"width": 1280, "height": 900}
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Chromium flags for a closed network: no background connections, no sandbox (CI runs as root).
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# TeX that MathJax should have typeset: delimiters and the commands our pages use.
RAW_TEX = re.compile(
    r"\$[^$\s][^$]*\$|\\\(|\\\)|\\\[|\\\]|\\begin\{|"
    r"\\(?:frac|mathcal|mathbb|theta|delta|sigma|lambda|Lambda|top|big|sum|log|operatorname|text)\b"
)

# Collected in the page: the text outside math, code, scripts; elements wider than the content column;
# images shrunk without a link; local links.
PAGE_PROBE = r"""
() => {
  const main = document.querySelector('main') || document.body;
  const skip = 'mjx-container, script, style, pre, code, .highlight, .MathJax, math, '
             + 'textarea, .bd-search, .search-button, .cell_output';
  const texts = [];
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const n = walker.currentNode;
    if (n.parentElement && !n.parentElement.closest(skip)) texts.push(n.textContent);
  }
  const column = document.querySelector('article.bd-article') || main;
  const colRight = column.getBoundingClientRect().right + 1;
  const wide = [];
  const blocks = main.querySelectorAll(
    'div.highlight pre, .cell_output pre, .output pre, table, .cell_output .output, mjx-container[display]');
  for (const el of blocks) {
    const r = el.getBoundingClientRect();
    if (r.width === 0) continue;
    const scrolls = el.scrollWidth > el.clientWidth + 1;
    const sticksOut = r.right > colRight;
    if (scrolls || sticksOut) {
      const cell = el.closest('.cell');
      const label = (el.textContent || '').trim().split('\n')[0].slice(0, 70);
      const kind = el.tagName === 'TABLE' ? 'table' : el.closest('.cell_output, .output') ? 'output' : 'code';
      wide.push(`${kind} ${Math.round(el.scrollWidth)}px > ` +
                `${Math.round(Math.min(el.clientWidth, colRight - r.left))}px: "${label}"` +
                (cell ? ` (cell ${[...document.querySelectorAll('.cell')].indexOf(cell) + 1})` : ''));
    }
  }
  const small = [];
  for (const img of main.querySelectorAll('img')) {
    if (!img.naturalWidth) { small.push(`image did not load: ${img.src}`); continue; }
    const shown = img.getBoundingClientRect().width;
    if (shown < 0.5 * img.naturalWidth && !img.closest('a')) {
      small.push(`image shown at ${Math.round(shown)} of ${img.naturalWidth} px with no link to full size: ` +
                 img.src.split('/').pop().slice(0, 40));
    }
  }
  const links = [...document.querySelectorAll('a[href]')].map(a => a.href);
  return {texts, wide, small, links, title: document.title};
}
"""


REDIRECT = re.compile(r'http-equiv="refresh"[^>]*url=([^"\']+)', re.I)


def find_browser() -> str | None:
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    for name in BROWSER_NAMES:
        if path := shutil.which(name):
            return path
    return None


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key in ("id", "name") and value:
                self.ids.add(value)


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    parser = _Ids()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(parser.ids)


def check_link(root: Path, base: str, href: str) -> str | None:
    """None if a local link resolves to a file (and anchor) in the build, else what is wrong."""
    url, fragment = urldefrag(href)
    parsed = urlparse(url)
    if not url.startswith(base):
        return None  # external links are not followed (the site must work offline)
    rel = unquote(parsed.path)[1:]
    target = root / rel
    if target.is_dir():
        target = target / "index.html"
    if not target.is_file():
        return f"broken link: {href}"
    if fragment and target.suffix == ".html" and unquote(fragment) not in anchors(target):
        return f"broken anchor: {href}"
    return None


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def check_page(page, root: Path, base: str, rel: str, shots: Path) -> list[str]:
    problems: list[str] = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text[:300]}"))
    page.on("pageerror", lambda e: problems.append(f"script error: {str(e)[:300]}"))
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url} ({r.failure})"))

    def on_response(response) -> None:
        if response.status >= 400:
            problems.append(f"HTTP {response.status}: {response.url}")

    page.on("response", on_response)

    def on_route(route) -> None:
        if route.request.url.startswith(base) or route.request.url.startswith("data:"):
            route.continue_()
        else:
            problems.append(f"request leaves the machine: {route.request.url}")
            route.abort()

    page.route("**/*", on_route)
    page.goto(base + rel, wait_until="load")
    # MathJax typesets after load; wait for it (pages without math have no MathJax).
    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
    page.wait_for_timeout(200)
    found = page.evaluate(PAGE_PROBE)
    for text in found["texts"]:
        if m := RAW_TEX.search(text):
            problems.append(f"raw TeX in the page: ...{text[max(0, m.start() - 30) : m.end() + 30]!r}...")
    if "\\" in found["title"] or "$" in found["title"]:
        problems.append(f"raw TeX in the title: {found['title']!r}")
    problems += [f"wider than the column: {w}" for w in found["wide"]]
    problems += found["small"]
    for href in sorted(set(found["links"])):
        if err := check_link(root, base, href):
            problems.append(err)
    shot = shots / (rel.replace("/", "__").removesuffix(".html") + ".png")
    page.screenshot(path=str(shot), full_page=True)
    return problems


def report(name: str, problems: list[str]) -> bool:
    """Print one page's (or notebook's) verdict and its problems; True if it has any."""
    print(f"{name}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    for p in problems:
        print(f"    {p}")
    return bool(problems)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("site", nargs="?", default="book/_build/html")
    parser.add_argument("--shots", default="book/_build/site-check")
    parser.add_argument("--require-browser", action="store_true")
    args = parser.parse_args()
    root = Path(args.site).resolve()
    if not (root / "index.html").is_file():
        sys.exit(f"site check: no {root}/index.html; build the book first (make book-html)")
    browser_path = find_browser()
    if browser_path is None:
        msg = "site check SKIPPED: no Chromium found (apt-get install chromium, or set CHROMIUM=/path)"
        print(msg)
        return 1 if args.require_browser else 0
    from playwright.sync_api import sync_playwright

    shots = Path(args.shots)
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    failures = 0
    pages = []
    for path in sorted(root.rglob("*.html")):
        if "_static" in path.parts:
            continue
        rel = path.relative_to(root).as_posix()
        if redirect := REDIRECT.search(path.read_text(encoding="utf-8", errors="replace")[:2000]):
            target = redirect.group(1)
            if not (path.parent / target.split("#")[0]).is_file():
                print(f"{rel}: redirects to a missing page {target}")
                failures += 1
            continue  # a redirect page: its target is checked as a page of its own
        pages.append(rel)
    server, base = serve(root)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=browser_path, args=FLAGS)
            for rel in pages:
                context = browser.new_context(viewport=VIEWPORT, service_workers="block")
                page = context.new_page()
                problems = check_page(page, root, base, rel, shots)
                context.close()
                failures += report(rel, problems)
            browser.close()
    finally:
        server.shutdown()
    print(f"site check: {len(pages)} pages, {failures} with problems; screenshots in {shots}/")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
