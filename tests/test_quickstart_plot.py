import matplotlib
import torch

matplotlib.use("Agg", force=False)

from laplace_from_scratch import helpers  # noqa: E402
from laplace_from_scratch.helpers.quickstart_plot import (  # noqa: E402
    OOD_PANELS,
    STYLES,
    confidence_figure,
    fraction_above,
)


def test_fraction_above_counts_ties_as_above():
    conf = torch.tensor([0.2, 0.5, 0.5, 1.0])
    assert fraction_above(conf, torch.tensor([0.0, 0.5, 0.6, 1.0])) == [1.0, 0.75, 0.25, 0.25]


def test_confidence_figure_draws_every_predictive_in_every_panel():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 10, (40,), generator=g)
    probs = {
        name: {s: torch.rand(40, 10, generator=g).softmax(-1) for s in ("test", "noise", "inverted")}
        for name in STYLES
    }
    fig = confidence_figure(probs, y)
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert set(axes) == {"test digits: reliability"} | {t for _, t in OOD_PANELS}
    for _, title in OOD_PANELS:
        lines = axes[title].lines
        # one curve per predictive and the test digits' reference; each starts at 1 (c = 0)
        assert [line.get_label() for line in lines] == [*STYLES, "test digits (Laplace, MC)"]
        assert all(line.get_ydata()[0] == 1.0 for line in lines)
        assert [line.get_linestyle() for line in lines[:-1]] == ["-", ":", "-.", "-"]
    assert [ax.get_ylabel() for ax in fig.axes if not ax.get_title()] == ["digits per bin"]
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == len(STYLES) + 1
    assert helpers.quickstart_plot.confidence_figure is confidence_figure
    matplotlib.pyplot.close(fig)
