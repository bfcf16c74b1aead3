"""The ads pipeline with a real pretrained teacher (the packaged SmolLM2-135M-Instruct) at test size:
chat-template prompts, LoRA SFT merged, an AGPO step, score-mode annotation and distillation, in one process.
The DAG runs the same steps (tests/dags); this checks that a pretrained teacher goes through all of them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agpo.pretrained import PackagedModelNotInstalled, resolve_base_model
from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.teacher.prompts import PROMPT_FILE
from pipelines.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.minutes(4)]


def test_smollm2_teacher_runs_the_whole_pipeline(tmp_path):
    try:
        resolve_base_model("smollm2-135m-instruct")
    except PackagedModelNotInstalled as missing:  # `make venv` installs it; a bare venv says how
        pytest.fail(str(missing))
    config = load_config(
        ads_pipeline.AdsPipelineConfig,
        ["configs/pipeline/small-lm-test.yaml"],
        [f"out_dir={tmp_path}/runs", "run_id=small-lm", f"tracking.store_dir={tmp_path}/mlflow"],
    )
    outputs = ads_pipeline.run(config)
    root = ads_pipeline.layout(config)
    report = json.loads((root.sft / "teacher_report.json").read_text())
    assert report["base_model"] == "smollm2-135m-instruct" and report["chat_template"] is True
    assert report["lora_rank"] == 4 and report["trainable_parameters"] < report["parameters"] / 100
    assert report["audit_unparseable_sft"] == 0.0
    for model_dir in (root.sft, root.rl / "model"):
        assert json.loads((model_dir / PROMPT_FILE).read_text())["prompt_version"] == "relevance-instruct-v1"
        assert not (model_dir / "adapter_config.json").exists()
    labels = pq.read_table(root.annotate / "labels").to_pylist()
    assert len(labels) == 16
    for row in labels:  # score mode: an exact distribution over the grades, its argmax and top probability
        assert sum(row["grade_probs"]) == pytest.approx(1.0, abs=1e-4)
        assert row["grade"] == max(range(4), key=lambda g: row["grade_probs"][g])
        assert row["confidence"] == pytest.approx(max(row["grade_probs"]), abs=1e-6)
    metrics = json.loads((root.student / "eval" / "metrics.json").read_text())
    assert 0 <= metrics["accuracy"] <= 1 and {"gold_only", "zero_shot", "lexical"} <= set(metrics["models"])
    assert "promoted" in json.loads(Path(outputs["registration"]).read_text())

    table = run_table_script(root.root, tmp_path / "results")  # docs/small-lm.md's preset table, from this run folder
    (figures,) = table["runs"]
    assert figures["teacher"] == "smollm2-135m-instruct" and figures["rl_steps"] == 1
    assert figures["teacher_audit_greedy"]["sft"] == report["audit_accuracy_sft"]
    assert figures["models"]["student"]["macro_f1"] == metrics["macro_f1"]
    assert figures["champion"]["candidate"] == json.loads(Path(outputs["registration"]).read_text())["candidate"]
    assert all(minutes >= 0 for minutes in figures["minutes"].values())
    assert "| minutes: teacher RL |" in table["table"]


def run_table_script(run: Path, results: Path) -> dict:
    env = {**os.environ, "AGPO_BENCH_RESULTS": str(results)}
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "pipeline_runs.py"
    done = subprocess.run([sys.executable, str(script), str(run)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((results / "pipeline_runs.json").read_text())
