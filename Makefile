# Every target does all of its own set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
PYTEST_WORKERS ?= 2

.PHONY: venv test lint demo bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/pytest -q -n $(PYTEST_WORKERS)

demo: venv
	$(BIN)/python scripts/demo.py

bench: venv
	$(BIN)/python benchmarks/losses.py

clean:
	rm -rf $(VENV) build *.egg-info
