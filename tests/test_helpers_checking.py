"""helpers.checking: the notebooks' compare (printed and asserted) and brief."""

import pytest
import torch

import laplace_from_scratch as lfs
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
