import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg", force=False)

from laplace_from_scratch import entropy  # noqa: E402
from laplace_from_scratch.helpers import toy_multiclass  # noqa: E402
from laplace_from_scratch.helpers.plotting import grid_2d, new_figure, plot_contour  # noqa: E402


def test_grid_2d_is_row_major_in_x2_then_x1():
    G = grid_2d((0.0, 1.0, 10.0, 12.0), n=3)
    assert G.shape == (9, 2)
    torch.testing.assert_close(G[:3, 0], torch.tensor([0.0, 0.5, 1.0], dtype=G.dtype))
    torch.testing.assert_close(G[::3, 1], torch.tensor([10.0, 11.0, 12.0], dtype=G.dtype))
    assert torch.equal(grid_2d(2.0, 4)[0], torch.tensor([-2.0, -2.0], dtype=G.dtype))


def test_entropy_bounds():
    p = torch.tensor([[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0.0]])
    torch.testing.assert_close(entropy(p), torch.tensor([0.0, math.log(3), math.log(2)]))


def test_plot_contour_draws_and_checks_shapes():
    data = toy_multiclass(n=30)
    G = grid_2d(3.0, 20)
    fig, axs = new_figure(3)
    plot_contour(axs[0], G, torch.sigmoid(G[:, 0]), data, title="p")
    plot_contour(axs[1], G, torch.rand(400), data, kind="entropy")
    plot_contour(axs[2], G, G[:, 1], kind="other")
    assert axs[0].get_xlim() == (-3.0, 3.0)
    with pytest.raises(ValueError, match="n×n grid"):
        plot_contour(axs[0], G, torch.rand(399))
    with pytest.raises(ValueError, match="kind"):
        plot_contour(axs[0], G, torch.rand(400), kind="heat")
    matplotlib.pyplot.close(fig)


def test_entropy_colour_bar_has_round_ticks_up_to_log_k():
    data = toy_multiclass(n=30)  # K = 3
    fig, ax = new_figure()
    plot_contour(ax, grid_2d(3.0, 20), torch.rand(400), data, kind="entropy")
    bar = fig.axes[-1]
    labels = [t.get_text() for t in bar.get_yticklabels()]
    assert labels == ["0", "0.2", "0.4", "0.6", "0.8", "1", "log 3"]
    assert bar.get_yticks()[-1] == pytest.approx(math.log(3))
    levels = ax.collections[0].levels
    assert list(levels[:-1]) == pytest.approx([i / 10 for i in range(11)])
    matplotlib.pyplot.close(fig)
