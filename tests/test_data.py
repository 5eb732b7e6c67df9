import torch

from laplace_from_scratch import sinusoid, toy_linear, toy_multiclass, toy_nonlinear


def test_sinusoid_shapes_ranges_and_determinism():
    d = sinusoid()
    assert d.X_train.shape == (150, 1) and d.y_train.shape == (150, 1) and d.X_test.shape == (500, 1)
    assert 0 <= d.X_train.min() and d.X_train.max() <= 10
    assert d.X_test.min() == -10 and d.X_test.max() == 13
    # y = sin x + 0.3 ε: the residual standard deviation is 0.3 up to sampling error (≈ 0.3/√300)
    resid = d.y_train - torch.sin(d.X_train)
    assert abs(resid.std().item() - 0.3) < 0.06
    torch.testing.assert_close(sinusoid().y_train, d.y_train, rtol=0, atol=0)
    assert not torch.equal(sinusoid(seed=1).y_train, d.y_train)


def test_toy_linear_is_linearly_separable():
    d = toy_linear()
    assert d.X.shape == (100, 2) and d.y.dtype == torch.int64
    s = d.X.sum(-1)
    assert (s[d.y == 0] < 0).all() and (s[d.y == 1] > 0).all()


def test_toy_nonlinear_is_balanced_and_deterministic():
    d = toy_nonlinear()
    assert d.X.shape == (200, 2) and set(d.y.tolist()) == {0, 1}
    assert (d.y == 0).sum() == 100
    torch.testing.assert_close(toy_nonlinear().X, d.X, rtol=0, atol=0)


def test_toy_multiclass_blobs_sit_on_the_circle():
    d = toy_multiclass(n=3000, n_classes=4, radius=2.0, std=0.8)
    assert d.X.shape == (3000, 2) and d.y.dtype == torch.int64
    assert torch.bincount(d.y).tolist() == [750] * 4
    for c in range(4):
        angle = torch.tensor(2 * torch.pi * c / 4 + torch.pi / 2)
        centre = 2.0 * torch.stack([torch.cos(angle), torch.sin(angle)])
        pts = d.X[d.y == c]
        # mean within 5 standard errors (0.8/√750 ≈ 0.03) of the centre; spread 0.8 up to sampling error
        assert (pts.mean(0) - centre).abs().max() < 5 * 0.8 / 750**0.5
        assert (pts.std(0) - 0.8).abs().max() < 0.08
    torch.testing.assert_close(toy_multiclass(n=3000, n_classes=4).X, d.X, rtol=0, atol=0)
