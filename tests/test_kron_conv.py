"""KFAC for nn.Conv2d: independent checks (a one-position Conv2d is a Linear layer; the factors
equal brute-force loops over patches and positions) and laplace-torch 0.3's default kron backend."""

import math

import pytest
import torch
from conftest import kron_block_matrix
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from laplace_from_scratch import Bernoulli, Categorical, Laplace
from laplace_from_scratch.helpers import PinnedZeroLogit, cnn, fit_map, image_data
from laplace_from_scratch.kron import kfac

D = torch.float64
LIKS = {"classification": Categorical(), "binary_classification": Bernoulli()}


pytestmark = pytest.mark.usefixtures("float64_default")


def _n_outputs(likelihood):
    return 3 if likelihood == "classification" else 1


# ----- independent of laplace-torch --------------------------------------------------------------


@pytest.mark.parametrize("likelihood", LIKS)
def test_conv_with_one_output_position_has_the_kfac_of_the_equivalent_linear_layer(likelihood):
    """A kernel covering the whole unpadded input gives T = 1 position: z = W vec(x) + b, a Linear layer
    on the flattened input with weight W = weight.reshape(out, -1), so the KFAC blocks must agree."""
    K = _n_outputs(likelihood)
    conv = nn.Sequential(nn.Conv2d(2, 3, 4), nn.Flatten(), nn.Tanh(), nn.Linear(3, K)).to(D)
    lin = nn.Sequential(nn.Flatten(), nn.Linear(32, 3), nn.Tanh(), nn.Linear(3, K)).to(D)
    with torch.no_grad():
        lin[1].weight.copy_(conv[0].weight.reshape(3, -1))
        lin[1].bias.copy_(conv[0].bias)
        lin[3].load_state_dict(conv[3].state_dict())
    X = torch.randn(30, 2, 4, 4, dtype=D)
    ours, ref = kfac(conv, X, LIKS[likelihood], batch_size=8), kfac(lin, X, LIKS[likelihood], batch_size=8)
    assert [b.size for b in ours] == [p.numel() for p in conv.parameters()]
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(kron_block_matrix(a), kron_block_matrix(b), rtol=1e-12, atol=1e-14)


def _brute_force_factors(model, k, X, likelihood):
    """B = Σₙ Σₜ Jzₙₜᵀ Λₙ Jzₙₜ and A = (1/(N·T)) Σₙ Σₜ uₙₜ uₙₜᵀ for the Conv2d ``model[k]``, by loops:
    patches sliced from the zero-padded input, full per-example Jacobians of the rest of the network."""
    m = model[k]
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = m.kernel_size, m.stride, m.dilation, m.padding
    out = m.weight.shape[0]
    A = torch.zeros(m.weight[0].numel(), m.weight[0].numel(), dtype=D)
    B = torch.zeros(out, out, dtype=D)
    with torch.no_grad():
        xs, f = model[:k](X), model(X)
    Lam = likelihood.output_hessian(f)
    for n in range(X.shape[0]):
        x = F.pad(xs[n], (pw, pw, ph, ph))  # (in, H + 2ph, W + 2pw)
        z = model[: k + 1](X[n : n + 1])
        J = torch.autograd.functional.jacobian(model[k + 1 :], z)[0, :, 0]  # (K, out, h, w)
        h, w = J.shape[-2:]
        for i in range(h):
            for j in range(w):
                u = x[:, i * sh : i * sh + dh * (kh - 1) + 1 : dh, j * sw : j * sw + dw * (kw - 1) + 1 : dw]
                A += torch.outer(u.reshape(-1), u.reshape(-1))
                Jt = J[:, :, i, j]  # (K, out)
                B += Jt.T @ Lam[n] @ Jt
    return B, A / (X.shape[0] * h * w)


def _strided_cnn(K):
    return nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=2, dilation=2),
        nn.Tanh(),
        nn.Conv2d(3, 2, (3, 2), stride=(2, 1), padding=(1, 0)),
        nn.Flatten(),
        nn.Linear(2 * 4 * 6, K),
    ).to(D)


@pytest.mark.parametrize("likelihood", LIKS)
@pytest.mark.parametrize("net", ["cnn", "strided"])
def test_conv_kfac_factors_equal_brute_force_loops(likelihood, net):
    K = _n_outputs(likelihood)
    if net == "cnn":
        model = cnn(n_classes=K, image_size=8, channels=(2, 3), seed=None, dtype=D)
        X = torch.rand(7, 1, 8, 8, dtype=D)
    else:
        model = _strided_cnn(K)
        X = torch.randn(7, 2, 7, 7, dtype=D)
    blocks = kfac(model, X, LIKS[likelihood], batch_size=3)
    convs = [k for k, m in enumerate(model) if isinstance(m, nn.Conv2d)]
    it = iter(blocks)
    for k, m in enumerate(model):
        if not list(m.parameters()):
            continue
        weight, bias = next(it), next(it)
        if k in convs:
            B, A = _brute_force_factors(model, k, X, LIKS[likelihood])
            torch.testing.assert_close(weight.B, B, rtol=1e-10, atol=1e-14)
            torch.testing.assert_close(weight.A, A, rtol=1e-10, atol=1e-14)
            torch.testing.assert_close(bias.B, B, rtol=1e-10, atol=1e-14)
            assert bias.A is None
    assert next(it, None) is None


def test_kron_refuses_grouped_convolutions_and_other_layers():
    X, y = torch.randn(4, 2, 5, 5, dtype=D), torch.zeros(4, dtype=torch.long)
    loader = DataLoader(TensorDataset(X, y), batch_size=4)
    grouped = nn.Sequential(nn.Conv2d(2, 2, 3, groups=2), nn.Flatten(), nn.Linear(18, 2)).to(D)
    with pytest.raises(NotImplementedError, match="groups=1"):
        Laplace(grouped, "classification", hessian_structure="kron").fit(loader)
    normed = nn.Sequential(nn.Conv2d(2, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(18, 2)).to(D).eval()
    with pytest.raises(ValueError, match="nn.Linear or nn.Conv2d"):
        Laplace(normed, "classification", hessian_structure="kron").fit(loader)


# ----- laplace-torch 0.3, default backend (curvlinops KFAC-expand) ---------------------------------

# float64: both sides sum the same N·T outer products in a different order and eigendecompose the same
# factors; we measure ~1e-15, so 1e-8 leaves ~7 orders of magnitude above round-off, while any slip in
# the convention (a factor T or N, another flattening of the kernel) gives an O(1) error.
RTOL = 1e-8


def _rel_err(A, B):
    return ((A - B).norm() / B.norm()).item()


def _digits_problem(likelihood):
    d = image_data("digits", n_train=48, n_test=12, dtype=D)
    y = d.y_train if likelihood == "classification" else d.y_train % 2
    model = cnn(n_classes=10 if likelihood == "classification" else 1, channels=(2, 3), seed=0, dtype=D)
    # a short fit (not a converged mode: both sides expand around the same θ) keeps the test fast
    fit_map(model, d.X_train, y, likelihood, prior_precision=1.0, adam_steps=50, lbfgs_steps=0)
    return model, d.X_train, y, d.X_test


@pytest.mark.parametrize("likelihood", LIKS)
def test_cnn_kron_laplace_equals_laplace_torch(likelihood):
    """laplace-torch 0.3 on the CNN (on [0, f] for one logit) with its default backend, CurvlinopsGGN:
    KFAC-expand, B summed over examples and positions, A averaged over both."""
    laplace = pytest.importorskip("laplace", reason="laplace-torch is installed by `make install`")
    model, X, y, X_test = _digits_problem(likelihood)
    loader = DataLoader(TensorDataset(X, y), batch_size=20)  # batches of 20, 20, 8: A is rescaled by M/N
    net = model if likelihood == "classification" else PinnedZeroLogit(model)
    ref = laplace.Laplace(
        net, "classification", subset_of_weights="all", hessian_structure="kron", prior_precision=0.5
    )
    ref.fit(loader)
    ours = Laplace(model, likelihood, subset_of_weights="all", hessian_structure="kron", prior_precision=0.5)
    ours.fit(loader)
    ref_sizes = [math.prod(factor.shape[0] for factor in fac) for fac in ref.H_facs.kfacs]  # [B, A] or [B]
    assert [b.size for b in ours.structure.blocks] == ref_sizes == [p.numel() for p in model.parameters()]
    assert _rel_err(ours.H.to_matrix(), ref.H.to_matrix()) < RTOL
    assert _rel_err(ours.posterior_precision.to_matrix(), ref.posterior_precision.to_matrix()) < RTOL
    assert _rel_err(ours.log_marginal_likelihood(), ref.log_marginal_likelihood()) < RTOL
    p, p_ref = ours(X_test, link_approx="probit"), ref(X_test, pred_type="glm", link_approx="probit")
    assert p.shape == p_ref.shape == (X_test.shape[0], 10 if likelihood == "classification" else 2)
    assert _rel_err(p, p_ref) < RTOL
    ref.optimize_prior_precision(method="marglik")
    ours.optimize_prior_precision(method="marglik")
    assert abs(ours.prior_precision.item() / ref.prior_precision.item() - 1) < 1e-4
