"""Baselines (temperature scaling, ensembles, MC dropout), the sum-zero projection of the logits'
mean and covariance, bootstrap AUROC intervals and the bin counts of reliability diagrams."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import laplace_from_scratch as lfs  # noqa: E402
from laplace_from_scratch import helpers  # noqa: E402
from laplace_from_scratch.helpers.plotting import plot_reliability  # noqa: E402


def test_fit_temperature_recovers_the_generating_temperature():
    # labels drawn from softmax(z / T0): the NLL-optimal T converges to T0 as N grows
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(20000, 5, generator=g, dtype=torch.float64)
    T0 = 2.5
    y = torch.multinomial(torch.softmax(z / T0, -1), 1, generator=g)[:, 0]
    T = helpers.fit_temperature(z, y)
    assert abs(T / T0 - 1) < 0.03  # the standard error of T at N = 20,000 is about 1 %


def test_fit_temperature_is_a_minimum():
    g = torch.Generator().manual_seed(1)
    z = 4 * torch.randn(300, 10, generator=g)
    y = torch.randint(0, 10, (300,), generator=g)
    T = helpers.fit_temperature(z, y)

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
        helpers.fit_temperature(logits, y)


def test_ensemble_probs_is_the_mean_softmax():
    X = torch.randn(7, 4)
    models = [helpers.mlp(4, 3, width=5, seed=s) for s in range(3)]
    expected = sum(torch.softmax(m(X), -1) for m in models) / 3
    torch.testing.assert_close(helpers.ensemble_probs(models, X), expected.detach())
    with pytest.raises(ValueError, match="at least one"):
        helpers.ensemble_probs([], X)


def test_mlp_and_cnn_dropout():
    assert [type(m) for m in helpers.mlp(4, 3, depth=2)] == [nn.Linear, nn.Tanh] * 2 + [nn.Linear]
    net = helpers.mlp(4, 3, depth=2, dropout=0.2)
    assert sum(isinstance(m, nn.Dropout) for m in net) == 2
    assert not any(isinstance(m, nn.Dropout) for m in helpers.cnn())
    assert sum(isinstance(m, nn.Dropout) for m in helpers.cnn(dropout=0.3)) == 1
    # the same initial weights with and without dropout
    a, b = helpers.mlp(4, 3, seed=3), helpers.mlp(4, 3, seed=3, dropout=0.5)
    torch.testing.assert_close(lfs.flatten_params(a), lfs.flatten_params(b))


def test_mc_dropout_probs():
    net = helpers.mlp(4, 3, width=20, seed=0, dropout=0.3)
    net.eval()
    X = torch.randn(6, 4)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    p = helpers.mc_dropout_probs(net, X, n_samples=50, seed=7)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is untouched
    assert not any(m.training for m in net.modules())  # modes restored
    torch.testing.assert_close(p.sum(-1), torch.ones(6))
    torch.testing.assert_close(helpers.mc_dropout_probs(net, X, n_samples=50, seed=7), p)  # repeatable
    # the same as 50 explicit passes with dropout on, from the same seed
    net.train()
    torch.manual_seed(7)
    with torch.no_grad():
        explicit = torch.stack([torch.softmax(net(X), -1) for _ in range(50)]).mean(0)
    torch.testing.assert_close(p, explicit)
    with torch.no_grad():
        assert not torch.allclose(p, torch.softmax(net.eval()(X), -1))  # dropout did something
    with pytest.raises(ValueError, match="nn.Dropout"):
        helpers.mc_dropout_probs(helpers.mlp(4, 3), X)
    with pytest.raises(ValueError, match="n_samples"):
        helpers.mc_dropout_probs(net, X, n_samples=0)


def test_sum_zero_projection():
    g = torch.Generator().manual_seed(0)
    K = 4
    A = 0.3 * torch.randn(2, K, K, generator=g, dtype=torch.float64)
    V = A @ A.mT + 25 * torch.ones(K, K, dtype=torch.float64)  # a large common-mode part
    mu = torch.randn(2, K, generator=g, dtype=torch.float64)
    m, W = lfs.sum_zero(mu, V)
    assert m.shape == (2, K) and W.shape == (2, K, K)
    ones = torch.ones(K, dtype=torch.float64)
    torch.testing.assert_close(m @ ones, torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(W @ ones, torch.zeros(2, K, dtype=torch.float64))
    torch.testing.assert_close(m, mu - mu.mean(-1, keepdim=True))
    torch.testing.assert_close(W, W.mT)
    m2, W2 = lfs.sum_zero(m, W)  # a projection: applied twice, the same
    torch.testing.assert_close(m2, m)
    torch.testing.assert_close(W2, W)
    # the common mode is invisible to softmax: the MC predictive is the same for N(μ, V)
    # and N(Cμ, CVC)
    gen = torch.Generator().manual_seed(1)
    p_v = lfs.mc_softmax(mu, V, 200_000, gen)
    p_w = lfs.mc_softmax(m, W + 1e-9 * torch.eye(K, dtype=torch.float64), 200_000, gen)
    assert (p_v - p_w).abs().max() < 5e-3  # MC standard error ≈ 1e-3 at 200,000 samples
    # probit on the raw V shrinks every logit by the common-mode variance too; on (Cμ,
    # CVC) it does not, and lands much closer to MC
    err_raw = (lfs.probit(mu, V) - p_v).abs().max()
    err_sz = (lfs.probit(*lfs.sum_zero(mu, V)) - p_v).abs().max()
    assert err_sz < err_raw / 4


def test_probit_after_sum_zero_ignores_a_common_shift_of_the_mean():
    # κ = 1/√(1 + π/8 · Vₖₖ) = (1, 0.5, 0.5): probit scales each logit by its own κₖ,
    # so adding 10 to every mean logit changes plain probit's answer
    V = torch.diag(torch.tensor([0.0, 24 / math.pi, 24 / math.pi], dtype=torch.float64))[None]
    mu = torch.tensor([[0.5, 0.0, 0.0]], dtype=torch.float64)
    assert lfs.probit(mu, V)[0, 0].item() == pytest.approx(0.452, abs=1e-3)
    assert lfs.probit(mu + 10, V)[0, 0].item() == pytest.approx(0.992, abs=1e-3)
    # softmax(f + c·1) = softmax(f): after the projection probit cannot see c either
    for c in (10.0, -3.0):
        torch.testing.assert_close(lfs.probit(*lfs.sum_zero(mu + c, V)), lfs.probit(*lfs.sum_zero(mu, V)))
    g = torch.Generator().manual_seed(2)
    A = torch.randn(5, 4, 4, generator=g, dtype=torch.float64)
    V, mu = A @ A.mT, torch.randn(5, 4, generator=g, dtype=torch.float64)
    shift = 7 * torch.randn(5, 1, generator=g, dtype=torch.float64)
    torch.testing.assert_close(lfs.probit(*lfs.sum_zero(mu + shift, V)), lfs.probit(*lfs.sum_zero(mu, V)))
    assert (lfs.probit(mu + shift, V) - lfs.probit(mu, V)).abs().max() > 0.01


def test_probit_after_sum_zero_of_a_common_mode_covariance_is_softmax():
    # V = s·11ᵀ moves every logit together: E[softmax(f)] = softmax(μ) exactly, and CVC = 0
    g = torch.Generator().manual_seed(3)
    mu = 3 * torch.randn(6, 5, generator=g, dtype=torch.float64)
    s = torch.rand(6, 1, 1, generator=g, dtype=torch.float64) * 50
    V = s * torch.ones(5, 5, dtype=torch.float64)
    torch.testing.assert_close(lfs.probit(*lfs.sum_zero(mu, V)), torch.softmax(mu, -1))
    # plain probit counts the common mode as uncertainty and flattens the prediction
    assert (lfs.probit(mu, V) - torch.softmax(mu, -1)).abs().max() > 0.1


def test_auroc_interval_equals_explicit_bootstrap():
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(40, generator=g) + 1
    neg = torch.randn(60, generator=g).round()  # ties with each other
    low, high = helpers.auroc_interval(pos, neg, n_boot=200, seed=3)
    # the same resamples, drawn the same way, scored one at a time by helpers.auroc (average ranks for ties)
    g2 = torch.Generator().manual_seed(3)
    ip = torch.randint(0, 40, (200, 40), generator=g2)
    ineg = torch.randint(0, 60, (200, 60), generator=g2)
    values = [helpers.auroc(pos[a], neg[b]) for a, b in zip(ip, ineg, strict=True)]
    values = torch.tensor(values, dtype=torch.float64)
    q = torch.quantile(values, torch.tensor([0.025, 0.975], dtype=torch.float64))
    assert (low, high) == pytest.approx(q.tolist(), abs=1e-12)
    assert low < helpers.auroc(pos, neg) < high


def test_auroc_interval_narrows_with_data_and_checks_input():
    g = torch.Generator().manual_seed(0)
    widths = []
    for n in (50, 2000):
        lo, hi = helpers.auroc_interval(
            torch.randn(n, generator=g) + 1, torch.randn(n, generator=g), n_boot=300
        )
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 4  # width ∝ 1/√n: a factor √40 ≈ 6.3
    with pytest.raises(ValueError, match="n_boot"):
        helpers.auroc_interval(torch.randn(5), torch.randn(5), n_boot=1)
    with pytest.raises(ValueError, match="level"):
        helpers.auroc_interval(torch.randn(5), torch.randn(5), level=1.5)
    probs = torch.softmax(torch.randn(30, 3, generator=g), -1)
    value, lo, hi = helpers.ood_auroc_interval(probs[:15], probs[15:], n_boot=100)
    assert value == helpers.ood_auroc(probs[:15], probs[15:]) and lo <= hi


def test_auroc_difference_interval_equals_explicit_paired_bootstrap():
    """Each resample draws the inputs once and scores both methods on them; with
    paired=True a negative is drawn with its positive."""
    g = torch.Generator().manual_seed(1)
    pos_a, neg_a = torch.randn(30, generator=g) + 1, torch.randn(30, generator=g)
    pos_b = pos_a + 0.5 * torch.randn(30, generator=g)  # b: a noisier scoring
    neg_b = neg_a.round()  # ties
    for paired in (False, True):
        d, low, high = helpers.auroc_difference_interval(
            pos_a, neg_a, pos_b, neg_b, paired=paired, n_boot=150, seed=4
        )
        assert d == pytest.approx(helpers.auroc(pos_a, neg_a) - helpers.auroc(pos_b, neg_b), abs=1e-12)
        g2 = torch.Generator().manual_seed(4)
        ip = torch.randint(0, 30, (150, 30), generator=g2)
        ineg = ip if paired else torch.randint(0, 30, (150, 30), generator=g2)
        values = [
            helpers.auroc(pos_a[a], neg_a[b]) - helpers.auroc(pos_b[a], neg_b[b])
            for a, b in zip(ip, ineg, strict=True)
        ]
        levels = torch.tensor([0.025, 0.975], dtype=torch.float64)
        q = torch.quantile(torch.tensor(values, dtype=torch.float64), levels)
        assert (low, high) == pytest.approx(q.tolist(), abs=1e-12)
        assert low <= d <= high
    # what the two scorings share cancels: the same scores differ by exactly 0
    assert helpers.auroc_difference_interval(pos_a, neg_a, pos_a, neg_a, n_boot=20) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="same inputs"):
        helpers.auroc_difference_interval(pos_a, neg_a, pos_b[:10], neg_b)
    with pytest.raises(ValueError, match="paired"):
        helpers.auroc_difference_interval(pos_a, neg_a[:20], pos_b, neg_b[:20], paired=True)


def test_plot_reliability_counts():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(200, 4, generator=g), -1)
    y = torch.randint(0, 4, (200,), generator=g)
    fig, (ax, cax) = plt.subplots(2, 1)
    e = plot_reliability(ax, probs, y, n_bins=10, counts_ax=cax)
    assert e == pytest.approx(helpers.ece(probs, y, n_bins=10))
    (stairs,) = cax.patches
    assert stairs.get_data().values.round().sum() >= 200 - 10 * 0.5  # empty bins drawn at 0.5 on a log axis
    _, _, count = helpers.calibration_curve(probs, y, 10)
    assert stairs.get_data().values[count > 0].sum() == pytest.approx(200)
    plt.close(fig)


def test_plot_reliability_marks_thin_bins_hollow():
    """Bins with fewer than min_count points get a second, hollow marker; the others
    none."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(200, 4, generator=g), -1)
    y = torch.randint(0, 4, (200,), generator=g)
    conf, _, count = helpers.calibration_curve(probs, y, 10)
    fig, ax = plt.subplots()
    plot_reliability(ax, probs, y, n_bins=10, min_count=20, linestyle=":")
    line, *hollow = [ln for ln in ax.lines if ln.get_gid() != "reliability-diagonal"]
    assert line.get_linestyle() == ":"
    thin = (count > 0) & (count < 20)
    assert 0 < thin.sum() < (count > 0).sum()  # some bins thin, some not
    (marks,) = hollow
    assert marks.get_markerfacecolor() == "white"
    assert marks.get_xdata().tolist() == conf[thin].tolist()
    plt.close(fig)
