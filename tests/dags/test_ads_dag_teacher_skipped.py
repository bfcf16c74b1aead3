"""The ads DAG on a tiny export of real text whose teacher fails its prior gate: the teacher path is skipped,
not failed, the run finishes green with the gold-only student and the baselines scored, a registered
champion, and the reason the teacher was skipped in the registration, the task log, the run's report page
and MLflow."""

import json
import sqlite3
from html import escape as html_escape

import mlflow
import pandas as pd
import pytest

from evaluation.comparison import SIMPLEST_FIRST
from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.distillation.report_page import REPORT_PAGE, verdict
from pipelines.tracking import REPORT_TAG, TrackingConfig, global_tracking_uri, pipeline_runs, tracking_uri

pytestmark = [pytest.mark.integration, pytest.mark.minutes(4)]
TEACHER_PATH = ("teacher", "train", "gate", "partition", "annotate_shard", "merge")


def test_a_teacher_below_its_gate_is_skipped_and_the_run_registers_the_best_other_model(
    fresh_airflow_home, dag_test, real_export, worker, tmp_path
):
    home, env = fresh_airflow_home  # its own metadata DB: its task states alone
    conf = {
        "presets": ["configs/pipeline/tiny-test.yaml"],
        "pairs": str(real_export),
        # a margin no teacher reaches: the prior gate after SFT fails for certain, whatever the tiny teacher learns
        "overrides": ["min_balanced_margin=0.9", "teacher.sft.epochs=1"],
        "run_name": "skipped",
    }
    done = dag_test({**env, **worker}, "ads_relevance_agpo", conf, timeout=900)
    log = done.stdout + done.stderr
    with sqlite3.connect(home / "airflow.db") as db:
        [(state,)] = db.execute("SELECT state FROM dag_run").fetchall()
        tasks = dict(db.execute("SELECT task_id, state FROM task_instance").fetchall())
    assert state == "success"  # green: a skipped teacher is not a failed run
    assert {tasks[t] for t in TEACHER_PATH} == {"skipped"}, tasks
    assert {tasks[t] for t in ("validate", "distil", "evaluate", "register")} == {"success"}, tasks
    assert "the teacher is skipped: no RL, no annotation" in log

    config, _ = ads_pipeline.from_airflow(conf, "ads_relevance_agpo", "unused", try_number=1)
    root = ads_pipeline.layout(config)
    skipped = json.loads((root.root / "teacher_skipped.json").read_text())
    assert skipped["step"] == "teacher" and skipped["reason"].startswith("SFT teacher: the teacher answers at its")
    assert not root.rl.exists() and not root.annotate.exists()
    distilled = json.loads((root.student / "distil.json").read_text())
    assert distilled["label_source"] == "train-gold" and set(distilled["training_pairs_by_source"]) == {"gold"}
    decision = json.loads((root.student / "registration.json").read_text())
    assert decision["teacher_skipped"] == skipped and decision["metric"] == "roc_auc_relevant"
    assert decision["candidate"] in SIMPLEST_FIRST and decision["version"] == 1 and decision["promoted"]

    # the run's report page on real text: the decision first, the teacher's skip reason, the plots inlined
    page = root.root / REPORT_PAGE
    html = page.read_text(encoding="utf-8")
    assert f"{html_escape(verdict(decision))}</h1>" in html.split("<body>", 1)[1].splitlines()[0]
    assert html_escape(skipped["reason"].splitlines()[0]) in html and 'src="data:image/png;base64,' in html

    tracking = TrackingConfig(store_dir=str(tmp_path / "mlflow"))
    [parent] = pipeline_runs(tracking)  # what agpo compare shows
    assert parent["status"] == "FINISHED" and parent["champion_candidate"] == decision["candidate"]
    assert parent[REPORT_TAG].endswith(f"/{REPORT_PAGE}")  # logged with the parent run
    assert parent["teacher"] == "skipped" and parent["teacher_skipped_reason"] == skipped["reason"]
    assert "teacher_audit_accuracy" not in parent and 0 < parent["zero_shot_roc_auc_relevant"] < 1
    with global_tracking_uri(tracking_uri(tracking)):
        champion = mlflow.pyfunc.load_model(f"models:/{tracking.registered_model}@champion")
    frame = pd.DataFrame({"query": ["angle bracket"], "ad_title": ["Simpson Strong-Tie 12-Gauge Angle"]})
    assert champion.predict(frame)["grade"].between(0, 3).all()
