# Two commands (see README): `make figures` and `make test`.
# Uses the active virtual environment if there is one, else creates .venv here.
SHELL := /bin/bash
PYTHON ?= python3
ifdef VIRTUAL_ENV
  PY := python
  ENV_DIR := $(VIRTUAL_ENV)
else ifdef CONDA_PREFIX
  PY := python
  ENV_DIR := $(CONDA_PREFIX)
else
  PY := .venv/bin/python
  ENV_DIR := .venv
endif
STAMP := $(ENV_DIR)/.repro-installed
# The notebooks run on a Jupyter kernel of their own, "repro" ("Python (repro)"), registered in the env.
KERNEL := $(ENV_DIR)/share/jupyter/kernels/repro/kernel.json
# Headless browser for tests/test_gallery.py (skipped without one, except under CI).
BROWSERS := chromium chromium-browser google-chrome google-chrome-stable
RESULTS ?= results
PYTEST_ARGS ?=

.PHONY: install test figures benchmark clean

install: $(STAMP) $(KERNEL)

$(STAMP): pyproject.toml constraints.txt
ifndef VIRTUAL_ENV
ifndef CONDA_PREFIX
	test -x .venv/bin/python || $(PYTHON) -m venv .venv
endif
endif
	$(PY) -m pip install --upgrade pip >/dev/null
	$(PY) -m pip install -c constraints.txt -e ".[notebooks,dev]"
	@# chromium for the gallery test: only when none is found, only as root with apt-get, never fatal
	@for b in $(BROWSERS); do command -v $$b >/dev/null 2>&1 && exit 0; done; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium (headless browser for tests/test_gallery.py) ..."; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  { apt-get install -y -qq chromium >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; }; } || \
	  echo "note: could not install chromium; tests/test_gallery.py's browser test will skip (fail under CI)"; \
	else \
	  echo "note: no chromium (as root: apt-get install chromium); tests/test_gallery.py's browser test will skip (fail under CI)"; \
	fi
	touch $(STAMP)

$(KERNEL): $(STAMP)
	$(PY) -m ipykernel install --sys-prefix --name repro --display-name "Python (repro)" >/dev/null
	@test -f $(KERNEL) || { echo "error: kernel spec not written at $(KERNEL)" >&2; exit 1; }

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

figures: install
	$(PY) -m repro.figures run --out $(RESULTS)

benchmark: install
	$(PY) benchmarks/bench_planners.py
	$(PY) benchmarks/bench_engine.py
	$(PY) benchmarks/bench_omgs.py
	$(PY) benchmarks/bench_sparse_exchange.py
	$(PY) benchmarks/bench_primitives.py
	$(PY) benchmarks/bench_dear.py
	$(PY) benchmarks/bench_ps.py

clean:
	rm -rf $(RESULTS) .pytest_cache
