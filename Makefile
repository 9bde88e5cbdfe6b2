# The two set-up commands of README.md. Each bootstraps .venv from this project's own files.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The tests' oracles that cannot live in the venv's site-packages: one requirements file each
# in oracles/, installed with --no-deps into <venv>/oracles/<its name> (each file says why).
ORACLES := $(wildcard oracles/*.txt)

.PHONY: demo test lint clean

$(STAMP): pyproject.toml Makefile $(ORACLES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	for f in $(ORACLES); do \
		$(BIN)/python -m pip install -q --upgrade --no-deps \
			--target $(VENV)/oracles/$$(basename $$f .txt) -r $$f || exit 1; \
	done
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/regen demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts bench
	$(BIN)/ruff format --check src tests scripts bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) demo-out .pytest_cache
