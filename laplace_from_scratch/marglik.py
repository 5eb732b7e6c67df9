"""The Laplace evidence and hyperparameter optimisation.

Integrating the Gaussian approximation of the log joint over θ gives the evidence

    log p(D) ≈ log p(D | θ*) + log p(θ*) + (P/2) log 2π − ½ log det Σ⁻¹
             = log p(D | θ*) − ½ (log det Σ⁻¹ − log det Σ₀⁻¹
                                  + (θ* − μ₀)ᵀ Σ₀⁻¹ (θ* − μ₀)),

the second form (laplace-torch's) once the Gaussian prior's (2π)^P/2 cancels
(Σ₀⁻¹ = diag(p₀), Σ⁻¹ = c·H + Σ₀⁻¹). It is differentiable in δ and σ, so we maximise it
by gradient ascent on log δ and log σ, which keeps both positive.

Shapes: P parameters.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def laplace_evidence(log_likelihood, log_det_posterior, log_det_prior, scatter):
    """log p(D | θ*) − ½ (log det Σ⁻¹ − log det Σ₀⁻¹ + (θ*−μ₀)ᵀ Σ₀⁻¹ (θ*−μ₀))."""
    return log_likelihood - 0.5 * (log_det_posterior - log_det_prior + scatter)


class LogAdam:
    """Adam on the logs of positive hyperparameters (``logs``: name → log value, any
    shape): :meth:`step` takes one step up an objective, the one loop that
    :func:`maximize_on_logs` and ``marglik_training`` share."""

    def __init__(self, logs: dict[str, Tensor], lr: float = 0.1):
        self.logs = {
            k: v.detach().clone().requires_grad_(True) for k, v in logs.items()
        }
        self.opt = torch.optim.Adam(self.logs.values(), lr)
        self.lr, self.n_steps = lr, 0
        self.last: dict[str, Tensor] = {}  # the values of the last step's objective

    def values(self) -> dict[str, Tensor]:
        """The current values, detached."""
        return {k: v.detach().exp() for k, v in self.logs.items()}

    def step(self, objective: Callable[..., Tensor]) -> float:
        """One Adam step up ``objective(**values)``; returns its value before the step.
        Raises ``ValueError`` where a value or the objective stops being finite."""
        self.opt.zero_grad()
        values = {k: v.exp() for k, v in self.logs.items()}
        if not all(
            bool(torch.isfinite(v).all() and (v > 0).all()) for v in values.values()
        ):
            raise ValueError(
                f"Adam diverged at step {self.n_steps} (lr={self.lr}): a "
                "hyperparameter became 0 or inf; the learning rate is too large"
            )
        value = objective(**values)
        if not torch.isfinite(value):
            raise ValueError(
                f"the evidence became {value.item()} at step {self.n_steps} of Adam "
                f"(lr={self.lr}): the learning rate is too large, or the model's loss "
                "is not finite"
            )
        (-value).backward()
        self.opt.step()
        self.n_steps += 1
        self.last = {k: v.detach() for k, v in values.items()}
        return value.item()


def maximize_on_logs(objective: Callable[..., Tensor], init: dict, n_steps=100, lr=0.1):
    """Maximise ``objective(**{name: value})`` by :class:`LogAdam` from ``init``
    (laplace-torch's scheme for δ, for any positive hyperparameters); returns the final
    values (detached) and the objective before each step."""
    adam = LogAdam({k: v.detach().log() for k, v in init.items()}, lr)
    history = [adam.step(objective) for _ in range(n_steps)]
    return adam.values(), history
