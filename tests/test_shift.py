import pytest
import torch
import torch.nn.functional as F

from laplace_from_scratch.helpers import image_data
from laplace_from_scratch.helpers.shift import fgsm, invert, noise_images, rotate


def blob(
    H: int, W: int, dx: float = 0.0, dy: float = 0.0, sx: float = 1.5, sy: float = 1.5, dtype=torch.float64
):
    """A Gaussian bump at (dx, dy) pixels from the image centre (dy pointing down), (1, 1, H, W)."""
    v = torch.arange(H, dtype=dtype) - (H - 1) / 2
    u = torch.arange(W, dtype=dtype) - (W - 1) / 2
    V, U = torch.meshgrid(v, u, indexing="ij")
    return torch.exp(-((U - dx) ** 2) / (2 * sx**2) - (V - dy) ** 2 / (2 * sy**2))[None, None]


def centroid(X: torch.Tensor) -> tuple[float, float]:
    """Centre of mass (dx, dy) of one image (1, 1, H, W), in pixels from the centre."""
    H, W = X.shape[-2:]
    v = torch.arange(H, dtype=X.dtype) - (H - 1) / 2
    u = torch.arange(W, dtype=X.dtype) - (W - 1) / 2
    m = X[0, 0]
    return float((m.sum(0) * u).sum() / m.sum()), float((m.sum(1) * v).sum() / m.sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rotate_by_multiples_of_90_is_rot90_counter_clockwise(dtype):
    X = torch.rand(4, 1, 28, 28, dtype=dtype)
    # 0°: identity. Multiples of 90° map pixel centres onto pixel centres (align_corners=False),
    # so only rounding is left: float64 internally, then at most half an ulp of the dtype (< 1e-7).
    torch.testing.assert_close(rotate(X, 0), X, atol=1e-6, rtol=0)
    torch.testing.assert_close(rotate(X, 360), X, atol=1e-6, rtol=0)
    for degrees, k in [(90, 1), (180, 2), (270, 3), (-90, -1)]:
        torch.testing.assert_close(rotate(X, degrees), torch.rot90(X, k, dims=(-2, -1)), atol=1e-6, rtol=0)
    Y = X
    for _ in range(4):
        Y = rotate(Y, 90)
    torch.testing.assert_close(Y, X, atol=1e-6, rtol=0)
    assert rotate(X, 0).dtype == dtype
    # counter-clockwise on screen: the top-right pixel goes to the top-left corner
    E = torch.zeros(1, 1, 8, 8, dtype=dtype)
    E[0, 0, 0, -1] = 1
    assert rotate(E, 90)[0, 0, 0, 0] == pytest.approx(1.0, abs=1e-6)


def test_rotate_preserves_mass_and_moves_the_centre_of_mass():
    # An elongated centred blob, so a rotation really changes the image; its bilinear resampling keeps
    # the total mass to well under 1 % when the blob spans several pixels and stays inside the image.
    X = blob(28, 28, sx=4.0, sy=1.5)
    for degrees in [30, 45, 137]:
        R = rotate(X, degrees)
        assert (R - X).abs().max() > 0.3
        assert R.sum().item() == pytest.approx(X.sum().item(), rel=5e-3)
    # On a non-square image (20 × 32), a blob at (dx, dy) must land at the counter-clockwise rotated
    # offset (dx cos t + dy sin t, −dx sin t + dy cos t) (dy points down): checks direction and aspect ratio.
    dx, dy = 6.0, -3.0
    B = blob(20, 32, dx, dy)
    for degrees in [30, 90, -60]:
        t = torch.deg2rad(torch.tensor(float(degrees), dtype=torch.float64))
        c, s = torch.cos(t).item(), torch.sin(t).item()
        cx, cy = centroid(rotate(B, degrees))
        assert cx == pytest.approx(dx * c + dy * s, abs=0.05)
        assert cy == pytest.approx(-dx * s + dy * c, abs=0.05)


def test_invert_twice_is_identity():
    X = torch.rand(3, 1, 8, 8)
    assert torch.equal(invert(invert(X)), X)
    torch.testing.assert_close(invert(X) + X, torch.ones_like(X))


def test_noise_images():
    U = noise_images(50, (1, 28, 28), seed=1)
    assert U.shape == (50, 1, 28, 28) and U.dtype == torch.get_default_dtype()
    assert 0 <= U.min() and U.max() <= 1
    assert torch.equal(U, noise_images(50, (1, 28, 28), seed=1))
    assert not torch.equal(U, noise_images(50, (1, 28, 28), seed=2))
    # 39 200 pixels: the mean of U[0, 1] is 0.5 ± 0.0015 (σ = √(1/12)/√39200), within 4σ
    assert U.mean().item() == pytest.approx(0.5, abs=0.006)
    S = noise_images(50, (1, 28, 28), seed=1, kind="bernoulli", density=0.13, dtype=torch.float64)
    assert set(S.unique().tolist()) <= {0.0, 1.0} and S.dtype == torch.float64
    # mean 0.13 ± 0.0017 (σ = √(0.13·0.87/39200)), within 4σ
    assert S.mean().item() == pytest.approx(0.13, abs=0.007)
    with pytest.raises(ValueError, match="density"):
        noise_images(5, (1, 8, 8), kind="bernoulli")
    with pytest.raises(ValueError, match="kind"):
        noise_images(5, (1, 8, 8), kind="perlin")


@pytest.fixture(scope="module")
def digits():
    """300 training and 200 test images of 8×8 digits (float64)."""
    return image_data("digits", n_train=300, n_test=200, dtype=torch.float64)


def train_logistic(X: torch.Tensor, y: torch.Tensor, K: int) -> torch.nn.Module:
    """A (multinomial) logistic regression on flattened images, by L-BFGS with a little weight decay."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(X[0].numel(), K)).double()
    opt = torch.optim.LBFGS(model.parameters(), max_iter=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        f = model(X)
        if K == 1:
            loss = F.binary_cross_entropy_with_logits(f.squeeze(1), y.double())
        else:
            loss = F.cross_entropy(f, y)
        loss = loss + 1e-3 * sum((p**2).sum() for p in model.parameters())
        loss.backward()
        return loss

    opt.step(closure)
    return model


def per_example_loss(model, X, y, K):
    f = model(X)
    if K == 1:
        return F.binary_cross_entropy_with_logits(f.squeeze(1), y.double(), reduction="none")
    return F.cross_entropy(f, y, reduction="none")


@pytest.mark.parametrize("K", [10, 1])
def test_fgsm_matches_the_closed_form_gradient_sign_and_increases_the_loss(digits, K):
    if K == 1:  # binary: zeros against ones
        keep_tr, keep_te = digits.y_train <= 1, digits.y_test <= 1
        X_tr, y_tr = digits.X_train[keep_tr], digits.y_train[keep_tr]
        X, y = digits.X_test[keep_te], digits.y_test[keep_te]
    else:
        X_tr, y_tr, X, y = digits.X_train, digits.y_train, digits.X_test, digits.y_test
    model = train_logistic(X_tr, y_tr, K)
    loss = "bce" if K == 1 else "ce"
    W, b = model[1].weight.detach(), model[1].bias.detach()
    x = X.flatten(1)
    # ∇ₓ of the loss of a linear model in closed form: Wᵀ(σ(f) − y) for one logit, Wᵀ(softmax(f) − eᵧ)
    if K == 1:
        grad = (torch.sigmoid(x @ W.T + b) - y.double().unsqueeze(1)) @ W
    else:
        grad = (torch.softmax(x @ W.T + b, -1) - F.one_hot(y, K).double()) @ W
    grad = grad.reshape(X.shape)
    assert (grad.abs() > 1e-12).float().mean() > 0.9  # signs are well defined almost everywhere

    # the parameters' gradients must be left as they were, set or not
    model[1].weight.grad = torch.full_like(model[1].weight, 7.0)
    model[1].bias.grad = None
    with torch.no_grad():
        base = per_example_loss(model, X, y, K)
    for eps in [0.01, 0.05, 0.1, 0.3]:
        X_adv = fgsm(model, X, y, eps, loss=loss)
        torch.testing.assert_close(X_adv, (X + eps * grad.sign()).clamp(0, 1), atol=1e-12, rtol=0)
        assert 0 <= X_adv.min() and X_adv.max() <= 1
        assert (X_adv - X).abs().max() <= eps + 1e-12
        assert not X_adv.requires_grad
        with torch.no_grad():
            adv = per_example_loss(model, X_adv, y, K)
        # the loss is convex in x and the step has a non-negative inner product with its gradient,
        # so no example's loss goes down; the mean goes up by a clear factor (seen: 1.17–1.23 at
        # eps = 0.01, ≥ 4 at 0.1 for both models)
        assert (adv >= base - 1e-10).all()
        assert adv.mean() > (1 + 10 * eps) * base.mean()
    assert torch.equal(fgsm(model, X, y, 0.0, loss=loss), X)
    assert torch.equal(model[1].weight.grad, torch.full_like(model[1].weight, 7.0))
    assert model[1].bias.grad is None


def test_fgsm_checks():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    X, y = torch.rand(5, 1, 2, 2), torch.zeros(5, dtype=torch.int64)
    with pytest.raises(ValueError, match="one logit"):
        fgsm(model, X, y, 0.1, loss="bce")
    with pytest.raises(ValueError, match="loss"):
        fgsm(model, X, y, 0.1, loss="hinge")
    with pytest.raises(ValueError, match="non-negative"):
        fgsm(model, X, y, -0.1)
    one = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 1))
    with pytest.raises(ValueError, match="K ≥ 2"):
        fgsm(one, X, y, 0.1, loss="ce")
    with torch.no_grad():  # works inside no_grad (e.g. an evaluation loop)
        assert fgsm(model, X, y, 0.1).shape == X.shape
