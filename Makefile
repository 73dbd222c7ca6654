# fallgate: two commands from a fresh clone -> `make demo`, `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-test

.PHONY: demo test lint fuzz bench diagrams graphviz clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP) graphviz
	$(VENV)/bin/fallgate demo

# Graphviz's `dot` (SVG diagrams) is a Debian package: best effort, as Mermaid and DOT
# output need nothing; without it the demo writes Mermaid only and says so.
graphviz:
	@command -v dot >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
	  { SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
	    { $$SUDO apt-get install -y -q --no-install-recommends graphviz \
	      || { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q --no-install-recommends graphviz; }; \
	    } >/dev/null 2>&1 || echo "make: could not install Graphviz (SVG diagrams skipped): apt-get install graphviz"; }

lint: $(STAMP)
	$(VENV)/bin/ruff check fsm providers tests
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/pytest

# Long Hypothesis run of the property fuzzers (profile "fuzz" in tests/conftest.py).
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(VENV)/bin/pytest -o timeout=3600 tests/test_properties_stateful.py tests/test_checker_broken.py

# Benchmarks (docs/bench.md): peers (tenacity, LiteLLM) are bench-only extras.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench --out build/bench.json

# Regenerate diagrams/ (Mermaid, DOT; SVG when Graphviz `dot` is installed).
diagrams: $(STAMP) graphviz
	$(PY) -m providers.gallery diagrams

clean:
	rm -rf $(VENV) build .hypothesis
