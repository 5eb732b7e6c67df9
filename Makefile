# Every target sets itself up: the virtual environment is (re)built whenever
# pyproject.toml or this Makefile changes.
#
#   make book   execute changed notebooks, build the site, print the path of index.html
#   make test   everything CI checks: ruff, module tests, nbval, book build with -W
#   make lab    JupyterLab on notebooks/
#   make bench  the benchmarks in benchmarks/
#
# torch: TORCH is the requirement, TORCH_INDEX an optional package index for it.
#   CPU only, anywhere:  make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   CUDA (Linux):        make test TORCH=torch        (PyPI's Linux wheels are CUDA builds)

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=

PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: install test lint unit nbval book book-html lab bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple) "$(TORCH)"
	$(PIP) install --quiet -e ".[reference,dev]"
	$(PIP) install --quiet --no-deps $$($(PY) tools/extra.py laplace)
	$(PY) -c "import torch, laplace; print('torch', torch.__version__, '| laplace-torch OK | CUDA available:', torch.cuda.is_available())"
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check laplace_from_scratch tests tools benchmarks notebooks

unit: $(STAMP)
	$(VENV)/bin/pytest -q tests

nbval: $(STAMP)
	$(VENV)/bin/pytest -q --nbval notebooks --nbval-sanitize-with tools/nbval_sanitize.cfg -p no:randomly

book-html: $(STAMP)
	rm -rf book/_build
	$(VENV)/bin/jupyter-book build . --config book/_config.yml --toc book/_toc.yml --path-output book -W -n --keep-going

test: lint unit nbval book-html
	@echo "make test: all checks passed"

book: $(STAMP)
	$(PY) tools/run_notebooks.py notebooks
	$(VENV)/bin/jupyter-book build . --config book/_config.yml --toc book/_toc.yml --path-output book
	@echo "Book built: $(CURDIR)/book/_build/html/index.html"

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks

bench: $(STAMP)
	@for f in benchmarks/bench_*.py; do [ -e "$$f" ] || { echo "no benchmarks yet"; break; }; echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf book/_build .pytest_cache .ruff_cache
