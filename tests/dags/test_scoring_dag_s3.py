"""The scoring DAG on data in an object store, through real Airflow (`airflow dags test`) and the real SeaweedFS
server the tests start: its ``pairs`` param names an s3:// dataset of two part files, its ``overrides`` publish the
scores to the bucket, and the worker's AWS environment is the only credential."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from pipelines.storage import locate
from student.model import RelevanceStudent, StudentConfig

pytestmark = pytest.mark.integration
FIELDS = ("pair_id", "query", "ad_title", "gold_grade", "split")


def test_the_scoring_dag_reads_an_s3_dataset_and_publishes_its_scores_there(
    airflow_home, dag_test, worker, s3_store, s3_env, tmp_path
):
    rows = [{k: r[k] for k in FIELDS} for r in generate_pairs(SyntheticConfig(train=40, audit=0, unlabeled=0, test=0))]
    student = RelevanceStudent.build(
        StudentConfig(tiny_hidden=32, tiny_vocab=300, seed=0), texts=[f"{r['query']} {r['ad_title']}" for r in rows]
    )
    student.save(tmp_path / "student")
    fs = locate(f"s3://{s3_env}").filesystem
    for day, half in (("2026-12-01", rows[:25]), ("2026-12-02", rows[25:])):
        with fs.open_output_stream(f"{s3_env}/pairs/dt={day}/part-0.jsonl") as out:
            out.write("".join(json.dumps(r) + "\n" for r in half).encode())
    conf = {
        "pairs": f"s3://{s3_env}/pairs/",
        "model": str(tmp_path / "student"),
        "overrides": [f"publish=s3://{s3_env}/scores", "threads=1", "batch_size=8"],
        "run_name": "s3-scoring",
    }
    _, env = airflow_home
    done = dag_test({**env, **worker, **s3_store.env("admin")}, "ads_scoring", conf, timeout=600)  # the worker's keys
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in done.stdout + done.stderr
    manifest = json.loads(locate(f"s3://{s3_env}/scores/_manifest.json").read_bytes())
    assert manifest["rows"] == {"rows_in": 40, "scored": 40, "quarantined": 0, "skipped_other_splits": 0}
    scores = pq.read_table(f"{s3_env}/scores/scores", filesystem=fs)
    assert sorted(scores["pair_id"].to_pylist()) == sorted(r["pair_id"] for r in rows)
