"""The pipeline's teacher gate on hand-written RL summaries: audit accuracy, and the one-grade check (a
teacher that answers nearly one grade for every audit pair fails, however accurate skewed gold makes it)."""

import json
from contextlib import contextmanager

import pytest

from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.pipeline import AdsPipelineConfig, GateFailed
from pipelines.steps import SUCCESS, PipelineRun


class RecordingLog:
    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.tags: dict[str, str] = {}

    def log_metrics(self, metrics):
        self.metrics.update(metrics)

    def set_tags(self, tags):
        self.tags.update(tags)


@pytest.fixture
def gate_log(monkeypatch):
    """The gate's MLflow child run, recorded in memory instead."""
    log = RecordingLog()

    class Tracker:
        @contextmanager
        def stage(self, name, params, try_number=1):
            yield log

    monkeypatch.setattr(PipelineRun, "tracker", lambda self: Tracker())
    return log


def write_summary(config: AdsPipelineConfig, **figures) -> None:
    path = ads_pipeline.layout(config).rl / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"audit_accuracy_end": 0.6, **figures}))


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
    with pytest.raises(GateFailed, match=r"grade 3 for 97\.0% of audit pairs > max_predicted_share 0\.95") as failed:
        ads_pipeline.gate(config)
    assert "teacher.sft.balance" in str(failed.value) and "1.0: no check" in str(failed.value)
    assert gate_log.tags == {"gate": "failed"} and gate_log.metrics["audit_top_predicted_share"] == 0.97
    assert not (tmp_path / "collapsed" / "steps" / f"gate{SUCCESS}").exists()  # a failed gate reruns
    ads_pipeline.gate(AdsPipelineConfig(out_dir=str(tmp_path), run_id="collapsed", max_predicted_share=1.0))


def test_the_share_at_the_limit_passes_and_the_accuracy_gate_still_applies(tmp_path, gate_log):
    config = AdsPipelineConfig(out_dir=str(tmp_path), run_id="edge", max_predicted_share=0.5)
    write_summary(config, **shares(0.25, 0.25, 0.0, 0.5))
    ads_pipeline.gate(config)
    low = AdsPipelineConfig(out_dir=str(tmp_path), run_id="low")
    write_summary(low, audit_accuracy_end=0.3, **shares(0.25, 0.25, 0.25, 0.25))
    with pytest.raises(GateFailed, match=r"audit_accuracy_end 0\.300 < min_audit_accuracy 0\.5"):
        ads_pipeline.gate(low)


def test_a_summary_without_shares_fails_clearly_unless_the_check_is_off(tmp_path, gate_log):
    config = AdsPipelineConfig(out_dir=str(tmp_path), run_id="old")
    write_summary(config)  # trained before the shares were recorded
    with pytest.raises(GateFailed, match=r"has no audit_predicted/g\{k\}_end shares .* max_predicted_share: 1\.0"):
        ads_pipeline.gate(config)
    ads_pipeline.gate(AdsPipelineConfig(out_dir=str(tmp_path), run_id="old", max_predicted_share=1.0))
    assert "audit_top_predicted_share" not in gate_log.metrics and gate_log.tags == {"gate": "passed"}


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_max_predicted_share_is_a_share(share):
    with pytest.raises(ValueError, match=r"max_predicted_share must be in \(0, 1\]"):
        AdsPipelineConfig(max_predicted_share=share)
