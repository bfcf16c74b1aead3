"""math_rlvr: RL with verifiable math rewards with a chosen algorithm, then pass@k evaluation (the papers'
experiment). Default: the synthetic arithmetic task with a tiny model warmed up here; ``dataset`` and
``path`` select GSM8K / MATH-500 / CMATH (then set ``overrides`` such as ``train.base_model=...``).

    train -> evaluate

Thin on purpose: each task calls one step of ``pipelines.math.math_pipeline`` (imported inside the task). Its
``overrides`` set only the keys a run may choose (``MathPipelineConfig.run_choices``); the run folder
(``$AGPO_OUTPUT_ROOT/math-runs``, default ``work/math-runs``) and the MLflow store are the worker's.
Runs are tracked in the MLflow experiment ``math_rlvr``; ``agpo compare --experiment math_rlvr`` lists them.
Both tasks sample from the model, so both go to ``AGPO_ACCELERATOR_QUEUE`` (``accelerator``); a config or
contract error fails without retrying, as in ``ads_relevance_agpo``.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import Param, dag, get_current_context, task

ACCELERATOR_QUEUE = os.environ.get("AGPO_ACCELERATOR_QUEUE", "accelerator")
# the algorithm param picks configs/train/<name>.yaml (pipelines.steps.config_from_params)
ALGORITHMS = sorted(path.stem for path in (Path(__file__).resolve().parents[1] / "configs" / "train").glob("*.yaml"))

PARAMS = {
    "presets": Param([], type="array", description="YAML presets, [SECTION=]configs/FILE.yaml, in order"),
    "algorithm": Param("agpo", type="string", enum=ALGORITHMS, description="RL algorithm (configs/train/<name>.yaml)"),
    "dataset": Param(None, type=["null", "string"], description="arithmetic, gsm8k, math500 or cmath"),
    "path": Param(None, type=["null", "string"], description="local JSONL of the math set"),
    "samples": Param(None, type=["null", "integer"], description="samples per problem for pass@k"),
    "overrides": Param(
        [],
        type="array",
        description="KEY=VALUE overrides of the keys a run may choose (MathPipelineConfig.run_choices)",
    ),
    "run_name": Param(None, type=["null", "string"], description="output folder and MLflow run name"),
}


def _run(step: str):
    from airflow.sdk.exceptions import AirflowFailException

    from pipelines.threads import prepare_airflow_task

    context = get_current_context()
    prepare_airflow_task(context)  # before the pipeline imports torch: threads that fit the task's slots
    from pipelines.math import math_pipeline as math_pipeline
    from pipelines.steps import run_airflow_task

    return run_airflow_task(math_pipeline, step, context, AirflowFailException)


@dag(
    dag_id="math_rlvr",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    default_args={
        "retries": 2,
        "retry_delay": timedelta(seconds=20),
        "queue": ACCELERATOR_QUEUE,
        "execution_timeout": timedelta(hours=24),
    },
    tags=["math", "agpo"],
    doc_md=__doc__,
)
def math_rlvr():
    @task
    def train() -> dict:
        return _run("train")

    @task
    def evaluate(_: dict) -> dict:
        return _run("evaluate")

    evaluate(train())


math_rlvr()
