"""The annotation-throughput benchmark at a tiny size, so its code cannot rot (its figures come from full runs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_annotate_throughput_benchmark_reports_every_setting_against_sample4(tmp_path):
    args = ["--pairs", "30", "--distinct", "10", "--train", "40", "--sft-examples", "20", "--sft-epochs", "1"]
    args += ["--repeats", "1"]
    env = {**os.environ, "AGPO_BENCH_RESULTS": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    script = ROOT / "benchmarks" / "bench_annotate_throughput.py"
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "annotate_throughput.json").read_text())
    traffic, settings = result["traffic"], result["settings"]
    assert traffic["rows"] == 30 and 0 < traffic["duplicate_rate"] < 1
    for name in ("sample4", "sample4_constrained", "score", "score_dedup"):
        assert settings[name]["rows"] == 30 and 0 <= settings[name]["accuracy"] <= 1
        assert settings[name]["pairs_per_s"] > 0
    assert settings["score"]["graded_pairs"] == 30
    assert settings["score_dedup"]["graded_pairs"] == traffic["distinct_pairs"] < 30
    target = result["targets"]["throughput_over_sample4"]
    assert settings["sample4_constrained_dedup"]["graded_pairs"] == traffic["distinct_pairs"]
    # the target is the fastest setting at equal accuracy (the baseline itself at worst)
    assert settings[target["setting"]]["equal_accuracy"] and target["target"] == 3.0
    fastest = max(s["pairs_per_s"] for s in settings.values() if s["equal_accuracy"])
    assert (
        target["ratio"] == settings[target["setting"]]["ratio_vs_baseline"]
        and settings[target["setting"]]["pairs_per_s"] == fastest
    )
    assert result["machine"]["cpus"] and result["commit"]
