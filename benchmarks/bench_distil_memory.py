"""Distil stage memory: the peak RSS of ``agpo distil`` as the teacher labels grow, and what the same inputs cost
as Python rows (what the stage held before issue 50's M5).

For each size in ``--sizes`` (default 10k and 160k) this process writes a pairs file of that many unlabeled
synthetic pairs plus 300 gold ones, and an annotation run's labels folder with a teacher label for each
unlabeled pair. Then, each in a fresh process (its own peak):

- ``stage``: the product's distil stage (``pipelines.ads.distillation.distil.run``) on those files, one epoch of a tiny
  student (hidden 64, one layer), no ONNX export and no zero-shot floor: its peak RSS (``VmHWM``) and its
  RSS before the stage (after imports);
- ``rows``: the pairs and labels files read into Python rows (``to_pylist``), the stage's reads before this
  change: the RSS that adds.

Goal: the stage's peak RSS at the largest size within 25 % of the smallest's (``stage_rss_largest_over_smallest``;
benchmarks/summary.py holds it). Run: ``.venv/bin/python benchmarks/bench_distil_memory.py`` (about 3 minutes on
2 cores).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from common import memory_mb, write_results

from durable.fileio import sha256_file
from pipelines.ads.intake.contracts import pairs_table, read_pairs, write_table
from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs

GOLD = 300


def write_inputs(size: int, folder: Path) -> None:
    """``folder/pairs.parquet`` (``size`` unlabeled pairs, ``GOLD`` gold ones) and ``folder/annotate/labels``."""
    rows = generate_pairs(SyntheticConfig(train=GOLD // 3, audit=GOLD // 3, unlabeled=size, test=GOLD // 3, seed=1))
    hidden = {r["pair_id"]: r["gold_grade"] for r in rows if r["split"] == "unlabeled"}
    for r in rows:
        r["gold_grade"] = None if r["split"] == "unlabeled" else r["gold_grade"]
    write_table(pairs_table(rows), folder / "pairs.parquet")
    grades = list(hidden.values())
    labels = pa.table(
        {
            "pair_id": list(hidden),
            "grade": pa.array(grades, pa.int8()),
            "votes": pa.array([[4 * (k == g) for k in range(4)] for g in grades], pa.list_(pa.int16())),
            "confidence": pa.array([1.0] * len(grades), pa.float32()),
        }
    )
    (folder / "annotate" / "labels").mkdir(parents=True)
    pq.write_table(labels, folder / "annotate" / "labels" / "part-00000.parquet")
    recorded = {"labels/part-00000.parquet": sha256_file(folder / "annotate" / "labels" / "part-00000.parquet")}
    (folder / "annotate" / "summary.json").write_text(json.dumps({"files": recorded}))


def stage_child(folder: Path) -> dict[str, float]:
    from pipelines.ads.distillation.distil import DistilConfig, run
    from student.model import StudentConfig
    from student.training import DistilTrainingConfig

    config = DistilConfig(
        labels=str(folder / "annotate" / "labels"),
        pairs=str(folder / "pairs.parquet"),
        out_dir=str(folder / "out"),
        export_onnx=False,
        zero_shot_floor=False,
        student=StudentConfig(kind="cross", tiny_hidden=64, tiny_layers=1, max_length=64),
        training=DistilTrainingConfig(epochs=1, min_epochs=1, batch_size=64),
    )
    before = memory_mb("VmRSS")
    run(config)
    return {"rss_before_mb": before, "peak_rss_mb": memory_mb("VmHWM")}


def rows_child(folder: Path) -> dict[str, float]:
    before = memory_mb("VmRSS")
    pairs = read_pairs(folder / "pairs.parquet").to_pylist()
    labels = pq.read_table(folder / "annotate" / "labels" / "part-00000.parquet").to_pylist()
    return {"rows": len(pairs) + len(labels), "rows_rss_mb": round(memory_mb("VmRSS") - before, 1)}


def in_child(part: str, folder: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", part, "--folder", str(folder)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,160000", help="comma-separated teacher label counts")
    parser.add_argument("--child", choices=("stage", "rows"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child = stage_child if args.child == "stage" else rows_child
        print(json.dumps(child(Path(args.folder))))
        return {}
    sizes = []
    with tempfile.TemporaryDirectory() as work:
        for size in (int(s) for s in args.sizes.split(",")):
            folder = Path(work) / str(size)
            write_inputs(size, folder)
            sizes.append({"labels": size, **in_child("stage", folder), **in_child("rows", folder)})
            print(sizes[-1], flush=True)
    ratio = round(sizes[-1]["peak_rss_mb"] / sizes[0]["peak_rss_mb"], 3)
    results = {
        "sizes": sizes,
        "targets": {"stage_rss_largest_over_smallest": {"ratio": ratio}},
        "goal": "the stage's peak RSS at the largest size within 25 % of the smallest's",
    }
    write_results("distil_memory", results)
    return results


if __name__ == "__main__":
    main()
