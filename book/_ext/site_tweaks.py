"""Small Sphinx extension for the book: offline MathJax (only what the pages load), no Thebe, figures that
open at full size. Loaded from book/_config.yml (``sphinx.local_extensions``).

- MathJax: the pages load ``tex-chtml.js`` (TeX input, CommonHTML output, menu and assistive
  MathML in one file), its web fonts and, on demand, TeX extensions that ``autoload`` fetches.
  We copy just those from the ``sphinx-mathjax-offline`` package, about 2 MB instead of its 24 MB
  distribution. The MathJax menu's optional explorer and speech features (``a11y``/``sre``) are not shipped.
- Thebe (live code in the page) is not used: launch buttons open Binder or Colab instead. Jupyter Book 1
  always loads sphinx-thebe, whose inline configuration is added twice and throws
  "Identifier 'THEBE_JS_URL' has already been declared" on every page; we drop its scripts.
"""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from pathlib import Path

# Relative to the MathJax distribution: what tex-chtml.js loads.
MATHJAX_FILES = ["tex-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions"]


def _mathjax_source() -> Path:
    dist = metadata.distribution("sphinx-mathjax-offline")
    init = next(f for f in dist.files if f.name == "tex-chtml.js" and "static/mathjax" in str(f))
    return Path(dist.locate_file(init)).parent


def copy_mathjax(app, exc) -> None:
    if exc is not None or app.builder.format != "html":
        return
    src, dst = _mathjax_source(), Path(app.outdir) / "_static" / "mathjax"
    shutil.rmtree(dst, ignore_errors=True)
    for rel in MATHJAX_FILES:
        if (src / rel).is_dir():
            shutil.copytree(src / rel, dst / rel)
        else:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dst / rel)


def drop_thebe(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if scripts is None:
        return

    def is_thebe(js) -> bool:
        name = getattr(js, "filename", None) or str(js)
        body = getattr(js, "attributes", {}).get("body", "")
        return "thebe" in str(name) or "THEBE_JS_URL" in body

    context["script_files"] = [js for js in scripts if not is_thebe(js)]


def repository(app, config) -> None:
    """One setting names the repository: ``repository.url`` in book/_config.yml (Jupyter Book passes it
    as ``html_theme_options["repository_url"]``). Left empty, a build on GitHub Actions takes the repository
    it runs in. With a URL, the page header shows the repository button and, on notebooks, the Binder launch
    button; the landing page's ``{{ repository }}`` names it."""
    options = config.html_theme_options
    url = options.get("repository_url") or ""
    if not url and os.environ.get("GITHUB_REPOSITORY"):
        server = os.environ.get("GITHUB_SERVER_URL", "https://github.com")
        url = f"{server}/{os.environ['GITHUB_REPOSITORY']}"
    options["repository_url"] = url
    options["use_repository_button"] = bool(url)
    if not url:  # sphinx-book-theme's launch buttons need the repository (and fail without one)
        options.pop("launch_buttons", None)
    config.myst_substitutions = {
        **config.myst_substitutions,
        "repository": f"<{url}>" if url else "the repository this site is built from (not set in this build)",
    }


def setup(app):
    app.connect("config-inited", repository)
    app.config.mathjax_path = "mathjax/tex-chtml.js"
    app.connect("build-finished", copy_mathjax)
    app.connect("html-page-context", drop_thebe)
    app.add_js_file("enlarge.js", loading_method="defer")
    app.add_css_file("book.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
