# Two entry points: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck docs pytest bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("agentsnap needs Python 3.11 or newer, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/agentsnap demo

test: $(STAMP) lint typecheck docs pytest

lint: $(STAMP)
	$(BIN)/ruff check agentsnap tests examples benchmarks migrations
	$(BIN)/ruff format --check agentsnap tests examples benchmarks migrations

# The package, tests, examples, scripts and migrations as pyproject.toml lists them; then the
# benchmarks on their own, since their `tools.py` and the tests' `tools` package share a name.
typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy benchmarks

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

pytest: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/bus.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis dist build site
