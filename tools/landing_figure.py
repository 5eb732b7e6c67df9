"""The landing page's figure, book/_static/landing.png: what the Laplace approximation adds.

The regression of notebooks 01-04: a 1-50-50-1 tanh MLP trained to its MAP on 150 noisy points of
sin(x), x in [0, 10] (noise sigma = 0.3, prior precision delta = 1), predicted on [-10, 20]. Left, the
plug-in predictive: the MAP network with the noise band +-2 sigma around it, the same width everywhere.
Right, the linearised Laplace predictive of notebook 04 with all weights and the full GGN: the band is
+-2 std of y, std^2 = J Sigma J^T + sigma^2, which stays at the noise level inside the data and widens
outside it. Both from the module (laplace_from_scratch and its helpers), on the CPU, in float64.

    python tools/landing_figure.py            # writes book/_static/landing.png
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# the same bits as the notebooks (tools/run_notebooks.py), set before torch is imported
for k, v in {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "2",
    "MKL_NUM_THREADS": "2",
}.items():
    os.environ.setdefault(k, v)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import laplace_from_scratch as lfs  # noqa: E402
from laplace_from_scratch import helpers  # noqa: E402
from laplace_from_scratch.helpers.plotting import new_figure, plot_regression  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIGMA, DELTA = 0.3, 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "book" / "_static" / "landing.png")
    args = parser.parse_args()

    torch.set_default_dtype(torch.float64)
    data = helpers.sinusoid(test_range=(-10.0, 20.0))
    X, y, xs = data.X_train, data.y_train, data.X_test
    model = helpers.fit_map(helpers.mlp(1, 1, width=50), X, y, "regression", SIGMA, DELTA)
    la = lfs.Laplace(
        model,
        "regression",
        subset_of_weights="all",
        hessian_structure="full",
        sigma_noise=SIGMA,
        prior_precision=DELTA,
    )
    la.fit(DataLoader(TensorDataset(X, y), batch_size=50))
    f_mu, f_var = la(xs, pred_type="glm")
    with torch.no_grad():
        f_map = model(xs)
    std_plugin = torch.full_like(f_map[:, 0], SIGMA)
    std_laplace = (f_var[:, 0, 0] + SIGMA**2).sqrt()

    fig, axes = new_figure(ncols=2, width=3.6, height=2.7, sharey=True)
    plot_regression(axes[0], data, f_map, std_plugin, label="MAP network", ylim=(-5, 5))
    plot_regression(axes[1], data, f_mu, std_laplace, label="Laplace", ylim=(-5, 5))
    axes[0].set_title("plug-in: the MAP network, noise only", fontsize=10)
    axes[1].set_title("Laplace: + the weights' uncertainty", fontsize=10)
    axes[1].set_ylabel("")
    for ax in axes:
        ax.legend(loc="upper right", fontsize=8)
    fig.savefig(args.out, dpi=150)
    plt.close(fig)
    inside = (xs[:, 0] >= X.min()) & (xs[:, 0] <= X.max())
    print(
        f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}: "
        f"P = {la.n_params}, std of y inside the data "
        f"{std_laplace[inside].min().item():.2f}..{std_laplace[inside].max().item():.2f}, "
        f"outside up to {std_laplace[~inside].max().item():.2f} (plug-in: {SIGMA} everywhere)"
    )


if __name__ == "__main__":
    main()
