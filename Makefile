# The two entry points of README.md: `make demo` (main job) and `make test` (test suite).
# Both create .venv with python3.11 on first use, install the CPU build of torch 2.13.0
# first (a bare `torch` requirement would pull a multi-GB CUDA build), then the project.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[dev,secure,cec]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/botorch-fed run fbo-fedgp --problem hartmann --dim 6 --clients 5 --rounds 15 --aggregator ckks

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check botorch_fed tests benchmarks

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
