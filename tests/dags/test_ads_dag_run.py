"""The ads DAG end to end through real Airflow (`airflow dags test`, SQLite metadata DB) on the tiny
preset, then read back from the real MLflow store: parent and child runs with metrics and artifacts, a
registered candidate (champion only by the champion rule); and a retried task creates no second
run or output."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient
from safetensors.torch import load_file

from evaluation.comparison import champion_candidate
from pipelines.ads import pipeline as ads_pipeline
from pipelines.steps import SUCCESS
from pipelines.tracking import TrackingConfig, global_tracking_uri, pipeline_runs, tracking_uri
from student.model import RelevanceStudent

pytestmark = [pytest.mark.integration, pytest.mark.minutes(7)]
ROOT = Path(__file__).resolve().parents[2]
STAGES = {
    "validate",
    "teacher",
    "train",
    "gate",
    "partition",
    "annotate-shard-0",
    "annotate-shard-1",
    "merge",
    "distil",
    "evaluate",
    "register",
}


WEEK_ONE = {"presets": ["configs/pipeline/tiny-test.yaml"], "algorithm": "agpo", "min_audit_accuracy": 0.0}


@pytest.fixture(scope="module")
def week_one(airflow_home, dag_test, settings_of_a_worker, tmp_path_factory):
    """The ads DAG run on the tiny preset, as a deployment's worker runs it (its settings also in this process):
    (Airflow home, its environment, the worker's settings, the worker's folder, the finished `dags test`)."""
    home, env = airflow_home
    folder = tmp_path_factory.mktemp("worker")
    with pytest.MonkeyPatch.context() as patch:
        worker = settings_of_a_worker(folder, patch)
        yield home, env, worker, folder, dag_test({**env, **worker}, "ads_relevance_agpo", WEEK_ONE, timeout=1200)


def test_the_ads_dag_runs_end_to_end_and_every_stage_is_tracked(week_one, tmp_path):
    home, _, _, folder, done = week_one
    conf = WEEK_ONE
    # the task log a worker keeps: progress as log lines naming the task, never carriage-return frames
    task_log = done.stdout + done.stderr
    assert "\r" not in task_log
    assert re.search(r"INFO \[train run=\S+ shard=-\] agpo\.progress: RL agpo: +100%", task_log), task_log[-3000:]
    assert re.search(r"INFO \[annotate_shard run=\S+ shard=1\] agpo\.progress: annotate shard 1:", task_log)

    tracking = TrackingConfig(store_dir=str(folder / "mlflow"))
    client = MlflowClient(tracking_uri(tracking))
    [parent] = pipeline_runs(tracking)
    assert parent["status"] == "FINISHED" and parent["algorithm"] == "agpo"
    assert 0 <= parent["student_accuracy"] <= 1 and parent["teacher_generated_tokens"] > 0
    assert 0 <= parent["gold_only_macro_f1"] <= 1  # the same student on the gold train pairs alone
    assert 0 <= parent["zero_shot_macro_f1"] <= 1 and 0 <= parent["lexical_macro_f1"] <= 1  # the two baselines
    assert (
        parent["teacher_added_macro_f1_low"]
        <= parent["teacher_added_macro_f1"]
        <= parent["teacher_added_macro_f1_high"]
    )
    experiment = client.get_experiment_by_name(tracking.experiment).experiment_id
    children = client.search_runs([experiment], filter_string="tags.`agpo.kind` = 'stage'")
    by_stage = {run.data.tags["agpo.stage"]: run for run in children}
    assert set(by_stage) == STAGES and len(children) == len(STAGES)
    assert {run.info.status for run in children} == {"FINISHED"}
    parent_id = {run.data.tags["mlflow.parentRunId"] for run in children}
    assert len(parent_id) == 1
    train = by_stage["train"]
    assert train.data.params["trainer.algorithm"] == "agpo"
    assert len(client.get_metric_history(train.info.run_id, "reward_mean")) == 2  # one point per trainer step
    query = f"name = 'teacher' AND source_run_id = '{train.info.run_id}'"
    [teacher] = client.search_logged_models([experiment], filter_string=query)  # the RL teacher as a LoggedModel
    assert teacher.status == "READY" and "audit_accuracy_end" in {m.key for m in teacher.metrics}
    evaluate_artifacts = {a.path for a in client.list_artifacts(by_stage["evaluate"].info.run_id)}
    assert {"confusion.png", "reliability.png", "metrics.json"} <= evaluate_artifacts
    # the student once, as the register run's LoggedModel (a pyfunc model holding the folder and its card)
    run_artifacts = Path(urllib.parse.urlparse(by_stage["register"].info.artifact_uri).path)
    assert not (run_artifacts / "student").exists()  # not a second copy beside it
    query = f"name = 'student' AND source_run_id = '{by_stage['register'].info.run_id}'"
    registry = client.get_experiment_by_name(f"{client.get_experiment(experiment).name}-registry").experiment_id
    [student] = client.search_logged_models([experiment, registry], filter_string=query)  # registered or not
    student_files = {a.path for a in client.list_logged_model_artifacts(student.model_id, "artifacts/model")}
    assert {f"artifacts/model/{f}" for f in ("model.safetensors", "student.onnx", "README.md")} <= student_files
    figures = {a.path for a in client.list_logged_model_artifacts(student.model_id, "figures")}
    assert {"figures/ranking_curves.png", "figures/confusion.png"} <= figures  # the evaluation's, on the model
    assert student.params["kind"] and "student/test_macro_f1" in {m.key for m in student.metrics}
    assert [i.dataset.name for i in client.get_run(by_stage["merge"].info.run_id).inputs.dataset_inputs] == [
        "teacher_labels"
    ]
    # the champion rule decided (evaluation.comparison): the most complex model that beats every
    # simpler one, on ROC-AUC; a first registered version is the champion, whichever model it is
    dag_run_id = client.get_run(parent_id.pop()).data.tags["dag_run_id"]
    config, caller = ads_pipeline.from_airflow(conf, "ads_relevance_agpo", dag_run_id, try_number=2)
    root = ads_pipeline.layout(config)
    decision = json.loads((root.student / "registration.json").read_text())
    metrics = json.loads((root.student / "eval" / "metrics.json").read_text())
    expected = champion_candidate(metrics, "roc_auc_relevant")
    assert decision["candidate"] == expected["candidate"] and decision["reason"].startswith(expected["reason"])
    assert by_stage["register"].data.tags["promotion_reason"] == decision["reason"]
    assert decision["teacher_skipped"] is None and parent["teacher"] == "used"
    assert "diff_student_vs_gold_only_macro_f1_low" in by_stage["evaluate"].data.metrics
    assert "differences.png" in evaluate_artifacts
    assert decision["promoted"] and decision["version"] == 1
    champion = client.get_model_version_by_alias(tracking.registered_model, "champion")
    assert int(champion.version) == 1 and champion.run_id == by_stage["register"].info.run_id

    # the DAG's assets: pairs, labels and student updated once each, the champion only on a promotion
    with sqlite3.connect(home / "airflow.db") as db:
        events = db.execute("SELECT a.uri, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id").fetchall()
    updated = ["x-agpo://ads-relevance/labels", "x-agpo://ads-relevance/pairs", "x-agpo://ads-relevance/student"]
    assert sorted(uri for uri, _ in events) == sorted(
        updated + ["x-agpo://ads-relevance/champion"] * decision["promoted"]
    )
    extras = {uri: json.loads(extra) for uri, extra in events}
    assert extras["x-agpo://ads-relevance/student"]["path"] == str(root.student / "model")

    # a retry of the distil task after its work finished but before it reported success
    weights = load_file(root.student / "model" / "model.safetensors")
    (root.steps / f"distil{SUCCESS}").unlink()
    outputs = ads_pipeline.distil(config, caller=caller)
    assert Path(outputs["model"]) == root.student / "model"
    again = load_file(root.student / "model" / "model.safetensors")
    assert all(np.array_equal(weights[k].numpy(), again[k].numpy()) for k in weights)  # resumed, not retrained
    ads_pipeline.register(config, caller=caller)  # a finished task rerun: no-op
    children = client.search_runs([experiment], filter_string="tags.`agpo.kind` = 'stage'")
    assert len(children) == len(STAGES)
    registered = client.search_model_versions(f"name = '{tracking.registered_model}'")
    assert len(registered) == int(decision["version"] is not None)  # never registered twice

    # the README's "After the demo" commands, exactly as written, in a folder laid out as a clone after `make
    # demo` (its work/runs/demo is this run, work/mlflow this run's store, .venv the project's)
    clone = tmp_path / "clone"
    (clone / "work" / "runs").mkdir(parents=True)
    (clone / "work" / "runs" / "demo").symlink_to(root.root)
    (clone / "work" / "mlflow").symlink_to(folder / "mlflow")
    (clone / ".venv").symlink_to(Path(sys.executable).parent.parent)
    (clone / "new_pairs.csv").write_text("query,ad_title\nred running shoes,Nike running shoes red\ngarden hose,Lamp\n")
    for command in readme_commands("### After the demo"):
        done = subprocess.run(
            ["bash", "-c", command], cwd=clone, env=plain_env(), capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, (
            command,
            done.stdout[-2000:],
            done.stderr[-2000:],
        )
    assert (root.root / "review" / "tasks.json").is_file() and (root.root / "score" / "summary.json").is_file()
    assert (root.root / "score-new" / "summary.json").is_file()

    # the README's "Serving" commands as written: the champion (whichever model the rule registered), then the
    # run's student folder, each answering as that model does
    served = run_serving_block(clone)
    assert len(served) == 2 and all(len(predictions) == 1 for predictions in served)  # the champion, the folder
    request = pd.DataFrame({"query": ["red shoes"], "ad_title": ["nike running shoes, red"]})  # the README's curl
    with global_tracking_uri(tracking_uri(tracking)):
        champion_model = mlflow.pyfunc.load_model(f"models:/{tracking.registered_model}@champion")
    expected_probs = champion_model.predict(request)[[f"p_{k}" for k in range(4)]].to_numpy()[0]
    assert np.allclose([served[0][0][f"p_{k}"] for k in range(4)], expected_probs, atol=1e-6)
    student_probs = RelevanceStudent.load(root.student / "model").predict_proba(
        ["red shoes"], ["nike running shoes, red"]
    )
    assert np.allclose([served[1][0][f"p_{k}"] for k in range(4)], student_probs[0], atol=1e-4)
    assert (root.root / "score-champion" / "summary.json").is_file()


NEW_SHARE = 0.1  # week 2: a tenth more unlabeled pairs, the same gold


def test_week_two_reuses_the_teacher_labels_only_the_new_pairs_and_registers_only_a_winner(week_one, dag_test):
    """Issue 60's loop: the week after, with 10 % new pairs and the same gold, the DAG reuses the registered
    teacher (no SFT, no RL), the label cache answers every old pair, the student learns from all labels and the
    champion rule compares it with the champion on the same test pairs."""
    _, env, worker, folder, _ = week_one
    [week_one_root] = [p.parent.parent for p in (folder / "runs").glob("*/steps/register_SUCCESS.json")]
    pairs = pq.read_table(week_one_root / "data" / "pairs.parquet")
    unlabeled = [row for row in pairs.to_pylist() if row["split"] == "unlabeled"]
    new = [
        {**row, "pair_id": f"week-2-{k}", "query": f"{row['query']} week two {k}"}
        for k, row in enumerate(unlabeled[: round(NEW_SHARE * len(unlabeled))])
    ]
    week_two_pairs = folder / "week-2" / "pairs.parquet"
    week_two_pairs.parent.mkdir()
    pq.write_table(pa.concat_tables([pairs, pa.Table.from_pylist(new, schema=pairs.schema)]), week_two_pairs)
    conf = {
        **WEEK_ONE,
        "pairs": str(week_two_pairs),
        "run_name": "week-2",
        "teacher_from": "current",  # what a scheduled run takes unasked (pipelines.ads.pipeline.weekly_params)
    }
    done = dag_test({**env, **worker}, "ads_relevance_agpo", conf, timeout=1200)
    root = folder / "runs" / "week-2"

    reuse = json.loads((root / "teacher_reuse.json").read_text())
    assert reuse["reuse"] and reuse["gold_change"] == 0.0, reuse
    assert not (root / "teacher" / "sft").exists() and not (root / "teacher" / "rl" / "metrics.jsonl").exists()
    old_texts = {(row["query"], row["ad_title"]) for row in unlabeled}
    annotation = json.loads((root / "annotate" / "summary.json").read_text())
    assert annotation["cache_hits"] == len(old_texts) and annotation["cache_misses"] == len(new), annotation
    labels = {
        week: {row["pair_id"]: row["grade"] for row in pq.read_table(path / "annotate" / "labels").to_pylist()}
        for week, path in (("one", week_one_root), ("two", root))
    }
    assert {k: v for k, v in labels["two"].items() if not k.startswith("week-2-")} == labels["one"]
    distilled = json.loads((root / "student" / "distil.json").read_text())
    assert distilled["training_pairs_by_source"]["teacher"] == len(unlabeled) + len(new)

    # the champion rule against the champion on the same test pairs: the alias moves only to a winner
    decision = json.loads((root / "student" / "registration.json").read_text())
    client = MlflowClient(tracking_uri(TrackingConfig(store_dir=str(folder / "mlflow"))))
    champion = client.get_model_version_by_alias("ads-relevance-student", "champion")
    assert int(champion.version) == (decision["version"] if decision["promoted"] else 1), decision
    assert (
        decision["test_pairs_sha256"]
        == json.loads((week_one_root / "student" / "registration.json").read_text())["test_pairs_sha256"]
    )
    assert "train: RL skipped: reusing teacher ads-relevance-student-teacher/1" in done.stdout + done.stderr


def run_serving_block(clone: Path) -> list[list[dict]]:
    """Run the README's Serving block in ``clone`` as a newcomer would: each ``agpo serve`` started (in the
    background, as in its own terminal) until it answers, asked with the block's ``curl`` commands, then
    stopped with SIGTERM (Ctrl-C's twin) leaving nothing on the port; the other commands run in order. Returns
    each server's predictions."""
    commands = readme_commands("## Serving")
    servers = [c for c in commands if c.split(" && ", 1)[1].startswith("agpo serve")]
    requests = [c for c in commands if c.split(" && ", 1)[1].startswith("curl ")]
    assert len(servers) == 2 and len(requests) == 1, commands
    served = []
    for command in servers:
        log = clone / "serve.log"
        with log.open("w") as out:  # its own session: a terminal's foreground job, which Ctrl-C interrupts
            server = subprocess.Popen(
                ["bash", "-c", command], cwd=clone, env=plain_env(), stdout=out, stderr=out, start_new_session=True
            )
            try:
                wait_for_ping(server, log)
                for request in requests:
                    done = subprocess.run(
                        ["bash", "-c", request], cwd=clone, env=plain_env(), capture_output=True, text=True, timeout=60
                    )
                    assert done.returncode == 0, (request, done.stderr)
                    served.append(json.loads(done.stdout)["predictions"])
            finally:
                os.killpg(server.pid, signal.SIGINT)  # Ctrl-C
                assert server.wait(timeout=30) == 0, log.read_text()[-2000:]
        assert "Traceback" not in log.read_text()
        with pytest.raises(OSError):  # the server is gone
            urllib.request.urlopen("http://127.0.0.1:5001/ping", timeout=2)
    for command in commands:
        if command not in servers and command not in requests:
            done = subprocess.run(
                ["bash", "-c", command], cwd=clone, env=plain_env(), capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stderr[-2000:])
    return served


def wait_for_ping(server: subprocess.Popen, log: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while True:
        assert server.poll() is None, log.read_text()[-2000:]
        try:
            with urllib.request.urlopen("http://127.0.0.1:5001/ping", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"no answer on 127.0.0.1:5001/ping within {seconds} s"
        time.sleep(0.5)


def readme_commands(heading: str) -> list[str]:
    """The commands of the first bash block under ``heading`` in the README (a line ending in a backslash
    continues on the next), comments cut, each prefixed with the block's first line (``source
    .venv/bin/activate``) as a newcomer's shell would have run it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text[text.index(heading) :].split("```bash\n", 1)[1].split("```", 1)[0]
    block = re.sub(r"\\\n\s*", "", block)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()]
    setup, *commands = [line for line in lines if line]
    assert setup == "source .venv/bin/activate", setup
    return [f"{setup} && {command}" for command in commands]


def plain_env() -> dict[str, str]:
    """A newcomer's environment: no venv on PATH, no MLflow URI, offline."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AGPO_", "VIRTUAL_ENV"))}
    return {**keep, "PATH": "/usr/local/bin:/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
