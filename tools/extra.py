"""Print one optional-dependency group of pyproject.toml, space separated.

The Makefile uses it to install the `laplace` group with ``--no-deps`` from the
single list in pyproject.toml.
"""

import sys
import tomllib
from pathlib import Path

pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
print(" ".join(pyproject["project"]["optional-dependencies"][sys.argv[1]]))
