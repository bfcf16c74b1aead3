"""ads_relevance_agpo: train the relevance teacher with RL, label unlabeled query-ad pairs with it, distil
a student, evaluate it on gold and register it (champion alias only when it beats the current one).

    validate -> teacher -> train -> gate -> partition -> annotate_shard (mapped, one per shard)
      -> merge -> distil -> evaluate -> register

Thin on purpose: each task reads its Airflow context and calls one step of ``pipelines.ads.pipeline``
(imported inside the task, so parsing this file imports no torch). Tasks pass paths, never data; every
step is idempotent, so retries are safe. Params select YAML presets, the algorithm, the data, the base
model and the gate threshold; ``overrides`` takes any other config key (``agpo pipeline --help`` lists them).

Schedule: weekly; a deployment sets another with ``AGPO_ADS_SCHEDULE`` (a cron or preset; empty: triggered
only, as the distributed stack of ``deploy/`` does, so that unpausing it starts no run with default params).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Param, dag, get_current_context, task

PARAMS = {
    "presets": Param(
        ["train=configs/cpu-tiny.yaml"], type="array", description="YAML presets, [SECTION=]FILE.yaml, in order"
    ),
    "algorithm": Param("agpo", type="string", description="teacher RL algorithm (configs/train/<name>.yaml)"),
    "pairs": Param(None, type=["null", "string"], description="pairs Parquet; null: the embedded synthetic set"),
    "base_teacher": Param(None, type=["null", "string"], description="SFT-ready teacher directory; null: build"),
    "min_audit_accuracy": Param(
        None, type=["null", "number"], description="gate: teacher audit accuracy needed; null: the config's (0.5)"
    ),
    "overrides": Param([], type="array", description="extra config overrides, KEY=VALUE"),
    "run_name": Param(
        None, type=["null", "string"], description="output folder and MLflow run name; null: the Airflow run id"
    ),
}


def _run(step: str, **kwargs):
    from pipelines.ads import pipeline as ads_pipeline
    from pipelines.steps import StepParamsChanged

    context = get_current_context()
    config, caller = ads_pipeline.from_airflow(
        context["params"], context["dag"].dag_id, context["run_id"], context["ti"].try_number
    )
    try:
        return getattr(ads_pipeline, step)(config, caller=caller, **kwargs)
    except (ads_pipeline.GateFailed, StepParamsChanged) as err:
        from airflow.sdk.exceptions import AirflowFailException

        # a bad teacher stays bad, a run name reused with other params stays reused: fail without retrying
        raise AirflowFailException(str(err)) from err


@dag(
    dag_id="ads_relevance_agpo",
    schedule=os.environ.get("AGPO_ADS_SCHEDULE", "@weekly") or None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=20)},
    tags=["ads-relevance", "agpo"],
    doc_md=__doc__,
)
def ads_relevance_agpo():
    @task
    def validate() -> dict:
        return _run("validate")

    @task
    def teacher(_: dict) -> dict:
        return _run("build_teacher")

    @task
    def train(_: dict) -> dict:
        return _run("train")

    @task
    def gate(_: dict) -> dict:
        return _run("gate")

    @task
    def partition(_: dict) -> list[int]:
        return _run("partition_shards")

    @task(max_active_tis_per_dag=2)
    def annotate_shard(shard: int) -> dict:
        return _run("annotate_shard", shard=shard)

    @task
    def merge(_: list) -> dict:
        return _run("merge")

    @task
    def distil(_: dict) -> dict:
        return _run("distil")

    @task
    def evaluate(_: dict) -> dict:
        return _run("evaluate")

    @task
    def register(_: dict) -> dict:
        return _run("register")

    shards = annotate_shard.expand(shard=partition(gate(train(teacher(validate())))))
    register(evaluate(distil(merge(shards))))


ads_relevance_agpo()
