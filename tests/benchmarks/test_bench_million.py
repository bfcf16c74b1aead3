"""The million-pair benchmark at a tiny size, so its code cannot rot (its figures come from full runs): every stage
at two sizes on the object store, scoring with the tiny student's int8 graph (the MiniLM one takes minutes to
export and score), the import once more on local disk beside it, then a rerun that finds every result recorded
and runs nothing. (Each stage is a fresh process: the local store's other stages would add minutes to CI and
nothing its import does not already reach.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
STAGES = ["import", "annotate", "distil", "score_tiny"]


def bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_million.py"), *args]
    command += ["--score-student", "tiny", "--minilm-at", "0", "--work", str(tmp_path / "work")]
    command += ["--out", str(tmp_path / "million.json"), "--sample-every", "0.1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


def test_without_the_csv_the_synthetic_text_keeps_the_gold_queries_out_of_the_generated_pairs():
    import bench_million

    queries, titles, gold = bench_million.synthetic_text(seed=0)
    held = {row["search_term"] for row in gold}
    assert queries and titles and gold and not held & set(queries)
    assert all(1 <= row["relevance"] <= 4 for row in gold)


@pytest.mark.integration
@pytest.mark.minutes(5)
def test_million_benchmark_accounts_every_row_of_every_stage_compares_the_stores_and_resumes(tmp_path):
    on_s3 = ("--sizes", "100,200", "--stores", "s3")
    done = bench(tmp_path, *on_s3)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    local = bench(tmp_path, "--sizes", "100", "--stores", "local", "--stages", "import")
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    result = json.loads((tmp_path / "million.json").read_text())
    assert result["sizes"] == [100, 200] and result["machine"]["cpus"] and result["commit"]
    keys = [(r["size"], r["store"], r["stage"]) for r in result["runs"]]
    assert keys == [(100, "local", "import")] + [(n, "s3", g) for n in (100, 200) for g in STAGES]
    for run in result["runs"]:
        assert run["status"] == "ok", run
        rows = run["rows"]
        assert rows["adds_up"] and rows["in"] == rows["out"] + rows["quarantined"] + rows["filtered"]
        assert run["seconds"] > 0 and run["peak_rss_mib"] > 100 and run["s_per_1k_pairs"] > 0
        # both rounded from one measurement: cpu_seconds to 0.01 s, which at 100 pairs is 0.1 s per 1,000
        assert run["cpu_seconds"] > 0 and run["cpu_s_per_1k_pairs"] == pytest.approx(
            1000 * run["cpu_seconds"] / run["size"], abs=0.1
        )
        if run["stage"] in ("annotate", "score_tiny"):
            assert rows["in"] == run["size"] and rows["published_rows"]["rows_in"] == run["size"]
    imported = [r["rows"] for r in result["runs"] if r["stage"] == "import"]
    assert all(rows["per_split"]["unlabeled"] in (100, 200) and rows["per_split"]["audit"] for rows in imported)
    by_name = {}
    for ratio in result["ratios"]:
        by_name.setdefault(ratio["ratio"], []).append(ratio)
        assert ratio["met"] == (ratio["value"] <= ratio["goal"])
    for name in (
        "time_per_pair_over_next_smaller_size",
        "cpu_per_pair_over_next_smaller_size",
        "peak_rss_over_next_smaller_size",
    ):
        assert sorted(r["stage"] for r in by_name[name]) == sorted(STAGES)  # per stage, 200 over 100, on s3
        assert all(r["sizes"] == [100, 200] and r["store"] == "s3" for r in by_name[name])
    [stores] = by_name["object_store_over_local_time"]
    assert (stores["size"], stores["stage"]) == (100, "import")
    assert "object_store_over_local_time" in local.stdout  # the table

    again = bench(tmp_path, *on_s3)  # every (size, store, stage) asked for is recorded: nothing runs again
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("recorded, skipped") == 8
    assert json.loads((tmp_path / "million.json").read_text())["runs"] == result["runs"]
