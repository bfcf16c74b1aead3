"""The math_rlvr DAG end to end through real Airflow on the tiny preset, read back from MLflow."""

import json

import pytest
from mlflow import MlflowClient

from pipelines.tracking import TrackingConfig, pipeline_runs, tracking_uri

pytestmark = pytest.mark.integration


def test_the_math_dag_trains_and_reports_pass_at_k(airflow_home, dag_test, worker, tmp_path):
    _, env = airflow_home
    conf = {"presets": ["configs/pipeline/math-tiny-test.yaml"], "algorithm": "grpo", "run_name": "tiny"}
    dag_test({**env, **worker}, "math_rlvr", conf, timeout=900)
    results = json.loads((tmp_path / "math-runs" / "tiny" / "eval" / "results.json").read_text())
    assert results["dataset"] == "arithmetic (held out)" and list(results["pass_at_k"]) == ["1", "2", "4"]
    tracking = TrackingConfig(experiment="math_rlvr", store_dir=str(tmp_path / "mlflow"))
    [parent] = pipeline_runs(tracking)
    assert parent["status"] == "FINISHED" and parent["algorithm"] == "grpo"
    client = MlflowClient(tracking_uri(tracking))
    experiment = client.get_experiment_by_name("math_rlvr").experiment_id
    children = {r.data.tags["agpo.stage"]: r for r in client.search_runs([experiment], "tags.`agpo.kind` = 'stage'")}
    assert set(children) == {"train", "evaluate"}
    assert children["evaluate"].data.metrics["pass_at_1"] == pytest.approx(results["pass_at_k"]["1"])
    assert "pass_at_k.png" in {a.path for a in client.list_artifacts(children["evaluate"].info.run_id)}
