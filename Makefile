# Two entry points for a fresh machine: `make demo` and `make test` (see README).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# Tests always see 8 emulated CPU devices so that sharding code paths run everywhere.
# The CLI's persistent compilation cache is off in tests (hermetic compile counts); tests/run/test_driver.py checks it.
TEST_ENV = XLA_FLAGS="--xla_force_host_platform_device_count=8 $(XLA_FLAGS)" JAX_PLATFORMS=$${JAX_PLATFORMS:-cpu} MPLBACKEND=Agg \
           IVHL_COMPILATION_CACHE=0

.PHONY: install demo test test-slow lint format bench clean docs docs-serve

$(BIN)/.installed: pyproject.toml
	@echo "installing ivhl_jax and its dependencies into $(VENV) (1-2 min on a fresh machine) ..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

install: $(BIN)/.installed

demo: install
	MPLBACKEND=Agg $(BIN)/ivhl demo

lint: install
	$(BIN)/ruff check ivhl_jax models sims bench tests
	$(BIN)/ruff format --check ivhl_jax models sims bench tests
	$(BIN)/mypy

# Applies the formatter (make lint checks it; .pre-commit-config.yaml runs both on every commit).
format: install
	$(BIN)/ruff format ivhl_jax models sims bench tests
	$(BIN)/ruff check --fix ivhl_jax models sims bench tests

# The suite runs as two pytest processes (the library-wide contracts and lower layers, then the families, runs and
# simulations): one process holding every compiled program of the whole suite has crashed inside XLA's CPU compiler
# (a segfault compiling a small program late in the run, not reproducible in a fresh process).
TESTS_A = tests/contracts tests/core tests/bench tests/models tests/nn tests/numerics
TESTS_B = tests/physics tests/run tests/sims tests/train bench/studies/tests

test: install lint
	$(TEST_ENV) $(BIN)/python -m pytest -m "not slow" -q --timeout=600 --durations=15 $(TESTS_A)
	$(TEST_ENV) $(BIN)/python -m pytest -m "not slow" -q --timeout=600 --durations=15 $(TESTS_B)

# The slow suite compiles far larger programs than the default one: a process that has run many of them has
# crashed inside XLA's CPU compiler (a segfault compiling a program that compiles in a fresh process), so each test
# file with slow tests runs in its own pytest process; every file runs, and the first failing status is returned.
SLOW = $(TEST_ENV) $(BIN)/python -m pytest -m "slow" -q --timeout=1800
test-slow: install
	@files=$$($(SLOW) --collect-only $(TESTS_A) $(TESTS_B) 2>/dev/null | grep '::' | cut -d: -f1 | sort -u); \
	[ -n "$$files" ] || { echo "no slow test collected (a collection error?)"; exit 1; }; \
	status=0; for f in $$files; do echo "== $$f"; $(SLOW) $$f || { rc=$$?; [ $$rc -ne 5 ] || echo "$$f: no slow test collected when the file runs alone"; \
	  [ $$status -ne 0 ] || status=$$rc; }; done; \
	exit $$status

bench: install
	$(BIN)/ivhl bench --size small --export bench/results/small.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

# Documentation site (mkdocs.yml, docs/): the API reference from the docstrings and the notebooks, executed.
$(BIN)/.docs-installed: $(BIN)/.installed pyproject.toml
	@echo "installing the docs tools (mkdocs, mkdocstrings, mkdocs-jupyter) into $(VENV) ..."
	$(BIN)/python -m pip install --quiet -e '.[dev,docs]'
	touch $@

# Material for MkDocs prints an end-of-life banner on every build unless told not to (the site is unaffected).
DOCS_ENV = NO_MKDOCS_2_WARNING=1 MPLBACKEND=Agg
docs: $(BIN)/.docs-installed
	$(DOCS_ENV) $(BIN)/mkdocs build --strict

docs-serve: $(BIN)/.docs-installed
	$(DOCS_ENV) $(BIN)/mkdocs serve
