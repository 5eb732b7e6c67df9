"""Baselines (temperature scaling, ensembles, MC dropout), the sum-zero projection of the logit
covariance, bootstrap AUROC intervals and the bin counts of reliability diagrams."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import laplace_from_scratch as lfs  # noqa: E402
from laplace_from_scratch.plotting import plot_reliability  # noqa: E402


def test_fit_temperature_recovers_the_generating_temperature():
    # labels drawn from softmax(z / T0): the NLL-optimal T converges to T0 as N grows
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(20000, 5, generator=g, dtype=torch.float64)
    T0 = 2.5
    y = torch.multinomial(torch.softmax(z / T0, -1), 1, generator=g)[:, 0]
    T = lfs.fit_temperature(z, y)
    assert abs(T / T0 - 1) < 0.03  # the standard error of T at N = 20,000 is about 1 %


def test_fit_temperature_is_a_minimum():
    g = torch.Generator().manual_seed(1)
    z = 4 * torch.randn(300, 10, generator=g)
    y = torch.randint(0, 10, (300,), generator=g)
    T = lfs.fit_temperature(z, y)

    def nll(t: float) -> float:
        return nn.functional.cross_entropy(z.double() / t, y).item()

    assert nll(T) <= min(nll(T * 1.01), nll(T / 1.01))


@pytest.mark.parametrize(
    "logits, y, match",
    [
        (torch.zeros(3), torch.zeros(3, dtype=torch.long), "must be"),
        (torch.zeros(3, 2), torch.zeros(4, dtype=torch.long), "must be"),
        (torch.full((3, 2), math.nan), torch.zeros(3, dtype=torch.long), "finite"),
        (torch.zeros(3, 2), torch.full((3,), 2), "labels"),
    ],
)
def test_fit_temperature_bad_input(logits, y, match):
    with pytest.raises(ValueError, match=match):
        lfs.fit_temperature(logits, y)


def test_ensemble_probs_is_the_mean_softmax():
    X = torch.randn(7, 4)
    models = [lfs.mlp(4, 3, width=5, seed=s) for s in range(3)]
    expected = sum(torch.softmax(m(X), -1) for m in models) / 3
    torch.testing.assert_close(lfs.ensemble_probs(models, X), expected.detach())
    with pytest.raises(ValueError, match="at least one"):
        lfs.ensemble_probs([], X)


def test_mlp_and_cnn_dropout():
    assert [type(m) for m in lfs.mlp(4, 3, depth=2)] == [nn.Linear, nn.Tanh] * 2 + [nn.Linear]
    net = lfs.mlp(4, 3, depth=2, dropout=0.2)
    assert sum(isinstance(m, nn.Dropout) for m in net) == 2
    assert not any(isinstance(m, nn.Dropout) for m in lfs.cnn())
    assert sum(isinstance(m, nn.Dropout) for m in lfs.cnn(dropout=0.3)) == 1
    # the same initial weights with and without dropout
    a, b = lfs.mlp(4, 3, seed=3), lfs.mlp(4, 3, seed=3, dropout=0.5)
    torch.testing.assert_close(lfs.flatten_params(a), lfs.flatten_params(b))


def test_mc_dropout_probs():
    net = lfs.mlp(4, 3, width=20, seed=0, dropout=0.3)
    net.eval()
    X = torch.randn(6, 4)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    p = lfs.mc_dropout_probs(net, X, n_samples=50, seed=7)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is untouched
    assert not any(m.training for m in net.modules())  # modes restored
    torch.testing.assert_close(p.sum(-1), torch.ones(6))
    torch.testing.assert_close(lfs.mc_dropout_probs(net, X, n_samples=50, seed=7), p)  # repeatable
    # the same as 50 explicit passes with dropout on, from the same seed
    net.train()
    torch.manual_seed(7)
    with torch.no_grad():
        explicit = torch.stack([torch.softmax(net(X), -1) for _ in range(50)]).mean(0)
    torch.testing.assert_close(p, explicit)
    with torch.no_grad():
        assert not torch.allclose(p, torch.softmax(net.eval()(X), -1))  # dropout did something
    with pytest.raises(ValueError, match="nn.Dropout"):
        lfs.mc_dropout_probs(lfs.mlp(4, 3), X)
    with pytest.raises(ValueError, match="n_samples"):
        lfs.mc_dropout_probs(net, X, n_samples=0)


def test_sum_zero_projection():
    g = torch.Generator().manual_seed(0)
    K = 4
    A = 0.3 * torch.randn(2, K, K, generator=g, dtype=torch.float64)
    V = A @ A.mT + 25 * torch.ones(K, K, dtype=torch.float64)  # a large common-mode part
    W = lfs.sum_zero(V)
    torch.testing.assert_close(W @ torch.ones(K, dtype=torch.float64), torch.zeros(2, K, dtype=torch.float64))
    torch.testing.assert_close(W, W.mT)
    torch.testing.assert_close(lfs.sum_zero(W), W)  # a projection
    # the common mode is invisible to softmax: the MC predictive is the same for V and C V C
    mu = torch.randn(2, K, generator=g, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    p_v = lfs.mc_softmax(mu, V, 200_000, gen)
    p_w = lfs.mc_softmax(mu, W + 1e-9 * torch.eye(K, dtype=torch.float64), 200_000, gen)
    assert (p_v - p_w).abs().max() < 5e-3  # MC standard error ≈ 1e-3 at 200,000 samples
    # probit on the raw V shrinks every logit towards 0; on C V C it is much closer to MC
    err_raw = (lfs.probit(mu, V) - p_v).abs().max()
    err_sz = (lfs.probit(mu, W) - p_v).abs().max()
    assert err_sz < err_raw / 4


def test_auroc_interval_equals_explicit_bootstrap():
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(40, generator=g) + 1
    neg = torch.randn(60, generator=g).round()  # ties with each other
    low, high = lfs.auroc_interval(pos, neg, n_boot=200, seed=3)
    # the same resamples, drawn the same way, scored one at a time by lfs.auroc (average ranks for ties)
    g2 = torch.Generator().manual_seed(3)
    ip = torch.randint(0, 40, (200, 40), generator=g2)
    ineg = torch.randint(0, 60, (200, 60), generator=g2)
    values = [lfs.auroc(pos[a], neg[b]) for a, b in zip(ip, ineg, strict=True)]
    values = torch.tensor(values, dtype=torch.float64)
    q = torch.quantile(values, torch.tensor([0.025, 0.975], dtype=torch.float64))
    assert (low, high) == pytest.approx(q.tolist(), abs=1e-12)
    assert low < lfs.auroc(pos, neg) < high


def test_auroc_interval_narrows_with_data_and_checks_input():
    g = torch.Generator().manual_seed(0)
    widths = []
    for n in (50, 2000):
        lo, hi = lfs.auroc_interval(torch.randn(n, generator=g) + 1, torch.randn(n, generator=g), n_boot=300)
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 4  # width ∝ 1/√n: a factor √40 ≈ 6.3
    with pytest.raises(ValueError, match="n_boot"):
        lfs.auroc_interval(torch.randn(5), torch.randn(5), n_boot=1)
    with pytest.raises(ValueError, match="level"):
        lfs.auroc_interval(torch.randn(5), torch.randn(5), level=1.5)
    probs = torch.softmax(torch.randn(30, 3, generator=g), -1)
    value, lo, hi = lfs.ood_auroc_interval(probs[:15], probs[15:], n_boot=100)
    assert value == lfs.ood_auroc(probs[:15], probs[15:]) and lo <= hi


def test_plot_reliability_counts():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(200, 4, generator=g), -1)
    y = torch.randint(0, 4, (200,), generator=g)
    fig, (ax, cax) = plt.subplots(2, 1)
    e = plot_reliability(ax, probs, y, n_bins=10, counts_ax=cax)
    assert e == pytest.approx(lfs.ece(probs, y, n_bins=10))
    (stairs,) = cax.patches
    assert stairs.get_data().values.round().sum() >= 200 - 10 * 0.5  # empty bins drawn at 0.5 on a log axis
    _, _, count = lfs.calibration_curve(probs, y, 10)
    assert stairs.get_data().values[count > 0].sum() == pytest.approx(200)
    plt.close(fig)
