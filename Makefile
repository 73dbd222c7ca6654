# fallgate: two commands from a fresh clone -> `make demo`, `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-test

.PHONY: demo test lint fuzz bench diagrams clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fallgate demo

lint: $(STAMP)
	$(VENV)/bin/ruff check fsm providers tests
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/pytest

# Long Hypothesis run of the property fuzzers (profile "fuzz" in tests/conftest.py).
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(VENV)/bin/pytest -o timeout=3600 tests/test_properties_stateful.py tests/test_checker_broken.py

# Benchmarks (SPEC section 8): peers (tenacity, LiteLLM) are bench-only extras.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench --out build/bench.json

# Regenerate diagrams/ (Mermaid, DOT; SVG when Graphviz `dot` is installed).
diagrams: $(STAMP)
	$(PY) -m providers.gallery diagrams

clean:
	rm -rf $(VENV) build .hypothesis
