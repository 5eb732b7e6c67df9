import pytest
import torch
from parity import PinnedZeroLogit  # noqa: F401  (benchmarks/parity.py; tests import it from here)

import laplace_from_scratch as lfs


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def mlp(d_in: int, d_out: int, width: int = 8, depth: int = 2, dtype=torch.float64):
    """Test-sized tanh MLPs in float64: ``lfs.mlp`` initialised from the current random state."""
    return lfs.mlp(d_in, d_out, width=width, depth=depth, seed=None, dtype=dtype)
