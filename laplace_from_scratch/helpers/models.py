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
    dropout: float = 0.0,
) -> nn.Sequential:
    """``depth`` hidden layers of ``width`` units with ``activation``, then a linear
    output layer.

    ``dropout > 0`` puts ``nn.Dropout(dropout)`` after every activation (for MC
    dropout); the default adds no module.

    Initialised from ``torch.manual_seed(seed)`` (PyTorch's default init; ``seed=None``
    uses the current random state), in ``dtype`` (default:
    ``torch.get_default_dtype()``). 1-50-50-1 has P = 2701 parameters.
    """
    if seed is not None:
        torch.manual_seed(seed)
    layers: list[nn.Module] = []
    d = d_in
    for _ in range(depth):
        layers += [nn.Linear(d, width), activation()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        d = width
    layers.append(nn.Linear(d, d_out))
    return nn.Sequential(*layers).to(dtype or torch.get_default_dtype())


def cnn(
    n_classes: int = 10,
    image_size: int = 8,
    channels: tuple[int, int] = (8, 16),
    in_channels: int = 1,
    seed: int | None = 0,
    dtype: torch.dtype | None = None,
    dropout: float = 0.0,
    hidden: int | None = None,
) -> nn.Sequential:
    """A small CNN for (N, in_channels, image_size, image_size) images, ending in
    ``nn.Linear``.

    [3×3 conv, ReLU, 2×2 max-pool] twice, then a linear layer on the flattened features.
    For 8×8 digits with channels (8, 16) it has P = 1898 parameters, for 28×28 MNIST P =
    9098. ``hidden`` puts a fully connected layer of that width (and a ReLU) before the
    output layer, as LeNet has: with channels (16, 32) and ``hidden=128``, P = 206,922
    for 28×28 MNIST, of which the output layer holds 1290. Initialised like :func:`mlp`.
    ``dropout > 0`` puts ``nn.Dropout(dropout)`` before each fully connected layer.
    """
    if seed is not None:
        torch.manual_seed(seed)
    c1, c2 = channels
    side = image_size // 4
    if side < 1:
        raise ValueError(
            f"image_size must be at least 4 (two 2×2 poolings), got {image_size}"
        )
    drop = [nn.Dropout(dropout)] if dropout else []
    d = c2 * side * side
    head: list[nn.Module] = []
    if hidden:
        head += [*drop, nn.Linear(d, hidden), nn.ReLU()]
        d = hidden
    head += [*drop, nn.Linear(d, n_classes)]
    return nn.Sequential(
        nn.Conv2d(in_channels, c1, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        *head,
    ).to(dtype or torch.get_default_dtype())


class PinnedZeroLogit(nn.Module):
    """[0, f(x)]: a one-logit network as a two-class softmax network with the same
    parameters.

    Same cross-entropy, same GGN (Λ's pinned row and column meet zero Jacobian rows),
    and its probit with f_var = diag(0, v) is σ(f/√(1 + πv/8)): laplace-torch's
    ``"classification"`` on this network is the reference for our
    ``"binary_classification"`` on ``model``.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.model(x)
        return torch.cat([torch.zeros_like(f), f], dim=-1)
