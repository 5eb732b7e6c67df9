"""How good are predicted class probabilities? Accuracy, proper scores, calibration, OOD
detection.

* :func:`accuracy`, :func:`nll` (mean −log p(y)) and :func:`brier` (mean Σ_c (p_c − 1[c
  = y])²).
* Calibration: :func:`calibration_curve` bins the confidence max_c p_c into equal-width
  bins (lo, hi] on (0, 1] and compares the mean confidence with the accuracy in each
  bin; :func:`ece` is the count-weighted mean gap.
* Out-of-distribution detection: :func:`auroc` (the Mann–Whitney statistic, ties counted
  ½) and :func:`ood_auroc`, which scores each input by how unsure the prediction is;
  bootstrap intervals of one AUROC (:func:`auroc_interval`) and of the difference of
  two on the same inputs (:func:`auroc_difference_interval`).

Shapes: N inputs, C classes. ``probs`` is (N, C) with rows that sum to 1 (use
:func:`~laplace_from_scratch.predictive.two_class` on the (N,) probabilities of a single
sigmoid output), ``y`` is (N,) int64.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..predictive import entropy

OOD_SCORES = ("max_prob", "entropy")


def _check_probs(probs: Tensor, name: str = "probs") -> None:
    """(N, C) floating probabilities whose rows sum to 1 (to 1e-4: catches logits passed
    by mistake)."""
    if probs.ndim != 2 or not probs.is_floating_point():
        raise ValueError(
            f"{name} must be floating class probabilities (N, C), got {probs.dtype} "
            f"{tuple(probs.shape)}"
        )
    if probs.shape[0] == 0:
        raise ValueError(f"{name} is empty")
    sums = probs.sum(-1)
    if not (sums - 1).abs().max() <= 1e-4:  # also False for NaN
        raise ValueError(
            f"the rows of {name} must sum to 1 (got sums in [{sums.min():.4g}, "
            f"{sums.max():.4g}])"
        )
    if not bool((probs >= 0).all()):  # also False for NaN
        raise ValueError(
            f"{name} must be probabilities in [0, 1] (got a minimum of "
            f"{probs.min():.4g}): logits?"
        )


def _check(probs: Tensor, y: Tensor) -> None:
    """``probs`` (N, C) and integer labels ``y`` (N,) in 0..C−1."""
    _check_probs(probs)
    if y.ndim != 1 or y.shape[0] != probs.shape[0]:
        raise ValueError(
            f"y must be (N,) = ({probs.shape[0]},) labels, got {tuple(y.shape)}"
        )
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"y must hold integer labels, got {y.dtype}")
    C = probs.shape[1]
    if y.min() < 0 or y.max() >= C:
        raise ValueError(
            f"labels must lie in 0..{C - 1} for {C} classes, got [{int(y.min())}, "
            f"{int(y.max())}]"
        )


def accuracy(probs: Tensor, y: Tensor) -> float:
    """Fraction of inputs whose most probable class (the first,
    on a tie) is the label.
    """
    _check(probs, y)
    return (probs.argmax(-1) == y).double().mean().item()


def nll(probs: Tensor, y: Tensor) -> float:
    """Mean negative log-likelihood −log p(y) in nats.

    p(y) = 0 is clamped to the dtype's smallest normal number
    (``torch.finfo(dtype).tiny``), so the result stays finite (−log tiny ≈ 87 in
    float32, ≈ 708 in float64).
    """
    _check(probs, y)
    p = probs.gather(1, y.unsqueeze(1)).squeeze(1)
    return -p.clamp(min=torch.finfo(p.dtype).tiny).log().mean().item()


def brier(probs: Tensor, y: Tensor) -> float:
    """Multi-class Brier score: mean over N of Σ_c (p_c − 1[c = y])², in [0, 2].

    For C = 2 this is twice scikit-learn's binary ``brier_score_loss`` (which scores
    only p(y = 1): both classes contribute the same squared error).
    """
    _check(probs, y)
    # one_hot takes int64 only; _check accepted any integer dtype
    onehot = torch.nn.functional.one_hot(y.long(), probs.shape[1]).to(probs.dtype)
    return (probs - onehot).pow(2).sum(-1).mean().item()


def calibration_curve(
    probs: Tensor, y: Tensor, n_bins: int = 15
) -> tuple[Tensor, Tensor, Tensor]:
    """Mean confidence, accuracy and count per confidence bin: three (n_bins,) tensors.

    The confidence of an input is max_c p_c. Bin b is (e_b, e_{b+1}] with edges e =
    ``torch.linspace(0, 1, n_bins + 1)`` in the dtype of ``probs``: a confidence equal
    to an edge goes to the lower bin (a confidence of exactly 0, impossible for a max
    over classes, to bin 0). Empty bins have NaN confidence and accuracy and count 0.
    Confidence and accuracy are in the dtype of ``probs``, counts are int64.
    """
    _check(probs, y)
    if n_bins < 1:
        raise ValueError(f"n_bins must be at least 1, got {n_bins}")
    conf, pred = probs.max(-1)
    correct = (pred == y).to(probs.dtype)
    edges = torch.linspace(0, 1, n_bins + 1, dtype=probs.dtype, device=probs.device)
    # bucketize(right=False) returns i with inner[i−1] < conf ≤ inner[i]: bins closed on
    # the right
    idx = torch.bucketize(conf, edges[1:-1], right=False)
    count = torch.zeros(n_bins, dtype=torch.int64, device=probs.device).index_add_(
        0, idx, torch.ones_like(idx)
    )
    conf_sum = torch.zeros(n_bins, dtype=probs.dtype, device=probs.device).index_add_(
        0, idx, conf
    )
    acc_sum = torch.zeros(n_bins, dtype=probs.dtype, device=probs.device).index_add_(
        0, idx, correct
    )
    n = count.to(probs.dtype)
    nan = torch.full_like(n, float("nan"))
    empty = count == 0
    return (
        torch.where(empty, nan, conf_sum / n),
        torch.where(empty, nan, acc_sum / n),
        count,
    )


def ece(probs: Tensor, y: Tensor, n_bins: int = 15) -> float:
    """Expected calibration error Σ_b (n_b / N)·|acc_b − conf_b| over the non-empty bins
    of :func:`calibration_curve`. 0 for perfect calibration; depends on ``n_bins``, and
    is biased upwards by the sampling noise of acc_b (of order √(conf(1 − conf)/n_b) per
    bin)."""
    conf, acc, count = calibration_curve(probs, y, n_bins)
    full = count > 0
    w = count[full].to(conf.dtype) / count.sum()
    return (w * (acc[full] - conf[full]).abs()).sum().item()


def _average_ranks(x: Tensor) -> Tensor:
    """Ranks 1..n of the entries of a 1-D tensor, tied entries sharing the mean of their
    ranks (float64)."""
    _, inverse, counts = torch.unique(
        x, sorted=True, return_inverse=True, return_counts=True
    )
    counts = counts.double()
    last = counts.cumsum(0)  # rank of the last member of each group of equal values
    return (last - (counts - 1) / 2)[inverse]


def auroc(scores_pos: Tensor, scores_neg: Tensor) -> float:
    """Area under the ROC curve: P(s₊ > s₋) + ½ P(s₊ = s₋) for a random positive and
    negative.

    scores_pos: (n₊,), scores_neg: (n₋,) — larger means "more likely positive". Computed
    as the Mann–Whitney U of the average ranks of the pooled scores: AUROC = (R₊ − n₊(n₊
    + 1)/2) / (n₊ n₋), R₊ the rank sum of the positives. 0.5 is chance, 1 perfect
    separation.
    """
    if scores_pos.ndim != 1 or scores_neg.ndim != 1:
        raise ValueError(
            f"scores must be 1-D, got {tuple(scores_pos.shape)} and "
            f"{tuple(scores_neg.shape)}"
        )
    n_pos, n_neg = scores_pos.numel(), scores_neg.numel()
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"need at least one positive and one negative, got {n_pos} and {n_neg}"
        )
    pooled = torch.cat([scores_pos, scores_neg]).double()
    if pooled.isnan().any():
        raise ValueError("scores contain NaN")
    ranks = _average_ranks(pooled)
    u = ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2
    return (u / (n_pos * n_neg)).item()


def ood_score(probs: Tensor, score: str = "max_prob") -> Tensor:
    """Per-input "out-of-distribution-ness", larger = more unsure. (N, C) → (N,).

    ``"max_prob"``: −max_c p_c; ``"entropy"``: the predictive entropy −Σ_c p_c log p_c.
    """
    if score not in OOD_SCORES:
        raise ValueError(f"score must be one of {OOD_SCORES}, got {score!r}")
    _check_probs(probs)
    if score == "max_prob":
        return -probs.max(-1).values
    if score == "entropy":
        return entropy(probs)
    raise ValueError(f"score must be one of {OOD_SCORES}, got {score!r}")


def ood_auroc(probs_in: Tensor, probs_out: Tensor, score: str = "max_prob") -> float:
    """AUROC of telling out-of-distribution inputs (positives) from in-distribution ones
    (negatives) by :func:`ood_score`. probs_in: (N_in, C), probs_out: (N_out, C), the
    same C classes.

    1 means every OOD input looks less certain than every in-distribution one; 0.5 is
    chance.
    """
    if score not in OOD_SCORES:
        raise ValueError(f"score must be one of {OOD_SCORES}, got {score!r}")
    _check_probs(probs_in, "probs_in")
    _check_probs(probs_out, "probs_out")
    if probs_in.shape[1] != probs_out.shape[1]:
        raise ValueError(
            "probs_in and probs_out must have the same classes, got C = "
            f"{probs_in.shape[1]} "
            f"and {probs_out.shape[1]}"
        )
    return auroc(ood_score(probs_out, score), ood_score(probs_in, score))


def _check_bootstrap(n_boot: int, level: float) -> None:
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 2:
        raise ValueError(f"n_boot must be an integer of at least 2, got {n_boot!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")


def _wins(scores_pos: Tensor, scores_neg: Tensor) -> Tensor:
    """W (n₊, n₋): [s₊ > s₋] + ½[s₊ = s₋], in float64 on the CPU; cᵀ₊ W c₋ / (n₊ n₋) is
    the AUROC of the inputs drawn c₊ and c₋ times."""
    sp, sn = scores_pos.detach().double().cpu(), scores_neg.detach().double().cpu()
    return (sp[:, None] > sn[None, :]).double() + 0.5 * (
        sp[:, None] == sn[None, :]
    ).double()


def _draws(n: int, n_boot: int, g: torch.Generator) -> Tensor:
    """How often each of n inputs is drawn in each of n_boot resamples: (n_boot, n)."""
    idx = torch.randint(0, n, (n_boot, n), generator=g, device="cpu")
    ones = torch.ones(n_boot, n, dtype=torch.float64, device="cpu")
    return torch.zeros(n_boot, n, dtype=torch.float64, device="cpu").scatter_add_(
        1, idx, ones
    )


def _percentiles(values: Tensor, level: float) -> tuple[float, float]:
    q = torch.tensor(
        [(1 - level) / 2, (1 + level) / 2], dtype=torch.float64, device="cpu"
    )
    low, high = torch.quantile(values, q).tolist()
    return low, high


def auroc_interval(
    scores_pos: Tensor,
    scores_neg: Tensor,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of :func:`auroc`: positives and negatives resampled
    with replacement, each set on its own, ``n_boot`` times. scores_pos: (n₊,),
    scores_neg: (n₋,) → (low, high).

    Every resample's AUROC is cᵀ₊ W c₋ / (n₊ n₋), with W the n₊ × n₋ matrix of [s₊ > s₋]
    + ½[s₊ = s₋] and c the multiplicities drawn (one matrix product for all resamples).
    Draws use a CPU generator seeded with ``seed``.
    """
    auroc(scores_pos, scores_neg)  # the same checks
    _check_bootstrap(n_boot, level)
    W = _wins(scores_pos, scores_neg)
    g = torch.Generator().manual_seed(seed)
    cp, cn = _draws(W.shape[0], n_boot, g), _draws(W.shape[1], n_boot, g)
    return _percentiles(((cp @ W) * cn).sum(1) / W.numel(), level)


def auroc_difference_interval(
    pos_a: Tensor,
    neg_a: Tensor,
    pos_b: Tensor,
    neg_b: Tensor,
    paired: bool = False,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """AUROC(a) − AUROC(b) for two scorings a and b of the same inputs, and its
    percentile bootstrap interval: (difference, low, high).

    pos_a, pos_b: (n₊,) and neg_a, neg_b: (n₋,), entry i of a and of b scoring the same
    input. Each resample draws the inputs once and scores both methods on them (a
    paired bootstrap), so what the two share cancels. ``paired=True``: the i-th negative
    belongs with the i-th positive (an input and its transformed copy, n₊ = n₋), and the
    two are drawn together. The interval covers the resampled inputs only, not what
    made the scores (training, Monte Carlo draws).
    """
    for p, n in ((pos_a, neg_a), (pos_b, neg_b)):
        auroc(p, n)  # the same checks
    if pos_a.shape != pos_b.shape or neg_a.shape != neg_b.shape:
        raise ValueError(
            "a and b must score the same inputs, got shapes "
            f"{tuple(pos_a.shape)}, {tuple(neg_a.shape)} and {tuple(pos_b.shape)}, "
            f"{tuple(neg_b.shape)}"
        )
    if paired and pos_a.numel() != neg_a.numel():
        raise ValueError(
            f"paired=True needs as many positives as negatives, got {pos_a.numel()} "
            f"and {neg_a.numel()}"
        )
    _check_bootstrap(n_boot, level)
    D = _wins(pos_a, neg_a) - _wins(pos_b, neg_b)  # (n₊, n₋)
    g = torch.Generator().manual_seed(seed)
    cp = _draws(D.shape[0], n_boot, g)
    cn = cp if paired else _draws(D.shape[1], n_boot, g)
    low, high = _percentiles(((cp @ D) * cn).sum(1) / D.numel(), level)
    return D.mean().item(), low, high


def ood_auroc_interval(
    probs_in: Tensor,
    probs_out: Tensor,
    score: str = "max_prob",
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """:func:`ood_auroc` and its bootstrap interval (:func:`auroc_interval`): (AUROC,
    low, high)."""
    value = ood_auroc(probs_in, probs_out, score)
    low, high = auroc_interval(
        ood_score(probs_out, score), ood_score(probs_in, score), n_boot, level, seed
    )
    return value, low, high
