"""The annotation-modes benchmark at a tiny size, so its code cannot rot (its figures come from full runs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_annotate_modes_benchmark_reports_both_modes(tmp_path):
    args = ["--pairs", "6", "--train", "40", "--sft-examples", "20", "--sft-epochs", "1", "--repeats", "1"]
    args += ["--answer-formats", "reason"]
    env = {**os.environ, "AGPO_BENCH_RESULTS": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    script = ROOT / "benchmarks" / "bench_annotate_modes.py"
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "annotate_modes.json").read_text())
    reason = result["teachers"]["reason"]
    assert result["commit"] and reason["score_over_sample_pairs_per_s"] > 0
    for mode in ("sample", "score"):
        assert reason[mode]["pairs"] == 6 and 0 <= reason[mode]["accuracy"] <= 1
        assert reason[mode]["same_labels_every_repeat"]
    assert reason["score"]["review_rate"] <= 1 and reason["score"]["soft_label_gold_log_loss"] > 0
