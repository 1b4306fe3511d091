# Two commands for a fresh machine with Python 3.11+ and pip:
#   make demo   - the main job: train a sharded MLP on an embedded LocalCluster
#   make test   - the test suite (with ruff and mypy)
# Both create and reuse a local virtualenv in .venv.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/pathdask demo

lint: $(STAMP)
	$(BIN)/ruff check pathdask graphs tests tutorials

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
