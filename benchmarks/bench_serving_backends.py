"""Serving backends side by side on one CPU: every backend of ours (``agpo score``'s: torch, onnxruntime fp32/int8,
OpenVINO fp32/bf16/static int8, and what ``backend=auto`` picks) against sentence-transformers' own CrossEncoder
backends (benchmarks/st_backends.py, in .venv-optimum), on the same student folder and pairs, in one run.

1. A cross-encoder student (all-MiniLM-L6-v2 from its wheel; ``--backbone tiny`` in the CI test) is distilled for
   ``--epochs`` on ``--train-pairs`` real Home Depot pairs (../shared/data/homedepot/hd_dev.csv, whole queries,
   graded as benchmarks/bench_student_training.py grades them; read in place; ``--synthetic`` or a missing file:
   the synthetic set), saved and exported (``student.onnx``, ``model.onnx``).
2. ``choose_backend`` (evaluation.backend_choice, what ``agpo distil`` with ``serving_backends: true`` runs) on
   ``--audit-pairs`` pairs of other queries: the int8 graphs (OpenVINO's static one calibrated on the first half),
   each backend's held-out figures and the ``auto`` choice in ``backends.json``.
3. Timing, on ``--pairs`` pairs of yet other queries at ``--batch-size``, max length 96: a warm-up pass, then the
   median of ``--repeats`` passes (benchmarks/timing.py); single-pair p50/p99 over ``--latency-requests`` calls. Ours
   first, then sentence-transformers' in its venv (its int8 backends calibrated on the same audit half, never GLUE).
4. Quality on ``--test-pairs`` pairs of other queries: ROC-AUC of "relevant" (grade >= 2) and its change against
   fp32 (ours on onnxruntime: the same weights), and the share of grades flipped against it.
Targets (their goals in benchmarks/summary.py): our fastest backend that keeps quality against sentence-transformers'
fastest (goal 1.0x) and CrossEncoder on torch (4x), and its ROC-AUC change (at most 0.005 down). The CPU's flags
(``machine.cpu_vector_extensions``) and every library's version go into the results.
Run: ``.venv/bin/python benchmarks/bench_serving_backends.py`` (writes results/serving_backends.json; needs
``make venv-optimum``; it took 37 minutes on 2 busy cores).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from bench_student_training import HOME_DEPOT, home_depot, labelled, synthetic
from common import machine, write_results
from timing import latency_ms, throughput

from evaluation.backend_choice import MAX_AUC_DROP, choose_backend, quality_change, runs_here
from evaluation.metrics import validation_scores
from evaluation.predictors import load_predictor
from student.export import export_onnx
from student.graph_runtimes import BACKENDS
from student.model import RelevanceStudent, StudentConfig
from student.training import DistilTrainingConfig, distil

ROOT = Path(__file__).resolve().parents[1]
SIDE_PYTHON = ROOT / ".venv-optimum" / "bin" / "python"
MAX_LENGTH = 96
LIBRARIES = ("torch", "transformers", "onnxruntime", "openvino", "nncf", "sentence-transformers")


def splits(args: argparse.Namespace) -> tuple[dict[str, list[dict]], str]:
    """(train, audit, timing and test pairs, each of other queries; their source: real pairs unless ``--synthetic``)."""
    sizes = {"train": args.train_pairs, "audit": args.audit_pairs, "timing": args.pairs, "test": args.test_pairs}
    real = not args.synthetic and HOME_DEPOT.is_file()
    train, rest = (home_depot if real else synthetic)(sizes["train"], sum(sizes.values()) - sizes["train"], 7)
    out, start = {"train": train}, 0
    for name in ("audit", "timing", "test"):
        out[name], start = rest[start : start + sizes[name]], start + sizes[name]
    return out, str(HOME_DEPOT) if real else "synthetic"


def trained_folder(train: list[dict], audit: list[dict], backbone: str, epochs: int, folder: Path) -> Path:
    """The cross student distilled on ``train``'s gold grades, saved and exported into ``folder``."""
    texts = [f"{r['query']} {r['ad_title']}" for r in train]
    config = StudentConfig(backbone=backbone, kind="cross", max_length=MAX_LENGTH, tiny_hidden=32, tiny_vocab=300)
    student = RelevanceStudent.build(config, texts=texts)
    training = DistilTrainingConfig(epochs=epochs, min_epochs=epochs, patience=epochs, batch_size=32)
    distil(student, labelled(train), audit, training, score=validation_scores)
    export_onnx(student, student.save(folder))
    return folder


def ours(folder: Path, data: dict, args: argparse.Namespace) -> dict[str, dict]:
    """Every backend of ours that runs here, timed, with its test probabilities."""
    queries, ads = [r["query"] for r in data["timing"]], [r["ad_title"] for r in data["timing"]]
    test_pairs = [r["query"] for r in data["test"]], [r["ad_title"] for r in data["test"]]
    results = {}
    for backend in ("torch", *(b for b in BACKENDS if runs_here(folder, b))):
        predict = load_predictor(folder, backend, MAX_LENGTH).predict_proba
        rate, _ = throughput(predict, queries, ads, args.batch_size, args.repeats)
        results[f"ours_{backend}"] = {
            "pairs_per_s": round(rate, 1),
            **latency_ms(predict, queries, ads, args.latency_requests),
            "test_probabilities": predict(*test_pairs, args.batch_size),
        }
        print(f"ours_{backend:16s} {rate:9.1f} pairs/s", flush=True)
    return results


def sentence_transformers(folder: Path, data: dict, args: argparse.Namespace, calibration: list[dict]) -> dict:
    """benchmarks/st_backends.py in .venv-optimum on the same folder and pairs: its results and versions."""
    if not SIDE_PYTHON.is_file():
        raise SystemExit(f"{SIDE_PYTHON} is missing: make venv-optimum (sentence-transformers' backends run there)")

    def columns(rows: list[dict]) -> dict[str, list[str]]:
        return {"queries": [r["query"] for r in rows], "ads": [r["ad_title"] for r in rows]}

    request = {
        "folder": str(folder),
        **{"pairs": columns(data["timing"]), "test": columns(data["test"]), "calibration": columns(calibration)},
        **{"batch_size": args.batch_size, "max_length": MAX_LENGTH, "repeats": args.repeats},
        "latency_requests": args.latency_requests,
        **({"contenders": args.st_contenders.split(",")} if args.st_contenders else {}),
    }
    with tempfile.TemporaryDirectory() as tmp:
        ask, answer = Path(tmp) / "args.json", Path(tmp) / "out.json"
        ask.write_text(json.dumps(request))
        script = Path(__file__).with_name("st_backends.py")
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": tmp}
        subprocess.run([str(SIDE_PYTHON), str(script), str(ask), str(answer)], check=True, env=env)
        reply = json.loads(answer.read_text())
    for row in reply["results"].values():
        row["test_probabilities"] = np.asarray(row["test_probabilities"], dtype=np.float32)
    return reply


def targets(results: dict[str, dict]) -> dict[str, dict]:
    """Our fastest backend that keeps quality (ROC-AUC at most ``MAX_AUC_DROP`` below fp32's) against
    sentence-transformers' fastest and CrossEncoder on torch, and its ROC-AUC change (goals: benchmarks/summary.py)."""
    kept = [n for n, r in results.items() if n.startswith("ours_") and r["roc_auc_change"] >= -MAX_AUC_DROP]
    best = max(kept, key=lambda n: results[n]["pairs_per_s"])
    theirs = max((n for n in results if n.startswith("st_")), key=lambda n: results[n]["pairs_per_s"])
    rate = results[best]["pairs_per_s"]
    return {
        "vs_fastest_sentence_transformers": {
            "ours": best,
            "theirs": theirs,
            "ratio": round(rate / results[theirs]["pairs_per_s"], 2),
        },
        "vs_cross_encoder_torch": {
            "ours": best,
            "theirs": "st_torch",
            "ratio": round(rate / results["st_torch"]["pairs_per_s"], 2),
        },
        "roc_auc_change": {"ours": best, "value": results[best]["roc_auc_change"]},
    }


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("pairs", 2000), ("train-pairs", 2000), ("audit-pairs", 600), ("test-pairs", 1000)):
        parser.add_argument(f"--{flag}", type=int, default=default)
    for flag, default in (("epochs", 2), ("batch-size", 32), ("repeats", 2), ("latency-requests", 200)):
        parser.add_argument(f"--{flag}", type=int, default=default)
    parser.add_argument("--backbone", default="all-minilm-l6-v2", help="all-minilm-l6-v2, or tiny (the CI test)")
    parser.add_argument("--synthetic", action="store_true", help="synthetic pairs instead of the Home Depot export")
    parser.add_argument("--st-contenders", help="comma-separated sentence-transformers contenders (default: all)")
    args = parser.parse_args()
    data, source = splits(args)
    test_grades = [r["gold_grade"] for r in data["test"]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = trained_folder(data["train"], data["audit"], args.backbone, args.epochs, Path(tmp) / "student")
        measured = choose_backend(folder, data["audit"], batch_size=args.batch_size)
        results = ours(folder, data, args)
        side = sentence_transformers(folder, data, args, data["audit"][: len(data["audit"]) // 2])
    results |= side["results"]
    reference = results["ours_onnx"]["test_probabilities"]
    for row in results.values():
        row |= quality_change(np.asarray(row.pop("test_probabilities")), reference, test_grades, 2)
    report = {
        "machine": machine(),  # its cpu_vector_extensions: the CPU flags (evaluation.backend_choice.cpu_fingerprint)
        "versions": {"ours": {n: importlib.metadata.version(n) for n in LIBRARIES}, "side_venv": side["versions"]},
        "student": f"{args.backbone} cross-encoder, {args.epochs} epochs on {len(data['train'])} pairs",
        "source": source,
        "pairs": {name: len(data[name]) for name in ("train", "audit", "timing", "test")},
        **{"batch_size": args.batch_size, "max_length": MAX_LENGTH, "repeats": args.repeats},
        "sentence_transformers_onnx_int8_config": side["onnx_int8_config"],
        "auto": {"choice": measured["choice"], "rule": measured["rule"], "measured": measured["backends"]},
        "results": results,
        "targets": targets(results),
    }
    write_results("serving_backends", report)
    return report


if __name__ == "__main__":
    main()
