import pytest
import torch

import laplace_from_scratch as lfs


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def mlp(d_in: int, d_out: int, width: int = 8, depth: int = 2, dtype=torch.float64):
    """Test-sized tanh MLPs in float64: ``lfs.mlp`` initialised from the current random state."""
    return lfs.mlp(d_in, d_out, width=width, depth=depth, seed=None, dtype=dtype)


class PinnedZeroLogit(torch.nn.Module):
    """[0, f(x)]: a one-logit network as a two-class softmax network with the same parameters.

    laplace-torch 0.3 has no one-logit likelihood; its 'classification' on this network is the
    reference for our 'binary_classification' on ``model``.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        f = self.model(x)
        return torch.cat([torch.zeros_like(f), f], dim=-1)
