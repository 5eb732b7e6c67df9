"""tools/nbval_cpu.py: on a CPU vendor other than the one that computed a notebook's outputs, nbval
compares them with the numbers masked; the masking hides digits and nothing else."""

import re
import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import nbval_cpu  # noqa: E402


def mask(s: str) -> str:
    for regex, replace in nbval_cpu.MASK.items():  # in order, as nbval applies them
        s = re.sub(regex, replace, s)
    return s


def test_masking_hides_digits_bounds_and_missing_numbers():
    amd = "gap 2.7e-03 (tol 1e-2); <1e-12 | –   | 10⁻⁹, 1 of 17 rows\n  slower: 0.87–7.8×"
    xeon = "gap 7.6e-03 (tol 1e-2); 4e-13  | 0.5 | 10⁻⁸, 2 of 17 rows slower: 0.9–8.1×"
    assert mask(amd) == mask(xeon)


def test_masking_keeps_words_and_structure():
    for a, b in [
        ("ours is slower in # rows", "ours is faster in # rows"),
        ("assert passed: True", "assert passed: False"),
        ("3 rows:\n a 1\n b 2", "3 rows:\n a 1"),
        ("x = 1.0", "x = nan"),
    ]:
        assert mask(a) != mask(b), (a, b)


def test_the_committed_notebooks_name_their_vendor(tmp_path):
    notebooks = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
    assert notebooks
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        assert nbval_cpu.recorded_vendor(nb), f"{path.name}: no laplace_from_scratch.cpu in its metadata"
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "x.ipynb")
    never_run = nbformat.read(tmp_path / "x.ipynb", as_version=4)
    assert nbval_cpu.recorded_vendor(never_run) is None  # masked everywhere
    assert nbval_cpu.cpu_vendor()
