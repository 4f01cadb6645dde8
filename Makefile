# Every target does all of its own set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
# The installer of the dev extra (see venv).
UV ?= uv==0.13.9
BIN := $(VENV)/bin
# Two pytest workers on two cores. Three were tried: the cores were busier but the suite was
# slower (pytest 18 min 50 s against 16 min 10 s; the DDP ranks and fits the tests start then
# contend with a third worker).
PYTEST_WORKERS ?= 2

.PHONY: package venv test pytest test-fast lint docs demo bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# What the demo needs and nothing more: torch (the CPU build unless TORCH says otherwise) and
# the package with its run-time dependencies.
package: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e .

# The package with the dev tools (pytest, hypothesis, ruff, mypy, mkdocs): what test, lint and
# docs need. Every make installs again what is missing, so `make demo` then `make test` gets them.
# torch comes from pip (it honours the machine's pip configuration: a local CPU build where there
# is one); the rest from uv, which keeps that torch and installs the dev extra's ~200 packages in
# well under a minute where pip took two to three. Like pip, it compiles their bytecode: where
# PYTHONDONTWRITEBYTECODE is set (as on this project's machines), Python would otherwise compile
# torch, Lightning and MLflow again in every process, and the tests start hundreds. Two references of the tests come last, without
# their dependencies: the reference implementation of Dirichlet calibration (Kull et al.), whose
# releases declare Python >= 3.12 but run on 3.10+ (what it needs, numpy, scipy, scikit-learn and
# jax, is installed before it), and TorchCP's scores, a reference of the conformal tests (its
# package imports torchsort and torchvision, which do not install beside a CPU torch; the tests
# load the score files alone: tests/helpers/torchcp.py).
venv: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q "$(UV)"
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e ".[dev]" jax jaxlib
	$(BIN)/pip install -q --no-deps --ignore-requires-python "dirichletcal==0.5.3" "torchcp==1.2.1"

# mypy reads its settings (the package, through the callbacks link) from pyproject.toml.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link, a missing API
# reference or a docstring the parser cannot read fails the build. NO_MKDOCS_2_WARNING silences
# the theme's notice about MkDocs 2.0, printed on every build.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# lint (ruff, mypy) and the tests (PYTEST_WORKERS workers) run side by side, after venv, which
# both need: mypy's minute fills the cores the tests leave idle while they wait on their
# subprocesses and servers. Either failing fails make test. The strict documentation build is
# one of the tests (tests/project/test_docs.py builds the site as `make docs` does), so it is
# not run a second time here.
test:
	$(MAKE) --no-print-directory -j2 lint pytest

# The package's and the tests' bytecode first, for the same reason (it is read, never written,
# under PYTHONDONTWRITEBYTECODE; a changed source file is compiled again from its mtime).
pytest: venv
	$(BIN)/python -m compileall -q lightning_losses callbacks tests scripts > /dev/null
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# The quick lane: every test but those marked slow (DDP processes, MLflow servers, console and
# LightningCLI subprocess runs, the demo, wheel builds); under 2 minutes on 2 cores.
test-fast: venv
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "not slow"

# The demo installs the package only (no test tools, no dirichletcal): see `package`.
demo: package
	$(BIN)/python scripts/demo.py

bench: venv
	$(BIN)/python benchmarks/losses.py

clean:
	rm -rf $(VENV) build site *.egg-info
