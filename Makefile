# Two commands (see README): `make figures` and `make test`.
# Uses the active virtual environment if there is one, else creates .venv here.
SHELL := /bin/bash
PYTHON ?= python3
ifdef VIRTUAL_ENV
  PY := python
  STAMP := $(VIRTUAL_ENV)/.repro-installed
else ifdef CONDA_PREFIX
  PY := python
  STAMP := $(CONDA_PREFIX)/.repro-installed
else
  PY := .venv/bin/python
  STAMP := .venv/.repro-installed
endif
RESULTS ?= results
PYTEST_ARGS ?=

.PHONY: install test figures benchmark clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
ifndef VIRTUAL_ENV
ifndef CONDA_PREFIX
	test -x .venv/bin/python || $(PYTHON) -m venv .venv
endif
endif
	$(PY) -m pip install --upgrade pip >/dev/null
	$(PY) -m pip install -c constraints.txt -e ".[notebooks,dev]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

figures: install
	$(PY) -m repro.figures run --out $(RESULTS)

benchmark: install
	$(PY) benchmarks/bench_planners.py
	$(PY) benchmarks/bench_engine.py

clean:
	rm -rf $(RESULTS) .pytest_cache
