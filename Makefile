# Two entry points: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# One stamp per set of packages: `make test` after `make demo` still installs the dev extra.
DEMO_STAMP := $(VENV)/.installed-demo
DEV_STAMP  := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck docs pytest bench langgraph-suite clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit("agentsnap needs Python 3.11 or newer, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The demo needs the core; the inspector it suggests next (`agentsnap ui`) needs the ui extra.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[ui]'
	touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(DEMO_STAMP)
	$(BIN)/agentsnap demo

test: $(DEV_STAMP) lint typecheck docs pytest

lint: $(DEV_STAMP)
	$(BIN)/ruff check agentsnap tests examples benchmarks migrations
	$(BIN)/ruff format --check agentsnap tests examples benchmarks migrations

# The package, tests, examples, scripts and migrations as pyproject.toml lists them; then the
# benchmarks on their own, since their `tools.py` and the tests' `tools` package share a name.
typecheck: $(DEV_STAMP)
	$(BIN)/mypy
	$(BIN)/mypy benchmarks

docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

pytest: $(DEV_STAMP)
	$(BIN)/python -m pytest

bench: $(DEV_STAMP)
	$(BIN)/python benchmarks/bus.py

# LangGraph's own graph tests, every case on AgentsnapSaver (`make test` runs a sample).
langgraph-suite: $(DEV_STAMP)
	$(BIN)/python scripts/langgraph_suite.py --full

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis dist build site
