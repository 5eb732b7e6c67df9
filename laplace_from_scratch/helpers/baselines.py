"""The non-Laplace baselines a calibration study compares against.

* Temperature scaling (Guo et al., 2017): one scalar T > 0 fitted on held-out data,
  softmax(f / T).
* A deep ensemble (Lakshminarayanan et al., 2017): the mean of the softmax of M
  independently initialised and trained networks.
* MC dropout (Gal and Ghahramani, 2016): dropout kept on at test time, the mean of the
  softmax over S forward passes.

Shapes: N inputs, C classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


def fit_temperature(logits: Tensor, y: Tensor, max_iter: int = 100) -> float:
    """The temperature T minimising the mean NLL of softmax(logits / T) on held-out
    data.

    logits: (N, C), y: (N,) class labels. The NLL is convex in β = 1/T, so L-BFGS on log
    β (in float64, on the CPU: one scalar) finds the global minimum. Returns T as a
    float.
    """
    if logits.ndim != 2 or y.shape != logits.shape[:1]:
        raise ValueError(
            f"logits must be (N, C) and y (N,), got {tuple(logits.shape)} and "
            f"{tuple(y.shape)}"
        )
    if logits.shape[0] == 0 or not torch.isfinite(logits).all():
        raise ValueError("logits must be finite and non-empty")
    z, t = logits.detach().double().cpu(), y.detach().long().cpu()
    if t.min() < 0 or t.max() >= z.shape[1]:
        raise ValueError(f"labels must lie in [0, {z.shape[1] - 1}]")
    log_beta = torch.zeros((), dtype=torch.float64, device="cpu", requires_grad=True)
    opt = torch.optim.LBFGS(
        [log_beta], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe"
    )

    def closure() -> Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(z * log_beta.exp(), t)
        loss.backward()
        return loss

    opt.step(closure)
    return float(torch.exp(-log_beta.detach()))


def ensemble_probs(models: Sequence[nn.Module], X: Tensor) -> Tensor:
    """The mean over ``models`` of softmax(model(X)). X: (N, ...) → (N, C)."""
    if len(models) == 0:
        raise ValueError("an ensemble needs at least one model")
    with torch.no_grad():
        return torch.stack([torch.softmax(m(X), -1) for m in models]).mean(0)


def mc_dropout_probs(
    model: nn.Module, X: Tensor, n_samples: int = 100, seed: int = 0
) -> Tensor:
    """MC dropout: the mean of softmax(model(X)) over ``n_samples`` passes with dropout
    on.

    X: (N, ...) → probabilities (N, C).

    Only the ``nn.Dropout`` modules are put in training mode (batch norm, if any, stays
    in eval mode), and the model's modes are restored afterwards. The dropout masks come
    from ``torch.manual_seed(seed)`` inside a forked random state, so the caller's
    random state is untouched and the result repeatable.
    """
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
    drops = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    if not drops:
        raise ValueError(
            "mc_dropout_probs needs nn.Dropout modules in the model (helpers.mlp(..., "
            "dropout=0.1))"
        )
    modes = {m: m.training for m in model.modules()}
    devices = [X.device] if X.device.type == "cuda" else []
    try:
        model.eval()
        for m in drops:
            m.train()
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed)
            return torch.stack(
                [torch.softmax(model(X), -1) for _ in range(n_samples)]
            ).mean(0)
    finally:
        for m, mode in modes.items():
            m.training = mode
