"""MLflow tracking on a real SQLite store: parent/child runs reattached on retries, params without
secrets, datasets with digests, the champion rule (the run's student must beat the gold-only student and the
strongest baseline beyond their intervals, else the gold-only student may, else nothing) and the champion alias
moved only by a better candidate."""

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evaluation.bootstrap import METRICS
from evaluation.comparison import champion_candidate
from evaluation.lexical import LexicalMatcher
from pipelines.ads.serving.registry import Evaluation, promotion_decision, register_champion, register_student
from pipelines.config import flatten
from pipelines.io import complete_rows
from pipelines.tracking import (
    CHAMPION_METRICS,
    Tracker,
    TrackingConfig,
    global_tracking_uri,
    metric_name,
    pipeline_runs,
    tracking_uri,
)


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # the tests' figures are macro-F1 (the default metric is ROC-AUC; the rule reads whichever is set)
    store = str(tmp_path / "mlflow")
    return TrackingConfig(
        experiment="unit", store_dir=store, registered_model="unit-student", champion_metric="macro_f1"
    )


def stage_runs(tracker, stage):
    query = f"tags.`agpo.stage` = '{stage}'"
    return tracker.client.search_runs([tracker.experiment_id], filter_string=query)


def test_flatten_leaves_secrets_out_and_dots_nested_keys():
    flat = flatten({"trainer": {"lr": 0.1, "max_new_tokens": 24}, "api_key": "s3cret", "db": {"password": "x"}})
    assert flat == {"trainer.lr": "0.1", "trainer.max_new_tokens": "24"}


SECRET_NAMES = [
    "api_token",
    "hf_token",
    "access_token",
    "token",
    "auth_header",
    "oauth",
    "db_dsn",
    "aws_secret_access_key",
    "private_key",
    "apikey",
    "apiKey",
    "mlflowpassword",
    "passwd",
    "credentials",
    "api_tokens",
]
KEPT_NAMES = ["max_new_tokens", "generated_tokens", "token_budget", "token_weights", "chat_tokenizer", "keep_last"]
STAGE_HELP = Path(__file__).resolve().parents[2] / "pipelines" / "stage_help.json"


def test_secret_looking_names_are_left_out_by_substring_and_config_keys_are_kept():
    flat = flatten({"engine_options": {name: "x" for name in SECRET_NAMES + KEPT_NAMES}, "db": {"url": "y"}})
    assert flat == {**{f"engine_options.{name}": "x" for name in KEPT_NAMES}, "db.url": "y"}
    # every key of every stage's config reaches MLflow: a new key with a stem belongs in NOT_SECRET_KEYS
    keys = {line.split()[0] for lines in json.loads(STAGE_HELP.read_text()).values() for line in lines}
    assert keys and not [key for key in keys if key not in flatten({key: 1})]


def test_user_info_in_url_values_is_redacted():
    flat = flatten(
        {
            "tracking_uri": "postgresql://mlflow:s3cret@db:5432/mlflow",
            "remote": {"mirrors": ["https://ghp_abc@github.com/org/repo.git", "s3://bucket/pairs"]},
            "note": "see http://user:pw@host/a and mailto:team@example.com",
        }
    )
    assert flat == {
        "tracking_uri": "postgresql://***@db:5432/mlflow",
        "remote.mirrors": "['https://***@github.com/org/repo.git', 's3://bucket/pairs']",
        "note": "see http://***@host/a and mailto:team@example.com",
    }


def test_secret_query_parameters_are_redacted_and_print_config_masks_what_mlflow_leaves_out():
    from pipelines.config import public_params

    uri = "postgresql://db/mlflow?user=m&password=s3cret&sslmode=require;token=t0k"
    assert flatten({"tracking_uri": uri}) == {
        "tracking_uri": "postgresql://db/mlflow?user=m&password=***&sslmode=require;token=***"
    }
    config = {"engine_options": {"hf_token": "hf_abc", "api_key": None, "max_tokens": 8}, "db": ["x://u:p@h"]}
    assert public_params(config, masked=True) == {
        "engine_options": {"hf_token": "***", "api_key": None, "max_tokens": 8},
        "db": ["x://***@h"],
    }
    assert public_params(config) == {"engine_options": {"max_tokens": 8}, "db": ["x://***@h"]}


def test_a_retry_attaches_to_the_same_runs_and_a_finished_stage_logs_nothing_again(tracking, tmp_path):
    first = Tracker(tracking, "dag/run-1", {"try_number": "1"})
    with pytest.raises(RuntimeError), first.stage("train", {"lr": 0.1}) as log:
        log.log_metrics({"loss": 1.0}, step=1)
        raise RuntimeError("killed")
    assert stage_runs(first, "train")[0].info.status == "FAILED"
    retry = Tracker(tracking, "dag/run-1", {"try_number": "2"})
    assert retry.parent_id == first.parent_id
    with retry.stage("train", {"lr": 0.1}, try_number=2) as log:
        log.log_step_metrics([{"step": 1, "loss": 0.9}, {"step": 2, "loss": 0.8}])
    runs = stage_runs(retry, "train")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["try_number"] == "2" and runs[0].data.params == {"lr": "0.1"}
    assert runs[0].data.tags["mlflow.parentRunId"] == first.parent_id
    with retry.stage("train", {"lr": 0.1}) as log:
        assert log is None  # finished: nothing is logged twice
    history = retry.client.get_metric_history(runs[0].info.run_id, "loss")
    # the failed try's point stays (it happened); the retry's points are logged once
    assert sorted((m.step, m.value) for m in history) == [(1, 0.9), (1, 1.0), (2, 0.8)]


def test_the_parent_run_holds_the_resolved_pipeline_config_as_params(tracking):
    from pipelines.ads.pipeline_config import AdsPipelineConfig
    from pipelines.config import to_dict

    config = to_dict(AdsPipelineConfig())
    first = Tracker(tracking, "dag/run-p", {"try_number": "1"}, config)
    params = first.client.get_run(first.parent_id).data.params
    assert len(params) == len(flatten(config)) > 100  # more than one of MLflow's batches
    assert params["train.trainer.algorithm"] == "agpo" and params["annotate.voting.votes"] == "4"
    retry = Tracker(tracking, "dag/run-p", {"try_number": "2"}, config)  # a retry logs nothing twice
    assert retry.client.get_run(retry.parent_id).data.params == params


def test_datasets_are_logged_with_their_digest(tracking, tmp_path):
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"pair_id": ["a", "b"], "query": ["red shoes", "phone"]}), path)
    tracker = Tracker(tracking, "dag/run-2")
    with tracker.stage("validate", {}) as log:
        digest = log.log_dataset(pq.read_table(path), path, "pairs", "training")
    run = tracker.client.get_run(stage_runs(tracker, "validate")[0].info.run_id)
    inputs = run.inputs.dataset_inputs
    assert [(i.dataset.name, i.dataset.digest) for i in inputs] == [("pairs", digest)]


def test_the_champion_alias_moves_only_to_a_better_student(tracking, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    decisions = []
    baselines = {"zero_shot": {"macro_f1": 0.35}, "lexical": {"macro_f1": 0.40}}
    for run_number, macro_f1 in enumerate([0.60, 0.55, 0.70]):
        tracker = Tracker(tracking, f"dag/run-{run_number}")
        with tracker.stage("register", {}) as log:
            decisions.append(register_student(tracker, log, model, Evaluation({"macro_f1": macro_f1}, baselines)))
            # a retry of the same task registers nothing new and keeps the decision
            again = register_student(tracker, log, model, Evaluation({"macro_f1": macro_f1}, baselines))
            assert (again["version"], again["promoted"]) == (run_number + 1, decisions[-1]["promoted"])
        tracker.finish()
    assert [(d["version"], d["promoted"]) for d in decisions] == [(1, True), (2, False), (3, True)]
    assert decisions[1]["reason"] == "kept as challenger: macro_f1 0.5500 does not beat champion version 1's 0.6000"
    champion = tracker.client.get_model_version_by_alias("unit-student", "champion")
    assert int(champion.version) == 3 and champion.tags["test_lexical_macro_f1"] == "0.4"
    # the version is its run's LoggedModel "student", logged once in each run (retry or not), its test metrics
    # linked to it, its model card the description with the baselines beside it
    # in the registry experiment, apart from the runs (where only the registrar writes on a shared server)
    models = tracker.client.search_logged_models([tracker.registry_experiment_id()], filter_string="name = 'student'")
    assert len(models) == 3 and len({m.source_run_id for m in models}) == 3
    model = tracker.client.get_logged_model(champion.source.removeprefix("models:/"))  # SQLite keeps no model_id
    assert model.name == "student" and model.source_run_id == champion.run_id
    assert model.status == "READY" and {(m.key, m.value) for m in model.metrics} == {("student/test_macro_f1", 0.7)}
    assert "| macro_f1 | 0.7000 | 0.3500 | 0.4000 |" in champion.description
    assert len(pipeline_runs(tracking)) == 3
    experiment = tracker.client.get_experiment(tracker.experiment_id)  # the UI opens it as model training
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_a_registry_error_while_reading_the_champion_fails_the_step_and_promotes_nothing(tracking, tmp_path):
    """A 5xx (after the client's retries) on the champion read used to read as "no champion yet": the
    candidate became the champion over a better one. Now the error fails the step, to be retried, and the
    alias stays where it was. The registry answers 503 once, on the first read after the version exists."""
    from mlflow.exceptions import MlflowException

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    first = Tracker(tracking, "dag/run-0")
    with first.stage("register", {}) as log:
        register_student(first, log, model, Evaluation({"macro_f1": 0.60}))
    first.finish()
    tracker = Tracker(tracking, "dag/run-1")
    client, outage = tracker.client, []
    create, reads = client.create_model_version, (client.get_registered_model, client.get_model_version_by_alias)

    def creating(*args, **kwargs):
        outage.append("503")  # the next read of the registry fails, once
        return create(*args, **kwargs)

    def failing(read):
        def read_once_failing(*args, **kwargs):
            if outage:
                raise MlflowException(f"API request failed: {outage.pop()}", error_code="TEMPORARILY_UNAVAILABLE")
            return read(*args, **kwargs)

        return read_once_failing

    # the registry server failing: outside the product, so faked
    client.create_model_version = creating
    client.get_registered_model, client.get_model_version_by_alias = (failing(read) for read in reads)
    with tracker.stage("register", {}) as log, pytest.raises(MlflowException, match="503"):
        register_student(tracker, log, model, Evaluation({"macro_f1": 0.10}))
    assert int(first.client.get_model_version_by_alias("unit-student", "champion").version) == 1


def interval(difference: float, low: float, high: float) -> dict:
    return {"difference": difference, "low": low, "high": high, "samples_used": 1000}


MODELS = ("student", "gold_only", "zero_shot", "lexical")  # agpo evaluate's order: each against those after it
TIE = (0.0, -0.05, 0.05)


def report(models=MODELS, zero_shot=0.35, **intervals) -> dict:
    """An evaluation report (agpo evaluate's metrics.json) of ``models`` with these macro-F1 intervals
    (``student_gold_only=(difference, low, high)`` for "student - gold_only"); every other difference a tie."""
    figures = {"student": 0.6, "gold_only": 0.7, "zero_shot": zero_shot, "lexical": 0.4}
    differences = {
        f"{a} - {b}": {"macro_f1": interval(*intervals.get(f"{a}_{b}", TIE))}
        for i, a in enumerate(models)
        for b in models[i + 1 :]
    }
    return {
        "models": {name: {"macro_f1": figures[name]} for name in models},
        "differences": differences,
        "strongest_baseline": {"macro_f1": "lexical"},
    }


WINS = (0.1, 0.05, 0.15)


def test_the_champion_rule_picks_the_most_complex_model_that_beats_every_simpler_one():
    wins = champion_candidate(
        report(student_gold_only=(0.05, 0.01, 0.09), student_zero_shot=WINS, student_lexical=WINS), "macro_f1"
    )
    assert wins["candidate"] == "student" and wins["teacher_added"].startswith("teacher labels added +0.050")
    # teacher labels that hurt: the gold-only student, which beats both baselines, and the reason says by how much
    hurts = champion_candidate(
        report(student_gold_only=(-0.117, -0.15, -0.09), gold_only_zero_shot=WINS, gold_only_lexical=WINS), "macro_f1"
    )
    assert hurts["candidate"] == "gold_only"
    assert "teacher labels added -0.117 [-0.150, -0.090] macro_f1" in hurts["reason"]
    # a student that beats the baselines but ties the gold-only student: the simpler gold-only student
    tie = champion_candidate(
        report(student_zero_shot=WINS, student_lexical=WINS, gold_only_zero_shot=WINS, gold_only_lexical=WINS),
        "macro_f1",
    )
    assert tie["candidate"] == "gold_only"
    # students that tie the baselines: the strongest baseline, the floor, even where the other one is not beaten
    # beyond its interval (the shipped model is never below a baseline on the metric); a tie goes to the matcher
    encoder = champion_candidate(report(zero_shot=0.45), "macro_f1")
    assert encoder["candidate"] == encoder["strongest_baseline"] == "zero_shot"
    assert "the zero-shot encoder is the candidate on macro_f1: the strongest baseline" in encoder["reason"]
    assert "strongest baseline zero_shot: lexical 0.4000, zero_shot 0.4500" in encoder["reason"]
    simplest = champion_candidate(report(student_lexical=WINS), "macro_f1")  # ties zero-shot: not every simpler one
    assert simplest["candidate"] == "lexical"
    assert "the gold-only student, the pipeline's student did not beat every simpler model" in simplest["reason"]
    assert champion_candidate(report(zero_shot=0.4), "macro_f1")["candidate"] == "lexical"
    # a run whose teacher was skipped: no gold-only row, the student is the gold-only student
    skipped = champion_candidate(
        report(("student", "zero_shot", "lexical"), student_zero_shot=WINS, student_lexical=WINS), "macro_f1"
    )
    assert skipped["candidate"] == "student" and skipped["teacher_added"] is None
    unscored = champion_candidate({"models": {}, "differences": {}}, "macro_f1")
    assert unscored["candidate"] is None and "no baseline was scored" in unscored["reason"]
    # students with no baseline scored (baselines off): no floor to clear, so nothing is registered unmeasured
    no_floor = champion_candidate(report(("student", "gold_only"), student_gold_only=WINS), "macro_f1")
    assert no_floor["candidate"] is None and "nothing is registered" in no_floor["reason"]
    assert set(CHAMPION_METRICS) == set(METRICS)  # every champion metric has bootstrap intervals
    assert TrackingConfig().champion_metric == "roc_auc_relevant"
    with pytest.raises(ValueError, match="champion_metric must be one of"):
        TrackingConfig(champion_metric="accuracy")


def test_register_champion_registers_the_candidates_folder_a_baseline_included(tracking, tmp_path):
    folders = {}
    for name in ("student", "gold_only"):
        folders[name] = tmp_path / name / "model"
        folders[name].mkdir(parents=True)
        (folders[name] / "config.json").write_text(json.dumps({"student_kind": "cross"}))
    tracker = Tracker(tracking, "dag/run-rule")
    hurts = report(student_gold_only=(-0.117, -0.15, -0.09), gold_only_zero_shot=WINS, gold_only_lexical=WINS)
    with tracker.stage("register", {}) as log:
        decision = register_champion(tracker, log, hurts, folders)
    assert (decision["candidate"], decision["version"], decision["promoted"]) == ("gold_only", 1, True)
    version = tracker.client.get_model_version("unit-student", "1")
    both = [tracker.experiment_id, tracker.registry_experiment_id()]
    logged = {m.name: m.model_id for m in tracker.client.search_logged_models(both)}
    assert logged.keys() == {"student", "gold_only"} and version.source == f"models:/{logged['gold_only']}"
    assert decision["challenger"] == 0.7 and "the gold-only student is the candidate" in decision["reason"]
    tracker.finish()
    # nothing beats the lexical matcher: it is registered from the folder evaluate saved it in, and served
    lexical = LexicalMatcher(4).fit(["red shoes", "red shoes", "mug"], ["red shoes nike", "blue hat", "mug"], [3, 0, 3])
    loses = {**report(), "baseline_models": {"lexical": str(lexical.save(tmp_path / "baselines" / "lexical"))}}
    tracker = Tracker(tracking, "dag/run-loses")
    plots = [tmp_path / name for name in ("confusion.png", "ranking_curves.png")]  # the student's; every model's
    for plot in plots:
        plot.write_bytes(b"\x89PNG")
    with tracker.stage("register", {}) as log:
        decision = register_champion(tracker, log, loses, folders, figures=plots)
    assert (decision["candidate"], decision["version"]) == ("lexical", 2)
    assert not decision["promoted"] and "does not beat champion version 1's 0.7000" in decision["reason"]
    # the run's student is still logged once, as a LoggedModel of its register run, beside the candidate
    query = f"source_run_id = '{log.run_id}'"
    logged = tracker.client.search_logged_models([tracker.experiment_id, tracker.registry_experiment_id()], query)
    assert sorted(m.name for m in logged) == ["lexical", "student"]
    attached = {
        m.name: [f.path for f in tracker.client.list_logged_model_artifacts(m.model_id, "figures")] for m in logged
    }
    assert attached == {
        "student": ["figures/confusion.png", "figures/ranking_curves.png"],
        "lexical": ["figures/ranking_curves.png"],
    }
    with global_tracking_uri(tracking_uri(tracking)):
        served = mlflow.pyfunc.load_model("models:/unit-student/2")
    frame = served.predict(pd.DataFrame({"query": ["red shoes"], "ad_title": ["red shoes nike"]}))
    expected = lexical.predict_proba(["red shoes"], ["red shoes nike"])[0]
    assert np.allclose(frame[[f"p_{k}" for k in range(4)]].to_numpy()[0], expected, atol=1e-6)
    assert promotion_decision("macro_f1", 0.9, ("2", 0.8))["promoted"]


def test_metric_names_are_made_legal_for_mlflow():
    assert metric_name("ndcg@10") == "ndcg_at_10"
    assert metric_name("eval/audit_maj@4") == "eval/audit_maj_at_4"
    assert metric_name("loss (β=0.1)") == "loss ___0.1_"


def test_live_metrics_log_while_a_step_trains_and_a_retry_logs_no_step_twice(tracking, tmp_path, monkeypatch):
    from pipelines import steps

    monkeypatch.setattr(steps, "LIVE_POLL_SECONDS", 0.02)
    metrics = tmp_path / "train" / "metrics.jsonl"
    metrics.parent.mkdir()
    summary = tmp_path / "train" / "summary.json"
    summary.write_text(json.dumps({"algorithm": "agpo", "audit_accuracy_end": 0.5}))

    def train(log, steps_, value, kill_at=None):
        for step in steps_:
            with metrics.open("a") as handle:
                handle.write(json.dumps({"step": step, "loss": value + step, "eval/acc@1": value}) + "\n")
            if step == kill_at:  # the follower logged steps 1-4 before the block ends
                deadline = time.monotonic() + 10
                while log.client.get_run(log.run_id).data.metrics.get("loss") is None and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert sorted(m.step for m in log.client.get_metric_history(log.run_id, "loss"))[:4] == [1, 2, 3, 4]
                raise RuntimeError(f"killed at step {step}")

    first = Tracker(tracking, "dag/live")
    with pytest.raises(RuntimeError), first.stage("train", {}) as log, steps.live_metrics(log, metrics, every=2):
        train(log, range(1, 9), 0.0, kill_at=5)
    # the retry resumes from the checkpoint of step 4 (restart_metrics cut the file back) and trains 5-8 again
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()[:4]))
    retry = Tracker(tracking, "dag/live", {"try_number": "2"})
    with retry.stage("train", {}, try_number=2) as log:
        with steps.live_metrics(log, metrics, every=2):
            train(log, range(5, 9), 10.0)
        steps.log_training(log, {"metrics": metrics, "summary": summary})
        steps.log_training(log, {"metrics": metrics, "summary": summary})  # again: nothing new
    run_id = stage_runs(retry, "train")[0].info.run_id
    for name, expected in (
        ("loss", list(range(1, 9))),
        ("eval/acc_at_1", list(range(1, 9))),
        ("audit_accuracy_end", [0]),
    ):
        history = retry.client.get_metric_history(run_id, name)
        assert sorted(m.step for m in history) == expected, name
    # step 5 was logged by the killed try (it happened); the retry's 6-8 follow it
    assert sorted((m.step, m.value) for m in retry.client.get_metric_history(run_id, "loss"))[4:] == [
        (5, 5.0),
        (6, 16.0),
        (7, 17.0),
        (8, 18.0),
    ]


def test_the_teacher_is_a_logged_model_of_its_run_with_the_summary_figures(tracking, tmp_path):
    from pipelines.steps import log_training

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    (model / "teacher_prompt.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps({"algorithm": "agpo", "audit_accuracy_end": 0.75}))
    paths = {"model": model, "metrics": tmp_path / "metrics.jsonl", "summary": tmp_path / "summary.json"}
    tracker = Tracker(tracking, "dag/teacher")
    with tracker.stage("train", {}) as log:
        model_id = log.log_model(model, "teacher", {"algorithm": "agpo"})
        assert log.log_model(model, "teacher", {"algorithm": "agpo"}) == model_id  # a retry: the same model
        log_training(log, paths, model_id=model_id)
    logged = tracker.client.get_logged_model(model_id)
    assert (logged.name, logged.source_run_id, logged.status) == ("teacher", log.run_id, "READY")
    assert logged.params == {"algorithm": "agpo"}
    assert {m.key: m.value for m in logged.metrics} == {"audit_accuracy_end": 0.75}
    files = {f.path for f in tracker.client.list_logged_model_artifacts(model_id)}
    assert files == {"model.safetensors", "teacher_prompt.json"}


def test_a_stage_run_samples_system_metrics(tracking, monkeypatch):
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)  # restored afterwards
    tracker = Tracker(replace(tracking, system_metrics_seconds=0.2), "dag/system")
    with tracker.stage("train", {}) as log:
        time.sleep(1.0)
    metrics = tracker.client.get_run(log.run_id).data.metrics
    assert any(name.startswith("system/cpu") for name in metrics), sorted(metrics)
    assert "MLFLOW_TRACKING_URI" not in os.environ  # the global URI was only borrowed


TRAIN_STAGE = "tags.`agpo.stage` = 'train'"


@pytest.mark.integration
def test_a_math_train_step_logs_live_and_its_retry_logs_every_step_exactly_once(small_math_base, tmp_path, monkeypatch):
    """A real math train step (8 tiny steps, checkpoints every 2) that dies at step 6 after its first points
    reached MLflow live, then a retry that resumes from step 4: every metric holds each step once."""
    from mlflow import MlflowClient

    from pipelines import steps
    from pipelines.config import load_config
    from pipelines.math import math_pipeline as math_pipeline
    from pipelines.math.math_train import MathTrainConfig
    from pipelines.rl import stage as rl_stage
    from pipelines.tracking import tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)
    monkeypatch.setattr(steps, "LIVE_POLL_SECONDS", 0.05)
    _, base, math_sets = small_math_base
    trainer = {"max_steps": 8, "rollout.group_size": 4, "rollout.prompts_per_step": 4, "rollout.max_new_tokens": 16}
    trainer |= {"eval_every": 4, "checkpoint.every": 2, "checkpoint.keep": 2}
    sets = {**math_sets, "base_model": base, **{f"trainer.{k}": v for k, v in trainer.items()}}
    train = load_config(MathTrainConfig, [], [f"{key}={value}" for key, value in sets.items()])
    track = TrackingConfig(
        experiment="live", store_dir=str(tmp_path / "mlflow"), live_every=2, system_metrics_seconds=0.5
    )
    config = math_pipeline.MathPipelineConfig(
        run_id="live", out_dir=str(tmp_path / "runs"), train=train, tracking=track
    )
    client = MlflowClient(tracking_uri(track))
    append, live = rl_stage.append_metrics, []

    def append_then_die_at_step_6(path, step, metrics):
        append(path, step, metrics)
        time.sleep(0.1)  # the tiny steps take ~25 ms: without this the try ends before one system-metrics sample
        if step == 6 and not live:
            (run,) = client.search_runs([client.get_experiment_by_name("live").experiment_id], TRAIN_STAGE)
            deadline = time.monotonic() + 20
            while not live and time.monotonic() < deadline:
                live.extend(m.step for m in client.get_metric_history(run.info.run_id, "reward_mean"))
                time.sleep(0.05)
            raise RuntimeError("killed at step 6")

    monkeypatch.setattr(rl_stage, "append_metrics", append_then_die_at_step_6)
    with pytest.raises(RuntimeError, match="killed"):
        math_pipeline.train(config, steps.Caller(dag_run_id="live", try_number=1))
    assert live and max(live) >= 2  # points reached MLflow while the step trained
    math_pipeline.train(config, steps.Caller(dag_run_id="live", try_number=2))

    (run,) = client.search_runs([client.get_experiment_by_name("live").experiment_id], TRAIN_STAGE)
    assert run.info.status == "FINISHED" and run.data.tags["try_number"] == "2"
    rows = complete_rows(tmp_path / "runs" / "live" / "train" / "metrics.jsonl")
    assert [row["step"] for row in rows if "reward_mean" in row] == list(range(1, 9))
    for name in ("reward_mean", "loss", "eval/heldout_pass_at_1"):
        logged = [m.step for m in client.get_metric_history(run.info.run_id, name)]
        assert sorted(logged) == sorted(row["step"] for row in rows if name.replace("_at_", "@") in row), name
    assert any(name.startswith("system/") for name in run.data.metrics)


@pytest.mark.parametrize("name", ["x' or name != '", "a b", "../model", "", "-model", "m" * 129, "mod\nel"])
def test_a_registered_model_name_that_could_reach_into_a_filter_or_a_path_is_refused(name):
    with pytest.raises(ValueError, match="is not a registered model name: use 1-128 letters"):
        TrackingConfig(registered_model=name)


def test_filter_values_cannot_close_their_string():
    from pipelines.tracking import filter_literal

    assert filter_literal("ads-relevance-student") == "'ads-relevance-student'"
    for value in ("x' or name != '", 'x"', "x\\", "x`", "x\n"):
        with pytest.raises(ValueError, match="cannot be written into an MLflow filter"):
            filter_literal(value)
