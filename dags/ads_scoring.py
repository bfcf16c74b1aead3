"""ads_scoring: the champion student grades a file of new query-ad pairs (``agpo score``), each time the
champion changes.

    score

Scheduled on the ``CHAMPION`` asset of ``ads_relevance_agpo``: its ``register`` task emits an event only
when it moved the ``champion`` alias, so each new champion scores the pairs once. The pairs come from the
``pairs`` param, else ``AGPO_SCORING_PAIRS`` (a deployment's file of new pairs); with neither the task is
skipped (nothing to score). The model is ``models:/ads-relevance-student@champion`` unless ``model`` says
otherwise, resolved when the task runs; each score row records the model version it came from. Output:
``$AGPO_OUTPUT_ROOT/scoring/<run>/`` (default ``work/scoring``; ``scores/``, ``quarantine/``, ``summary.json``),
announced as the ``SCORES`` asset.

Thin on purpose, like the other DAGs: the task imports ``pipelines.ads.serving.score`` when it runs and builds its
config with ``pipelines.steps.run_folder_config`` (presets from ``configs/`` only, ``run_name`` held to the path
rules, ``overrides`` only of ``ScoreConfig.run_choices``: where it writes and which MLflow store it reads are the
worker's).
Config and contract errors fail without retrying; anything else retries, as an accelerator task does (2 retries
from 5 min, capped at 1 h), in the ``agpo_accelerator`` pool. A failure, or a run not done
``AGPO_SCORING_DEADLINE_HOURS`` (8) after it was queued, sends an alert (dags/agpo_operations.py).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from agpo_operations import ACCELERATOR, ACCELERATOR_POOL, AlertNotifier, run_deadline
from airflow.sdk import Asset, Param, dag, get_current_context, task

CPU_QUEUE = os.environ.get("AGPO_CPU_QUEUE", "default")
# the ads DAG's asset (dags/ads_relevance_agpo.py): the same name and URI are the same asset
CHAMPION = Asset(name="ads_relevance_champion", uri="x-agpo://ads-relevance/champion", group="ads-relevance")
SCORES = Asset(name="ads_relevance_scores", uri="x-agpo://ads-relevance/scores", group="ads-relevance")

PARAMS = {
    "pairs": Param(
        None,
        type=["null", "string"],
        description="pairs to score (Parquet/CSV/JSONL file or dataset folder; local or s3://...); null: "
        "$AGPO_SCORING_PAIRS; overrides publish=s3://... publishes the scores",
    ),
    "model": Param(
        "models:/ads-relevance-student@champion",
        type="string",
        description="student: a folder or models:/<name>@<alias> or /<version>",
    ),
    "presets": Param([], type="array", description="YAML presets of `agpo score` in configs/, in order"),
    "overrides": Param(
        [],
        type="array",
        description="KEY=VALUE overrides of the keys a run may choose (ScoreConfig.run_choices; agpo score --help)",
    ),
    "run_name": Param(None, type=["null", "string"], description="output folder; null: the Airflow run id"),
}
OUT_ROOT = "work/scoring"  # the run folders' parent, unless the worker's AGPO_OUTPUT_ROOT names another


@dag(
    dag_id="ads_scoring",
    schedule=[CHAMPION],
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    default_args={
        **ACCELERATOR,
        "queue": CPU_QUEUE,
        "pool": ACCELERATOR_POOL,
        "on_failure_callback": [AlertNotifier()],
    },
    deadline=run_deadline("AGPO_SCORING_DEADLINE_HOURS", 8),
    tags=["ads-relevance", "scoring"],
    doc_md=__doc__,
)
def ads_scoring():
    @task(execution_timeout=timedelta(hours=6), outlets=[SCORES])
    def score() -> dict:
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from pipelines.threads import prepare_airflow_task

        context = get_current_context()
        prepare_airflow_task(context)  # before the stage imports torch: threads that fit the task's slots
        from pipelines.ads.serving import score as score_stage
        from pipelines.config import literal_override
        from pipelines.errors import StageFailed
        from pipelines.steps import run_folder_config

        params = context["params"]
        pairs = params.get("pairs") or os.environ.get("AGPO_SCORING_PAIRS")
        if not pairs:
            raise AirflowSkipException("no pairs to score: set the pairs param or AGPO_SCORING_PAIRS")
        try:
            sets = [literal_override("input.path", pairs), literal_override("model", params["model"])]
            config = run_folder_config(score_stage.ScoreConfig, params, context["run_id"], sets, OUT_ROOT)
        except (ValueError, TypeError) as err:  # ConfigError is a ValueError
            raise AirflowFailException(f"the run's params make no valid config: {err}") from err
        try:
            outputs = {key: str(path) for key, path in score_stage.run(config).items()}
        except StageFailed as err:  # a file that breaks its contract stays broken
            raise AirflowFailException(str(err)) from err
        context["outlet_events"][SCORES].extra = {"out_dir": config.out_dir, "model": config.model}
        return outputs

    score()


ads_scoring()
