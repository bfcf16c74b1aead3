"""The annotation quality report: label distribution, abstentions, parse failures, agreement with gold
where gold exists (accuracy, macro-F1, confusion matrix), throughput. Written as JSON and one PNG.

Gold comes from the input rows' own ``gold_grade`` and from the optional ``gold`` Parquet (pair_id ->
gold_grade, e.g. the synthetic set's hidden ``unlabeled_gold.parquet``). Agreement is measured on the
pairs that have gold; abstained pairs count as wrong for accuracy and are reported separately.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.io import write_json_atomic
from pipelines.plots import plot_annotation_quality


def macro_f1(predicted: list[int | None], gold: list[int], grades: int) -> float:
    """Mean over grades of F1 (a grade never predicted nor present scores 0 and still counts)."""
    scores = []
    for g in range(grades):
        tp = sum(p == g and t == g for p, t in zip(predicted, gold, strict=True))
        fp = sum(p == g and t != g for p, t in zip(predicted, gold, strict=True))
        fn = sum(p != g and t == g for p, t in zip(predicted, gold, strict=True))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / grades


def gold_grades(out: Path, gold_path: str | None) -> dict[str, int]:
    """pair_id -> gold grade from the partitioned inputs and the optional gold file."""
    gold: dict[str, int] = {}
    for path in sorted((out / "partition").glob("input-*.parquet")):
        table = pq.read_table(path, columns=["pair_id", "gold_grade"])
        gold.update(
            (p, g) for p, g in zip(*(table[c].to_pylist() for c in table.column_names), strict=True) if g is not None
        )
    if gold_path and Path(gold_path).is_file():
        table = pq.read_table(gold_path, columns=["pair_id", "gold_grade"])
        gold.update(
            (p, g)
            for p, g in zip(table["pair_id"].to_pylist(), table["gold_grade"].to_pylist(), strict=True)
            if g is not None
        )
    return gold


def quality_report(
    config: Any, labels: pa.Table, counts: dict[str, int], throughput: dict[str, Any], out: Path
) -> dict[str, Path]:
    grades = len(config.input.grades)
    rows = labels.to_pylist()
    votes_requested = config.voting.votes * max(len(rows), 1)
    distribution = {str(g): sum(r["grade"] == g for r in rows) for g in range(grades)}
    report: dict[str, Any] = {
        "counts": counts,
        "label_distribution": distribution,
        "abstention_rate": sum(r["grade"] is None for r in rows) / max(len(rows), 1),
        "parse_failure_rate": sum(r["parse_failures"] for r in rows) / votes_requested,
        "mean_confidence": sum(r["confidence"] for r in rows) / max(len(rows), 1),
        "review_rate": counts["review_queue"] / max(len(rows), 1),
    }
    gold = gold_grades(out, config.gold)
    scored = [(r["grade"], gold[r["pair_id"]]) for r in rows if r["pair_id"] in gold]
    if scored:
        predicted, truth = [p for p, _ in scored], [t for _, t in scored]
        confusion = [[sum(p == c and t == g for p, t in scored) for c in range(grades)] for g in range(grades)]
        report["gold_agreement"] = {
            "pairs": len(scored),
            "accuracy": sum(p == t for p, t in scored) / len(scored),
            "macro_f1": macro_f1(predicted, truth, grades),
            "abstained": sum(p is None for p in predicted),
            "confusion_gold_by_label": confusion,
        }
    seconds = throughput.get("seconds")
    if seconds:
        report["throughput"] = {
            **throughput,
            "pairs_per_s": throughput["pairs"] / seconds,
            "tokens_per_s": throughput["generated_tokens"] / seconds,
            "engine_tokens_per_s": throughput["generated_tokens"] / max(throughput["generation_seconds"], 1e-9),
            "engine_time_share": throughput["generation_seconds"] / seconds,
        }
    else:
        report["throughput"] = {}
    return {
        "report": write_json_atomic(out / "quality_report.json", report),
        "plot": plot_annotation_quality(report, out / "quality_report.png"),
    }
