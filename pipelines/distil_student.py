"""Stage ``agpo distil``: train the student on the teacher's labels and score it on gold test pairs.

Reads the annotation run's ``labels/`` (or, with ``label_source: gold``, the hidden gold grades of the
same pairs: the gold-label reference student), joins the pairs' text from the pairs file, distils
(student.distill) with early stopping on the gold ``audit`` split, and evaluates on the gold ``test``
split: accuracy, macro-F1, per-grade precision/recall, ROC-AUC and PR-AUC of "relevant" (grade >= 2) and
one-vs-rest, NDCG@10 per query with ESCI gains, and expected calibration error. Writes into ``out_dir``:
``model/`` (save_pretrained), ``metrics.json``, ``confusion.png``, ``reliability.png``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from tqdm import tqdm

from agpo.checks import require_choice
from pipelines.contracts import ContractError, read_pairs
from pipelines.io import print_summary, write_json_atomic
from pipelines.plots import plot_confusion, plot_reliability
from student.distill import DistillConfig, distill
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

LABEL_SOURCES = ("teacher", "gold")


@dataclass(frozen=True)
class DistilConfig:
    """Labels to learn from, gold splits to stop and score on, and the student."""

    labels: str = field(default="work/annotate/labels", metadata={"help": "labels Parquet folder (agpo annotate)"})
    pairs: str = field(default="work/data/pairs.parquet", metadata={"help": "pairs file: text, audit and test gold"})
    label_source: str = field(default="teacher", metadata={"help": f"one of {list(LABEL_SOURCES)}"})
    gold: str = field(
        default="work/data/unlabeled_gold.parquet",
        metadata={"help": "hidden gold of the labeled pairs (label_source: gold)"},
    )
    out_dir: str = field(default="work/student", metadata={"help": "output folder"})
    student: StudentConfig = field(default_factory=StudentConfig, metadata={"help": "the student model"})
    distill: DistillConfig = field(default_factory=DistillConfig, metadata={"help": "distillation"})

    def __post_init__(self) -> None:
        require_choice("label_source", self.label_source, LABEL_SOURCES)


def training_rows(config: DistilConfig, text: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Labeled pairs with their text; gold source: one-hot votes of the hidden gold grade."""
    folder = Path(config.labels)
    files = sorted(folder.glob("*.parquet"))
    if not files:
        raise ContractError(f"no labels in {folder}; run `agpo annotate` first or fix labels")
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    missing = [r["pair_id"] for r in rows if r["pair_id"] not in text]
    if missing:
        raise ContractError(f"{len(missing)} labeled pair_ids are not in {config.pairs}, e.g. {missing[0]!r}")
    if config.label_source == "gold":
        table = pq.read_table(config.gold)
        gold = dict(zip(table["pair_id"].to_pylist(), table["gold_grade"].to_pylist(), strict=True))
        grades = config.student.num_grades
        rows = [
            {"pair_id": r["pair_id"], "grade": gold[r["pair_id"]], "confidence": 1.0,
             "votes": [int(g == gold[r["pair_id"]]) for g in range(grades)]}
            for r in rows if gold.get(r["pair_id"]) is not None
        ]  # fmt: skip
    return [{**r, "query": text[r["pair_id"]]["query"], "ad_title": text[r["pair_id"]]["ad_title"]} for r in rows]


def evaluate(student: RelevanceStudent, test: list[dict[str, Any]], num_grades: int) -> dict[str, Any]:
    probs = student.predict_proba([r["query"] for r in test], [r["ad_title"] for r in test])
    gold = [r["gold_grade"] for r in test]
    predicted = probs.argmax(1).tolist()
    ece, bins = expected_calibration_error(y_true=gold, probs=probs)
    # expected gain under the student's distribution ranks each query's ads
    expected_grade = (probs * list(range(num_grades))).sum(1).tolist()
    return {
        "pairs": len(test),
        "accuracy": accuracy(y_true=gold, y_pred=predicted, num_grades=num_grades),
        "macro_f1": macro_f1(y_true=gold, y_pred=predicted, num_grades=num_grades),
        **relevance_aucs(y_true=gold, probs=probs),
        "ndcg@10": ndcg_at_k(query_ids=[r["query"] for r in test], y_true=gold, scores=expected_grade, k=10),
        "ece": ece,
        "per_grade": precision_recall_per_grade(y_true=gold, y_pred=predicted, num_grades=num_grades),
        "confusion_gold_by_predicted": confusion_matrix(y_true=gold, y_pred=predicted, num_grades=num_grades),
        "reliability_bins": bins,
    }


def run(config: DistilConfig) -> dict[str, Path]:
    pairs = read_pairs(config.pairs).to_pylist()
    text = {r["pair_id"]: r for r in pairs}
    validation = [r for r in pairs if r["split"] == "audit" and r["gold_grade"] is not None]
    test = [r for r in pairs if r["split"] == "test" and r["gold_grade"] is not None]
    if not validation or not test:
        raise ContractError(f"{config.pairs} needs gold audit and test splits, got {len(validation)} and {len(test)}")
    rows = training_rows(config, text)
    started = time.perf_counter()
    student = RelevanceStudent.build(config.student, texts=[f"{r['query']} {r['ad_title']}" for r in pairs])
    with tqdm(total=config.distill.epochs, desc=f"distil ({config.label_source} labels)", unit="epoch") as bar:

        def progress(record: dict[str, float]) -> None:
            bar.update()
            bar.set_postfix(val_f1=f"{record['val_macro_f1']:.3f}")

        result = distill(student, rows, validation, config.distill, on_epoch=progress)
    metrics = evaluate(student, test, config.student.num_grades)
    out = Path(config.out_dir)
    summary = {
        "label_source": config.label_source,
        "labels": config.labels,
        "training_pairs": len(rows),
        "abstained_skipped": result.skipped_abstained,
        "best_epoch": result.best_epoch,
        "best_val_macro_f1": result.best_val_macro_f1,
        "history": result.history,
        "seconds": round(time.perf_counter() - started, 1),
        "test": metrics,
    }
    paths = {
        "model": student.save(out / "model"),
        "metrics": write_json_atomic(out / "metrics.json", summary),
        "confusion": plot_confusion(
            metrics["confusion_gold_by_predicted"],
            out / "confusion.png",
            f"student ({config.label_source} labels) on gold test pairs",
        ),
        "reliability": plot_reliability(
            metrics["reliability_bins"], metrics["ece"], out / "reliability.png", "student calibration"
        ),
    }
    print_summary(
        f"student from {config.label_source} labels ({len(rows):,} pairs, best epoch {result.best_epoch}): gold test "
        f"accuracy {metrics['accuracy']:.3f}, macro-F1 {metrics['macro_f1']:.3f}, ROC-AUC(relevant) "
        f"{metrics['roc_auc_relevant']:.3f}, NDCG@10 {metrics['ndcg@10']:.3f}, ECE {metrics['ece']:.3f}",
        paths,
    )
    return paths
