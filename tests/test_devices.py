"""The device policy (``laplace_from_scratch/devices.py``): every tensor on the model's device.

Two kinds of test:

* **meta** (runs everywhere, in CI): the whole public API with torch's default device set to
  ``meta`` while the model and the data are on the CPU. A factory call that forgets ``device=`` (or a
  ``torch.as_tensor`` that moves a tensor to the default device) then makes a meta tensor, and the
  next operation with a CPU tensor, or any ``.item()``, fails: exactly the mistake that fails on a GPU.
  Every output must come back on the CPU and finite.
* **accelerators** (``cuda``, or those given with ``pytest --device``, e.g. ``--device mps``): the same
  API on the device, compared with the CPU run, number by number. Skipped, with the reason printed
  (``pytest -rs``), on a machine without one.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import laplace_from_scratch as lfs
from laplace_from_scratch import helpers, matfree
from laplace_from_scratch.helpers import plotting

LIKELIHOODS = ("regression", "classification", "binary_classification")
CONFIGS = [
    (lik, subset, structure)
    for lik in LIKELIHOODS
    for subset in ("all", "last_layer")
    for structure in ("full", "diag", "kron")
]
# the structures new in the protocol, and the subnetwork (full over a subset of the weights)
EXTRA = [(lik, "all", s) for lik in LIKELIHOODS for s in ("lowrank", "matfree")] + [
    (lik, "subnetwork", "full") for lik in LIKELIHOODS
]
N_OUT = {"regression": 2, "classification": 3, "binary_classification": 1}


def problem(likelihood: str, dtype: torch.dtype = torch.float64) -> tuple:
    """A small MLP and 24 inputs with targets, on the CPU (deterministic)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(24, 3, generator=g, dtype=dtype)
    K = N_OUT[likelihood]
    model = helpers.mlp(3, K, width=5, depth=1, seed=0, dtype=dtype)
    if likelihood == "regression":
        y = torch.randn(24, K, generator=g, dtype=dtype)
    else:
        y = torch.randint(0, max(K, 2), (24,), generator=g)
    return model, X, y


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1)  # a seeded CPU generator, as in the notebooks


def exercise(likelihood: str, subset: str, structure: str, model, X: Tensor, y: Tensor) -> dict[str, Tensor]:
    """Every public method of ``Laplace`` for one configuration; returns what each produced.

    Hyperparameters are passed as Python numbers and as CPU tensors; random draws use a CPU
    generator. A list of (X, y) batches stands in for a DataLoader (whose own seed is drawn with a
    device-less factory call inside torch).
    """
    batches = [(X[:12], y[:12]), (X[12:], y[12:])]
    reg = likelihood == "regression"
    extra = (
        {"rank": 5}
        if structure == "lowrank"
        else {"n_probes": 4, "lanczos_steps": 8}
        if structure == "matfree"
        else {}
    )
    if subset == "subnetwork":
        extra["subnetwork_indices"] = torch.arange(
            0, sum(p.numel() for p in model.parameters()), 2, device=X.device
        )
    kw = dict(
        subset_of_weights=subset,
        hessian_structure=structure,
        **extra,
        prior_precision=torch.tensor(0.7, device="cpu"),  # a float32 CPU tensor, whatever the model
        **(dict(sigma_noise=0.5) if reg else {}),
    )
    la = lfs.Laplace(model, likelihood, **kw)
    la.fit(batches)
    out: dict[str, Tensor] = {"evidence": la.log_marginal_likelihood()}
    at = dict(prior_precision=2.0, **(dict(sigma_noise=0.4) if reg else {}))
    out["evidence_at"] = la.log_marginal_likelihood(**at)
    if structure == "full":
        eigen = lfs.Laplace(model, likelihood, **kw, evidence_route="eigen")
        eigen.fit(batches)
        out["evidence_eigen"] = eigen.log_marginal_likelihood(**at)
        out["covariance"] = la.posterior_covariance
    P_post = la.posterior_precision
    out["precision"] = P_post if isinstance(P_post, Tensor) else P_post.to_matrix()
    out["variance"] = la.posterior_variance
    out["sample"] = la.sample(5, generator=gen())
    out["log_prob"] = la.log_prob(torch.zeros(2, la.n_params, dtype=X.dtype, device="cpu"))
    out["glm_samples"] = la.glm_samples(X[:4], 3, generator=gen())
    for pred_type in ("glm", "nn"):
        out[f"functional_samples_{pred_type}"] = la.functional_samples(X[:4], pred_type, 3, generator=gen())
        out[f"predictive_samples_{pred_type}"] = la.predictive_samples(
            X[:4], pred_type, 3, diagonal_output=True, generator=gen()
        )
    if structure == "kron":
        out["kron_logdet"] = P_post.logdet()
        out["kron_diag"] = P_post.diag(exponent=-1)
    if reg:
        out["f_mu"], out["f_var"] = la(X[:4])
        nn_kw = dict(pred_type="nn", link_approx="mc", n_samples=4, generator=gen())
        out["nn_mean"], out["nn_var"] = la(X[:4], **nn_kw)
    else:
        links = ("probit", "mc") if likelihood == "binary_classification" else ("probit", "mc", "bridge")
        for link in links:
            out[link] = la(X[:4], link_approx=link, n_samples=5, generator=gen())
        out["nn"] = la(X[:4], pred_type="nn", link_approx="mc", n_samples=4, generator=gen())
    la.prior_mean = torch.full((la.n_params,), 0.01, device="cpu")  # a CPU tensor, converted when set
    out["evidence_prior_mean"] = la.log_marginal_likelihood()
    la.optimize_prior_precision(method="marglik", n_steps=3)
    out["delta_marglik"] = la.prior_precision
    la.optimize_prior_precision(method="marglik", n_steps=2, prior_structure="layerwise")
    out["delta_layerwise"] = la.prior_precision
    la.optimize_prior_precision(method="gridsearch", val_loader=batches[:1], grid_size=3, n_samples=4)
    out["delta_grid"] = la.prior_precision
    out["history"] = torch.tensor(la.optimize_hyperparameters(n_steps=3, tune_sigma=reg), device=X.device)
    if reg:
        out["sigma"] = la.sigma_noise
    return out


def exercise_functions(model, X: Tensor, y: Tensor) -> dict[str, Tensor]:
    """The functional API: curvature, posterior, predictive, matrix-free, metrics and shifts."""
    f, theta = lfs.make_functional(model)
    lik = lfs.Categorical()
    out: dict[str, Tensor] = {}
    H = lfs.ggn(f, theta, X, lik)
    out["ggn_diag"] = lfs.curvature.ggn_diagonal(f, theta, X, lik)
    P = lfs.posterior_precision(
        H, lfs.prior_precision_diag(torch.tensor(0.5, device="cpu"), [theta.numel()]).to(H)
    )
    L = lfs.cholesky(P)
    out["sample"] = lfs.sample_from_cholesky(theta, L, 4, generator=gen())
    eig = lfs.EigenPosterior.from_H(H)
    out["eig_sample"] = theta + eig.sample(3, 0.5, generator=gen())
    out["eig_cov"] = eig.covariance(0.5)
    J = lfs.jacobian(f, theta, X[:3])
    f_mu = f(theta, X[:3]).detach()
    f_var = eig.functional_variance(J, 0.5)
    out["mc"] = lfs.mc_softmax(f_mu, f_var, 6, generator=gen())
    out["mc_sigmoid"] = lfs.mc_sigmoid(f_mu[:, :1], f_var[:, :1, :1], 6, generator=gen())
    mv = matfree.posterior_precision_matvec(f, theta, X, lik, theta.new_tensor(0.5))
    out["cg"] = matfree.conjugate_gradient(mv, theta.clone())[0]
    out["lanczos_T"] = matfree.lanczos(mv, theta.clone(), 4)[0]
    out["slq"] = torch.stack(
        matfree.slq_log_det(mv, theta.numel(), 3, 5, generator=gen(), dtype=theta.dtype, device=theta.device)
    )
    out["mf_sample"] = matfree.sample_matrix_free(mv, theta, 2, m=5, generator=gen())
    out["mf_fvar"] = matfree.jacobian_sandwich_cg(mv, J)[0]
    probs = lfs.probit(f_mu, f_var)
    scores = [
        helpers.nll(probs, y[:3]),
        helpers.brier(probs, y[:3]),
        helpers.ece(probs, y[:3]),
        helpers.accuracy(probs, y[:3]),
    ]
    scores.append(helpers.ood_auroc(probs[:2], probs[1:], "entropy"))
    out["metrics"] = theta.new_tensor(scores)
    out["calibration"] = torch.stack(helpers.calibration_curve(probs, y[:3], 4)[:2])
    out["sum_zero"] = lfs.probit(*lfs.sum_zero(f_mu, f_var))
    with torch.no_grad():
        logits = model(X)
    T = helpers.fit_temperature(logits, y)
    low, high = helpers.ood_auroc_interval(probs[:2], probs[1:], n_boot=20)[1:]
    s_in, s_out = helpers.ood_score(probs[:2]), helpers.ood_score(probs[1:3])
    diff = helpers.auroc_difference_interval(s_out, s_in, s_out.flip(0), s_in, True, 20)
    out["baselines"] = theta.new_tensor([T, low, high, *diff])
    out["ensemble"] = helpers.ensemble_probs([model, model], X[:3])
    dropped = torch.nn.Sequential(model, torch.nn.Dropout(0.5))
    out["mc_dropout"] = helpers.mc_dropout_probs(dropped, X[:3], n_samples=3)
    imgs = helpers.noise_images(2, (1, 4, 4), seed=3, dtype=X.dtype, device=X.device)
    out["rotate"] = helpers.rotate(imgs, 30.0)
    out["invert"] = helpers.invert(imgs)
    out["fgsm"] = helpers.fgsm(model, X[:3], y[:3], 0.1)
    return out


def _check_outputs(out: dict[str, Tensor], device: torch.device) -> None:
    for name, value in out.items():
        assert value.device == device, f"{name} is on {value.device}, not {device}"
        assert torch.isfinite(value[~value.isnan()]).all(), f"{name} is not finite"


# ----- meta: catches a forgotten device= on a machine without a GPU --------------------------------


@pytest.mark.parametrize("likelihood, subset, structure", CONFIGS + EXTRA)
def test_laplace_api_creates_nothing_on_the_default_device(likelihood, subset, structure):
    model, X, y = problem(likelihood)
    with torch.device("meta"):
        out = exercise(likelihood, subset, structure, model, X, y)
    _check_outputs(out, X.device)


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
def test_laplace_api_in_float32_creates_nothing_on_the_default_device(structure):
    model, X, y = problem("classification", torch.float32)
    with torch.device("meta"):
        out = exercise("classification", "all", structure, model, X, y)
    _check_outputs(out, X.device)
    assert all(v.dtype == torch.float32 for k, v in out.items() if k != "history"), "outputs not in float32"


def test_functional_api_creates_nothing_on_the_default_device():
    model, X, y = problem("classification")
    with torch.device("meta"):
        out = exercise_functions(model, X, y)
    _check_outputs(out, X.device)


def test_data_sets_are_made_on_the_cpu_whatever_the_default_device():
    with torch.device("meta"):
        sets = [
            helpers.sinusoid(n=10),
            helpers.toy_linear(n=10),
            helpers.toy_nonlinear(n=10),
            helpers.toy_multiclass(n=9),
        ]
        grid = plotting.grid_2d(2.0, n=3)
    for d in sets:
        assert all(t.device.type == "cpu" for t in vars(d).values())
    assert grid.device.type == "cpu"


def test_data_on_another_device_is_a_clear_error():
    model, X, y = problem("regression")
    la = lfs.Laplace(model, "regression")
    with pytest.raises(ValueError, match=r"the inputs X is on meta but the model's parameters are on cpu"):
        la.fit([(X.to("meta"), y)])
    la.fit([(X, y)])
    with pytest.raises(ValueError, match=r"x is on meta .* on cpu"):
        la(X.to("meta"))
    with pytest.raises(ValueError, match=r"targets y is on meta"):
        la.fit([(X, y.to("meta"))])


def test_hyperparameters_are_converted_when_set():
    model, X, y = problem("regression")
    la = lfs.Laplace(
        model, "regression", sigma_noise=torch.tensor(0.5, dtype=torch.float32), prior_precision=2
    )
    assert la.sigma_noise.dtype == la.prior_precision.dtype == la.mean.dtype == torch.float64
    with pytest.raises(TypeError, match="prior_precision must be a number or a tensor, got str"):
        la.prior_precision = "1.0"
    with pytest.raises(ValueError, match="got str"):  # laplace-torch raises ValueError here
        la.sigma_noise = "0.5"
    with pytest.raises(TypeError, match="sigma_noise must be a number or a tensor, got NoneType"):
        la.sigma_noise = None


# ----- accelerators: the same numbers on the device as on the CPU ----------------------------------


def _to(out: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().cpu() for k, v in out.items()}


def _compare(on_device: dict[str, Tensor], on_cpu: dict[str, Tensor], rtol: float = 1e-6) -> None:
    assert on_device.keys() == on_cpu.keys()
    for name in on_cpu:
        torch.testing.assert_close(on_device[name], on_cpu[name], rtol=rtol, atol=1e-8, msg=name)


@pytest.mark.parametrize("likelihood, subset, structure", CONFIGS + EXTRA)
def test_laplace_api_on_device_equals_cpu(device, likelihood, subset, structure):
    model, X, y = problem(likelihood)
    ref = _to(exercise(likelihood, subset, structure, model, X, y))
    model, X, y = problem(likelihood)
    out = exercise(likelihood, subset, structure, model.to(device), X.to(device), y.to(device))
    _check_outputs(out, torch.device(device.type, device.index or 0) if device.type == "cuda" else device)
    _compare(_to(out), ref)


def test_functional_api_on_device_equals_cpu(device):
    model, X, y = problem("classification")
    ref = _to(exercise_functions(model, X, y))
    out = exercise_functions(model.to(device), X.to(device), y.to(device))
    _compare(_to(out), ref)


def test_generator_on_the_device_is_accepted(device):
    model, X, y = problem("classification")
    la = lfs.Laplace(model.to(device), "classification")
    la.fit([(X.to(device), y.to(device))])
    s = la.sample(3, generator=torch.Generator(device).manual_seed(0))
    assert s.device.type == device.type and s.shape == (3, la.n_params)
