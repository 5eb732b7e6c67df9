import pytest
import torch
from torch import nn


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def mlp(d_in: int, d_out: int, width: int = 8, depth: int = 2, act=nn.Tanh, dtype=torch.float64):
    layers, d = [], d_in
    for _ in range(depth):
        layers += [nn.Linear(d, width), act()]
        d = width
    layers.append(nn.Linear(d, d_out))
    return nn.Sequential(*layers).to(dtype)
