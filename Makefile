# Every target sets itself up: the virtual environment is (re)built whenever
# pyproject.toml or this Makefile changes.
#
#   make book   execute changed notebooks, build the site, print the path of index.html
#   make test   everything CI checks: ruff, module tests, nbval, book build with -W, site check, lab check
#   make site-check  every page of the built site in headless Chromium (after book-html)
#   make lab-check   every notebook opened in this environment's JupyterLab in headless Chromium
#   make lab    JupyterLab in the repository, opened at notebook 01 (links to book/ pages work)
#   make bench  the benchmarks in benchmarks/
#   make bench-gpu  ours vs laplace-torch at scale on a CUDA GPU (install with TORCH=torch for a CUDA build)
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
# pip byte-compiles one file at a time; compileall after the install does the same files on every
# core (a fresh install here: 117 s instead of 155 s; 138-143 s in the CI runs after). They must be
# compiled at install: where PYTHONDONTWRITEBYTECODE is set, as in CI, nothing compiled later is
# kept, and every process would compile what it imports again. Like pip, it passes over files that
# do not compile.
PIP_INSTALL := $(PIP) install --quiet --no-compile
STAMP := $(VENV)/.installed
export PYDEVD_DISABLE_FILE_VALIDATION := 1
# Notebook outputs are committed and nbval compares them digit for digit, so every machine must compute the
# same bits: pin torch's own vector kernels and oneDNN's (convolutions) to AVX2, which every x86-64 machine
# we run on has (on an AVX-512 CPU the default kernels round differently, and a float32 training run
# amplifies that into the printed digits), and pin the thread count. OMP_WAIT_POLICY=PASSIVE: a thread
# waiting at the end of a parallel region sleeps instead of spinning; it changes no result, and two
# notebooks at once (make nbval) no longer stall each other (with spinning, 05 took 16 min instead of 80 s).
NB_ENV := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE

.PHONY: install test lint unit nbval book book-html site-check lab-check lab bench bench-gpu clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple) "$(TORCH)"
	$(PIP_INSTALL) -e ".[reference,dev]"
	$(PIP_INSTALL) --no-deps $$($(PY) tools/extra.py laplace)
	$(PY) -m compileall -q -j 0 $$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") > /dev/null || true
	$(PY) -c "import torch, laplace; print('torch', torch.__version__, '| laplace-torch OK | CUDA available:', torch.cuda.is_available())"
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check laplace_from_scratch tests tools benchmarks notebooks book/_ext
	$(VENV)/bin/lint-imports --no-cache --no-logo

# The module's tests on both cores at once (pytest-xdist), one thread each: most of them are
# small and bound by Python, so two processes finish in about half the time of one.
unit: $(STAMP)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VENV)/bin/pytest -q -rs -n 2 tests

# Digits are compared on the CPU vendor that computed the committed outputs; on another vendor (MKL
# rounds differently there) tools/nbval_cpu.py masks the numbers and compares the rest. Two notebooks
# run at once, each on its own worker (-n 2 --dist loadfile), each kernel with the threads NB_ENV pins;
# tools/nbval_kernels.py starts one kernel at a time, so that two never take the same port.
nbval: $(STAMP)
	$(NB_ENV) $(PY) -m pytest -q --nbval notebooks -n 2 --dist loadfile --nbval-sanitize-with tools/nbval_sanitize.cfg -p tools.nbval_cpu -p tools.nbval_kernels -p no:randomly

book-html: $(STAMP)
	rm -rf book/_build
	$(VENV)/bin/jupyter-book build . --config book/_config.yml --toc book/_toc.yml --path-output book -W -n --keep-going

# Every page of the built site in headless Chromium (tools/site_check.py): console errors, failed or
# off-machine requests, raw TeX, broken links, code or tables wider than the column; screenshots in
# book/_build/site-check/. Without Chromium it says SKIPPED, unless SITE_CHECK_REQUIRED=1 (CI).
site-check: $(STAMP)
	$(PY) tools/site_check.py book/_build/html --shots book/_build/site-check $(if $(SITE_CHECK_REQUIRED),--require-browser)

# Every notebook in this environment's JupyterLab (tools/lab_check.py), windowing off, in headless Chromium:
# raw MyST roles, unrendered markdown cells, quoted values missing from the prose, raw TeX, console errors,
# requests off the machine; screenshots in book/_build/lab-check/. Same browser rule as the site check.
lab-check: $(STAMP)
	$(PY) tools/lab_check.py notebooks --shots book/_build/lab-check $(if $(SITE_CHECK_REQUIRED),--require-browser)

# The two browser checks run side by side: each spends about half its time waiting on
# Chromium, so together they take about 0.8 of their sum.
test: lint unit nbval book-html
	$(MAKE) --no-print-directory --output-sync=target -j2 site-check lab-check
	@echo "make test: all checks passed"

book: $(STAMP)
	$(NB_ENV) $(PY) tools/run_notebooks.py notebooks
	$(VENV)/bin/jupyter-book build . --config book/_config.yml --toc book/_toc.yml --path-output book
	@echo "Book built: $(CURDIR)/book/_build/html/index.html"

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/01_map_training.ipynb

bench: $(STAMP)
	@for f in benchmarks/bench_*.py; do [ -e "$$f" ] || { echo "no benchmarks yet"; break; }; echo "== $$f"; $(PY) $$f || exit 1; done

# The GPU comparison (benchmarks/scale.py --preset gpu): every structure and every laplace-torch backend on
# MNIST-5k, P from 1e4 to 1e7; out-of-memory and errors are recorded as results. Writes
# results/scale_<date>_cuda-<gpu>.{json,md,png}. The same command at CPU size is tests/test_scale_command.py.
# Then full Laplace up to the card's limit (P = 135,160 at width 170: one float32 P×P buffer is 73 GB),
# ours with two buffers and with one against laplace-torch: results/bench_full_memory_<date>_cuda.json.
bench-gpu: $(STAMP)
	$(PY) -c "import torch, sys; torch.cuda.is_available() or sys.exit('make bench-gpu needs a CUDA build of torch and a GPU: make bench-gpu TORCH=torch')"
	$(PY) benchmarks/scale.py --preset gpu
	$(PY) benchmarks/bench_full_memory.py --device cuda --widths 14 56 96 128 170

clean:
	rm -rf book/_build .pytest_cache .ruff_cache
