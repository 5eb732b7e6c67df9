import pytest
import torch

from laplace_from_scratch import helpers


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def float64_default():
    """torch's default dtype float64 for one test (``pytestmark = pytest.mark.usefixtures(...)``):
    laplace-torch's curvlinops backend materialises H as ``linop @ torch.eye(P)`` with eye in the
    *default* dtype, which under float32 rounds a float64 H to float32 accuracy (measured: 1.4e-8
    relative on the sinusoid MLP); a float64 default keeps both sides float64 throughout."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def same_subset(indices: list[int], n_data: int):
    """A stand-in for laplace-torch's subset-of-data sampler (``SoDSampler``, which draws with
    numpy) that yields the given positions among ``n_data`` training inputs: our GP's subset."""

    class Sampler:
        def __init__(self, N, M, seed=0):
            assert (N, M) == (n_data, len(indices))

        def __iter__(self):
            return iter(indices)

        def __len__(self):
            return len(indices)

    return Sampler


def mlp(d_in: int, d_out: int, width: int = 8, depth: int = 2, dtype=torch.float64):
    """Test-sized tanh MLPs in float64: ``helpers.mlp`` initialised from the current random state."""
    return helpers.mlp(d_in, d_out, width=width, depth=depth, seed=None, dtype=dtype)


def kron_block_matrix(block) -> torch.Tensor:
    """A KFAC block (``kron.KronBlock``) as a dense matrix: B ⊗ A, or B alone for a bias."""
    return block.B if block.A is None else torch.kron(block.B, block.A)


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        action="append",
        default=None,
        help="accelerator(s) for tests/test_devices.py, e.g. --device cuda:1 or --device mps "
        "(default: cuda, skipped with its reason where absent)",
    )


def pytest_generate_tests(metafunc):
    """Tests that take a ``device`` run on each accelerator (``--device``, default cuda)."""
    if "device" in metafunc.fixturenames:
        names = metafunc.config.getoption("device") or ["cuda"]
        metafunc.parametrize("device", names, indirect=True)


@pytest.fixture
def device(request) -> torch.device:
    """An accelerator, or a skip that says which one this machine lacks."""
    name = request.param
    available = {
        "cuda": torch.cuda.is_available(),
        "mps": getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available(),
    }.get(name.split(":")[0], True)
    if not available:
        pytest.skip(f"no {name} device on this machine (torch {torch.__version__})")
    return torch.device(name)
