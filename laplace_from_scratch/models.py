"""The small networks the notebooks use."""

from __future__ import annotations

import torch
from torch import nn


def mlp(
    d_in: int,
    d_out: int,
    width: int = 50,
    depth: int = 2,
    activation: type[nn.Module] = nn.Tanh,
    seed: int | None = 0,
    dtype: torch.dtype | None = None,
) -> nn.Sequential:
    """``depth`` hidden layers of ``width`` units with ``activation``, then a linear output layer.

    Initialised from ``torch.manual_seed(seed)`` (PyTorch's default init; ``seed=None`` uses the
    current random state), in ``dtype`` (default: ``torch.get_default_dtype()``). 1-50-50-1 has
    P = 2701 parameters.
    """
    if seed is not None:
        torch.manual_seed(seed)
    layers: list[nn.Module] = []
    d = d_in
    for _ in range(depth):
        layers += [nn.Linear(d, width), activation()]
        d = width
    layers.append(nn.Linear(d, d_out))
    return nn.Sequential(*layers).to(dtype or torch.get_default_dtype())
