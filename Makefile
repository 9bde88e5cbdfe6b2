# The two set-up commands of README.md. Each bootstraps .venv from this project's own files.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The tests' oracles that cannot live in the venv's site-packages: one requirements file each
# in oracles/, installed with --no-deps into <venv>/oracles/<its name> (each file says why).
ORACLES := $(wildcard oracles/*.txt)
# A second venv with the lowest versions pyproject.toml allows, for `make test-lowest`.
LOWEST ?= .venv-lowest
LOWEST_STAMP := $(LOWEST)/.installed

.PHONY: demo test test-lowest lint clean

$(STAMP): pyproject.toml Makefile $(ORACLES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	for f in $(ORACLES); do \
		$(BIN)/python -m pip install -q --upgrade --no-deps \
			--target $(VENV)/oracles/$$(basename $$f .txt) -r $$f || exit 1; \
	done
	touch $(STAMP)

# uv (a dev dependency) resolves pyproject.toml's direct dependencies to their lowest allowed
# versions (the others to their highest), and installs the same oracles; built anew each time
# pyproject.toml changes, so no version of an earlier resolution stays behind. Then each bound
# must be the version installed: one that another package lifted was never tested.
$(LOWEST_STAMP): $(STAMP) pyproject.toml Makefile $(ORACLES)
	rm -rf $(LOWEST)
	$(BIN)/uv venv -q --python $(PYTHON) $(LOWEST)
	$(BIN)/uv pip install -q --python $(LOWEST)/bin/python --resolution lowest-direct -e '.[dev]'
	for f in $(ORACLES); do \
		$(BIN)/uv pip install -q --python $(LOWEST)/bin/python --no-deps \
			--target $(LOWEST)/oracles/$$(basename $$f .txt) -r $$f || exit 1; \
	done
	$(LOWEST)/bin/python scripts/lowest_bounds.py
	touch $(LOWEST_STAMP)

demo: $(STAMP)
	$(BIN)/regen demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto

test-lowest: $(LOWEST_STAMP)
	$(LOWEST)/bin/python -m pytest -q -n auto

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts bench
	$(BIN)/ruff format --check src tests scripts bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(LOWEST) demo-out .pytest_cache
