# Newcomer commands: `make demo` runs the main job on the embedded defaults, `make test` runs the tests.
# Both create .venv from constraints.txt first (torch stays the local CPU wheel).

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MLFLOW_DISABLE_TELEMETRY := true

.PHONY: venv demo bench test test-fast test-integration lint format clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev]"
	$(BIN)/pip check
	touch $(STAMP)

# The main job on the embedded defaults: synthetic pairs -> tiny teacher + SFT -> AGPO RL (about 3 minutes).
demo: venv
	$(BIN)/agpo data
	$(BIN)/agpo teacher
	$(BIN)/agpo train --config configs/cpu-tiny.yaml --config configs/train/agpo.yaml

bench: venv
	$(BIN)/python benchmarks/bench_algorithm_core.py
	$(BIN)/python benchmarks/bench_trainer_step.py

test: lint test-fast test-integration

test-fast: venv
	$(BIN)/pytest -m "not integration" -p no:cacheprovider

test-integration: venv
	$(BIN)/pytest -m integration -p no:cacheprovider

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) work .pytest_cache .ruff_cache .hypothesis
