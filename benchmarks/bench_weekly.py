"""Two weeks of the weekly loop (issue 60), timed: week 1 trains and registers the teacher, labels the pool,
distils and registers; week 2 has the same gold and 10 % new unlabeled pairs, starts from the registered teacher
(``teacher_reuse.source=current``, as a scheduled DAG run: SFT and RL skipped) and labels only the new pairs (the
label cache answers the rest).

Each week is ``agpo pipeline`` in its own process, as a scheduled run would start, in one runs folder and one
MLflow store (``--out``). Its steps' shares come from their success markers (bench_demo.step_timeline). Figures:
- week 2's teacher and annotation time over week 1's: validate through merge (goal: at most 0.15);
- the whole run's wall time, week 2 over week 1, and what is left of week 2 (the student's training and
  evaluation, retrained on every label: the student does not start from last week's);
- cache hits and misses, pairs labelled;
- the projected whole-run ratio at a GPU teacher's cost: week 1 plus ``--teacher-hours`` (an assumption, not a
  measurement: no GPU has run the 7B preset), week 2 as measured.
Run: ``.venv/bin/python benchmarks/bench_weekly.py`` (the demo's settings, writes benchmarks/results/weekly.json);
``--config`` and ``--set`` pass settings to both weeks (the CI test runs it on the tiny preset).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from bench_demo import step_shares, step_timeline
from common import write_results

ROOT = Path(__file__).resolve().parent.parent
AGPO = str(Path(sys.executable).parent / "agpo")
TEACHER_AND_ANNOTATION = ("validate", "teacher-reuse", "teacher", "train", "gate", "partition", "merge")
GOAL = 0.15
NEW_SHARE = 0.1


def run_week(out: Path, name: str, configs: list[str], settings: list[str]) -> dict:
    """``agpo pipeline --run name`` in ``out`` with ``configs`` and ``settings``: its wall seconds, its steps'
    shares and its annotation's cache counts."""
    settings = [f"out_dir={out / 'runs'}", f"tracking.store_dir={out / 'mlflow'}", *settings]
    started = time.time()
    subprocess.run(
        [AGPO, "pipeline", "--run", name]
        + [arg for config in configs for arg in ("--config", config)]
        + [arg for setting in settings for arg in ("--set", setting)],
        cwd=ROOT,
        check=True,
    )
    seconds = time.time() - started
    shares = step_shares(step_timeline(out / "runs" / name / "steps", started))
    annotation = json.loads((out / "runs" / name / "annotate" / "summary.json").read_text())
    teacher = sum(s for step, s in shares.items() if step in TEACHER_AND_ANNOTATION or step.startswith("annotate"))
    return {
        "seconds": round(seconds, 1),
        "teacher_and_annotation_seconds": round(teacher, 1),
        "steps": shares,
        "cache_hits": annotation["cache_hits"],
        "cache_misses": annotation["cache_misses"],
        "pairs_labelled": annotation["cache_misses"],
    }


def week_two_pairs(week_one: Path, target: Path) -> int:
    """Week 1's pairs and a tenth more unlabeled ones (new text) into ``target``; returns the new pairs."""
    pairs = pq.read_table(week_one / "data" / "pairs.parquet")
    unlabeled = [row for row in pairs.to_pylist() if row["split"] == "unlabeled"]
    new = [
        {**row, "pair_id": f"week-2-{k}", "query": f"{row['query']} week two {k}"}
        for k, row in enumerate(unlabeled[: round(NEW_SHARE * len(unlabeled))])
    ]
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.concat_tables([pairs, pa.Table.from_pylist(new, schema=pairs.schema)]), target)
    return len(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "work" / "bench-weekly"), help="runs folder and MLflow store")
    parser.add_argument("--config", action="append", default=[], help="a config file both weeks read")
    parser.add_argument("--set", action="append", default=[], dest="settings", help="KEY=VALUE for both weeks")
    parser.add_argument("--teacher-hours", type=float, default=8.0, help="the assumed GPU teacher's SFT + RL hours")
    parser.add_argument("--registered-model", default="ads-relevance-bench-weekly")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    common = [f"tracking.registered_model={args.registered_model}", *args.settings]
    configs = args.config or ["train=configs/cpu-tiny.yaml"]  # make demo's
    one = run_week(out, "week-1", configs, common)
    new = week_two_pairs(out / "runs" / "week-1", out / "week-2-pairs.parquet")
    week_two = [f"pairs={out / 'week-2-pairs.parquet'}", "teacher_reuse.source=current"]
    two = run_week(out, "week-2", configs, [*common, *week_two])
    ratio = two["teacher_and_annotation_seconds"] / one["teacher_and_annotation_seconds"]
    gpu_teacher = args.teacher_hours * 3600
    results = {
        "configs": configs,
        "settings": common,
        "new_pairs": new,
        "week_1": one,
        "week_2": two,
        "teacher_and_annotation_ratio": round(ratio, 3),
        "whole_run_ratio": round(two["seconds"] / one["seconds"], 3),
        "week_2_left": {"student_seconds": two["steps"].get("distil", 0.0) + two["steps"].get("evaluate", 0.0)},
        "projected_whole_run_ratio_at_gpu_teacher": round(two["seconds"] / (one["seconds"] + gpu_teacher), 4),
        "assumed_teacher_hours": args.teacher_hours,
        "targets": {"teacher_and_annotation_ratio": {"goal": GOAL, "value": round(ratio, 3), "met": ratio <= GOAL}},
    }
    write_results("weekly", results)


if __name__ == "__main__":
    main()
