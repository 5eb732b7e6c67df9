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

from .checks import deferred, require


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

    def step(self, objective: Callable[..., Tensor]) -> Tensor:
        """One Adam step up ``objective(**values)``; returns its value before the step
        (a detached scalar tensor: reading it would wait for the device). Raises
        ``ValueError`` where a value or the objective stops being finite (inside
        :func:`checks.deferred`, when that block ends)."""
        self.opt.zero_grad()
        values = {k: v.exp() for k, v in self.logs.items()}
        for v in values.values():
            require(
                torch.isfinite(v) & (v > 0),
                f"Adam diverged at step {self.n_steps} (lr={self.lr}): a "
                "hyperparameter became 0 or inf; the learning rate is too large",
            )
        value = objective(**values)
        step = self.n_steps
        require(
            torch.isfinite(value),
            lambda: (
                f"the evidence became {value.item()} at step {step} of Adam "
                f"(lr={self.lr}): the learning rate is too large, or the model's loss "
                "is not finite"
            ),
        )
        (-value).backward()
        self.opt.step()
        self.n_steps += 1
        self.last = {k: v.detach() for k, v in values.items()}
        return value.detach()


def maximize_on_logs(objective: Callable[..., Tensor], init: dict, n_steps=100, lr=0.1):
    """Maximise ``objective(**{name: value})`` by :class:`LogAdam` from ``init``
    (laplace-torch's scheme for δ, for any positive hyperparameters); returns the final
    values (detached) and the objective before each step."""
    adam = LogAdam({k: v.detach().log() for k, v in init.items()}, lr)
    with deferred():  # every step's checks, read once at the end
        history = [adam.step(objective) for _ in range(n_steps)]
    return adam.values(), torch.stack(history).tolist()
