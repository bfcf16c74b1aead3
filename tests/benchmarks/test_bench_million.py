"""The million-pair benchmark at a tiny size, so its code cannot rot (its figures come from full runs): both stores,
every stage, the tiny student's int8 graph scoring (the MiniLM one takes minutes to export and score), then a
rerun that finds every result recorded and runs nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["import", "annotate", "distil", "score"]


def bench(tmp_path: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_million.py"), "--sizes", "100,200"]
    command += ["--score-student", "tiny", "--minilm-at", "0", "--work", str(tmp_path / "work")]
    command += ["--out", str(tmp_path / "million.json"), "--sample-every", "0.1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.integration
def test_million_benchmark_accounts_every_row_of_every_stage_on_both_stores_and_resumes(tmp_path):
    done = bench(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "million.json").read_text())
    assert result["sizes"] == [100, 200] and result["machine"]["cpus"] and result["commit"]
    keys = [(r["size"], r["store"], r["stage"]) for r in result["runs"]]
    assert keys == [(n, s, g) for n in (100, 200) for s in ("local", "s3") for g in STAGES]
    for run in result["runs"]:
        assert run["status"] == "ok", run
        rows = run["rows"]
        assert rows["adds_up"] and rows["in"] == rows["out"] + rows["quarantined"] + rows["filtered"]
        assert run["seconds"] > 0 and run["peak_rss_mib"] > 100 and run["s_per_1k_pairs"] > 0
        if run["stage"] in ("annotate", "score"):
            assert rows["in"] == run["size"] and rows["published_rows"]["rows_in"] == run["size"]
    imported = [r["rows"] for r in result["runs"] if r["stage"] == "import"]
    assert all(rows["per_split"]["unlabeled"] in (100, 200) and rows["per_split"]["audit"] for rows in imported)
    names = {r["ratio"] for r in result["ratios"]}
    assert names == {
        "time_per_pair_largest_over_smallest",
        "peak_rss_largest_over_smallest",
        "object_store_over_local_time",
    }
    assert len(result["ratios"]) == 2 * 4 * 2 + 2 * 4  # per store and stage two, per size and stage one
    assert all(r["met"] == (r["value"] <= r["goal"]) for r in result["ratios"])
    assert "object_store_over_local_time" in done.stdout  # the table

    again = bench(tmp_path)  # every (size, store, stage) is recorded: nothing runs again
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("recorded, skipped") == 16
    assert json.loads((tmp_path / "million.json").read_text())["runs"] == result["runs"]
