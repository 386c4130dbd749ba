# The two entry points of README.md: `make demo` (main job) and `make test` (test suite).
# Both create .venv with python3.11 on first use, install the CPU build of torch 2.13.0
# first (a bare `torch` requirement would pull a multi-GB CUDA build), then the project.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test docs lint clean test-matrix

# Bytecode caching stays on for what make runs, whatever the environment says: the suite
# starts dozens of Python processes (xdist workers, CLI runs, Flower's processes, notebook
# kernels) that would otherwise each compile botorch_fed and the tests from source.
unexport PYTHONDONTWRITEBYTECODE

# pip installs without byte-compiling every module of every wheel (torch alone: ~17 CPU
# s); importing every botorch_fed module, and the libraries it imports only when asked
# (LAZY: plots, CKKS, the HPO tasks' models), then compiles what the package uses. Other
# modules compile on first import under make (and are recompiled on each import where
# PYTHONDONTWRITEBYTECODE is set outside it).
LAZY := matplotlib.pyplot tenseal sklearn.ensemble sklearn.neural_network sklearn.pipeline \
	sklearn.preprocessing sklearn.datasets sklearn.metrics tomli_w
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-compile -e ".[dev,secure,cec,flower,docs,console]"
	$(BIN)/python -c "import importlib, importlib.util, pkgutil, sys, botorch_fed; \
	  [importlib.import_module(m.name) for m in pkgutil.walk_packages(botorch_fed.__path__, \
	  'botorch_fed.') if not m.name.endswith('__main__')]; \
	  [importlib.import_module(n) for n in sys.argv[1:] \
	  if importlib.util.find_spec(n.split('.')[0]) is not None]" $(LAZY)
	touch $(STAMP)

# FBO-FedGP against independent BO on the same federation and 6 seeds (about a minute on
# 2 cores); a fresh comparison each time (compare would reuse the runs of build/demo)
demo: $(STAMP)
	rm -rf build/demo
	$(BIN)/botorch-fed compare fbo-fedgp local --problem hartmann --dim 6 --clients 5 \
		--rounds 15 --aggregator ckks --seeds 6 --jobs 2 --out build/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The documentation site into docs/_build/html (warnings are errors; the tutorials are
# executed in smoke mode: a few minutes on 2 cores)
docs: $(STAMP)
	$(BIN)/python -m sphinx -E -W --keep-going -j auto -b html docs docs/_build/html

# By hand, not in CI: the suite under every setting that changes how linear algebra
# rounds, one setting changed at a time from `make test`'s (each entry: variables joined
# by commas). One line per run, logs in build/test-matrix/; fails if any run failed.
# - MKL_CBWR=COMPATIBLE|AVX2|AVX512: MKL's conditional numerical reproducibility branches
#   (COMPATIBLE is MKL's SSE2 path; a branch the CPU lacks falls back);
# - MKL_ENABLE_INSTRUCTIONS=SSE4_2|AVX2: caps the ISA MKL dispatches to, on Intel CPUs
#   only (on AMD, MKL takes its generic path whatever it says);
# - BOTORCH_FED_TEST_THREADS=1|2|4: torch threads per worker (tests/conftest.py; default
#   cores / workers), which changes the blocking of Cholesky, TRSM and long sums;
# - BOTORCH_FED_TEST_MKLDNN=0: torch.backends.mkldnn off.
# Each line ends with tests/mkl_probe.py's report: the settings, MKL's processor class and
# which operations round differently under them than under `make test`'s own settings
# (probed first: the baseline). benchmarks/results/test_matrix.md records a run and which
# settings changed results. Left out, as they compare nothing computed two ways: the
# Flower loopback (processes), the packaging check (network) and the notebooks.
MATRIX ?= BOTORCH_FED_TEST_THREADS=1 BOTORCH_FED_TEST_THREADS=2 BOTORCH_FED_TEST_THREADS=4 \
	MKL_CBWR=COMPATIBLE MKL_CBWR=AVX2 MKL_CBWR=AVX512 \
	MKL_ENABLE_INSTRUCTIONS=SSE4_2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
	BOTORCH_FED_TEST_MKLDNN=0
MATRIX_PYTEST_ARGS ?= -m "not flower" --ignore=tests/test_packaging.py \
	--ignore=tests/test_tutorials.py

test-matrix: $(STAMP)
	@rm -rf build/test-matrix; mkdir -p build/test-matrix; failed=0; \
	echo "make test's settings: $$($(BIN)/python tests/mkl_probe.py --baseline build/test-matrix/baseline.json)"; \
	for e in $(MATRIX); do \
	  log=build/test-matrix/$$e.log; vars=$$(echo $$e | tr , ' '); \
	  if env $$vars $(BIN)/python -m pytest -q $(MATRIX_PYTEST_ARGS) > $$log 2>&1; \
	  then r=passed; else r=FAILED; failed=1; fi; \
	  probe=$$(env $$vars $(BIN)/python tests/mkl_probe.py --baseline build/test-matrix/baseline.json); \
	  echo "test-matrix $$e: $$r: $$(tail -n 1 $$log) [$$probe]"; \
	done; \
	exit $$failed

lint: $(STAMP)
	$(BIN)/ruff check botorch_fed tests benchmarks

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache docs/_build docs/generated
