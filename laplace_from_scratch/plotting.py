"""The plots the notebooks share (matplotlib)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from torch import Tensor

from .data import ClassificationData, RegressionData

CLASS_COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]


def plot_regression(
    ax: Axes,
    data: RegressionData,
    mean: Tensor | None = None,
    std: Tensor | None = None,
    label: str = "fit",
    colour: str = "tab:red",
    ylim: tuple[float, float] = (-3.0, 3.0),
) -> Axes:
    """Training points, and optionally a curve ``mean`` (M, 1) on ``data.X_test`` with a ±2·std band."""
    x = data.X_test.squeeze(-1)
    ax.scatter(data.X_train.squeeze(-1), data.y_train.squeeze(-1), s=8, c="k", alpha=0.6, label="data")
    if mean is not None:
        m = mean.detach().squeeze(-1)
        ax.plot(x, m, c=colour, lw=2, label=label)
        if std is not None:
            s = std.detach().squeeze(-1)
            ax.fill_between(x, m - 2 * s, m + 2 * s, color=colour, alpha=0.2, label="±2 std")
    ax.axvspan(float(data.X_train.min()), float(data.X_train.max()), color="0.9", zorder=-1)
    ax.set(xlabel="x", ylabel="y", ylim=ylim, xlim=(float(x.min()), float(x.max())))
    return ax


def plot_2d_data(ax: Axes, data: ClassificationData, title: str = "") -> Axes:
    """Scatter a 2-D classification set, one colour per class."""
    for c in torch.unique(data.y).tolist():
        pts = data.X[data.y == c]
        ax.scatter(
            pts[:, 0],
            pts[:, 1],
            s=14,
            c=CLASS_COLOURS[c % len(CLASS_COLOURS)],
            edgecolors="k",
            linewidths=0.3,
            label=f"class {c}",
        )
    ax.set(xlabel="$x_1$", ylabel="$x_2$", title=title, aspect="equal")
    ax.legend(loc="best", fontsize=8)
    return ax


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 4.5, height: float = 3.2, **kw):
    """``plt.subplots`` sized per panel, with constrained layout."""
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), layout="constrained", **kw)
