"""The plots the notebooks share (matplotlib)."""

from __future__ import annotations

import math

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
    """Training points, and optionally a curve ``mean`` (M, 1) on ``data.X_test`` with a
    ±2·std band."""
    x = data.X_test.squeeze(-1)
    ax.scatter(
        data.X_train.squeeze(-1),
        data.y_train.squeeze(-1),
        s=8,
        c="k",
        alpha=0.6,
        label="data",
    )
    if mean is not None:
        m = mean.detach().squeeze(-1)
        ax.plot(x, m, c=colour, lw=2, label=label)
        if std is not None:
            s = std.detach().squeeze(-1)
            ax.fill_between(
                x, m - 2 * s, m + 2 * s, color=colour, alpha=0.2, label="±2 std"
            )
    ax.axvspan(
        float(data.X_train.min()), float(data.X_train.max()), color="0.9", zorder=-1
    )
    ax.set(xlabel="x", ylabel="y", ylim=ylim, xlim=(float(x.min()), float(x.max())))
    return ax


def _scatter_classes(
    ax: Axes, data: ClassificationData, size: float, label: bool
) -> None:
    """One scatter per class, in the shared class colours."""
    for c in torch.unique(data.y).tolist():
        pts = data.X[data.y == c]
        ax.scatter(
            pts[:, 0],
            pts[:, 1],
            s=size,
            c=CLASS_COLOURS[c % len(CLASS_COLOURS)],
            edgecolors="k",
            linewidths=0.3,
            label=f"class {c}" if label else None,
        )


def plot_2d_data(ax: Axes, data: ClassificationData, title: str = "") -> Axes:
    """Scatter a 2-D classification set, one colour per class."""
    _scatter_classes(ax, data, size=14, label=True)
    ax.set(xlabel="$x_1$", ylabel="$x_2$", title=title, aspect="equal")
    ax.legend(loc="best", fontsize=8)
    return ax


def grid_2d(
    lim: float | tuple[float, float, float, float] = 3.0, n: int = 100
) -> Tensor:
    """An n×n grid of 2-D inputs, (n·n, 2), row-major in x₂ then x₁ (so
    ``values.reshape(n, n)`` plots).

    ``lim`` is a half-width (a square around 0) or (x₁min, x₁max, x₂min, x₂max). Made on
    the CPU (plots are drawn from there): move it with ``.to(device)`` to predict on
    another device.
    """
    x1min, x1max, x2min, x2max = (
        (-lim, lim, -lim, lim) if isinstance(lim, int | float) else lim
    )
    dtype = torch.get_default_dtype()
    x1 = torch.linspace(x1min, x1max, n, dtype=dtype, device="cpu")
    x2 = torch.linspace(x2min, x2max, n, dtype=dtype, device="cpu")
    X2, X1 = torch.meshgrid(x2, x1, indexing="ij")
    return torch.stack([X1.reshape(-1), X2.reshape(-1)], -1)


def plot_contour(
    ax: Axes,
    grid: Tensor,
    values: Tensor,
    data: ClassificationData | None = None,
    kind: str = "probability",
    title: str = "",
    colorbar: bool = True,
    levels: int | list[float] | None = None,
) -> Axes:
    """Filled contours of ``values`` (n·n,) on a :func:`grid_2d` grid, with the data on
    top.

    ``kind="probability"``: p(y = 1 | x) on [0, 1] (diverging colours, the 0.5 line
    drawn); ``kind="entropy"``: predictive entropy on [0, log K] (sequential colours), K
    from ``data`` (or the maximum of ``values``); ``kind="other"``: any scalar, own
    range.
    """
    n = int(round(grid.shape[0] ** 0.5))
    if n * n != grid.shape[0] or values.numel() != grid.shape[0]:
        raise ValueError(
            f"grid {tuple(grid.shape)} and values {tuple(values.shape)} must be an n×n "
            "grid"
        )
    # matplotlib draws from the CPU, whatever device predicted
    grid = grid.detach().cpu()
    X1, X2 = grid[:, 0].reshape(n, n), grid[:, 1].reshape(n, n)
    V = values.detach().cpu().reshape(n, n)
    colorbar_ticks = None  # matplotlib's, unless set below
    if kind == "probability":
        cs = ax.contourf(
            X1,
            X2,
            V,
            levels=levels or [i / 10 for i in range(11)],
            cmap="RdBu_r",
            vmin=0,
            vmax=1,
        )
        ax.contour(X1, X2, V, levels=[0.5], colors="k", linewidths=1)
    elif kind == "entropy":
        K = len(torch.unique(data.y)) if data is not None else None
        top = math.log(K) if K else float(V.max())
        # round levels (0, 0.1, ...) and colour-bar ticks (0, 0.2, ...) up to log K
        round_levels = _multiples(_round_step(top / 10), top)
        if top - round_levels[-1] > 1e-9 * top:
            round_levels.append(top)
        cs = ax.contourf(X1, X2, V, levels=levels or round_levels, cmap="viridis")
        if levels is None:
            ticks = _multiples(_round_step(top / 5), top)
            labels = [f"{t:g}" for t in ticks]
            if K and top - ticks[-1] > 0.08 * top:  # room for a tick at log K
                ticks, labels = [*ticks, top], [*labels, f"log {K}"]
            colorbar_ticks = (ticks, labels)
    elif kind == "other":
        cs = ax.contourf(X1, X2, V, levels=levels or 10, cmap="viridis")
    else:
        raise ValueError(
            f"kind must be 'probability', 'entropy' or 'other', got {kind!r}"
        )
    if colorbar:
        bar = ax.figure.colorbar(cs, ax=ax, shrink=0.85)
        if colorbar_ticks is not None:
            bar.set_ticks(colorbar_ticks[0], labels=colorbar_ticks[1])
    if data is not None:
        _scatter_classes(ax, data, size=8, label=False)
    ax.set(xlabel="$x_1$", ylabel="$x_2$", title=title, aspect="equal")
    ax.set_xlim(float(X1.min()), float(X1.max()))
    ax.set_ylim(float(X2.min()), float(X2.max()))
    return ax


def _round_step(x: float) -> float:
    """The largest of 1, 2 or 5 times a power of ten that is at most ``x`` > 0."""
    power = 10 ** math.floor(math.log10(x))
    return max(m * power for m in (1, 2, 5) if m * power <= x * (1 + 1e-9))


def _multiples(step: float, top: float) -> list[float]:
    """0, step, 2·step, ... up to ``top`` (rounded, so that 3·0.1 is 0.3)."""
    return [round(i * step, 12) for i in range(int(top / step * (1 + 1e-9)) + 1)]


def new_figure(
    ncols: int = 1, nrows: int = 1, width: float = 4.5, height: float = 3.2, **kw
):
    """``plt.subplots`` sized per panel, with constrained layout."""
    return plt.subplots(
        nrows,
        ncols,
        figsize=(width * ncols, height * nrows),
        layout="constrained",
        **kw,
    )


def plot_reliability(
    ax: Axes,
    probs: Tensor,
    y: Tensor,
    n_bins: int = 15,
    label: str | None = None,
    color: str | None = None,
    counts_ax: Axes | None = None,
    min_count: int = 0,
    linestyle: str = "-",
) -> float:
    """Reliability diagram: accuracy against mean confidence in each non-empty bin of
    :func:`~laplace_from_scratch.helpers.metrics.calibration_curve`, as a line with
    markers, and the diagonal (perfect calibration) once per axes. probs: (N, C), y:
    (N,). Returns the ECE, shown in the legend. Bins with fewer than ``min_count``
    points get hollow markers: their accuracy rests on a handful of points.

    ``counts_ax``: an axes (typically a short one below ``ax``) where the number of
    points in each confidence bin is drawn as a step histogram on a log scale: bins with
    few points say little. Call it again on the same axes to overlay several
    predictives.
    """
    from .metrics import calibration_curve, ece

    probs, y = probs.detach().cpu(), y.cpu()  # matplotlib draws from the CPU
    conf, acc, count = calibration_curve(probs, y, n_bins)
    error = ece(probs, y, n_bins)
    if not any(line.get_gid() == "reliability-diagonal" for line in ax.lines):
        ax.plot([0, 1], [0, 1], ls="--", c="0.5", lw=1, gid="reliability-diagonal")
    full = count > 0
    text = f"ECE {error:.3f}" if label is None else f"{label} (ECE {error:.3f})"
    (line,) = ax.plot(
        conf[full], acc[full], marker="o", ms=4, color=color, ls=linestyle, label=text
    )
    thin = full & (count < min_count)
    if thin.any():
        ax.plot(conf[thin], acc[thin], "o", ms=4, color=line.get_color(), mfc="white")
    ax.set(xlabel="confidence", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="upper left", fontsize=8)
    if counts_ax is not None:
        edges = torch.linspace(0, 1, n_bins + 1, device="cpu")
        counts_ax.stairs(
            count.clamp(min=0.5).numpy(), edges.numpy(), color=color, baseline=0.5
        )
        counts_ax.set(xlim=(0, 1), yscale="log", ylabel="points", xlabel="confidence")
    return error
