import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy
from sklearn.metrics import accuracy_score, brier_score_loss, log_loss, roc_auc_score

from laplace_from_scratch.helpers.metrics import (
    accuracy,
    auroc,
    brier,
    calibration_curve,
    ece,
    nll,
    ood_auroc,
)


def random_probs(n: int, C: int, seed: int = 0, dtype=torch.float64):
    """Dirichlet(1) rows and labels drawn uniformly: (N, C) probabilities, (N,) int64."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(3 * torch.randn(n, C, generator=g, dtype=torch.float64), -1).to(dtype)
    return probs, torch.randint(0, C, (n,), generator=g)


@pytest.mark.parametrize("C", [2, 5])
def test_accuracy_nll_against_sklearn(C):
    probs, y = random_probs(400, C)
    P, Y = probs.numpy(), y.numpy()
    assert accuracy(probs, y) == pytest.approx(accuracy_score(Y, P.argmax(1)), abs=1e-12)
    assert nll(probs, y) == pytest.approx(log_loss(Y, P, labels=list(range(C))), rel=1e-10)


def test_brier_binary_is_twice_sklearn():
    probs, y = random_probs(300, 2)
    ref = brier_score_loss(y.numpy(), probs[:, 1].numpy())  # binary: mean (p₁ − y)²
    assert brier(probs, y) == pytest.approx(2 * ref, rel=1e-10)


def test_brier_multiclass_against_loop_and_sklearn():
    probs, y = random_probs(200, 4, seed=1)
    P, Y = probs.numpy(), y.numpy()
    total = 0.0
    for i in range(len(Y)):
        for c in range(P.shape[1]):
            total += (P[i, c] - (1.0 if c == Y[i] else 0.0)) ** 2
    assert brier(probs, y) == pytest.approx(total / len(Y), rel=1e-10)
    sk = brier_score_loss(Y, P, labels=[0, 1, 2, 3], scale_by_half=False)
    assert brier(probs, y) == pytest.approx(sk, rel=1e-10)


def test_nll_float32_true_class_probability_zero_is_finite():
    probs = torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=torch.float32)
    y = torch.tensor([0, 0])
    value = nll(probs, y)
    # −log(tiny_float32) = −log(1.1755e−38) ≈ 87.34; the mean with −log 0.5 ≈ 0.693
    expected = (-math.log(torch.finfo(torch.float32).tiny) + math.log(2)) / 2
    assert math.isfinite(value)
    assert value == pytest.approx(expected, rel=1e-6)
    assert brier(probs, y) == pytest.approx((2 + 0.5) / 2)
    assert math.isfinite(ece(probs, y))


def test_ece_hand_computed_and_bins_closed_on_the_right():
    # n_bins = 4: bins (0, .25], (.25, .5], (.5, .75], (.75, 1]; the edges are exact in binary.
    probs = torch.tensor(
        [
            [0.5, 0.3, 0.2],  # conf 0.5  → bin 1 (edge goes down), correct
            [0.4, 0.35, 0.25],  # conf 0.4  → bin 1, wrong (y = 1)
            [0.25, 0.75, 0.0],  # conf 0.75 → bin 2 (edge goes down), correct
            [0.1, 0.2, 0.7],  # conf 0.7  → bin 2, wrong (y = 0)
            [0.9, 0.05, 0.05],  # conf 0.9  → bin 3, correct
            [1.0, 0.0, 0.0],  # conf 1.0  → bin 3, correct
        ],
        dtype=torch.float64,
    )
    y = torch.tensor([0, 1, 1, 0, 0, 0])
    # bin 1: conf (0.5 + 0.4)/2 = 0.45,  acc 1/2 → |gap| 0.05
    # bin 2: conf (0.75 + 0.7)/2 = 0.725, acc 1/2 → |gap| 0.225
    # bin 3: conf (0.9 + 1.0)/2 = 0.95,  acc 2/2 → |gap| 0.05
    # ECE = 2/6·0.05 + 2/6·0.225 + 2/6·0.05 = 0.325/3 = 0.108333…
    # (bins [lo, hi) would give 1/6·0.4 + 2/6·0.1 + 3/6·(1 − 0.88333…) = 0.158333…)
    conf, acc, count = calibration_curve(probs, y, n_bins=4)
    assert count.tolist() == [0, 2, 2, 2]
    assert count.dtype == torch.int64
    assert torch.isnan(conf[0]) and torch.isnan(acc[0])
    torch.testing.assert_close(conf[1:], torch.tensor([0.45, 0.725, 0.95], dtype=torch.float64))
    torch.testing.assert_close(acc[1:], torch.tensor([0.5, 0.5, 1.0], dtype=torch.float64))
    assert ece(probs, y, n_bins=4) == pytest.approx(0.325 / 3, abs=1e-12)


def test_calibration_curve_against_a_loop_with_confidences_on_the_edges():
    # Confidences on a grid of 1/16 with 8 bins: half of them sit exactly on a bin edge.
    g = torch.Generator().manual_seed(3)
    n, n_bins = 500, 8
    c = torch.randint(6, 17, (n,), generator=g).double() / 16  # 0.375 … 1, max of 3 classes
    probs = torch.stack([c, (1 - c) / 2, (1 - c) / 2], -1)
    shift = torch.randint(0, 3, (n, 1), generator=g)
    probs = probs.gather(1, (torch.arange(3) + shift) % 3)  # the confident class varies
    y = torch.randint(0, 3, (n,), generator=g)
    conf, acc, count = calibration_curve(probs, y, n_bins)
    assert int(count.sum()) == n
    P, Y = probs.numpy(), y.numpy()
    top, correct = P.max(1), P.argmax(1) == Y
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        mask = (top > lo) & (top <= hi)
        assert count[b] == mask.sum()
        if mask.any():
            assert conf[b].item() == pytest.approx(top[mask].mean(), abs=1e-12)
            assert acc[b].item() == pytest.approx(correct[mask].mean(), abs=1e-12)
        else:
            assert math.isnan(conf[b]) and math.isnan(acc[b])


def calibrated_sample(n: int, C: int, overconfident: bool, seed: int = 0):
    """Confidence c ~ U(1/C, 1) on a random class; the label is that class with probability c
    (calibrated) or c² (overconfident), else one of the others at random."""
    g = torch.Generator().manual_seed(seed)
    c = 1 / C + (1 - 1 / C) * torch.rand(n, generator=g, dtype=torch.float64)
    top = torch.randint(0, C, (n,), generator=g)
    probs = ((1 - c) / (C - 1)).unsqueeze(1).repeat(1, C)
    probs[torch.arange(n), top] = c
    hit = torch.rand(n, generator=g, dtype=torch.float64) < (c**2 if overconfident else c)
    other = (top + torch.randint(1, C, (n,), generator=g)) % C
    return probs, torch.where(hit, top, other)


def test_ece_near_zero_when_calibrated_and_large_when_not():
    # In each bin E[acc_b] = mean conf_b exactly, so only sampling noise is left: per bin
    # E|acc_b − conf_b| ≈ √(2/π)·√(c(1 − c)/n_b) ≤ 0.8·0.5/√n_b; with 15 bins of ~N/15 each the
    # ECE is ≈ 0.4·√(15/N) ≈ 0.005 for N = 10⁵ (the bound 0.015 is ~3×).
    N = 100_000
    probs, y = calibrated_sample(N, 4, overconfident=False)
    assert ece(probs, y) < 0.015
    # labels with probability c² instead of c: every bin is overconfident by the mean of c − c²
    # there, so ECE ≈ E[c − c²] for c ~ U(1/4, 1) = 5/8 − (1 − 1/64)/(3·3/4) = 0.625 − 0.4375 = 0.1875
    probs, y = calibrated_sample(N, 4, overconfident=True)
    assert ece(probs, y) == pytest.approx(0.1875, abs=0.01)


def sklearn_auroc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    labels = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    return roc_auc_score(labels, np.r_[pos.numpy(), neg.numpy()])


@pytest.mark.parametrize("decimals", [None, 1, 0])
def test_auroc_against_sklearn_with_and_without_ties(decimals):
    g = torch.Generator().manual_seed(5)
    pos = torch.randn(300, generator=g, dtype=torch.float64) + 0.7
    neg = torch.randn(170, generator=g, dtype=torch.float64)
    if decimals is not None:  # rounding makes many ties, within and across the two groups
        pos, neg = pos.round(decimals=decimals), neg.round(decimals=decimals)
    assert auroc(pos, neg) == pytest.approx(sklearn_auroc(pos, neg), abs=1e-12)


def test_auroc_small_cases():
    t = torch.tensor
    assert auroc(t([2.0, 3.0]), t([0.0, 1.0])) == 1.0
    assert auroc(t([0.0, 1.0]), t([2.0, 3.0])) == 0.0
    assert auroc(t([1.0]), t([1.0])) == 0.5
    # pairs: (1 vs 0) win, (1 vs 1) tie, (1 vs 2) loss, (3 vs ·) 3 wins → (1 + 0.5 + 3) / 6
    assert auroc(t([1.0, 3.0]), t([0.0, 1.0, 2.0])) == pytest.approx(4.5 / 6)
    with pytest.raises(ValueError, match="at least one"):
        auroc(t([]), t([1.0]))


@pytest.mark.parametrize("score", ["max_prob", "entropy"])
def test_ood_auroc_against_sklearn(score):
    g = torch.Generator().manual_seed(7)
    probs_in = torch.softmax(4 * torch.randn(250, 5, generator=g, dtype=torch.float64), -1)
    probs_out = torch.softmax(1.5 * torch.randn(180, 5, generator=g, dtype=torch.float64), -1)
    probs_out[:20] = 0.2  # uniform rows: ties in the OOD score
    P_in, P_out = probs_in.numpy(), probs_out.numpy()
    if score == "max_prob":
        s_in, s_out = -P_in.max(1), -P_out.max(1)
    else:
        s_in, s_out = scipy_entropy(P_in, axis=1), scipy_entropy(P_out, axis=1)
    labels = np.r_[np.ones(len(s_out)), np.zeros(len(s_in))]
    ref = roc_auc_score(labels, np.r_[s_out, s_in])
    assert ood_auroc(probs_in, probs_out, score) == pytest.approx(ref, abs=1e-12)
    assert ref > 0.7  # the sharper in-distribution rows are told apart from the OOD ones


def test_input_checks():
    probs, y = random_probs(10, 3)
    with pytest.raises(ValueError, match="score"):
        ood_auroc(probs, probs, score="energy")
    with pytest.raises(ValueError, match="same classes"):
        ood_auroc(probs, random_probs(10, 4)[0])
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        ood_auroc(probs[0], probs)
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        nll(probs.unsqueeze(0), y)
    with pytest.raises(ValueError, match="sum to 1"):
        accuracy(torch.randn(10, 3, dtype=torch.float64), y)  # logits, not probabilities
    with pytest.raises(ValueError, match=r"y must be \(N,\)"):
        brier(probs, y[:9])
    with pytest.raises(ValueError, match="labels must lie"):
        ece(probs, torch.full((10,), 3))
    with pytest.raises(ValueError, match="labels must lie"):
        nll(probs, torch.full((10,), -1))
    with pytest.raises(ValueError, match="integer"):
        accuracy(probs, y.double())


def test_plot_reliability_draws_the_non_empty_bins_and_returns_the_ece():
    import matplotlib

    matplotlib.use("Agg", force=False)
    from laplace_from_scratch.helpers.plotting import new_figure, plot_reliability

    probs, y = calibrated_sample(2000, 3, overconfident=True)
    fig, ax = new_figure()
    e1 = plot_reliability(ax, probs, y, n_bins=10, label="MAP", color="tab:red")
    e2 = plot_reliability(ax, *calibrated_sample(2000, 3, overconfident=False), n_bins=10)
    assert e1 == ece(probs, y, n_bins=10) and e2 < e1
    diagonal = [line for line in ax.lines if line.get_gid() == "reliability-diagonal"]
    assert len(diagonal) == 1 and len(ax.lines) == 3  # the diagonal once, one curve per call
    conf, acc, count = calibration_curve(probs, y, n_bins=10)
    curve = ax.lines[1]
    full = count > 0
    assert len(curve.get_xdata()) == int(full.sum()) < 10  # c > 1/3: the lowest bins are empty
    torch.testing.assert_close(torch.as_tensor(curve.get_ydata()), acc[full])
    labels = ax.get_legend_handles_labels()[1]
    assert labels == [f"MAP (ECE {e1:.3f})", f"ECE {e2:.3f}"]
    assert ax.get_xlim() == (0.0, 1.0) and ax.get_ylim() == (0.0, 1.0)
    matplotlib.pyplot.close(fig)
