"""Stage ``agpo evaluate``: score a saved student on a gold split with the offline relevance metrics.

Loads ``model`` (a ``save_pretrained`` student; ``backend: onnx`` serves its ``model.onnx`` with
onnxruntime instead of torch), predicts the grade distribution of every gold pair of ``split`` in the
pairs file, and writes into ``out_dir``: ``metrics.json`` (accuracy, macro-F1, per-grade precision and
recall, ROC-AUC and PR-AUC of "relevant" (grade >= ``relevant_from``) and one-vs-rest, NDCG@k per query
ranked by the expected grade with ESCI gains, expected calibration error, the confusion matrix and the
reliability bins), ``confusion.png`` and ``reliability.png``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from agpo.checks import require_choice
from pipelines.ads.contracts import ContractError, read_pairs
from pipelines.io import print_summary, write_json_atomic
from pipelines.plots import plot_confusion, plot_reliability
from student.export import OnnxStudent
from student.metrics import (
    accuracy,
    confusion_matrix,
    expected_calibration_error,
    macro_f1,
    ndcg_at_k,
    precision_recall_per_grade,
    relevance_aucs,
)
from student.model import RelevanceStudent

BACKENDS = ("torch", "onnx")


@dataclass(frozen=True)
class EvaluateConfig:
    """Which student, which gold pairs, and how to score them."""

    model: str = field(default="work/student/model", metadata={"help": "student folder (agpo distil)"})
    pairs: str = field(default="work/data/pairs.parquet", metadata={"help": "pairs file with the gold split"})
    split: str = field(default="test", metadata={"help": "gold split scored"})
    out_dir: str = field(default="work/student/eval", metadata={"help": "output folder"})
    backend: str = field(default="torch", metadata={"help": f"one of {list(BACKENDS)}"})
    relevant_from: int = field(default=2, metadata={"help": "grades >= this count as relevant (ROC-AUC, PR-AUC)"})
    ndcg_k: int = field(default=10, metadata={"help": "k of NDCG@k"})
    batch_size: int = field(default=256, metadata={"help": "pairs per prediction batch"})
    max_length: int = field(default=96, metadata={"help": "longest query + ad in tokens"})

    def __post_init__(self) -> None:
        require_choice("backend", self.backend, BACKENDS)
        if self.ndcg_k < 1 or self.batch_size < 1:
            raise ValueError(f"ndcg_k and batch_size must be >= 1, got {self.ndcg_k}, {self.batch_size}")


def relevance_metrics(
    probs: np.ndarray, gold: list[int], query_ids: list[str], relevant_from: int = 2, ndcg_k: int = 10
) -> dict[str, Any]:
    """Every offline metric of one set of predicted grade distributions against gold grades."""
    grades = probs.shape[1]
    predicted = probs.argmax(1).tolist()
    ece, bins = expected_calibration_error(y_true=gold, probs=probs)
    expected_grade = (probs * np.arange(grades)).sum(1).tolist()  # ranks each query's ads
    return {
        "pairs": len(gold),
        "accuracy": accuracy(y_true=gold, y_pred=predicted, num_grades=grades),
        "macro_f1": macro_f1(y_true=gold, y_pred=predicted, num_grades=grades),
        **relevance_aucs(y_true=gold, probs=probs, relevant_from=relevant_from),
        f"ndcg@{ndcg_k}": ndcg_at_k(query_ids=query_ids, y_true=gold, scores=expected_grade, k=ndcg_k),
        "ece": ece,
        "per_grade": precision_recall_per_grade(y_true=gold, y_pred=predicted, num_grades=grades),
        "confusion_gold_by_predicted": confusion_matrix(y_true=gold, y_pred=predicted, num_grades=grades),
        "reliability_bins": bins,
    }


def run(config: EvaluateConfig) -> dict[str, Path]:
    pairs = [r for r in read_pairs(config.pairs).to_pylist() if r["split"] == config.split]
    gold_pairs = [r for r in pairs if r["gold_grade"] is not None]
    if not gold_pairs:
        raise ContractError(f"{config.pairs} has no gold pairs in split {config.split!r}; choose another split")
    if config.backend == "onnx":
        student = OnnxStudent(config.model, max_length=config.max_length)
    else:
        student = RelevanceStudent.load(config.model, max_length=config.max_length)
    started = time.perf_counter()
    parts = []
    for i in tqdm(range(0, len(gold_pairs), config.batch_size), desc=f"evaluate ({config.backend})", unit="batch"):
        rows = gold_pairs[i : i + config.batch_size]
        parts.append(student.predict_proba([r["query"] for r in rows], [r["ad_title"] for r in rows]))
    probs = np.concatenate(parts)
    seconds = time.perf_counter() - started
    metrics = relevance_metrics(
        probs,
        [r["gold_grade"] for r in gold_pairs],
        [r["query"] for r in gold_pairs],
        config.relevant_from,
        config.ndcg_k,
    )
    report = {
        "model": config.model,
        "backend": config.backend,
        "split": config.split,
        "pairs_per_s": round(len(gold_pairs) / seconds, 1),
        **metrics,
    }
    out = Path(config.out_dir)
    paths = {
        "metrics": write_json_atomic(out / "metrics.json", report),
        "confusion": plot_confusion(
            metrics["confusion_gold_by_predicted"], out / "confusion.png", f"student on gold {config.split} pairs"
        ),
        "reliability": plot_reliability(
            metrics["reliability_bins"], metrics["ece"], out / "reliability.png", "student calibration"
        ),
    }
    ndcg = f"ndcg@{config.ndcg_k}"
    print_summary(
        f"student on {len(gold_pairs):,} gold {config.split} pairs: accuracy {metrics['accuracy']:.3f}, macro-F1 "
        f"{metrics['macro_f1']:.3f}, ROC-AUC(relevant) {metrics['roc_auc_relevant']:.3f}, PR-AUC "
        f"{metrics['pr_auc_relevant']:.3f}, {ndcg.upper()} {metrics[ndcg]:.3f}, ECE {metrics['ece']:.3f}",
        paths,
    )
    return paths
