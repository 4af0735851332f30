# The single entry point. `make demo` and `make test` create the virtualenv themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.keel-installed

.PHONY: demo test lint typecheck unit pg-status bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/keel demo

test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check keel examples tests bench
	$(BIN)/ruff format --check keel examples tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf .keel .pytest_cache .mypy_cache .ruff_cache
