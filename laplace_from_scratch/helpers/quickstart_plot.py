"""Notebook 00's figure: the reliability diagram of each predictive on the test digits,
and how confident each one is on inputs that are not digits (matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import Tensor

from .plotting import plot_reliability

# each predictive's colour and line style, as notebook 00 names them (MAP, MAP + T and
# last-layer Laplace with MC in notebook 09's colours)
STYLES: dict[str, tuple[str, str]] = {
    "MAP": ("C0", "-"),
    "MAP + T": ("C1", ":"),
    "Laplace, probit": ("C5", "-."),
    "Laplace, MC": ("C4", "-"),
}
# reliability bins with fewer digits than this get hollow markers
MIN_COUNT = 20
# the out-of-distribution sets drawn, and their panels' titles
OOD_PANELS: tuple[tuple[str, str], ...] = (
    ("noise", "uniform noise"),
    ("inverted", "inverted digits"),
)


def fraction_above(conf: Tensor, grid: Tensor) -> list[float]:
    """For each c in ``grid``, the fraction of ``conf`` that is at least c."""
    return [(conf >= c).double().mean().item() for c in grid]


def confidence_figure(
    probs: Mapping[str, Mapping[str, Tensor]],
    y_test: Tensor,
    styles: Mapping[str, tuple[str, str]] = STYLES,
    panels: Sequence[tuple[str, str]] = OOD_PANELS,
    reference: str = "Laplace, MC",
) -> Figure:
    """Notebook 00's three panels, one line per predictive in ``styles`` (its colour and
    line style).

    Left: the reliability diagram on the test digits (accuracy against confidence in 15
    bins; hollow markers: bins of fewer than ``MIN_COUNT`` digits), with the number of
    digits in each bin below it (log scale, labelled "digits per bin"). Middle and
    right, one per entry ``(key, title)`` of ``panels``: the fraction of those inputs
    whose confidence (largest class probability) is at least c, against c; the grey
    curve is the test digits under ``reference``, for comparison.

    probs: ``probs[name][key]`` the class probabilities (n, C) of predictive ``name`` on
    the inputs ``key``: ``"test"`` and each key of ``panels``. y_test: the test labels
    (n,). Returns the figure; the legend sits below the panels.
    """
    fig, ax = plt.subplot_mosaic(
        [["rel", *(k for k, _ in panels)], ["count", *(k for k, _ in panels)]],
        figsize=(9, 3.8),
        height_ratios=[3, 1],
        layout="constrained",
    )
    for name, (color, ls) in styles.items():
        plot_reliability(
            ax["rel"],
            probs[name]["test"],
            y_test,
            label=name,
            color=color,
            counts_ax=ax["count"],
            min_count=MIN_COUNT,
            linestyle=ls,
        )
    ax["rel"].get_legend().remove()
    ax["rel"].text(
        0.98,
        0.03,
        f"dashed: perfect calibration\nhollow: fewer than {MIN_COUNT} digits",
        color="0.4",
        fontsize=8,
        ha="right",
    )
    ax["rel"].set(
        title="test digits: reliability", xlim=(0.2, 1), ylim=(0, 1), xlabel=""
    )
    ax["count"].set(xlim=(0.2, 1), ylabel="digits per bin")
    grid = torch.linspace(0, 1, 201)
    for key, title in panels:
        for name, (color, ls) in styles.items():
            conf = probs[name][key].max(-1).values
            ax[key].plot(
                grid, fraction_above(conf, grid), color=color, ls=ls, lw=1.8, label=name
            )
        conf = probs[reference]["test"].max(-1).values
        ax[key].plot(
            grid,
            fraction_above(conf, grid),
            color="0.5",
            lw=1,
            label=f"test digits ({reference})",
        )
        ax[key].set(title=title, xlabel="confidence c", xlim=(0.1, 1))
        ax[key].set(ylabel="fraction with confidence ≥ c")
    fig.legend(
        *ax[panels[0][0]].get_legend_handles_labels(),
        loc="outside lower center",
        ncol=len(styles) + 1,
    )
    return fig
