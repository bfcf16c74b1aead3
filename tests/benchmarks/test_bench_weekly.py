"""The weekly-loop benchmark at the tiny preset, so its code cannot rot (its figures come from the demo's settings):
week 2 starts from week 1's registered teacher, labels only its new pairs and records the ratios."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# every step at its least work: this checks the benchmark's wiring and its figures' arithmetic, not a model
LEAST = ["gold_student=false", "evaluate.baselines.names=[lexical]", "evaluate.bootstrap.samples=100"]


@pytest.mark.integration
@pytest.mark.minutes(3)
def test_the_second_week_reuses_the_teacher_and_labels_only_the_new_pairs(tmp_path):
    results = tmp_path / "results"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_weekly.py"), "--out", str(tmp_path / "weekly")]
    command += ["--config", "configs/pipeline/tiny-test.yaml", *(arg for key in LEAST for arg in ("--set", key))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "AGPO_BENCH_RESULTS": str(results)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads((results / "weekly.json").read_text())
    one, two = figures["week_1"], figures["week_2"]
    assert one["cache_hits"] == 0 and one["pairs_labelled"] == one["cache_misses"] > 0
    assert two["cache_hits"] == one["cache_misses"] and two["pairs_labelled"] == figures["new_pairs"] > 0
    assert "teacher-reuse" in two["steps"] and "train" not in two["steps"]  # reused: no RL step ran
    ratio = two["teacher_and_annotation_seconds"] / one["teacher_and_annotation_seconds"]
    assert figures["teacher_and_annotation_ratio"] == pytest.approx(ratio, abs=1e-3)
    target = figures["targets"]["teacher_and_annotation_ratio"]
    assert target["met"] == (target["value"] <= 0.15) and target["value"] == figures["teacher_and_annotation_ratio"]
    assert figures["commit"] and figures["machine"]
