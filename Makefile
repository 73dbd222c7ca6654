# fallgate: two commands from a fresh clone -> `make demo`, `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-test

.PHONY: demo test test-slow lint fuzz bench bench-hermes diagrams clean typecheck-tree test-openai2 \
	test-pythons test-embed test-hermes hermes-venv test-frameworks

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# Installs nothing outside .venv. SVG diagrams need Graphviz's `dot` (a system package);
# without it the demo writes Mermaid only and prints one line saying how to get SVGs.
demo: $(STAMP)
	$(VENV)/bin/fallgate demo

# mypy sees the installed names (fallgate.fsm, fallgate.providers) through links.
typecheck-tree:
	@mkdir -p build/typecheck/fallgate && cd build/typecheck/fallgate && \
	  for f in ../../../fallgate/*; do ln -sfn "$$f" .; done && \
	  ln -sfn ../../../fsm fsm && ln -sfn ../../../providers providers

lint: $(STAMP) typecheck-tree
	$(VENV)/bin/ruff check fsm providers fallgate tests bench examples
	$(VENV)/bin/mypy

# The default run (under 10 minutes); `make test-slow` runs the rest (the whole checker
# grid, load, multi-process and benchmark tests): CI runs both.
test: lint
	$(VENV)/bin/pytest -m "not slow"

test-slow: $(STAMP)
	$(VENV)/bin/pytest -m slow

# openai 2.x (built on httpx) next to .venv's newest openai 3.x (httpx2): mypy, and the
# adapter, end-to-end and fault-server tests, with the openai hermes-agent pins (our floor).
OPENAI2 ?= 2.24.0
OPENAI2_VENV := .venv-openai2
OPENAI2_STAMP := $(OPENAI2_VENV)/.installed-openai-$(OPENAI2)
PROVIDER_TESTS := tests/test_providers_*.py tests/test_e2e_*.py tests/test_fault_server*.py tests/test_demo.py \
	tests/test_embedded_client.py tests/test_embedded_bounds.py tests/test_stream_helpers.py \
	tests/test_caller_mistakes.py tests/test_otel.py tests/test_no_key_echoed_by_replies.py

$(OPENAI2_STAMP): pyproject.toml
	rm -f $(OPENAI2_VENV)/.installed-openai-*
	$(PYTHON) -m venv $(OPENAI2_VENV)
	$(OPENAI2_VENV)/bin/python -m pip install -q --upgrade pip
	$(OPENAI2_VENV)/bin/python -m pip install -q -e '.[test]' 'openai==$(OPENAI2)'
	touch $@

test-openai2: $(OPENAI2_STAMP) typecheck-tree
	$(OPENAI2_VENV)/bin/mypy --cache-dir $(OPENAI2_VENV)/.mypy_cache
	$(OPENAI2_VENV)/bin/pytest $(PROVIDER_TESTS)

# fallgate inside the real hermes-agent (tests/hermes/check_hermes.py): a venv of its own
# with hermes-agent (which pins openai 2.24.0) and fallgate's wheel. The venv is cached by
# its stamp; fallgate's wheel is rebuilt and reinstalled on every run. Where PyPI cannot
# be reached the target says so and skips; any other install failure fails.
HERMES_VERSION ?= 0.19.0
HERMES_VENV := build/hermes-venv
HERMES_STAMP := $(HERMES_VENV)/.installed-hermes-$(HERMES_VERSION)
HERMES_PY := $(HERMES_VENV)/bin/python

$(HERMES_STAMP): pyproject.toml
	rm -rf $(HERMES_VENV) build/hermes-wheel
	$(PYTHON) -m venv $(HERMES_VENV)
	$(HERMES_PY) -m pip install -q --upgrade pip
	$(HERMES_PY) -m pip wheel -q --no-deps -w build/hermes-wheel .
	$(HERMES_PY) -m pip install -q 'hermes-agent==$(HERMES_VERSION)' build/hermes-wheel/fallgate-*.whl
	touch $@

hermes-venv:
	@$(MAKE) --no-print-directory $(HERMES_STAMP) || { \
	  if $(PYTHON) -m pip index versions hermes-agent >/dev/null 2>&1; then \
	    echo "make: installing hermes-agent==$(HERMES_VERSION) failed (PyPI answers)" >&2; exit 1; \
	  else echo "make: SKIPPED test-hermes: PyPI cannot be reached to install hermes-agent"; \
	    rm -rf $(HERMES_VENV); exit 0; fi; }
	@if [ -f $(HERMES_STAMP) ]; then \
	  rm -rf build/hermes-wheel && $(HERMES_PY) -m pip wheel -q --no-deps -w build/hermes-wheel . \
	  && $(HERMES_PY) -m pip install -q --no-deps --force-reinstall build/hermes-wheel/fallgate-*.whl; fi

# -P: the repository's folders (providers/, ...) must not shadow hermes' top-level packages.
test-hermes: hermes-venv
	@if [ -f $(HERMES_STAMP) ]; then $(HERMES_PY) -P tests/hermes/check_hermes.py; fi

# Agent frameworks from PyPI over fallgate.http_client, one venv each (build/frameworks/NAME:
# the pinned framework, the openai it resolves, fallgate's wheel), each checked against the
# fault server by tests/frameworks/check_NAME.py (docs/frameworks.md). Where PyPI cannot be
# reached the target says so and skips; any other install failure fails.
FRAMEWORKS := agents pydantic_ai langchain instructor llama_index
FW_SPEC_agents := openai-agents==0.24.0
FW_SPEC_pydantic_ai := pydantic-ai-slim[openai]==2.68.0
FW_SPEC_langchain := langchain-openai==1.7.4
FW_SPEC_instructor := instructor==1.17.0
FW_SPEC_llama_index := llama-index-llms-openai==0.8.3
FW_WHEEL := build/fw-wheel

build/frameworks/%/.installed: pyproject.toml
	rm -rf build/frameworks/$*
	$(PYTHON) -m venv build/frameworks/$*
	build/frameworks/$*/bin/python -m pip install -q '$(FW_SPEC_$*)' $(FW_WHEEL)/fallgate-*.whl
	touch $@

test-frameworks:
	@if ! $(PYTHON) -m pip index versions openai-agents >/dev/null 2>&1; then \
	  echo "make: SKIPPED test-frameworks: PyPI cannot be reached to install the frameworks"; \
	  exit 0; fi; \
	rm -rf $(FW_WHEEL) && $(PYTHON) -m pip wheel -q --no-deps -w $(FW_WHEEL) . || exit 1; \
	failed=0; for fw in $(FRAMEWORKS); do \
	  $(MAKE) --no-print-directory build/frameworks/$$fw/.installed || exit 1; \
	  build/frameworks/$$fw/bin/python -m pip install -q --no-deps --force-reinstall \
	    $(FW_WHEEL)/fallgate-*.whl || exit 1; \
	  build/frameworks/$$fw/bin/python -P tests/frameworks/check_$$fw.py || failed=1; \
	done; exit $$failed

# The core tests on the other supported Pythons, one venv each (.venv-py312, .venv-py313).
# An interpreter is pythonX.Y on PATH, else pyenv's (its shims run only active versions).
PY_VENVS := .venv-py312 .venv-py313
CORE_TESTS := tests/test_core_*.py tests/test_machine_meaning.py
FIND_PYTHON = if python$(1) -c '' 2>/dev/null; then echo python$(1); \
	else v=$$(pyenv whence python$(1) 2>/dev/null | tail -n 1) && [ -n "$$v" ] \
	&& PYENV_VERSION=$$v pyenv which python$(1); fi

.venv-py%/.installed-test: pyproject.toml
	@py=$$($(call FIND_PYTHON,3.$(patsubst 3%,%,$*))) && [ -n "$$py" ] \
	  || { echo "make: python3.$(patsubst 3%,%,$*) not found (on PATH or in pyenv)" >&2; exit 1; }; \
	  echo "$$py -m venv .venv-py$*"; $$py -m venv .venv-py$*
	.venv-py$*/bin/python -m pip install -q --upgrade pip
	.venv-py$*/bin/python -m pip install -q -e '.[test]'
	touch $@

test-pythons: $(PY_VENVS:%=%/.installed-test)
	set -e; for v in $(PY_VENVS); do $$v/bin/python --version; $$v/bin/pytest -q $(CORE_TESTS); done

# The installed wheel beside a host application's own top-level `fsm` and `providers`
# packages, on openai 2.24.0 and the newest 3.x ("3": >=3,<4), each in a fresh venv
# build/embed-VERSION. The wheel is built from a clean setuptools build dir (a stale
# build/lib would leak dropped packages into it), its files are checked against the
# checkout's packages, then tests/embed/check_embed.py runs in each venv.
EMBED_OPENAIS ?= 2.24.0 3

test-embed: $(STAMP)
	rm -rf build/wheel build/lib build/bdist.* fallgate.egg-info
	$(PY) -m pip wheel -q --no-deps -w build/wheel .
	$(PY) tests/embed/wheel_check.py build/wheel/fallgate-*.whl
	set -e; host=$$(mktemp -d); trap 'rm -rf "$$host"' EXIT; \
	  $(PY) tests/embed/host_dist.py "$$host/src" >/dev/null; \
	  $(PY) -m pip wheel -q --no-deps -w "$$host/wheel" "$$host/src"; \
	  for v in $(EMBED_OPENAIS); do \
	    case $$v in *.*) spec="openai==$$v";; *) spec="openai>=$$v,<$$((v + 1))";; esac; \
	    venv=build/embed-$$v; echo "== $$venv: fallgate wheel + host packages + $$spec"; \
	    rm -rf $$venv; $(PYTHON) -m venv $$venv; \
	    $$venv/bin/python -m pip install -q build/wheel/fallgate-*.whl "$$host"/wheel/*.whl "$$spec"; \
	    env -u PYTHONPATH $$venv/bin/python tests/embed/check_embed.py; \
	  done

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

# hermes-agent alone and with fallgate attached, on the faults table's scenarios.
bench-hermes: $(STAMP) hermes-venv
	$(PY) -m bench --only hermes --out build/bench-hermes.json

# Regenerate diagrams/ (Mermaid, DOT; SVG when Graphviz `dot` is installed).
diagrams: $(STAMP)
	$(PY) -m fallgate.providers.cli.gallery diagrams

clean:
	rm -rf $(VENV) $(OPENAI2_VENV) $(PY_VENVS) build .hypothesis
