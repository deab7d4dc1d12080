# Two commands (see README): `make figures` and `make test`.
# Test tiers (markers in pyproject.toml): `make test` runs everything; `make test-fast` only the unit tier
# (no slow, distributed, notebook, netns or gpu test; under 2 minutes). `make install-browser` installs
# chromium (a system package, so only on request; CI asks) for tests/test_gallery.py's browser test.
# `make docs` builds the documentation site (mkdocs, strict) into build/site/ (mkdocs.yml's site_dir).
# CPU-only machines: `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu` installs torch and
# torchvision from that index first (the CPU wheels, ~1 GB less than the CUDA build PyPI serves on Linux).
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
# Headless browser for tests/test_gallery.py (skipped without one, except under CI): `make install-browser`.
BROWSERS := chromium chromium-browser google-chrome google-chrome-stable
RESULTS ?= results
PYTEST_ARGS ?=
# An index to install torch and torchvision from before the rest (same pins, constraints.txt); empty: PyPI's
# default build (CUDA on Linux). E.g. https://download.pytorch.org/whl/cpu for a machine without a GPU.
TORCH_INDEX ?=
# The unit tier: what needs no extra processes, notebooks, root network namespaces or GPU, and is quick;
# plus the few-second distributed samples of larger matrices (marker `sample`, e.g. DDP conformance).
FAST_MARKERS := not (slow or notebook or netns or gpu) and (not distributed or sample)
# pytest-xdist workers for the unit tier (its tests start no processes of their own, so they run side by side)
FAST_WORKERS ?= 2
# ... and for the rest of `make test` but its serial tests (ranks are 1 thread each: 2 workers on 2 cores)
TEST_WORKERS ?= 2

.PHONY: install install-browser test test-fast docs figures benchmark clean

install: $(STAMP) $(KERNEL)

$(STAMP): pyproject.toml constraints.txt Makefile
ifndef VIRTUAL_ENV
ifndef CONDA_PREFIX
	test -x .venv/bin/python || $(PYTHON) -m venv .venv
endif
endif
	$(PY) -m pip install --upgrade pip >/dev/null
ifneq ($(strip $(TORCH_INDEX)),)
	$(PY) -m pip install -c constraints.txt --index-url $(TORCH_INDEX) torch torchvision
endif
	$(PY) -m pip install -c constraints.txt -e ".[notebooks,dev,docs]"
	touch $(STAMP)

# chromium for the gallery test: only when none is found, only as root with apt-get, never fatal
install-browser:
	@for b in $(BROWSERS); do command -v $$b >/dev/null 2>&1 && { echo "headless browser: $$b"; exit 0; }; done; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium (headless browser for tests/test_gallery.py) ..."; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  { apt-get install -y -qq chromium >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; }; } || \
	  echo "note: could not install chromium; tests/test_gallery.py's browser test will skip (fail under CI)"; \
	else \
	  echo "note: no chromium (as root: apt-get install chromium); tests/test_gallery.py's browser test will skip (fail under CI)"; \
	fi

$(KERNEL): $(STAMP)
	$(PY) -m ipykernel install --sys-prefix --name repro --display-name "Python (repro)" >/dev/null
	@test -f $(KERNEL) || { echo "error: kernel spec not written at $(KERNEL)" >&2; exit 1; }

# Everything: the tests that may share the machine side by side (pytest-xdist, a file per worker, so a
# file's launched ranks start once), then the serial ones (wall-clock timing, network namespaces) alone.
test: install
	$(PY) -m pytest -m "not serial" -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)
	$(PY) -m pytest -m serial $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "$(FAST_MARKERS)" -n $(FAST_WORKERS) $(PYTEST_ARGS)

docs: install
	$(PY) -m mkdocs build --strict

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
	rm -rf $(RESULTS) .pytest_cache build/site
