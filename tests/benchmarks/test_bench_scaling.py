"""The scaling benchmark at a tiny size, so its code cannot rot (its figures come from full runs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_scaling_benchmark_reports_each_size_the_rss_target_and_a_timeline_plot(tmp_path):
    env = {**os.environ, "AGPO_BENCH_RESULTS": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_scaling.py"), "--sizes", "60,120", "--sample-every", "0.1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "scaling.json").read_text())
    assert [row["pairs"] for row in result["sizes"]] == [60, 120]
    for row in result["sizes"]:
        assert row["labeled_rows"] == row["counts"]["rows_in"] == row["pairs"]
        assert 0 < row["sampled_max_rss_mib"] <= row["peak_rss_mib"] * 1.05  # the sampler sees the child
    target = result["targets"]["rss_120_over_60"]
    assert target["target"] == 1.1 and target["ratio"] == result["sizes"][1]["peak_rss_over_smallest"]
    assert (tmp_path / result["rss_timeline"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
