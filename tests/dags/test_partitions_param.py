"""The ads DAG's partitions param: Airflow validates its forms, and a task's params become the config's
pairs_window through run_airflow_task (pipelines/ads/intake/window.py has the rule)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest
from airflow.sdk.exceptions import AirflowFailException

from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.intake.contracts import pairs_table, write_table
from pipelines.ads.intake.window import PairsWindow, dag_params
from pipelines.steps import run_airflow_task


@pytest.fixture
def partitions():
    import ads_relevance_agpo  # dags/ is on sys.path (tests/dags/conftest.py)

    return copy.deepcopy(ads_relevance_agpo.PARAMS["partitions"])  # resolve() keeps the value it was given


@pytest.mark.parametrize("value", ["interval", "all", {"from": "2026-11-30", "to": "2026-12-07"}, {"to": "2026-12-07"}])
def test_the_partitions_param_takes_its_forms(partitions, value):
    assert partitions.resolve(value) == value


@pytest.mark.parametrize("value", ["week", {"from": "30/11/2026"}, {"since": "2026-11-30"}, {}, 7])
def test_the_partitions_param_refuses_others(partitions, value):
    assert partitions.resolve() == "interval"  # the default: the run's interval
    with pytest.raises(ValueError):
        partitions.resolve(value)


class TaskInstance:
    try_number = 1
    map_index = -1


class Dag:
    dag_id = "ads_relevance_agpo"


def test_a_task_config_gets_the_window_of_its_interval(tmp_path, monkeypatch):
    monkeypatch.setenv("AGPO_OUTPUT_ROOT", str(tmp_path / "work"))
    dataset = tmp_path / "pairs"
    rows = [{"pair_id": "a", "query": "q", "ad_title": "t", "gold_grade": 1, "split": "train"}]
    write_table(pairs_table(rows), dataset / "dt=2026-12-01" / "part-0.parquet")
    params = {"presets": ["configs/pipeline/tiny-test.yaml"], "pairs": str(dataset), "partitions": "interval"}
    moment = datetime(2026, 12, 7, tzinfo=UTC)
    context = {
        "params": params,
        "dag": Dag(),
        "run_id": "scheduled__2026-12-07",
        "ti": TaskInstance(),
        "data_interval_start": moment,
        "data_interval_end": moment,
        "prev_data_interval_end_success": datetime(2026, 11, 30, tzinfo=UTC),
    }
    config, _ = ads_pipeline.from_airflow(dag_params(context), "ads_relevance_agpo", "scheduled__2026-12-07", 1)
    assert config.pairs_window == PairsWindow("2026-11-30", "2026-12-07")
    # an explicit window on a pairs file fails the task without retry
    file = write_table(pairs_table(rows), tmp_path / "one.parquet")
    bad = {**context, "params": {**params, "pairs": str(file), "partitions": {"to": "2026-12-01"}}}
    with pytest.raises(AirflowFailException, match="needs pairs to be a dataset"):
        run_airflow_task(ads_pipeline, "validate", bad, AirflowFailException, run_params=dag_params)


class DagRun:
    def __init__(self, run_type: str) -> None:
        self.run_type = run_type


@pytest.mark.parametrize(
    ("run_type", "teacher_from", "source"),
    [("scheduled", None, "current"), ("manual", None, None), ("scheduled", "models:/t/3", "models:/t/3")],
)
def test_a_scheduled_run_starts_from_the_registered_teacher_unless_it_names_one(
    run_type, teacher_from, source, tmp_path, monkeypatch
):
    monkeypatch.setenv("AGPO_OUTPUT_ROOT", str(tmp_path / "work"))
    params = {"presets": ["configs/pipeline/tiny-test.yaml"], "teacher_from": teacher_from}
    context = {"params": params, "dag_run": DagRun(run_type), "data_interval_start": None, "data_interval_end": None}
    config, _ = ads_pipeline.from_airflow(ads_pipeline.weekly_params(context), "ads_relevance_agpo", "r", 1)
    assert config.teacher_reuse.source == source
