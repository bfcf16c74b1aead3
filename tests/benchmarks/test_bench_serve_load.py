"""The serving load test at a tiny size: its JSON has both phases, the good requests' latency, the server's memory
and every abusive kind refused with 413 or 422, so the script cannot rot."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFUSED = {
    "declared_20MiB": "413",
    "chunked_past_cap": "413",
    "rows_1025": "422",
    "text_20k_chars": "422",
    "truncated_json": "422",
    "missing_column": "422",
}


@pytest.mark.integration
def test_serve_load_benchmark_reports_latency_memory_and_refusals(tmp_path):
    env = {**os.environ, "AGPO_BENCH_RESULTS": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    script = ROOT / "benchmarks" / "bench_serve_load.py"
    tiny = ["--model", "lexical", "--requests", "6", "--largest", "1", "--clients", "2", "--max-seconds", "60"]
    done = subprocess.run([sys.executable, str(script), *tiny], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "serve_load.json").read_text())
    assert result["commit"] and result["machine"]["cpus"] and result["requests_per_phase"] == 6
    for phase in ("good", "abusive", "largest_allowed"):
        figures = result["phases"][phase]
        assert figures["statuses"]["good"] == {"200": 6}
        assert 0 < figures["good"]["p50_ms"] <= figures["good"]["p99_ms"]
        rss = figures["rss_mb"]
        assert 0 < rss["start"] <= rss["peak"] and rss["end"] > 0
    assert result["flat"]["refused"] == {kind: {status: 1} for kind, status in REFUSED.items()}
    assert result["phases"]["largest_allowed"]["statuses"]["largest_allowed"] == {"200": 1}
