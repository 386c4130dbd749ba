# The two entry points of README.md: `make demo` (main job) and `make test` (test suite).
# Both create .venv with python3.11 on first use, install the CPU build of torch 2.13.0
# first (a bare `torch` requirement would pull a multi-GB CUDA build), then the project.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean test-matrix

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[dev,secure,cec,flower]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/botorch-fed run fbo-fedgp --problem hartmann --dim 6 --clients 5 --rounds 15 --aggregator ckks

test: $(STAMP)
	$(BIN)/python -m pytest -q

# By hand, not in CI: the suite (as `make test`) under each MKL code path with 1 and 2
# threads; one line per run, logs in build/test-matrix/, fails if any run failed.
# About 80 s a run on 2 cores. MKL_ENABLE_INSTRUCTIONS caps the ISA MKL dispatches to,
# on Intel CPUs. On non-Intel ones MKL takes its generic path whatever it says: checked
# on an AMD EPYC (AVX-512) machine, MKL_VERBOSE=1 named "Intel(R) Architecture
# processors" under all three and float32 GEMM / Cholesky / TRSM results were bit for
# bit the same (only the thread count changed them). MKL_CBWR=COMPATIBLE (MKL's SSE2
# path) changes the results on any CPU, so it runs too. Each line ends with
# tests/mkl_probe.py's report: MKL's processor class and a fingerprint of its results
# (runs with equal fingerprints went through the same kernels).
MATRIX_ENVS ?= MKL_ENABLE_INSTRUCTIONS=SSE4_2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
	MKL_ENABLE_INSTRUCTIONS=AVX512 MKL_CBWR=COMPATIBLE
MATRIX_THREADS ?= 1 2

test-matrix: $(STAMP)
	@mkdir -p build/test-matrix; failed=0; \
	for e in $(MATRIX_ENVS); do for t in $(MATRIX_THREADS); do \
	  log=build/test-matrix/$$e-threads$$t.log; \
	  run="env $$e OMP_NUM_THREADS=$$t MKL_NUM_THREADS=$$t"; \
	  if $$run $(BIN)/python -m pytest -q > $$log 2>&1; then r=passed; else r=FAILED; failed=1; fi; \
	  echo "test-matrix $$e threads=$$t: $$r: $$(tail -n 1 $$log) [$$($$run $(BIN)/python tests/mkl_probe.py)]"; \
	done; done; \
	exit $$failed

lint: $(STAMP)
	$(BIN)/ruff check botorch_fed tests benchmarks

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
