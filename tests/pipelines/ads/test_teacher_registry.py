"""The registered teacher, reused (issue 60 item 1): the reuse rule on its own, then on a real SQLite store a tiny
run whose teacher passes its gates: the gate registers nothing, the register step (the one that may move aliases on
the stack) registers it as ``current``, once, a retry included; a second run started from ``models:/...@current``
(one gold grade changed) that skips SFT and RL, labels with the reused teacher's verified bytes and registers no
teacher; a teacher below its gate that leaves ``current`` alone; and gold changed past the threshold, which
retrains."""

import json
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.distillation.evidence import gold_pairs_digest
from pipelines.ads.intake.contracts import pairs_table, write_table
from pipelines.ads.pipeline import AdsPipelineConfig
from pipelines.ads.serving import teacher_registry
from pipelines.ads.teacher.gate import TeacherReuseConfig, gold_change, reuse_verdict
from pipelines.config import load_config
from pipelines.errors import StepSkipped
from pipelines.tracking import STAGE, import_mlflow, tracking_uri

TEACHER = "ads-relevance-student-teacher"
CURRENT = f"models:/{TEACHER}@current"


@pytest.mark.parametrize(
    ("mode", "change", "failure", "reused"),
    [
        ("auto", 0.05, None, True),
        ("auto", 0.2, None, False),  # gold changed past the threshold: retrain
        ("auto", None, None, True),  # a folder: no gold recorded, judged on the audit pairs alone
        ("auto", 0.0, "audit accuracy too low", False),
        ("always", 0.9, None, True),
        ("never", 0.0, None, False),
    ],
)
def test_the_reuse_rule(mode, change, failure, reused):
    verdict, reason = reuse_verdict(TeacherReuseConfig(mode=mode, retrain_gold_change=0.1), change, failure)
    assert verdict is reused and reason


def test_gold_change_counts_pairs_added_and_removed_over_the_trained_ones():
    assert gold_change({"a", "b", "c", "d"}, {"a", "b", "c", "d"}) == 0.0
    assert gold_change({"a", "b", "c", "d"}, {"a", "b", "c", "e"}) == 0.5  # one changed: one out, one in


@pytest.mark.parametrize(("key", "value"), [("mode", "sometimes"), ("retrain_gold_change", 1.5)])
def test_a_bad_reuse_setting_is_a_config_error(key, value):
    with pytest.raises(ValueError, match=f"teacher_reuse.{key}"):
        TeacherReuseConfig(**{key: value})


def test_current_names_the_teacher_model_of_the_run(tmp_path):
    config = run_config(tmp_path, "r", "teacher_reuse.source=current", "tracking.registered_model=ads-x")
    assert teacher_registry.source_of(config) == "models:/ads-x-teacher@current"
    named = run_config(tmp_path, "r", "teacher_reuse.source=current", "teacher_reuse.registered_model=t")
    assert teacher_registry.source_of(named) == "models:/t@current"
    assert teacher_registry.source_of(run_config(tmp_path, "r", "teacher_reuse.source=/a/folder")) == "/a/folder"


def run_config(work, run_id, *overrides) -> AdsPipelineConfig:
    settings = [f"out_dir={work}/runs", f"run_id={run_id}", f"tracking.store_dir={work}/mlflow"]
    # the student's steps at the least work: the register step is what matters here
    least = ["distil.training.epochs=1", "gold_student=false", "evaluate.baselines.names=[lexical]"]
    return load_config(
        AdsPipelineConfig,
        ["configs/pipeline/tiny-test.yaml"],
        [*settings, "tracking.system_metrics_seconds=0", *least, "evaluate.bootstrap.samples=100", *overrides],
    )


def client_of(config):
    uri = tracking_uri(config.tracking)
    return import_mlflow().MlflowClient(tracking_uri=uri, registry_uri=uri)


def with_train_grades_changed(config, count: int, path):
    """The run's pairs with the gold grade of ``count`` train pairs changed."""
    rows = pq.read_table(ads_pipeline.pairs_path(config)).to_pylist()
    train = [row for row in rows if row["split"] == "train" and row["gold_grade"] is not None]
    for row in train[:count]:
        row["gold_grade"] = (row["gold_grade"] + 1) % 4
    return write_table(pairs_table(rows), path)


def label_and_register(config) -> dict:
    """The steps after the gate, to the register step; returns the registration record."""
    for shard in ads_pipeline.partition_shards(config):
        ads_pipeline.annotate_shard(config, shard)
    ads_pipeline.merge(config)
    ads_pipeline.distil(config)
    ads_pipeline.evaluate(config)
    return json.loads(Path(ads_pipeline.register(config)["registration"]).read_text())


def registered_teachers(config) -> list:
    return client_of(config).search_registered_models(f"name = '{TEACHER}'")


@pytest.fixture(scope="module")
def week1(tmp_path_factory):
    """A tiny run, every step (SFT, RL, the gate, annotation, the student, the register step, which registers the
    teacher); about 35 s on 2 cores. Also returns the teacher models registered right after the gate."""
    work = tmp_path_factory.mktemp("teacher-registry")
    config = run_config(work, "week1")
    for step in (ads_pipeline.validate, ads_pipeline.build_teacher, ads_pipeline.train, ads_pipeline.gate):
        step(config)
    after_gate = registered_teachers(config)
    return work, config, after_gate, label_and_register(config)


@pytest.mark.integration
def test_a_teacher_that_passes_its_gates_is_registered_as_current_by_the_register_step(week1):
    _, config, after_gate, decision = week1
    assert after_gate == []  # the gate step, a task like any other, registers nothing
    assert decision["teacher_registration"] == {"model": TEACHER, "version": 1, "alias": "current"}
    client = client_of(config)
    version = client.get_model_version_by_alias(TEACHER, "current")
    assert str(version.version) == "1" and client.get_run(version.run_id).data.tags[STAGE] == "register"
    root = ads_pipeline.layout(config)
    tags = version.tags
    assert tags[teacher_registry.FILES_TAG] == teacher_registry.teacher_digest(root.rl / "model")
    gold = teacher_registry.gold_train(ads_pipeline.pairs_path(config))
    assert tags[teacher_registry.GOLD_TAG] == gold_pairs_digest(gold) and tags["gold_train_pairs"] == str(len(gold))
    assert tags[teacher_registry.KEYS_RUN_TAG] == version.run_id
    assert tags["prompt_version"] == json.loads((root.rl / "summary.json").read_text())["prompt_version"]
    assert "gate_threshold" in tags and float(tags["gate_audit_accuracy_end"]) >= 0.0


@pytest.mark.integration
def test_a_retried_register_step_finds_the_teacher_version_it_created(week1):
    _, config, _, decision = week1
    client, root = client_of(config), ads_pipeline.layout(config)
    register_run = client.get_model_version(TEACHER, "1").run_id
    client.update_run(register_run, status="FAILED")  # as a try killed after registering, before its record
    (root.steps / "register_SUCCESS.json").unlink()
    again = json.loads(Path(ads_pipeline.register(config)["registration"]).read_text())
    assert again["teacher_registration"] == decision["teacher_registration"]
    assert len(client.search_model_versions(f"name = '{TEACHER}'")) == 1
    assert str(client.get_model_version_by_alias(TEACHER, "current").version) == "1"


@pytest.mark.integration
def test_a_run_from_the_current_teacher_skips_sft_and_rl_and_labels_with_it(week1, tmp_path, capsys):
    work, first, _, _ = week1
    pairs = with_train_grades_changed(first, 1, tmp_path / "pairs.parquet")  # 2 keys of ~180: below 10 %
    config = run_config(work, "week2", f"pairs={pairs}", "teacher_reuse.source=current")  # models:/TEACHER@current
    ads_pipeline.validate(config)
    ads_pipeline.build_teacher(config)
    ads_pipeline.train(config)
    ads_pipeline.gate(config)
    registration = label_and_register(config)["teacher_registration"]
    root, said = ads_pipeline.layout(config), capsys.readouterr().out
    assert "teacher: SFT skipped: reusing teacher" in said and "train: RL skipped: reusing teacher" in said
    assert not root.sft.exists() and not (root.rl / "metrics.jsonl").exists()  # no SFT, no RL step
    decision = json.loads((root.root / teacher_registry.RECORD).read_text())
    assert decision["reuse"] and decision["teacher"] == f"{TEACHER}/1" and 0 < decision["gold_change"] < 0.1
    version = client_of(config).get_model_version(TEACHER, "1")
    assert teacher_registry.teacher_digest(root.rl / "model") == version.tags[teacher_registry.FILES_TAG]
    assert pq.read_table(root.annotate / "labels").num_rows > 0  # labelled by the reused teacher, in rl/model
    assert registration["version"] is None and f"reused teacher {TEACHER}/1" in registration["reason"]
    assert len(client_of(config).search_model_versions(f"name = '{TEACHER}'")) == 1  # not registered again


@pytest.mark.integration
def test_a_teacher_below_its_gate_does_not_move_current(week1):
    work, first, _, _ = week1
    config = replace(run_config(work, "week3"), min_audit_accuracy=1.01)
    rl = ads_pipeline.layout(config).rl
    rl.mkdir(parents=True)
    (rl / "summary.json").write_text((ads_pipeline.layout(first).rl / "summary.json").read_text())
    with pytest.raises(StepSkipped):
        ads_pipeline.gate(config)
    skipped = ads_pipeline.teacher_skipped(config)
    place, pairs = ads_pipeline.layout(config), ads_pipeline.pairs_path(config)
    with ads_pipeline.pipeline_run(config, ads_pipeline.CLI).tracker().stage("register", {}) as log:
        registration = teacher_registry.register_teacher(config, log, place, pairs, skipped)["teacher_registration"]
        assert registration["version"] is None and "skipped at the gate step" in registration["reason"]
        # without its record, a gate that never passed still registers nothing
        registration = teacher_registry.register_teacher(config, log, place, pairs, None)["teacher_registration"]
        assert registration["version"] is None and "the gate step has not passed" in registration["reason"]
    client = client_of(config)
    assert str(client.get_registered_model(TEACHER).aliases["current"]) == "1"
    assert len(client.search_model_versions(f"name = '{TEACHER}'")) == 1


@pytest.mark.integration
def test_gold_changed_past_the_threshold_retrains(week1, tmp_path, capsys):
    work, first, _, _ = week1
    pairs = with_train_grades_changed(first, 40, tmp_path / "pairs.parquet")
    config = run_config(work, "week4", f"pairs={pairs}", f"teacher_reuse.source={CURRENT}")
    place = ads_pipeline.layout(config)
    assert (
        teacher_registry.reuse_step(config, ads_pipeline.pipeline_run(config, ads_pipeline.CLI), place, pairs) is None
    )
    decision = json.loads((place.root / teacher_registry.RECORD).read_text())
    assert not decision["reuse"] and "retrain_gold_change" in decision["reason"] and decision["gold_change"] > 0.1
    assert "training a new teacher" in capsys.readouterr().out and not place.rl.exists()
