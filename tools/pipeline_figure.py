"""The series' overview diagram, book/_static/pipeline.png: the Laplace pipeline (MAP →
GGN → posterior → predictive → evidence), which notebook builds each piece, and which of
the module's four calls runs it. Shown on the landing page and in notebook 00.

With ``--roadmaps``, also one smaller copy of Part I per Part I notebook, that notebook's
box highlighted and the rest faded (book/_static/roadmap_<notebook>.png): the roadmap at
the top of each Part I notebook.

    python tools/pipeline_figure.py              # writes book/_static/pipeline.png
    python tools/pipeline_figure.py --roadmaps   # and the roadmaps
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
W, H = 2.7, 1.05  # a box's width and height, in data units

# (x, y, notebook, title, what it builds, colour); the main line first
S = 3.1  # the distance between boxes
MAIN = [
    (0 * S, 3.0, "01", "MAP", "train θ*; weight decay\n= a Gaussian prior δ"),
    (1 * S, 3.0, "02", "curvature", "Jacobians J, the GGN\nH = Σ Jᵀ Λ J (Λ = I\nin regression)"),
    (2 * S, 3.0, "03", "posterior", "N(θ*, Σ), Σ⁻¹ = H/σ² + δI,\nand samples"),
    (3 * S, 3.0, "04", "predictive", "linearised (GLM):\nf(x; θ*), J Σ Jᵀ"),
    (4 * S, 3.0, "05, 05b", "evidence", "tune δ and σ;\ncompare models"),
]
SIDE = [  # (x, y, ...): below the piece each extends, but 00
    (0 * S, 1.55, "00", "quick start", "the four calls on a\ntrained network"),
    (1 * S, 1.55, "07", "scaling up", "diagonal, KFAC,\nlast layer, subnetwork"),
    (2 * S, 1.55, "07a", "matrix-free", "CG, Lanczos, SLQ;\nthe GP view"),
    (3 * S, 1.55, "06, 06b", "classification", "probit, Monte Carlo,\nthe Laplace bridge"),
    (4 * S, 1.55, "07b", "prior in training", "online marginal\nlikelihood"),
]
CHECK = [
    (1 * S, 0.1, "08", "vs laplace-torch", "parity to round-off;\nCPU and GPU at scale"),
    (2 * S, 0.1, "09", "into the wild", "calibration, OOD, shift;\nwhen Laplace helps"),
]
PART_ONE = ["01", "02", "03", "04", "05", "05b", "06", "06b", "07", "07a", "07b"]
CALLS = [  # the module's call that runs each step, above the main line
    (0 * S, "your training"),
    (1 * S, "la.fit(loader)"),
    (2 * S, "la.fit(loader)"),
    (3 * S, "la(x)"),
    (4 * S, "la.optimize_prior_precision()"),
]


def box(ax, x, y, nb, title, body, face, edge, here=None):
    """One notebook's box; with ``here`` given, its own box bold and every other faded."""
    mine = here is not None and here in nb.split(", ")
    alpha = 1.0 if here is None or mine else 0.35
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            W,
            H,
            boxstyle="round,pad=0.04,rounding_size=0.12",
            fc=face,
            ec=edge,
            lw=3.2 if mine else 1.3,
            alpha=alpha,
        )
    )
    ax.text(x + W / 2, y + H - 0.12, f"{nb} · {title}", ha="center", va="top",
            fontsize=9.5, weight="bold", color=edge, alpha=alpha)  # fmt: skip
    ax.text(x + W / 2, y + 0.1, body, ha="center", va="bottom", fontsize=8.2,
            alpha=alpha)  # fmt: skip


def arrow(ax, a, b, style="-|>", ls="-", color="0.25"):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=12, lw=1.2, ls=ls, color=color))


def part_one(ax, side, here=None) -> None:
    """Part I's two rows: the main line with its arrows, and the ``side`` notebooks
    hanging below the piece each extends; with ``here``, that notebook highlighted."""
    for x, y, *t in MAIN:
        box(ax, x, y, *t, face="#e8f0fb", edge="#1f5fa8", here=here)
    for x, y, *t in side:
        box(ax, x, y, *t, face="#eef7ec", edge="#2e7d32", here=here)
    for (x0, y0, *_), (x1, _, *_) in zip(MAIN, MAIN[1:], strict=False):
        arrow(ax, (x0 + W + 0.05, y0 + H / 2), (x1 - 0.05, y0 + H / 2))
    for x in (1 * S, 2 * S, 3 * S, 4 * S):
        arrow(ax, (x + W / 2, 3.0 - 0.05), (x + W / 2, 1.55 + H + 0.05), ls="--",
              color="#2e7d32")  # fmt: skip


def draw(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(13, 5.2))
    part_one(ax, SIDE)
    for x, y, *t in CHECK:
        box(ax, x, y, *t, face="#fbf0e6", edge="#b35c00")
    for x, label in CALLS:
        ax.text(x + W / 2, 3.0 + H + 0.12, label, ha="center", va="bottom",
                fontsize=8, family="monospace", color="#1f5fa8")  # fmt: skip
    ax.text(-0.15, 3.0 + H / 2, "Part I\nbuilding it", ha="right", va="center",
            fontsize=9, color="#1f5fa8")  # fmt: skip
    ax.text(-0.15, 0.1 + H / 2, "Part II\nchecking it", ha="right", va="center",
            fontsize=9, color="#b35c00")  # fmt: skip
    ax.text(
        3 * S, 0.1 + H / 2,
        "appendices: A1 full Laplace at the memory limit,\n"
        "A2 time and memory as P grows, A3 where ReLU units switch,\n"
        "A4 online marginal likelihood over seeds",
        ha="left", va="center", fontsize=8.2, color="0.3",
    )  # fmt: skip
    ax.set(xlim=(-1.6, 4 * S + W + 0.2), ylim=(-0.15, 4.55))
    ax.axis("off")
    ax.set_title(
        "The Laplace pipeline, and the notebook that builds each piece",
        fontsize=11,
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def roadmap(path: Path, here: str) -> None:
    """Part I's two rows, notebook ``here`` highlighted."""
    fig, ax = plt.subplots(figsize=(13, 3.1))
    part_one(ax, SIDE[1:], here)  # 00 is not Part I
    order = " → ".join(PART_ONE)
    ax.text(4 * S + W, 1.3, "reading order: " + order, ha="right",
            va="top", fontsize=8.5, color="0.3")  # fmt: skip
    ax.set(xlim=(-0.2, 4 * S + W + 0.2), ylim=(1.0, 4.2))
    ax.axis("off")
    ax.set_title(
        f"Part I, and where notebook {here} sits (bold); a green arrow: the notebook "
        "below extends the piece above",
        fontsize=11,
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "book" / "_static" / "pipeline.png"))
    parser.add_argument("--roadmaps", action="store_true", help="and Part I's roadmaps")
    args = parser.parse_args()
    draw(Path(args.out))
    if args.roadmaps:
        for nb in PART_ONE:
            roadmap(Path(args.out).with_name(f"roadmap_{nb}.png"), nb)


if __name__ == "__main__":
    main()
