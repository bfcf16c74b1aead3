"""The pipeline's teacher gates. On hand-written RL summaries: audit accuracy, the one-grade check (a teacher
that answers nearly one grade for every audit pair fails, however accurate skewed gold makes it) and the prior
check. On real SFT of the tiny teacher: a teacher SFT'd on random labels answers at its class prior on held-out
queries and fails before RL, one SFT'd on learnable labels passes, and its checkpoint is chosen on audit."""

import json
import random
import re
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agpo.models import TinyModelConfig
from agpo.sft import SFTConfig
from evaluation.comparison import SIMPLEST_FIRST
from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.distillation.report_page import REPORT_PAGE, verdict
from pipelines.ads.intake.contracts import pairs_table, write_table
from pipelines.ads.pipeline import AdsPipelineConfig
from pipelines.ads.serving import teacher_registry
from pipelines.ads.teacher.warm_start import TeacherConfig
from pipelines.errors import StepSkipped
from pipelines.steps import SUCCESS, PipelineRun
from pipelines.tracking import REPORT_TAG, import_mlflow, pipeline_runs, tracking_uri


class RecordingLog:
    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.tags: dict[str, str] = {}

    def log_metrics(self, metrics):
        self.metrics.update(metrics)

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_step_metrics(self, rows, step_key):
        self.metrics.update({f"{k}@{row[step_key]}": v for row in rows for k, v in row.items() if k != step_key})

    def log_artifact(self, path):
        pass


@pytest.fixture
def gate_log(monkeypatch):
    """The gate's MLflow child run, recorded in memory instead (and no teacher registered: tests/pipelines/ads/
    test_teacher_registry.py registers on a real store)."""
    log = RecordingLog()
    monkeypatch.setattr(teacher_registry, "register_teacher", lambda *args: {})

    class Tracker:
        @contextmanager
        def stage(self, name, params, try_number=1):
            yield log

    monkeypatch.setattr(PipelineRun, "tracker", lambda self: Tracker())
    return log


def write_summary(config: AdsPipelineConfig, **figures) -> None:
    path = ads_pipeline.layout(config).rl / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    balanced = {
        "audit_balanced_accuracy_end": 0.6,
        "audit_balanced_accuracy_prior_end": 0.25,
        "audit_balanced_accuracy_null_se_end": 0.025,
    }
    path.write_text(json.dumps({"audit_accuracy_end": 0.6, **balanced, **figures}))


def shares(*values: float) -> dict[str, float]:
    return {f"audit_predicted/g{g}_end": v for g, v in enumerate(values)}


def test_a_teacher_with_spread_answers_passes(tmp_path, gate_log):
    config = AdsPipelineConfig(out_dir=str(tmp_path), run_id="spread")
    write_summary(config, **shares(0.1, 0.1, 0.3, 0.5))
    assert ads_pipeline.gate(config) == {"summary": str(tmp_path / "spread" / "teacher" / "rl" / "summary.json")}
    assert gate_log.metrics["audit_top_predicted_share"] == 0.5
    assert gate_log.metrics["gate_max_predicted_share"] == 0.95
    assert gate_log.tags == {"gate": "passed"}


def test_a_teacher_answering_one_grade_fails_however_accurate(tmp_path, gate_log):
    config = AdsPipelineConfig(out_dir=str(tmp_path), run_id="collapsed")
    write_summary(config, audit_accuracy_end=0.9, **shares(0.0, 0.0, 0.03, 0.97))
    with pytest.raises(StepSkipped, match=r"grade 3 for 97\.0% of audit pairs > max_predicted_share 0\.95") as failed:
        ads_pipeline.gate(config)
    assert "teacher.sft.balance" in str(failed.value) and "1.0: no check" in str(failed.value)
    assert gate_log.tags == {"gate": "failed"} and gate_log.metrics["audit_top_predicted_share"] == 0.97
    # the teacher is skipped, not the run: the record says where and why, and the student learns from gold alone
    assert "the teacher is skipped: no RL, no annotation" in str(failed.value)
    skipped = ads_pipeline.teacher_skipped(config)
    assert skipped["step"] == "gate" and "max_predicted_share 0.95" in skipped["reason"]
    assert ads_pipeline.student_config(config).label_source == "train-gold"
    assert not (tmp_path / "collapsed" / "steps" / f"gate{SUCCESS}").exists()  # a failed gate reruns
    passing = AdsPipelineConfig(out_dir=str(tmp_path), run_id="collapsed", max_predicted_share=1.0)
    ads_pipeline.gate(passing)
    assert ads_pipeline.teacher_skipped(passing) is None and ads_pipeline.student_config(passing).label_source == (
        "gold+teacher"
    )


def test_the_share_at_the_limit_passes_and_the_accuracy_gate_still_applies(tmp_path, gate_log):
    config = AdsPipelineConfig(out_dir=str(tmp_path), run_id="edge", max_predicted_share=0.5)
    write_summary(config, **shares(0.25, 0.25, 0.0, 0.5))
    ads_pipeline.gate(config)
    low = AdsPipelineConfig(out_dir=str(tmp_path), run_id="low")
    write_summary(low, audit_accuracy_end=0.3, **shares(0.25, 0.25, 0.25, 0.25))
    with pytest.raises(StepSkipped, match=r"audit_accuracy_end 0\.300 < min_audit_accuracy 0\.5"):
        ads_pipeline.gate(low)


def test_a_summary_without_shares_fails_clearly_unless_the_check_is_off(tmp_path, gate_log):
    config = AdsPipelineConfig(out_dir=str(tmp_path), run_id="old")
    write_summary(config)  # trained before the shares were recorded
    with pytest.raises(StepSkipped, match=r"has no audit_predicted/g\{k\}_end shares .* max_predicted_share: 1\.0"):
        ads_pipeline.gate(config)
    ads_pipeline.gate(AdsPipelineConfig(out_dir=str(tmp_path), run_id="old", max_predicted_share=1.0))
    assert "audit_top_predicted_share" not in gate_log.metrics and gate_log.tags == {"gate": "passed"}


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_max_predicted_share_is_a_share(share):
    with pytest.raises(ValueError, match=r"max_predicted_share must be in \(0, 1\]"):
        AdsPipelineConfig(max_predicted_share=share)


def test_a_teacher_at_its_class_prior_fails_the_gate_after_rl_however_accurate(tmp_path, gate_log):
    config = AdsPipelineConfig(out_dir=str(tmp_path), run_id="prior")
    write_summary(config, audit_accuracy_end=0.55, audit_balanced_accuracy_end=0.27, **shares(0.1, 0.1, 0.4, 0.4))
    with pytest.raises(
        StepSkipped,
        match=r"answers at its class prior on held-out queries: audit balanced accuracy 0\.270, "
        r"where any answer that ignores the pair scores 0\.250; it needs 0\.300",
    ) as failed:
        ads_pipeline.gate(config)
    assert "more or cleaner gold, a larger base model, or a GPU preset" in str(failed.value)
    assert gate_log.tags == {"gate": "failed"} and gate_log.metrics["gate_balanced_needed"] == pytest.approx(0.30)
    ads_pipeline.gate(AdsPipelineConfig(out_dir=str(tmp_path), run_id="prior", min_balanced_margin=None))
    assert gate_log.tags == {"gate": "passed"}


def test_the_prior_margin_is_at_least_twice_chances_standard_error(tmp_path, gate_log):
    noisy = {"audit_balanced_accuracy_null_se_end": 0.04, **shares(0.25, 0.25, 0.25, 0.25)}
    config = AdsPipelineConfig(out_dir=str(tmp_path), run_id="few")
    write_summary(config, audit_balanced_accuracy_end=0.32, **noisy)  # +0.07 > 0.05, but < 2 x 0.04
    with pytest.raises(StepSkipped, match=r"it needs 0\.330 \(min_balanced_margin 0\.05 or twice the 0\.040"):
        ads_pipeline.gate(config)
    enough = AdsPipelineConfig(out_dir=str(tmp_path), run_id="enough")
    write_summary(enough, audit_balanced_accuracy_end=0.34, **noisy)
    ads_pipeline.gate(enough)


def test_a_summary_without_the_prior_figures_fails_clearly_unless_the_check_is_off(tmp_path, gate_log):
    config = AdsPipelineConfig(out_dir=str(tmp_path), run_id="old-prior")
    path = ads_pipeline.layout(config).rl / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"audit_accuracy_end": 0.6, **shares(0.25, 0.25, 0.25, 0.25)}))
    with pytest.raises(StepSkipped, match=r"no audit_balanced_accuracy_prior_end .* min_balanced_margin: null"):
        ads_pipeline.gate(config)
    ads_pipeline.gate(AdsPipelineConfig(out_dir=str(tmp_path), run_id="old-prior", min_balanced_margin=None))


@pytest.mark.parametrize("margin", [-0.1, 1.0])
def test_min_balanced_margin_is_a_share(margin):
    with pytest.raises(ValueError, match=r"min_balanced_margin must be in \[0, 1\) or null"):
        AdsPipelineConfig(min_balanced_margin=margin)


WORDS = ("lamp", "sofa", "desk", "chair")


def keyword_pairs(path, learnable: bool, test: int = 4):
    """Pairs whose grade is the index of the query's first word (learnable in a few dozen steps by the tiny
    teacher), or the same text with grades drawn at random (nothing to learn)."""
    rng = random.Random(0)
    rows = []
    for split, count in (("train", 160), ("audit", 80), ("test", test)):
        for i in range(count):
            word = rng.randrange(4)
            rows.append(
                {
                    "pair_id": f"{split}-{i}",
                    "query": f"{WORDS[word]} {rng.choice(['red', 'blue', 'big', 'old'])}",
                    "ad_title": f"{rng.choice(WORDS)} {rng.choice(['x', 'y', 'z'])}",
                    "gold_grade": word if learnable else rng.randrange(4),
                    "split": split,
                }
            )
    return write_table(pairs_table(rows), path)


def sft_config(tmp_path, learnable: bool, **gate) -> AdsPipelineConfig:
    name = "learnable" if learnable else "random"
    teacher = TeacherConfig(
        answer_format="answer",
        audit_examples=80,
        max_new_tokens=8,
        model=TinyModelConfig(hidden_size=64, intermediate_size=128, num_layers=2),
        sft=SFTConfig(epochs=14, learning_rate=3e-3, eval_every=10, patience=3),
    )
    pairs = keyword_pairs(tmp_path / f"{name}.parquet", learnable)
    return AdsPipelineConfig(out_dir=str(tmp_path), run_id=name, pairs=str(pairs), teacher=teacher, **gate)


def test_a_teacher_sft_on_random_labels_fails_the_prior_gate_before_rl(tmp_path, gate_log):
    config = sft_config(tmp_path, learnable=False)
    with pytest.raises(
        StepSkipped, match=r"SFT teacher: the teacher answers at its class prior on held-out queries"
    ) as failed:
        ads_pipeline.build_teacher(config)
    report_path = ads_pipeline.layout(config).sft / "teacher_report.json"
    report = json.loads(report_path.read_text())
    assert report["audit_balanced_margin"] < 0.05 and report["audit_sft_balanced_accuracy_prior"] == 0.25
    assert report["sft_stopped_early"] and report["sft_steps"] < report["sft_planned_steps"]
    assert 0 <= report["audit_roc_auc_expected_grade"] <= 1  # the gate's reader sees how it ranks, in the reason too
    assert "its expected grade ranks audit pairs at ROC-AUC" in str(failed.value)
    assert gate_log.metrics["sft/audit_balanced_accuracy@10"] == report["sft_curve"][1]["audit_balanced_accuracy"]
    # the SFT step is done; a rerun with the check off reads its report again without training again
    written = report_path.stat().st_mtime_ns
    ads_pipeline.build_teacher(sft_config(tmp_path, learnable=False, min_balanced_margin=None))
    assert report_path.stat().st_mtime_ns == written


def test_a_teacher_sft_on_learnable_labels_passes_with_its_checkpoint_chosen_on_audit(tmp_path, gate_log):
    config = sft_config(tmp_path, learnable=True)
    rows = pq.read_table(config.pairs).to_pylist()
    paths = ads_pipeline.build_teacher(config)
    report = json.loads((ads_pipeline.layout(config).sft / "teacher_report.json").read_text())
    curve = report["sft_curve"]
    chosen = next(h for h in curve[1:] if h["step"] == report["sft_best_step"])
    assert chosen["audit_balanced_accuracy"] == max(h["audit_balanced_accuracy"] for h in curve[1:])
    assert report["audit_balanced_accuracy_sft"] == chosen["audit_balanced_accuracy"] > 0.9
    # it ranks too: its expected grade orders relevant (grade >= 2) audit pairs above the rest, where the zero-shot
    # encoder, which cannot know the grade is the query word's index, ranks near chance
    assert report["audit_roc_auc_expected_grade"] > 0.95 and report["audit_ranking_abstained"] == 0
    assert 0.3 < report["audit_zero_shot_roc_auc"] < 0.7
    assert report["train_audit_gap"] == pytest.approx(
        chosen["train_balanced_accuracy"] - chosen["audit_balanced_accuracy"]
    )
    train, audit = ([r["gold_grade"] for r in rows if r["split"] == s] for s in ("train", "audit"))
    majority = max(range(4), key=lambda g: (train.count(g), -g))
    assert report["class_prior_grade"] == majority
    assert report["audit_prior_accuracy"] == audit.count(majority) / len(audit)
    assert (Path(paths["model"]) / "sft_curve.png").stat().st_size > 0


def test_a_users_pairs_without_hidden_gold_give_the_stages_no_gold_whatever_the_current_run(tmp_path, monkeypatch):
    """The stage configs are part of a step's hashed params: a stage's own default gold path follows AGPO_RUN, so
    it must not leak in (a retry by a worker with another AGPO_RUN would read as changed params)."""
    from pipelines.ads.pipeline_config import annotate_config, distil_config

    seen = []
    for run in ("demo", "weekly-3"):
        monkeypatch.setenv("AGPO_RUN", run)
        config = AdsPipelineConfig(out_dir=str(tmp_path), pairs=str(tmp_path / "pairs.parquet"))
        seen.append((annotate_config(config).gold, distil_config(config).gold))
    assert seen == [(None, None), (None, None)]
    with_gold = AdsPipelineConfig(out_dir=str(tmp_path), pairs="p.parquet", unlabeled_gold="g.parquet")
    assert annotate_config(with_gold).gold == distil_config(with_gold).gold == "g.parquet"


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("distil.labels=my/labels", "distil.labels is set by the pipeline from the run's folders ('my/labels' would"),
        ("annotate.input.path=x.parquet", "annotate.input.path is set by the pipeline"),
        ("train.rl_share=0.5", "set teacher.rl_share (SFT and RL split the gold train pairs together) instead"),
    ],
)
def test_a_key_the_pipeline_sets_itself_is_a_config_error_naming_what_to_set(override, said):
    from pipelines.config import ConfigError, describe, load_config

    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(AdsPipelineConfig, [], [override])
    listed = describe(AdsPipelineConfig)
    assert not any(line.startswith("  distil.labels ") for line in listed)  # not offered as a key
    assert listed[-1].startswith("  (set by the stage itself, an error to set: data.out_dir, teacher.pairs")


@pytest.mark.integration
def test_agpo_pipeline_goes_on_without_a_teacher_below_its_gate_and_registers_a_model(tmp_path):
    """``agpo pipeline`` (every step in one process) with a teacher SFT'd on random grades: the prior gate skips
    it, RL and annotation never run, the student learns from gold alone, and the run still registers a model."""
    config = sft_config(tmp_path, learnable=False)
    pairs = keyword_pairs(tmp_path / "random-60.parquet", learnable=False, test=60)
    config = replace(
        config,
        pairs=str(pairs),
        tracking=replace(config.tracking, store_dir=str(tmp_path / "mlflow")),
        distil=replace(config.distil, training=replace(config.distil.training, epochs=2, min_epochs=1)),
    )
    outputs = ads_pipeline.run(config)
    decision = json.loads(Path(outputs["registration"]).read_text())
    root = ads_pipeline.layout(config)
    assert decision["teacher_skipped"]["step"] == "teacher" and decision["version"] == 1 and decision["promoted"]
    assert decision["candidate"] in SIMPLEST_FIRST and not root.rl.exists() and not root.annotate.exists()
    distilled = json.loads((root.student / "distil.json").read_text())
    assert distilled["label_source"] == "train-gold" and not root.gold_only.exists()  # the student is gold-only
    assert_the_report_page_is_written_and_logged(config, outputs, decision)
    # killed after the register stage's MLflow run finished, before its step marker: the retry keeps the record
    # (it used to write {} over it, and the DAG then emitted no champion event)
    (root.steps / "register_SUCCESS.json").unlink()
    assert json.loads(Path(ads_pipeline.register(config)["registration"]).read_text()) == decision


def assert_the_report_page_is_written_and_logged(config: AdsPipelineConfig, outputs: dict, decision: dict) -> None:
    """report.html in the run folder, its decision first and the evaluation's plots inlined, logged to the register
    stage run and the parent run (whose tag, what agpo compare lists, names it), and tagged on the LoggedModels."""
    page = ads_pipeline.layout(config).root / REPORT_PAGE
    assert Path(outputs["report"]) == page
    html = page.read_text(encoding="utf-8")
    assert f"{verdict(decision)}</h1>" in html.split("<body>", 1)[1].splitlines()[0]
    assert html.count('src="data:image/png;base64,') == 4 and "teacher_skipped.json" in html
    [parent] = pipeline_runs(config.tracking)
    client = import_mlflow().MlflowClient(tracking_uri(config.tracking))
    assert parent[REPORT_TAG] == f"{client.get_run(parent['run_id']).info.artifact_uri}/{REPORT_PAGE}"
    [register] = client.search_runs(
        [client.get_run(parent["run_id"]).info.experiment_id], "tags.`agpo.stage` = 'register'"
    )
    for run_id in (parent["run_id"], register.info.run_id):
        assert REPORT_PAGE in [artifact.path for artifact in client.list_artifacts(run_id)]
    experiments = [e.experiment_id for e in client.search_experiments()]
    models = client.search_logged_models(experiments, filter_string=f"source_run_id = '{register.info.run_id}'")
    assert models and all(model.tags[REPORT_TAG] == parent[REPORT_TAG] for model in models)
