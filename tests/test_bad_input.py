"""Bad input gets a clear error, and a failed call changes nothing.

One test per class of input; each asserts the error type, that the message names the problem, and,
where a call could have half-happened, that the object's state is what it was before."""

import math

import pytest
import torch
from conftest import mlp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs
from laplace_from_scratch import helpers, matfree

D = torch.float64


def loader(X, y, bs=10, **kw):
    return DataLoader(TensorDataset(X, y), batch_size=bs, **kw)


@pytest.fixture
def reg():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(30, 2, generator=g, dtype=D), torch.randn(30, 1, generator=g, dtype=D)
    la = lfs.Laplace(mlp(2, 1, width=5), "regression", sigma_noise=0.5, prior_precision=2.0)
    la.fit(loader(X, y))
    return la, X, y


@pytest.fixture
def clf():
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(30, 2, generator=g, dtype=D), torch.randint(0, 3, (30,), generator=g)
    la = lfs.Laplace(mlp(2, 3, width=5), "classification")
    la.fit(loader(X, y))
    return la, X, y


def state(la):
    return (
        la.prior_precision.clone(),
        la.sigma_noise.clone(),
        la.temperature.clone(),
        la.prior_mean.clone(),
        la.mean.clone(),
        la.structure,
        la.loss.clone(),
        la.n_data,
    )


def same(a, b):
    return all(
        x is y if not isinstance(x, torch.Tensor) else torch.equal(x, y) for x, y in zip(a, b, strict=True)
    )


# ----- hyperparameters ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, value, error, match",
    [
        ("prior_mean", "P1", ValueError, "prior_mean must be a scalar or"),
        ("prior_mean", float("nan"), ValueError, "prior_mean must be finite"),
        ("sigma_noise", float("inf"), ValueError, "sigma_noise must be one positive finite"),
        ("sigma_noise", torch.ones(1, 1), ValueError, "sigma_noise must be one positive finite"),
        ("temperature", -1.0, ValueError, "temperature must be one positive finite"),
        ("temperature", float("inf"), ValueError, "temperature must be one positive finite"),
        ("prior_precision", torch.ones(1, 1), ValueError, "prior_precision must be a scalar"),
        ("prior_precision", float("nan"), ValueError, "positive and finite"),
        ("prior_precision", "1.0", TypeError, "prior_precision must be a number or a tensor, got str"),
        ("sigma_noise", None, TypeError, "sigma_noise must be a number or a tensor, got NoneType"),
    ],
)
def test_bad_hyperparameters_are_refused_and_change_nothing(reg, name, value, error, match):
    la, *_ = reg
    if isinstance(value, str) and value == "P1":
        value = torch.zeros(la.n_params, 1, dtype=D)
    before = state(la)
    with pytest.raises(error, match=match):
        setattr(la, name, value)
    assert same(state(la), before)


def test_evidence_with_a_bad_sigma_keeps_the_prior(reg):
    la, *_ = reg
    before = state(la)
    with pytest.raises(ValueError, match="sigma_noise"):
        la.log_marginal_likelihood(prior_precision=5.0, sigma_noise=-1.0)
    assert same(state(la), before)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(lr=-1.0), "lr must be a positive"),
        (dict(n_steps=0), "n_steps must be a positive integer"),
        (dict(method="gridsearch", val_loader=None), "needs a val_loader"),
        (dict(method="gridsearch", grid_size=0, val_loader="X"), "grid_size must be a positive integer"),
        (dict(lr=1e8, n_steps=5), "learning rate is too large"),
    ],
)
def test_tuning_with_bad_arguments_changes_nothing(reg, kw, match):
    la, X, y = reg
    if kw.get("val_loader") == "X":
        kw["val_loader"] = loader(X, y)
    before = state(la)
    with pytest.raises(ValueError, match=match):
        la.optimize_prior_precision(init_prior_prec=7.0, **kw)
    assert same(state(la), before)


def test_gridsearch_with_a_failing_batch_restores_delta(reg):
    la, X, y = reg
    before = state(la)
    with pytest.raises(ValueError, match="must match outputs"):
        la.optimize_prior_precision(
            method="gridsearch", val_loader=loader(X, y[:, 0]), grid_size=3
        )  # (N,) targets
    with pytest.raises(ValueError, match="yielded no data"):
        la.optimize_prior_precision(method="gridsearch", val_loader=[], grid_size=3)
    assert same(state(la), before)


def test_out_of_range_validation_labels(clf):
    la, X, y = clf
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        la.optimize_prior_precision(method="gridsearch", val_loader=loader(X, y + 5), grid_size=2)


# ----- fit ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda X, y: X, TypeError, "train_loader must be an iterable of \\(X, y\\) batches"),
        (lambda X, y: [(X, y, y)], TypeError, "an \\(X, y\\) pair of tensors, got a tuple of 3 items"),
        # a dict batch is read by its keys, laplace-torch's "input_ids" and "labels" by default
        (lambda X, y: [{"x": X, "y": y}], KeyError, "input_ids"),
        (lambda X, y: loader(X, y, bs=None), ValueError, "batch_size=None"),
        (
            lambda X, y: [(X.float(), y)],
            ValueError,
            "X has dtype torch.float32 but the model's parameters are",
        ),
        (lambda X, y: [(X, y * float("nan"))], ValueError, "targets y contain NaN"),
        (lambda X, y: [(X, y[:, 0])], ValueError, "must match outputs"),
        (lambda X, y: [], ValueError, "yielded no data"),
    ],
)
def test_bad_loaders_fail_clearly_and_change_nothing(reg, make, error, match):
    la, X, y = reg
    before = state(la)
    with pytest.raises(error, match=match):
        la.fit(make(X, y))
    assert same(state(la), before)


def test_nonfinite_outputs_and_one_dimensional_outputs(reg):
    la, X, y = reg
    with torch.no_grad():
        la.model[0].weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="outputs contain NaN"):
        la.fit(loader(X, y))
    flat = lfs.Laplace(nn.Sequential(nn.Linear(2, 1), nn.Flatten(0)).to(D), "regression")
    with pytest.raises(ValueError, match=r"outputs must be \(N, K\)"):
        flat.fit(loader(X, y[:, 0]))


def test_models_that_cannot_be_used():
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        lfs.Laplace(lambda x: x, "regression")
    frozen = mlp(2, 1)
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        lfs.Laplace(frozen, "regression")
    for dtype in (torch.float16, torch.bfloat16):  # no eigh/Cholesky in half precision
        with pytest.raises(ValueError, match="float32 or float64 parameters"):
            lfs.Laplace(mlp(2, 1).to(dtype), "regression")


@pytest.mark.parametrize("layer", [nn.BatchNorm1d(4), nn.Dropout(0.1)])
def test_training_mode_is_refused_before_anything_changes(layer):
    model = nn.Sequential(nn.Linear(2, 4), layer, nn.Tanh(), nn.Linear(4, 1)).to(D)
    X, y = torch.randn(8, 2, dtype=D), torch.randn(8, 1, dtype=D)
    buffers = {k: v.clone() for k, v in model.state_dict().items()}
    la = lfs.Laplace(model, "regression")
    with pytest.raises(ValueError, match=r"call model.eval\(\) first"):
        la.fit(loader(X, y))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in buffers.items())  # running stats untouched
    model.eval()
    la.fit(loader(X, y))


def test_using_the_posterior_before_fit():
    for structure in ["full", "diag", "kron", "lowrank", "matfree"]:
        la = lfs.Laplace(mlp(2, 1, width=4), "regression", hessian_structure=structure)
        with pytest.raises(RuntimeError, match="call Laplace.fit"):
            la.sample(2)


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_bad_sample_counts(clf, n):
    la, X, _ = clf
    with pytest.raises(ValueError, match="n_samples must be a positive integer"):
        la(X[:2], link_approx="mc", n_samples=n)
    with pytest.raises(ValueError, match="n_samples must be a positive integer"):
        la.sample(n)


# ----- numerical building blocks -----------------------------------------------------------------


def test_cholesky_of_nan_and_conjugate_gradients_on_bad_operators():
    with pytest.raises(ValueError, match="NaN or inf"):
        lfs.cholesky(torch.full((3, 3), float("nan"), dtype=D))
    A = torch.diag(torch.tensor([1.0, -2.0, 3.0], dtype=D))
    b = torch.ones(3, dtype=D)
    with pytest.raises(ValueError, match="positive-definite"):
        matfree.conjugate_gradient(lambda v: A @ v, b)
    with pytest.raises(ValueError, match="positive-definite"):
        matfree.conjugate_gradient(lambda v: torch.zeros_like(v), b)  # singular
    with pytest.raises(ValueError, match="max_iter must be a positive integer"):
        matfree.conjugate_gradient(lambda v: v, b, max_iter=-1)
    with pytest.warns(RuntimeWarning, match="did not reach"):
        matfree.conjugate_gradient(lambda v: torch.diag(torch.arange(1.0, 4.0, dtype=D)) @ v, b, max_iter=1)


def test_lanczos_and_slq_on_bad_input():
    with pytest.raises(ValueError, match="non-zero"):
        matfree.lanczos(lambda v: v, torch.zeros(4, dtype=D), 3)
    A = torch.diag(torch.tensor([1.0, -2.0, 3.0, 4.0], dtype=D))
    with pytest.raises(ValueError, match="not positive definite"):
        matfree.slq_log_det(lambda v: A @ v, 4, n_probes=3, m=4, dtype=D)
    with pytest.raises(ValueError, match="n_probes must be at least 2"):
        matfree.slq_log_det(lambda v: v, 4, n_probes=1, dtype=D)


def test_metrics_refuse_negative_probabilities_and_logits():
    y = torch.tensor([0, 1])
    bad = torch.tensor([[1.2, -0.2], [0.5, 0.5]], dtype=D)
    for metric in (helpers.nll, helpers.ece):
        with pytest.raises(ValueError, match="probabilities in \\[0, 1\\]"):
            metric(bad, y)
    with pytest.raises(ValueError, match="sum to 1"):
        helpers.ood_score(torch.randn(4, 3, dtype=D))
    assert math.isfinite(helpers.nll(bad.abs() / bad.abs().sum(-1, keepdim=True), y))


STRUCTURES = ["full", "diag", "kron", "lowrank", "matfree"]


def fit_and_predict(model, X, y, structure):
    torch.manual_seed(3)  # lowrank's Lanczos start and matfree's probes
    la = lfs.Laplace(model, "classification", hessian_structure=structure)
    la.fit(loader(X, y))
    return la.log_marginal_likelihood().detach(), la(X, pred_type="glm", link_approx="probit")


@pytest.mark.parametrize("structure", STRUCTURES)
def test_models_with_backward_hooks_give_the_same_posterior(clf, structure):
    """Full backward hooks (BackPACK's, ASDL's or a user's) make torch.func fail deep
    inside torch; we set them aside while we differentiate, never fire them, and put
    them back."""
    _, X, y = clf
    torch.manual_seed(0)
    clean = mlp(2, 3, width=5)
    hooked = mlp(2, 3, width=5)
    hooked.load_state_dict(clean.state_dict())
    fired = []
    handles = [
        hooked[0].register_full_backward_hook(lambda *a: fired.append("module")),
        hooked.register_full_backward_pre_hook(lambda *a: fired.append("pre")),
        nn.modules.module.register_module_full_backward_hook(lambda *a: fired.append("global")),
    ]
    try:
        before = [dict(m._backward_hooks) for m in hooked.modules()]
        ev, probs = fit_and_predict(hooked, X, y, structure)
        ev0, probs0 = fit_and_predict(clean, X, y, structure)
        assert fired == []
        assert [dict(m._backward_hooks) for m in hooked.modules()] == before
        assert len(nn.modules.module._global_backward_hooks) == 1
        torch.testing.assert_close(ev, ev0, rtol=1e-12, atol=0)
        torch.testing.assert_close(probs, probs0, rtol=1e-12, atol=0)
        hooked(X).sum().backward()  # the hooks still work for the user afterwards
        assert sorted(set(fired)) == ["global", "module", "pre"]
    finally:
        for h in handles:
            h.remove()


def test_backward_hooks_come_back_after_an_error():
    model = mlp(2, 1, width=4)
    h = model[0].register_full_backward_hook(lambda *a: None)
    try:
        f, theta = lfs.functional.make_functional(model)
        with pytest.raises(RuntimeError):
            f(theta, torch.randn(3, 5, dtype=D))  # wrong feature count
        assert len(model[0]._backward_hooks) == 1
    finally:
        h.remove()


@pytest.mark.parametrize("structure", STRUCTURES)
def test_a_model_laplace_torch_has_fitted_with_backpack(clf, structure):
    """Readers compare both libraries on one model: our fit after laplace-torch's
    BackPACK fit, predictive and tuning equals our fit on an untouched copy."""
    laplace = pytest.importorskip("laplace", reason="laplace-torch: `make install`")
    from laplace.curvature import BackPackGGN

    _, X, y = clf
    torch.manual_seed(0)
    model = mlp(2, 3, width=5)
    clean = mlp(2, 3, width=5)
    clean.load_state_dict(model.state_dict())
    ref = laplace.Laplace(model, "classification", hessian_structure="full", backend=BackPackGGN)
    ref.fit(loader(X, y))
    ref(X, pred_type="glm", link_approx="mc", n_samples=5)
    ref.optimize_prior_precision(method="marglik", n_steps=2)
    ev, probs = fit_and_predict(model, X, y, structure)
    ev0, probs0 = fit_and_predict(clean, X, y, structure)
    torch.testing.assert_close(ev, ev0, rtol=1e-12, atol=0)
    torch.testing.assert_close(probs, probs0, rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    "structure, match",
    [
        ("full", r"full Laplace over P = 1051 parameters needs 1 dense 1051×1051"),
        ("kron", r"Kronecker factors of sizes \[30, 2, 30, 30, 1, 30\].*'diag'"),
        ("lowrank", r"Lanczos with 60 steps needs a 1051×60 float64 basis.*fewer steps"),
    ],
)
def test_every_structure_checks_memory_before_allocating(monkeypatch, structure, match):
    from laplace_from_scratch import memory_limit

    X, y = torch.randn(20, 2, dtype=D), torch.randn(20, 1, dtype=D)
    la = lfs.Laplace(mlp(2, 1, width=30), "regression", hessian_structure=structure)
    la.fit(loader(X, y))
    before, ev = state(la), la.log_marginal_likelihood()
    monkeypatch.setattr(memory_limit, "available_bytes", lambda device: 1000)
    with pytest.raises(MemoryError, match=match) as err:
        la.fit(loader(X, y))  # a re-fit: the first fit's posterior must survive
    assert "GiB are available on cpu" in str(err.value)
    monkeypatch.undo()
    assert same(state(la), before)
    assert torch.equal(la.log_marginal_likelihood(), ev)


def test_matrix_free_checks_its_lanczos_bases(monkeypatch):
    from laplace_from_scratch import memory_limit

    X, y = torch.randn(20, 2, dtype=D), torch.randn(20, 1, dtype=D)
    la = lfs.Laplace(mlp(2, 1, width=30), "regression", hessian_structure="matfree")
    la.fit(loader(X, y))
    monkeypatch.setattr(memory_limit, "available_bytes", lambda device: 1000)
    with pytest.raises(MemoryError, match=r"Lanczos with \d+ steps needs a 1051×"):
        la.log_marginal_likelihood()
    with pytest.raises(MemoryError, match=r"Lanczos with \d+ steps needs a 1051×"):
        la.sample(2)


def test_inputs_the_model_cannot_take_name_both_shapes(clf):
    la, X, _ = clf
    bad = torch.randn(4, 3, dtype=D)
    nn_call = lambda: la(bad, pred_type="nn", link_approx="mc")  # noqa: E731
    for call in [lambda: la(bad), nn_call, lambda: la.functional_samples(bad)]:
        with pytest.raises(ValueError, match=r"x has shape \(4, 3\), but the model was fitted .* \(N, 2\)"):
            call()
    assert la(X[:4]).shape == (4, 3)


def test_brier_takes_any_integer_labels():
    probs = torch.softmax(torch.randn(6, 3, generator=torch.Generator().manual_seed(0)), -1)
    y = torch.tensor([0, 1, 2, 2, 1, 0])
    assert helpers.metrics.brier(probs, y.int()) == helpers.metrics.brier(probs, y)


def test_a_hyperparameter_on_the_meta_device_is_refused(reg):
    la = reg[0]
    before = state(la)
    with pytest.raises(ValueError, match="prior_precision is a meta tensor"):
        la.prior_precision = torch.tensor(1.0, device="meta")
    assert same(before, state(la))


def test_an_option_a_structure_does_not_take_is_refused():
    """Structure options are keyword arguments of Laplace; one the structure does not take (e.g. a rank
    for KFAC, or the full structure's evidence_route for the diagonal) is an error, not ignored."""
    model = mlp(1, 1)
    with pytest.raises(TypeError, match=r"'kron' takes no option rank \(its options: none\)"):
        lfs.Laplace(model, "regression", hessian_structure="kron", rank=3)
    with pytest.raises(TypeError, match=r"'diag' takes no option evidence_route"):
        lfs.Laplace(model, "regression", hessian_structure="diag", evidence_route="eigen")
    with pytest.raises(TypeError, match=r"its options: rank, n_iter"):
        lfs.Laplace(model, "regression", hessian_structure="lowrank", n_probes=3)
    la = lfs.Laplace(model, "regression", evidence_route="cholesky")  # the full structure's option
    X = torch.randn(20, 1, dtype=torch.float64)
    la.fit(DataLoader(TensorDataset(X, X), batch_size=10))
    assert la.structure.route == "cholesky"
    with pytest.raises(ValueError, match="evidence_route must be one of"):
        lfs.Laplace(model, "regression", evidence_route="fast")  # refused when made, not at fit


@pytest.mark.parametrize(
    "structure, option, match",
    [
        ("full", dict(evidence_route="fast"), "evidence_route must be one of"),
        ("full", dict(one_buffer="yes"), "one_buffer must be True or False"),
        ("lowrank", dict(rank=0), "rank must be a positive integer"),
        ("lowrank", dict(n_iter=2.5), "n_iter must be a positive integer"),
        ("matfree", dict(n_probes=1), "n_probes must be at least 2"),
        ("matfree", dict(cg_tol=-1.0), "cg_tol must be a positive finite number"),
    ],
)
def test_an_invalid_option_is_refused_before_any_data_pass(structure, option, match):
    """An option's value is checked when the Laplace is made, before a loader is touched."""

    def no_data():
        raise AssertionError("the data was read")
        yield

    with pytest.raises(ValueError, match=match):
        lfs.Laplace(mlp(1, 1), "regression", hessian_structure=structure, **option).fit(no_data())


def _dense_H(la):
    H = la.H
    return H.to_matrix() if hasattr(H, "to_matrix") else H


@pytest.mark.parametrize("failure", ["loader", "shape"])
@pytest.mark.parametrize(
    "structure, make",
    [
        ("full", lambda: mlp(2, 1, width=5)),
        ("full", lambda: mlp(2, 1, width=2)),  # N·K > P: no whitened Jacobians kept
        ("diag", lambda: mlp(2, 1, width=5)),  # the layer-wise builder
        ("diag", lambda: nn.Sequential(nn.Linear(2, 5), nn.LayerNorm(5), nn.Linear(5, 1)).double()),
        ("kron", lambda: mlp(2, 1, width=5)),
        ("matfree", lambda: mlp(2, 1, width=5)),
    ],
)
def test_a_failed_continued_fit_leaves_the_laplace_as_it_was(structure, make, failure):
    """fit(override=False) adds to the running sums; when it fails halfway (the loader raises, or a
    batch's targets do not match the outputs, found only after its curvature was added), the
    posterior, its curvature, the loss and the sums of the next continued fit are as before it."""
    g = torch.Generator().manual_seed(4)
    X, y = torch.randn(40, 2, generator=g, dtype=D), torch.randn(40, 1, generator=g, dtype=D)
    model = make()
    la = lfs.Laplace(model, "regression", hessian_structure=structure, sigma_noise=0.5)
    la.fit(loader(X[:20], y[:20]))
    before, H, ev = state(la), _dense_H(la).clone(), la.log_marginal_likelihood()

    def fails_halfway():
        yield X[20:30], y[20:30]
        if failure == "loader":
            raise RuntimeError("the loader broke")
        yield X[30:40], y[30:40, 0]  # targets (10,) for outputs (10, 1)

    error, match = (RuntimeError, "the loader broke") if failure == "loader" else (ValueError, "must match")
    with pytest.raises(error, match=match):
        la.fit(fails_halfway(), override=False)
    assert same(state(la), before) and torch.equal(_dense_H(la), H)
    assert torch.equal(la.log_marginal_likelihood(), ev)
    la.fit(loader(X[20:], y[20:]), override=False)  # continues from the sums before the failure
    once = lfs.Laplace(model, "regression", hessian_structure=structure, sigma_noise=0.5)
    once.fit(loader(X, y, bs=20))
    assert la.n_data == once.n_data == 40
    torch.testing.assert_close(_dense_H(la), _dense_H(once), rtol=1e-12, atol=1e-12)


def test_joint_is_refused_for_class_probabilities(clf):
    """joint=True has no meaning for class probabilities: an error, not silently dropped; the joint
    Gaussian over the logits is glm_predictive's."""
    la, X, _ = clf
    with pytest.raises(ValueError, match="joint=True is the joint Gaussian of regression outputs"):
        la(X[:3], joint=True)
    f_mu, f_var = la.glm_predictive(X[:3], joint=True)
    assert f_mu.shape == (9,) and f_var.shape == (9, 9)


@pytest.mark.parametrize("fixture", ["reg", "clf"])
def test_nn_predictive_needs_the_mc_link_and_model_kwargs_are_refused(fixture, request):
    """laplace-torch's rule: pred_type="nn" is a Monte Carlo average, so any other link_approx
    (its default "probit" included) is a ValueError, for regression too, checked before any
    other keyword; keyword arguments for the model (laplace-torch passes them on) are a TypeError
    naming them, since ours calls model(x) only."""
    la, X, _ = request.getfixturevalue(fixture)
    for link in ("probit", "bridge"):
        with pytest.raises(ValueError, match="pass link_approx='mc'"):
            la(X[:3], pred_type="nn", link_approx=link)
    with pytest.raises(ValueError, match="pass link_approx='mc'"):
        la(X[:3], pred_type="nn", num_samples=3)  # laplace-torch's test_dtype call, same error
    with pytest.raises(TypeError, match=r"\['attention_mask'\].*ours calls model\(x\) only"):
        la(X[:3], pred_type="nn", link_approx="mc", attention_mask=None)
    out = la(X[:3], pred_type="nn", link_approx="mc", n_samples=4)
    assert (out[0] if isinstance(out, tuple) else out).shape[0] == 3
