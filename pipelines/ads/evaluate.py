"""Stage ``agpo evaluate``: score a saved student on a gold split with the offline relevance metrics.

Loads ``model`` (a ``save_pretrained`` student; ``backend: onnx`` serves its ``model.onnx`` with
onnxruntime instead of torch), predicts the grade distribution of every gold pair of ``split`` in the
pairs file, and writes into ``out_dir``: ``metrics.json`` (accuracy, macro-F1, per-grade precision and
recall, ROC-AUC and PR-AUC of "relevant" (grade >= ``relevant_from``) and one-vs-rest, NDCG@k per query
ranked by the expected grade with ESCI gains, expected calibration error, the confusion matrix and the
reliability bins), ``confusion.png`` and ``reliability.png``.

The lexical baseline (``lexical_baseline.enabled``, on by default): TF-IDF word and character n-grams +
logistic regression (student.lexical) trained on the labels the student learned from (the same rows as
``agpo distil``: its ``training_rows``, abstained pairs skipped, weighted by the teacher's confidence when
the distiller was), scored on the same gold pairs with the same metrics. The label folder and source are
read from ``distil.json`` beside the model unless given. ``metrics.json`` gains a ``lexical_baseline``
section and ``comparison.md`` puts the two side by side; ``agpo pipeline``'s register step promotes no
student that does not beat it (``tracking.require_beat_lexical``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from agpo.checks import require_choice
from pipelines.ads import distil as distil_stage
from pipelines.ads.contracts import ContractError, read_pairs
from pipelines.ads.distil import LABEL_SOURCES, DistilConfig, training_rows
from pipelines.io import print_summary, write_atomic, write_json_atomic
from pipelines.plots import plot_confusion, plot_reliability
from student.distill import pair_weights, usable_labels
from student.export import OnnxStudent
from student.lexical import LexicalBaseline, LexicalConfig
from student.metrics import (
    accuracy,
    confusion_matrix,
    expected_calibration_error,
    macro_f1,
    ndcg_at_k,
    precision_recall_per_grade,
    relevance_aucs,
)
from student.model import RelevanceStudent, StudentConfig

BACKENDS = ("torch", "onnx")
COMPARED = ("accuracy", "macro_f1", "roc_auc_relevant", "pr_auc_relevant", "ece")


@dataclass(frozen=True)
class LexicalBaselineConfig:
    """The TF-IDF + logistic-regression baseline, trained on the labels the student learned from."""

    enabled: bool = field(default=True, metadata={"help": "train the baseline and report it beside the student"})
    labels: str | None = field(
        default=None, metadata={"help": "labels Parquet folder the student learned from; null: distil.json's"}
    )
    label_source: str | None = field(
        default=None, metadata={"help": f"one of {list(LABEL_SOURCES)}; null: distil.json's (else teacher)"}
    )
    gold: str = field(
        default="work/data/unlabeled_gold.parquet",
        metadata={"help": "hidden gold of the labeled pairs (label_source: gold), as agpo distil's gold"},
    )
    confidence_weighting: bool = field(
        default=True, metadata={"help": "weight pairs by the teacher's confidence, as distill.confidence_weighting"}
    )
    model: LexicalConfig = field(default_factory=LexicalConfig, metadata={"help": "features and regularisation"})

    def __post_init__(self) -> None:
        if self.label_source is not None:
            require_choice("label_source", self.label_source, LABEL_SOURCES)


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
    lexical_baseline: LexicalBaselineConfig = field(
        default_factory=LexicalBaselineConfig, metadata={"help": "the lexical baseline reported beside the student"}
    )

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


def gold_metrics(probs: np.ndarray, gold_pairs: list[dict[str, Any]], config: EvaluateConfig) -> dict[str, Any]:
    """``relevance_metrics`` of predictions for ``gold_pairs`` (their gold grades, grouped by query)."""
    gold = [r["gold_grade"] for r in gold_pairs]
    return relevance_metrics(probs, gold, [r["query"] for r in gold_pairs], config.relevant_from, config.ndcg_k)


def lexical_baseline(
    config: EvaluateConfig, pairs: list[dict[str, Any]], gold_pairs: list[dict[str, Any]], num_grades: int
) -> dict[str, Any]:
    """The baseline fitted on the student's training rows and scored on ``gold_pairs``: its metrics."""
    options = config.lexical_baseline
    summary = Path(config.model).parent / "distil.json"
    recorded = json.loads(summary.read_text()) if summary.is_file() else {}
    labels = options.labels or recorded.get("labels")
    if not labels:
        raise ContractError(
            f"the lexical baseline needs the student's labels: {summary} is missing; set "
            "lexical_baseline.labels=<labels folder> (and label_source) or lexical_baseline.enabled=false"
        )
    source = options.label_source or recorded.get("label_source", "teacher")
    distil_config = DistilConfig(
        labels=labels,
        pairs=config.pairs,
        label_source=source,
        gold=options.gold,
        student=StudentConfig(num_grades=num_grades),
    )
    rows = usable_labels(training_rows(distil_config, {r["pair_id"]: r for r in pairs}))
    if not rows:
        raise ContractError(f"no usable labels in {labels} for the lexical baseline (every pair abstained)")
    started = time.perf_counter()
    baseline = LexicalBaseline(num_grades, options.model).fit(
        [r["query"] for r in rows],
        [r["ad_title"] for r in rows],
        [r["grade"] for r in rows],
        pair_weights(rows, options.confidence_weighting),
    )
    probs = baseline.predict_proba([r["query"] for r in gold_pairs], [r["ad_title"] for r in gold_pairs])
    metrics = gold_metrics(probs, gold_pairs, config)
    return {
        "model": "tf-idf word + char_wb n-grams, logistic regression",
        "labels": labels,
        "label_source": source,
        "training_pairs": len(rows),
        "single_grade": baseline.single_grade,
        "seconds": round(time.perf_counter() - started, 1),
        **metrics,
    }


def learning_like(config: EvaluateConfig, distil: DistilConfig) -> EvaluateConfig:
    """``config`` whose lexical baseline learns from exactly the labels ``distil`` trains the student on."""
    baseline = replace(
        config.lexical_baseline,
        labels=distil.labels,
        label_source=distil.label_source,
        gold=distil.gold,
        confidence_weighting=distil.distill.confidence_weighting,
    )
    return replace(config, lexical_baseline=baseline)


def distil_and_evaluate(distil: DistilConfig, config: EvaluateConfig) -> tuple[dict[str, Path], dict[str, Path]]:
    """Train a student with ``distil`` and score it (``<distil.out_dir>/eval``) on the gold test split of its
    pairs, beside the lexical baseline learned from the same labels; returns both stages' output paths."""
    trained = distil_stage.run(distil)
    scored = run(
        replace(
            learning_like(config, distil),
            model=str(trained["model"]),
            pairs=distil.pairs,
            out_dir=str(Path(distil.out_dir) / "eval"),
        )
    )
    return trained, scored


def comparison_table(student: dict[str, Any], baseline: dict[str, Any], ndcg: str) -> str:
    """Markdown: the student and the lexical baseline on the same gold pairs."""
    keys = (*COMPARED[:4], ndcg, COMPARED[4])
    rows = [("student", student), ("lexical baseline", baseline)]
    lines = [
        "| model | " + " | ".join(keys) + " |",
        "|---|" + "---:|" * len(keys),
        *(f"| {name} | " + " | ".join(f"{m[k]:.3f}" for k in keys) + " |" for name, m in rows),
        "| student - baseline | " + " | ".join(f"{student[k] - baseline[k]:+.3f}" for k in keys) + " |",
    ]
    return "\n".join(lines) + "\n"


def run(config: EvaluateConfig) -> dict[str, Path]:
    all_pairs = read_pairs(config.pairs).to_pylist()
    gold_pairs = [r for r in all_pairs if r["split"] == config.split and r["gold_grade"] is not None]
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
    metrics = gold_metrics(probs, gold_pairs, config)
    report = {
        "model": config.model,
        "backend": config.backend,
        "split": config.split,
        "pairs_per_s": round(len(gold_pairs) / seconds, 1),
        **metrics,
    }
    ndcg = f"ndcg@{config.ndcg_k}"
    if config.lexical_baseline.enabled:
        report["lexical_baseline"] = lexical_baseline(config, all_pairs, gold_pairs, probs.shape[1])
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
    headline = (
        f"student on {len(gold_pairs):,} gold {config.split} pairs: accuracy {metrics['accuracy']:.3f}, macro-F1 "
        f"{metrics['macro_f1']:.3f}, ROC-AUC(relevant) {metrics['roc_auc_relevant']:.3f}, PR-AUC "
        f"{metrics['pr_auc_relevant']:.3f}, {ndcg.upper()} {metrics[ndcg]:.3f}, ECE {metrics['ece']:.3f}"
    )
    if "lexical_baseline" in report:
        lexical = report["lexical_baseline"]
        paths["comparison"] = write_atomic(out / "comparison.md", comparison_table(metrics, lexical, ndcg))
        headline += (
            f"\nlexical baseline (TF-IDF + logistic regression on the same {lexical['training_pairs']:,} "
            f"{lexical['label_source']} labels): accuracy {lexical['accuracy']:.3f}, "
            f"macro-F1 {lexical['macro_f1']:.3f}, "
            f"ROC-AUC(relevant) {lexical['roc_auc_relevant']:.3f}, {ndcg.upper()} {lexical[ndcg]:.3f}; student - "
            f"baseline macro-F1 {metrics['macro_f1'] - lexical['macro_f1']:+.3f}"
        )
    print_summary(headline, paths)
    return paths
