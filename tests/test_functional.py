import pytest
import torch
from conftest import mlp

from laplace_from_scratch import flatten_params, make_functional, unflatten_params, vector_to_model


def test_functional_call_equals_module():
    model = mlp(3, 2)
    X = torch.randn(5, 3, dtype=torch.float64)
    f, theta = make_functional(model)
    assert theta.shape == (sum(p.numel() for p in model.parameters()),)
    torch.testing.assert_close(f(theta, X), model(X), rtol=0, atol=0)


def test_flatten_order_matches_torch_parameters_to_vector():
    model = mlp(3, 2)
    expected = torch.nn.utils.parameters_to_vector(model.parameters())
    torch.testing.assert_close(flatten_params(model), expected, rtol=0, atol=0)


def test_vector_to_model_round_trip():
    model = mlp(3, 2)
    theta = torch.randn_like(flatten_params(model))
    vector_to_model(theta, model)
    torch.testing.assert_close(flatten_params(model), theta, rtol=0, atol=0)


def test_wrong_length_raises():
    model = mlp(3, 2)
    with pytest.raises(ValueError, match="parameters"):
        unflatten_params(torch.zeros(7, dtype=torch.float64), model)


def test_the_private_hook_names_backward_hooks_off_relies_on_exist_in_this_torch():
    """``functional.backward_hooks_off`` swaps four private dicts of torch (no public API suspends a
    hook registered by someone else): each module's ``_backward_hooks`` and ``_backward_pre_hooks``
    and the module globals ``_global_backward_hooks`` and ``_global_backward_pre_hooks``. Each public
    registration must land in the dict we swap, and ``Module.__call__`` must read them: then a hooked
    model under the context runs torch.func's Jacobian and fires nothing. If torch renames them, this
    fails first (pyproject.toml allows torch ≥ 2.2; CI runs the Makefile's pinned torch)."""
    from torch.func import jacrev
    from torch.nn.modules import module as module_globals

    from laplace_from_scratch.functional import GLOBAL_BACKWARD_HOOKS, backward_hooks_off

    model = mlp(2, 1, width=3)
    fired = []
    handles = [
        model[0].register_full_backward_hook(lambda *a: fired.append("module")),
        model[0].register_full_backward_pre_hook(lambda *a: fired.append("pre")),
        module_globals.register_module_full_backward_hook(lambda *a: fired.append("global")),
        module_globals.register_module_full_backward_pre_hook(lambda *a: fired.append("global pre")),
    ]
    try:
        assert len(model[0]._backward_hooks) == len(model[0]._backward_pre_hooks) == 1
        assert [len(getattr(module_globals, n)) for n in GLOBAL_BACKWARD_HOOKS] == [1, 1]
        f, theta = make_functional(model)
        X = torch.randn(4, 2, dtype=torch.float64)
        with backward_hooks_off(model):
            assert not model[0]._backward_hooks and not model[0]._backward_pre_hooks
            assert not any(getattr(module_globals, n) for n in GLOBAL_BACKWARD_HOOKS)
        J = jacrev(lambda th: f(th, X))(theta)
        assert J.shape == (4, 1, theta.numel()) and fired == []
        assert [len(getattr(module_globals, n)) for n in GLOBAL_BACKWARD_HOOKS] == [1, 1]
        model(X.requires_grad_()).sum().backward()
        assert sorted(set(fired)) == ["global", "global pre", "module", "pre"]
    finally:
        for h in handles:
            h.remove()


def test_a_model_without_backward_hooks_has_nothing_swapped():
    """The usual case touches no private name: the same hook dicts inside the context as outside."""
    from torch.nn.modules import module as module_globals

    from laplace_from_scratch.functional import GLOBAL_BACKWARD_HOOKS, backward_hooks_off

    model = mlp(2, 1, width=3)

    def dicts():
        own = [d for m in model.modules() for d in (m._backward_hooks, m._backward_pre_hooks)]
        return [id(d) for d in own + [getattr(module_globals, n) for n in GLOBAL_BACKWARD_HOOKS]]

    before = dicts()
    with backward_hooks_off(model):
        assert dicts() == before
