"""benchmarks/compare_runs.py: figures equal to the digit, times, paths and run ids left out."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from compare_runs import compare, figures


def write(folder: Path, name: str, value) -> None:
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(value))


def test_times_paths_and_run_ids_are_left_out_and_figures_must_match(tmp_path):
    assert figures({"seconds": 3.2, "step_time": 1, "pairs_per_s": 9, "auc": 0.7, "model": "/tmp/x/model"}) == {
        "auc": 0.7,
        "model": "<path or id>",
    }
    before, after = tmp_path / "before", tmp_path / "after"
    write(before, "a/summary.json", {"auc": 0.75, "seconds": 10, "run": "0" * 32})
    write(after, "a/summary.json", {"auc": 0.75, "seconds": 12, "run": "f" * 32})
    write(before, "metrics.jsonl", {"step": 1, "loss": 0.5})
    (after / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5000001}) + "\n")
    write(before, "gone.json", {})
    same, differ = compare(before, after)
    assert same == 1
    assert differ == ["gone.json: missing", "metrics.jsonl: [0].loss: 0.5 != 0.5000001"]
