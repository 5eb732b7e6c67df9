"""helpers.checking: the notebooks' compare (printed and asserted), brief, and keep_yours."""

import pytest
import torch

import laplace_from_scratch as lfs
from laplace_from_scratch import helpers
from laplace_from_scratch.helpers.checking import brief, compare


def test_compare_prints_the_relative_difference_and_asserts_it(capsys):
    ref = torch.tensor([1.0, -4.0], dtype=torch.float64)
    d = compare("x", ref + torch.tensor([0.0, 4e-13]), ref)
    assert d == pytest.approx(1e-13, rel=1e-3)
    assert capsys.readouterr().out == "x: max |difference| / max |value| = 1.0e-13 (tolerance 1e-12)\n"
    with pytest.raises(AssertionError):
        compare("x", ref + 1e-3, ref, tol=1e-6)
    assert compare("numbers", 2.0, 2.0) == 0.0


def test_brief_prints_signature_and_first_paragraph(capsys):
    brief(lfs.posterior_precision)
    first, second = capsys.readouterr().out.splitlines()[:2]
    assert first.startswith("lfs.posterior.posterior_precision(") and ":" not in first
    assert second.startswith("    ") and len(second) <= 88


# keep_yours: a folded solution stands in for the reader's function only while the
# reader's is still a stub


def stub_with_docstring(x):
    """Twice x."""
    ...


def stub_with_pass(x):
    pass


def stub_docstring_only(x, y=1):
    """Nothing yet."""


def written(x):
    """Twice x."""
    return 2 * x


def returns_none_explicitly(x):
    print(x)
    return None


def test_is_stub_tells_an_empty_body_from_a_written_one():
    for fn in (stub_with_docstring, stub_with_pass, stub_docstring_only):
        assert helpers.is_stub(fn), fn.__name__
    for fn in (written, returns_none_explicitly, lambda x: x):
        assert not helpers.is_stub(fn), fn.__name__


def test_keep_yours_uses_the_solution_until_yours_is_written():
    @helpers.keep_yours(stub_with_docstring)
    def twice(x):
        return x + x

    assert twice(3) == 6 and twice.__name__ == "twice"  # the solution stood in

    @helpers.keep_yours(written)
    def twice_again(x):
        return x + x

    assert twice_again is written  # the reader's own version is kept


def test_a_class_is_a_stub_until_one_of_its_methods_is_written():
    class Stub:
        """A stub class."""

        def __init__(self, x):
            """Keep x."""

        def twice(self):
            """Twice x."""
            ...

    class Written(Stub):
        def twice(self):
            return 2

    assert helpers.is_stub(Stub) and not helpers.is_stub(Written)
    assert helpers.keep_yours(Written)(Stub) is Written
