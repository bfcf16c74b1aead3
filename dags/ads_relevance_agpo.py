"""ads_relevance_agpo: train the relevance teacher with RL, label unlabeled query-ad pairs with it, distil
a student, evaluate it on gold and register it (champion alias only when it beats the current one).

    validate -> teacher -> train -> gate -> partition -> annotate_shard (mapped, one per shard)
      -> merge -> distil -> evaluate -> register

A teacher below the prior gate (``teacher``) or the gate (``gate``) is skipped, not failed: that task and the
rest of the teacher path (RL, annotation, merge) are marked skipped with the reason in the task log and in
``teacher_skipped.json``, and ``distil`` (trigger rule ``none_failed``) goes on with the student on the gold
train pairs alone; ``evaluate`` and ``register`` then register the best of it and the baselines, so the run
finishes green with a model and says why the teacher was skipped.

Thin on purpose: each task reads its Airflow context and calls one step of ``pipelines.ads.pipeline`` (imported
inside the task, so parsing this file imports no torch). Tasks pass paths, never data; steps are idempotent, so
retries are safe. Params select YAML presets (files of the project's ``configs/`` only), the algorithm, the data and
its ``partitions`` (docs/operations.md "This week's data"), the base model, the gate threshold and the registered
model's name; ``overrides`` only the keys a run may choose (``AdsPipelineConfig.run_choices``), any other refused by
name. Any task may trigger a DAG with any conf, so the worker's environment decides the run folder
(``$AGPO_OUTPUT_ROOT/runs/<run_name>``, default ``work/runs``), the MLflow store and the registration lock.

Assets: ``validate`` updates ``PAIRS``, ``merge`` ``LABELS``, ``distil`` ``STUDENT`` (each event's extra
holds the run's path), and ``register`` updates ``CHAMPION`` only when it moved the champion alias, so a
DAG scheduled on ``CHAMPION`` (``ads_scoring``) runs once per new champion. Failures that no retry can
fix (a config error, a file that breaks its contract, a run name reused with other params) fail the task
at once; anything else (a lost worker, an unreachable MLflow server) retries.

Threads: each task runs torch with the worker's usable CPUs divided by the instances of it that may run at once
(``AGPO_PARALLEL_SHARDS``, default 2, for the shards) unless ``OMP_NUM_THREADS`` or ``AGPO_TASK_SLOTS`` is set.

Queues and pools: the teacher, RL, annotation and student tasks go to ``AGPO_ACCELERATOR_QUEUE`` (``accelerator``;
only Celery reads queues) and pool ``agpo_accelerator`` (the shards: ``agpo_annotation``), the others to
``AGPO_CPU_QUEUE`` (``default``). Retries back off exponentially, sized per task: quick CPU tasks 3 from 10 s (cap
5 min), accelerator tasks 2 from 5 min (cap 1 h), the day-long ``train`` 1 (it resumes from its checkpoint). A
failed task, or a run not done ``AGPO_ADS_DEADLINE_HOURS`` (48) after it was queued, sends an alert naming the
run, the task, the reason and the log (``AGPO_ALERT_WEBHOOK``; dags/agpo_operations.py has the rules).

Schedule: weekly (``AGPO_ADS_SCHEDULE``: a cron, a preset, or empty: triggered only, as the stack of ``deploy/``);
a scheduled run that names no ``teacher_from`` starts from the registered teacher (``current``: docs/tracking.md
"The weekly loop"); ``AGPO_ADS_RUN_TYPES=scheduled,manual`` refuses runs that tasks trigger.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agpo_operations import (
    ACCELERATOR,
    ACCELERATOR_POOL,
    ANNOTATION_POOL,
    LONG,
    PARALLEL_SHARDS,
    QUICK,
    AlertNotifier,
    run_deadline,
)
from airflow.sdk import Asset, AssetAlias, Param, dag, get_current_context, task

ACCELERATOR_QUEUE = os.environ.get("AGPO_ACCELERATOR_QUEUE", "accelerator")
CPU_QUEUE = os.environ.get("AGPO_CPU_QUEUE", "default")
# the run types a deployment allows (AGPO_ADS_RUN_TYPES, e.g. "scheduled,manual": a task's TriggerDagRunOperator,
# an "operator_triggered" run, is then refused by Airflow itself); unset: every type
RUN_TYPES = [t.strip() for t in os.environ.get("AGPO_ADS_RUN_TYPES", "").split(",") if t.strip()] or None
# the algorithm param picks configs/train/<name>.yaml (pipelines.steps.config_from_params)
ALGORITHMS = sorted(path.stem for path in (Path(__file__).resolve().parents[1] / "configs" / "train").glob("*.yaml"))

PAIRS = Asset(name="ads_relevance_pairs", uri="x-agpo://ads-relevance/pairs", group="ads-relevance")
LABELS = Asset(name="ads_relevance_labels", uri="x-agpo://ads-relevance/labels", group="ads-relevance")
STUDENT = Asset(name="ads_relevance_student", uri="x-agpo://ads-relevance/student", group="ads-relevance")
CHAMPION = Asset(name="ads_relevance_champion", uri="x-agpo://ads-relevance/champion", group="ads-relevance")
# register declares the alias and adds a CHAMPION event through it only on a promotion (no event otherwise)
CHAMPION_CHANGES = AssetAlias("ads_relevance_champion_changes")

DAY = {"type": ["null", "string"], "pattern": r"^\d{4}-\d{2}-\d{2}$"}  # a dt= partition's date, YYYY-MM-DD
PARAMS = {
    "presets": Param(
        ["train=configs/cpu-tiny.yaml"], type="array", description="YAML presets, [SECTION=]configs/FILE.yaml, in order"
    ),
    "algorithm": Param(
        "agpo", type="string", enum=ALGORITHMS, description="teacher RL algorithm (configs/train/<name>.yaml)"
    ),
    "pairs": Param(
        None,
        type=["null", "string"],
        description="pairs Parquet, a local path or URI (s3://bucket/pairs.parquet), or a dataset of dt=YYYY-MM-DD "
        "partitions (a folder or prefix; partitions picks this run's); null: the embedded set",
    ),
    "partitions": Param(
        "interval",
        oneOf=[
            {"type": "string", "enum": ["interval", "all"]},
            {
                "type": "object",
                "properties": {"from": DAY, "to": DAY},
                "additionalProperties": False,
                "minProperties": 1,
            },
        ],
        description="the dt= partitions of a pairs dataset this run reads: interval (unlabeled pairs since the last "
        "successful run, up to data_interval_end; gold up to it), all, or {from, to} (dates, to not included); "
        "a pairs file: ignored (pipelines/ads/intake/window.py)",
    ),
    "base_teacher": Param(None, type=["null", "string"], description="SFT-ready teacher directory; null: build"),
    "min_audit_accuracy": Param(
        None, type=["null", "number"], description="gate: teacher audit accuracy needed; null: the config's (0.5)"
    ),
    "registered_model": Param(
        None,
        type=["null", "string"],
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$",
        description="registry name of the run's model; null: ads-relevance-student",
    ),
    "overrides": Param(
        [], type="array", description="KEY=VALUE overrides of the keys a run may choose (data, gates, models, sizes)"
    ),
    "run_name": Param(
        None, type=["null", "string"], description="output folder and MLflow run name; null: the Airflow run id"
    ),
    "teacher_from": Param(
        None,
        type=["null", "string"],
        description="the teacher to start from (teacher_reuse.source): current (the registered teacher), "
        "models:/<name>@<alias> or /<N>; null: a scheduled run takes current, any other trains its teacher",
    ),
}


def _run(step: str, **kwargs):
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    from pipelines.threads import prepare_airflow_task

    context = get_current_context()
    prepare_airflow_task(context)  # before the pipeline imports torch: threads that fit the task's slots
    from pipelines.ads import pipeline as ads_pipeline
    from pipelines.steps import run_airflow_task

    fail, skip = AirflowFailException, AirflowSkipException
    return run_airflow_task(ads_pipeline, step, context, fail, skip, run_params=ads_pipeline.weekly_params, **kwargs)


def _record(asset: Asset, outputs: dict, key: str) -> dict:
    """``outputs`` of a step, with its ``key`` output's path on the asset event the task emits."""
    get_current_context()["outlet_events"][asset].extra = {"path": str(outputs[key])}
    return outputs


@dag(
    dag_id="ads_relevance_agpo",
    schedule=os.environ.get("AGPO_ADS_SCHEDULE", "@weekly") or None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    allowed_run_types=RUN_TYPES,
    params=PARAMS,
    default_args={
        **QUICK,
        "queue": CPU_QUEUE,
        "execution_timeout": timedelta(hours=1),
        "on_failure_callback": [AlertNotifier()],
    },
    deadline=run_deadline("AGPO_ADS_DEADLINE_HOURS", 48),
    tags=["ads-relevance", "agpo"],
    doc_md=__doc__,
)
def ads_relevance_agpo():
    @task(outlets=[PAIRS])
    def validate() -> dict:
        return _record(PAIRS, _run("validate"), "pairs")

    on_accelerator = {"queue": ACCELERATOR_QUEUE, "pool": ACCELERATOR_POOL, **ACCELERATOR}

    @task(**on_accelerator, execution_timeout=timedelta(hours=12))
    def teacher(_: dict) -> dict:
        return _run("build_teacher")

    @task(**{**on_accelerator, **LONG}, execution_timeout=timedelta(hours=24))
    def train(_: dict) -> dict:
        return _run("train")

    @task
    def gate(_: dict) -> dict:
        return _run("gate")

    @task
    def partition(_: dict) -> list[int]:
        return _run("partition_shards")

    @task(
        **{**on_accelerator, "pool": ANNOTATION_POOL},
        execution_timeout=timedelta(hours=6),
        max_active_tis_per_dag=PARALLEL_SHARDS,
    )
    def annotate_shard(shard: int) -> dict:
        return _run("annotate_shard", shard=shard)

    @task(outlets=[LABELS])
    def merge(_: list) -> dict:
        return _record(LABELS, _run("merge"), "labels")

    # none_failed: runs after the teacher path finished or was skipped (a teacher below a gate), not after a failure
    @task(**on_accelerator, execution_timeout=timedelta(hours=6), outlets=[STUDENT], trigger_rule="none_failed")
    def distil(_: dict | None) -> dict:
        return _record(STUDENT, _run("distil"), "model")

    @task(**on_accelerator, execution_timeout=timedelta(hours=6))  # also trains the gold-only student
    def evaluate(_: dict) -> dict:
        return _run("evaluate")

    @task(outlets=[CHAMPION_CHANGES])
    def register(_: dict) -> dict:
        import json

        outputs = _run("register")
        decision = json.loads(Path(outputs["registration"]).read_text())
        if decision.get("promoted"):
            extra = {"version": decision["version"], "registration": str(outputs["registration"])}
            get_current_context()["outlet_events"][CHAMPION_CHANGES].add(CHAMPION, extra=extra)
        return outputs

    shards = annotate_shard.expand(shard=partition(gate(train(teacher(validate())))))
    register(evaluate(distil(merge(shards))))


ads_relevance_agpo()
